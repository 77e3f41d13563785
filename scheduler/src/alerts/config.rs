//! Channel configuration: the `[[alerts.channels]]` tables of the scheduler's TOML file, and
//! their validation. Every error names the channel and the field.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::AlertKind;

/// The wire format of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelFormat {
    /// ax's own JSON body (schema version 1, see the module doc).
    Webhook,
    /// A DingTalk group robot (`oapi.dingtalk.com/robot/send`), markdown message.
    DingTalk,
    /// A Feishu or Lark custom bot (`/open-apis/bot/v2/hook/…`), text message.
    Feishu,
    /// A WeCom (WeChat Work) group robot (`qyapi.weixin.qq.com/cgi-bin/webhook/send`), markdown.
    WeCom,
    /// A Slack incoming webhook, mrkdwn text.
    Slack,
}

impl ChannelFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelFormat::Webhook => "webhook",
            ChannelFormat::DingTalk => "dingtalk",
            ChannelFormat::Feishu => "feishu",
            ChannelFormat::WeCom => "wecom",
            ChannelFormat::Slack => "slack",
        }
    }

    /// Parses a configured format; case, `-` and `_` do not matter, and `lark` is Feishu.
    pub fn parse(text: &str) -> Option<ChannelFormat> {
        let normalized: String = text
            .trim()
            .to_ascii_lowercase()
            .chars()
            .filter(|c| *c != '-' && *c != '_')
            .collect();
        match normalized.as_str() {
            "webhook" | "json" => Some(ChannelFormat::Webhook),
            "dingtalk" | "dingding" => Some(ChannelFormat::DingTalk),
            "feishu" | "lark" => Some(ChannelFormat::Feishu),
            "wecom" | "wechatwork" | "wework" => Some(ChannelFormat::WeCom),
            "slack" => Some(ChannelFormat::Slack),
            _ => None,
        }
    }

    /// Whether a `secret` means something for this format.
    fn signs(self) -> bool {
        matches!(
            self,
            ChannelFormat::Webhook | ChannelFormat::DingTalk | ChannelFormat::Feishu
        )
    }
}

impl fmt::Display for ChannelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// At most `max` alerts per `per`, as a token bucket: a burst of `max`, then one every
/// `per / max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub max: u32,
    pub per: Duration,
}

impl RateLimit {
    pub fn per_minute(max: u32) -> RateLimit {
        RateLimit {
            max,
            per: Duration::from_secs(60),
        }
    }
}

/// The defaults: DingTalk's documented robot limit is 20 messages a minute, and the others are
/// of the same order, so 20 a minute is safe everywhere.
pub const DEFAULT_MAX_PER_MINUTE: u32 = 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_RETRIES: u32 = 3;
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// One channel, validated. Build it with [`ChannelConfig::new`] or deserialize it from a
/// `[[alerts.channels]]` table.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ChannelFile")]
pub struct ChannelConfig {
    /// Names the channel in logs, stats and errors; unique.
    pub name: String,
    pub format: ChannelFormat,
    /// `http://` or `https://`. Webhook urls usually carry a token: they are never logged.
    pub url: String,
    /// The kinds this channel takes; empty means every kind.
    pub kinds: Vec<AlertKind>,
    /// DingTalk and Feishu signing secret; for a generic webhook, the `X-Ax-Signature` key.
    pub secret: Option<String>,
    pub rate_limit: RateLimit,
    /// Per request (connect, send, read the answer).
    pub timeout: Duration,
    /// Retries after the first try, on connection errors, timeouts, 5xx and 429.
    pub retries: u32,
    /// The first retry's delay; each later retry waits twice as long as the one before.
    pub retry_backoff: Duration,
}

impl ChannelConfig {
    /// A channel with the default rate limit, timeout and retries, taking every kind.
    pub fn new(name: impl Into<String>, format: ChannelFormat, url: impl Into<String>) -> Self {
        ChannelConfig {
            name: name.into(),
            format,
            url: url.into(),
            kinds: Vec::new(),
            secret: None,
            rate_limit: RateLimit::per_minute(DEFAULT_MAX_PER_MINUTE),
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
        }
    }

    /// Checks what `Alerter::new` relies on; the error names this channel and the field.
    pub fn validate(&self) -> Result<(), AlertConfigError> {
        let invalid = |field: &'static str, message: String| AlertConfigError::Invalid {
            channel: self.name.clone(),
            field,
            message,
        };
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty".into()));
        }
        parse_url(&self.url).map_err(|message| invalid("url", message))?;
        match &self.secret {
            Some(secret) if secret.is_empty() => {
                return Err(invalid("secret", "must not be empty when given".into()));
            }
            Some(_) if !self.format.signs() => {
                return Err(invalid(
                    "secret",
                    format!(
                        "{} webhooks are not signed (the key is part of the url)",
                        self.format
                    ),
                ));
            }
            _ => {}
        }
        if self.rate_limit.max == 0 || self.rate_limit.per.is_zero() {
            return Err(invalid(
                "max_per_minute",
                "must allow at least one alert".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(invalid("timeout", "must be longer than zero".into()));
        }
        if self.retries > MAX_RETRIES {
            return Err(invalid(
                "retries",
                format!("at most {MAX_RETRIES} (the backoff doubles each time)"),
            ));
        }
        Ok(())
    }
}

/// Ten doublings of a 500 ms backoff already wait over eight minutes in total.
const MAX_RETRIES: u32 = 10;

/// The url as reqwest takes it, with an http(s) scheme and a host.
pub(super) fn parse_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text.trim()).map_err(|err| format!("not a valid url: {err}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("scheme \"{}\" is not http or https", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    Ok(url)
}

impl fmt::Debug for ChannelConfig {
    /// Webhook urls and secrets are credentials: Debug shows the url's origin only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origin = parse_url(&self.url)
            .map(|url| url.origin().ascii_serialization())
            .unwrap_or_else(|_| "<invalid>".into());
        f.debug_struct("ChannelConfig")
            .field("name", &self.name)
            .field("format", &self.format)
            .field("url", &format_args!("{origin}/…"))
            .field("kinds", &self.kinds)
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("rate_limit", &self.rate_limit)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("retry_backoff", &self.retry_backoff)
            .finish()
    }
}

/// A `[[alerts.channels]]` table as written; `TryFrom` turns it into a [`ChannelConfig`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    name: String,
    format: String,
    url: String,
    #[serde(default)]
    kinds: Vec<String>,
    secret: Option<String>,
    #[serde(default, alias = "max-per-minute")]
    max_per_minute: Option<u32>,
    timeout: Option<String>,
    retries: Option<u32>,
    #[serde(default, alias = "retry-backoff")]
    retry_backoff: Option<String>,
}

impl TryFrom<ChannelFile> for ChannelConfig {
    type Error = AlertConfigError;

    fn try_from(file: ChannelFile) -> Result<ChannelConfig, AlertConfigError> {
        let invalid = |field: &'static str, message: String| AlertConfigError::Invalid {
            channel: file.name.clone(),
            field,
            message,
        };
        let format = ChannelFormat::parse(&file.format).ok_or_else(|| {
            invalid(
                "format",
                format!(
                    "unknown format \"{}\" (expected webhook, dingtalk, feishu, lark, wecom or \
                     slack)",
                    file.format
                ),
            )
        })?;
        let kinds = file
            .kinds
            .iter()
            .map(|text| {
                AlertKind::parse(text).ok_or_else(|| {
                    let known: Vec<&str> = AlertKind::ALL.iter().map(|k| k.as_str()).collect();
                    invalid(
                        "kinds",
                        format!(
                            "unknown kind \"{text}\" (expected one of {})",
                            known.join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let duration = |field: &'static str, text: &Option<String>, default: Duration| match text {
            Some(text) => {
                ax_core::duration::parse(text).map_err(|err| invalid(field, err.to_string()))
            }
            None => Ok(default),
        };
        let config = ChannelConfig {
            name: file.name.clone(),
            format,
            url: file.url.clone(),
            kinds,
            secret: file.secret.clone(),
            rate_limit: RateLimit::per_minute(
                file.max_per_minute.unwrap_or(DEFAULT_MAX_PER_MINUTE),
            ),
            timeout: duration("timeout", &file.timeout, DEFAULT_TIMEOUT)?,
            retries: file.retries.unwrap_or(DEFAULT_RETRIES),
            retry_backoff: duration("retry_backoff", &file.retry_backoff, DEFAULT_RETRY_BACKOFF)?,
        };
        config.validate()?;
        Ok(config)
    }
}

/// The `[alerts]` section of the scheduler's configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    #[serde(default)]
    pub channels: Vec<ChannelConfig>,
}

impl AlertsConfig {
    /// The `[alerts]` section of a whole TOML document (other sections are ignored); no section
    /// means no channels.
    pub fn from_toml_str(text: &str) -> Result<AlertsConfig, AlertConfigError> {
        #[derive(Deserialize)]
        struct Document {
            #[serde(default)]
            alerts: AlertsConfig,
        }
        let document: Document =
            toml::from_str(text).map_err(|err| AlertConfigError::Toml(err.to_string()))?;
        validate_all(&document.alerts.channels)?;
        Ok(document.alerts)
    }
}

/// Every channel valid, and no name used twice.
pub(super) fn validate_all(channels: &[ChannelConfig]) -> Result<(), AlertConfigError> {
    let mut names = HashSet::new();
    for channel in channels {
        channel.validate()?;
        if !names.insert(channel.name.as_str()) {
            return Err(AlertConfigError::DuplicateName(channel.name.clone()));
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AlertConfigError {
    #[error("alert channel \"{channel}\": {field}: {message}")]
    Invalid {
        channel: String,
        field: &'static str,
        message: String,
    },
    #[error("alert channel \"{0}\" is configured twice")]
    DuplicateName(String),
    #[error("alerts config: {0}")]
    Toml(String),
    #[error("alert channels need a tokio runtime to deliver from")]
    NoRuntime,
    #[error("building the alerts http client: {0}")]
    Client(String),
}
