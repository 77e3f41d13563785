//! One channel's delivery task: its rate limit (a token bucket), the request in the channel's
//! format, retries with exponential backoff, and the counters.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{ChannelConfig, ChannelFormat, RateLimit};
use super::{Counters, Outbound, dingtalk, feishu, slack, webhook, wecom};

/// One HTTP request, ready to post.
pub(super) struct Prepared {
    pub url: reqwest::Url,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Prepared {
    pub fn json(url: reqwest::Url, body: &impl Serialize) -> Prepared {
        Prepared {
            url,
            // Serializing plain structs and `json!` values with string keys cannot fail.
            body: serde_json::to_vec(body).unwrap_or_default(),
            headers: Vec::new(),
        }
    }
}

/// What a chat service said in a 2xx body. DingTalk, Feishu and WeCom answer HTTP 200 even when
/// they refuse a message (bad signature, unknown token, too fast) and put the reason in a code.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ServiceAnswer {
    Accepted,
    Refused {
        code: i64,
        message: String,
        retry: bool,
    },
}

impl ServiceAnswer {
    /// Reads the first of `code_fields` present in a JSON object body: 0 is accepted. A body
    /// that is not JSON or has no code is taken as accepted, since the HTTP status was 2xx.
    pub fn from_code(
        body: &[u8],
        code_fields: &[&str],
        message_field: &str,
        retry_codes: &[i64],
    ) -> ServiceAnswer {
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(body) else {
            return ServiceAnswer::Accepted;
        };
        let Some(code) = code_fields
            .iter()
            .find_map(|field| fields.get(*field).and_then(serde_json::Value::as_i64))
        else {
            return ServiceAnswer::Accepted;
        };
        if code == 0 {
            return ServiceAnswer::Accepted;
        }
        let message = fields
            .get(message_field)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        ServiceAnswer::Refused {
            code,
            message,
            retry: retry_codes.contains(&code),
        }
    }
}

pub(super) fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A token bucket in its GCRA form: `tat` is when the bucket would be full again. A burst of
/// `max` passes, then one alert every `per / max`.
#[derive(Debug)]
pub(super) struct TokenBucket {
    interval: Duration,
    tolerance: Duration,
    tat: Instant,
}

impl TokenBucket {
    pub fn new(limit: RateLimit, now: Instant) -> TokenBucket {
        let interval = limit.per / limit.max.max(1);
        TokenBucket {
            interval,
            tolerance: limit.per.saturating_sub(interval),
            tat: now,
        }
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let tat = self.tat.max(now);
        if tat.saturating_duration_since(now) > self.tolerance {
            return false;
        }
        self.tat = tat + self.interval;
        true
    }

    /// When the next token is there.
    pub fn ready_at(&self) -> Instant {
        self.tat.checked_sub(self.tolerance).unwrap_or(self.tat)
    }
}

/// A Retry-After longer than this is not waited for within one delivery; the retry happens
/// after this long and the service decides again.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How much of an error body goes into a log line.
const BODY_SNIPPET_CHARS: usize = 200;

enum Outcome {
    Delivered,
    Failed {
        status: Option<u16>,
        error: String,
        retry: bool,
        retry_after: Option<Duration>,
    },
}

pub(super) struct Delivery {
    config: ChannelConfig,
    url: reqwest::Url,
    client: reqwest::Client,
    counters: Arc<Counters>,
}

impl Delivery {
    pub fn new(
        config: ChannelConfig,
        url: reqwest::Url,
        client: reqwest::Client,
        counters: Arc<Counters>,
    ) -> Self {
        Delivery {
            config,
            url,
            client,
            counters,
        }
    }

    fn channel(&self) -> &str {
        &self.config.name
    }

    /// Takes alerts off the queue until it is closed and empty (`drain`, or every sender
    /// dropped), or until `stop`.
    pub async fn run(
        self,
        mut inbox: mpsc::Receiver<Outbound>,
        drain: CancellationToken,
        stop: CancellationToken,
    ) {
        let mut bucket = TokenBucket::new(self.config.rate_limit, Instant::now());
        let mut suppressed: u64 = 0;
        let mut draining = false;
        loop {
            let summary_at = (suppressed > 0).then(|| bucket.ready_at());
            let next = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = drain.cancelled(), if !draining => {
                    // Closing keeps what is queued receivable and refuses new alerts.
                    draining = true;
                    inbox.close();
                    continue;
                }
                _ = tokio::time::sleep_until(summary_at.unwrap_or_else(Instant::now)),
                    if summary_at.is_some() =>
                {
                    if !bucket.try_take(Instant::now()) {
                        continue;
                    }
                    Outbound::Suppressed {
                        count: std::mem::take(&mut suppressed),
                        at_ms: now_ms(),
                    }
                }
                received = inbox.recv() => match received {
                    None => break,
                    Some(message) => {
                        if bucket.try_take(Instant::now()) {
                            message
                        } else {
                            suppressed += 1;
                            self.counters
                                .dropped_rate_limited
                                .fetch_add(1, Ordering::Relaxed);
                            if suppressed == 1 {
                                tracing::warn!(
                                    channel = %self.channel(),
                                    max = self.config.rate_limit.max,
                                    per_ms = self.config.rate_limit.per.as_millis() as u64,
                                    "alert rate limit reached; suppressing until it frees"
                                );
                            }
                            continue;
                        }
                    }
                },
            };
            if !self.deliver_or_stop(&next, &stop).await {
                break;
            }
        }
        // The queue is closed: whatever was suppressed is reported now rather than never.
        if suppressed > 0 && !stop.is_cancelled() {
            let summary = Outbound::Suppressed {
                count: suppressed,
                at_ms: now_ms(),
            };
            self.deliver_or_stop(&summary, &stop).await;
        }
        inbox.close();
        let mut abandoned = 0;
        while inbox.try_recv().is_ok() {
            abandoned += 1;
        }
        if abandoned > 0 {
            self.counters.failed.fetch_add(abandoned, Ordering::Relaxed);
            tracing::warn!(
                channel = %self.channel(),
                abandoned,
                "alerts still queued at shutdown were not delivered"
            );
        }
    }

    /// Delivers, unless `stop` comes first (then the message counts as failed). False if
    /// stopped.
    async fn deliver_or_stop(&self, message: &Outbound, stop: &CancellationToken) -> bool {
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(channel = %self.channel(), "alert delivery cut off by shutdown");
                false
            }
            _ = self.deliver(message) => true,
        }
    }

    /// Posts the message, retrying connection errors, timeouts, 5xx, 429 and the services'
    /// own "too fast" codes with exponential backoff; counts the outcome.
    pub async fn deliver(&self, message: &Outbound) {
        let tries = self.config.retries + 1;
        let mut backoff = self.config.retry_backoff;
        for attempt in 1..=tries {
            match self.post(self.prepare(message)).await {
                Outcome::Delivered => {
                    self.counters.sent.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(channel = %self.channel(), attempt, "alert delivered");
                    return;
                }
                Outcome::Failed {
                    status,
                    error,
                    retry,
                    retry_after,
                } => {
                    if retry && attempt < tries {
                        let wait =
                            backoff.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER));
                        tracing::debug!(
                            channel = %self.channel(),
                            status,
                            attempt,
                            error = %error,
                            wait_ms = wait.as_millis() as u64,
                            "alert delivery failed; retrying"
                        );
                        tokio::time::sleep(wait).await;
                        backoff = backoff.saturating_mul(2);
                        continue;
                    }
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        channel = %self.channel(),
                        format = %self.config.format,
                        status,
                        attempts = attempt,
                        error = %error,
                        "alert not delivered"
                    );
                    return;
                }
            }
        }
    }

    fn prepare(&self, message: &Outbound) -> Prepared {
        let secret = self.config.secret.as_deref();
        match self.config.format {
            ChannelFormat::Webhook => webhook::prepare(&self.url, secret, message),
            ChannelFormat::DingTalk => dingtalk::prepare(&self.url, secret, message, now_ms()),
            ChannelFormat::Feishu => feishu::prepare(&self.url, secret, message, now_ms()),
            ChannelFormat::WeCom => wecom::prepare(&self.url, message),
            ChannelFormat::Slack => slack::prepare(&self.url, message),
        }
    }

    fn check(&self, body: &[u8]) -> ServiceAnswer {
        match self.config.format {
            ChannelFormat::DingTalk => dingtalk::check(body),
            ChannelFormat::Feishu => feishu::check(body),
            ChannelFormat::WeCom => wecom::check(body),
            ChannelFormat::Webhook | ChannelFormat::Slack => ServiceAnswer::Accepted,
        }
    }

    async fn post(&self, prepared: Prepared) -> Outcome {
        let mut request = self
            .client
            .post(prepared.url)
            .timeout(self.config.timeout)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/json; charset=utf-8",
            )
            .body(prepared.body);
        for (name, value) in prepared.headers {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => {
                return Outcome::Failed {
                    status: None,
                    error: describe(err, self.config.timeout),
                    retry: true,
                    retry_after: None,
                };
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response.bytes().await;
        if status.is_success() {
            // A 2xx whose body could not be read was taken by the service: retrying could post
            // the alert twice.
            let Ok(body) = body else {
                return Outcome::Delivered;
            };
            return match self.check(&body) {
                ServiceAnswer::Accepted => Outcome::Delivered,
                ServiceAnswer::Refused {
                    code,
                    message,
                    retry,
                } => Outcome::Failed {
                    status: Some(status.as_u16()),
                    error: format!("refused with code {code}: {message}"),
                    retry,
                    retry_after,
                },
            };
        }
        let snippet = body
            .map(|body| {
                let text = String::from_utf8_lossy(&body);
                super::truncate(text.trim(), BODY_SNIPPET_CHARS)
            })
            .unwrap_or_default();
        Outcome::Failed {
            status: Some(status.as_u16()),
            error: format!("http {status}: {snippet}"),
            retry: status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS,
            retry_after,
        }
    }
}

/// The error with its causes, and without the url: webhook urls carry tokens.
fn describe(err: reqwest::Error, timeout: Duration) -> String {
    if err.is_timeout() {
        return format!("no answer within {} ms", timeout.as_millis());
    }
    let err = err.without_url();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_passes_a_burst_then_one_per_interval() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(
            RateLimit {
                max: 3,
                per: Duration::from_secs(3),
            },
            start,
        );
        assert!(bucket.try_take(start));
        assert!(bucket.try_take(start));
        assert!(bucket.try_take(start));
        assert!(!bucket.try_take(start));
        assert_eq!(bucket.ready_at(), start + Duration::from_secs(1));
        assert!(!bucket.try_take(start + Duration::from_millis(999)));
        assert!(bucket.try_take(start + Duration::from_secs(1)));
        assert!(!bucket.try_take(start + Duration::from_secs(1)));
        // A long quiet spell refills the burst, but never beyond `max`.
        let later = start + Duration::from_secs(60);
        assert!(bucket.try_take(later));
        assert!(bucket.try_take(later));
        assert!(bucket.try_take(later));
        assert!(!bucket.try_take(later));
    }

    #[test]
    fn service_answers_are_read_from_their_code_field() {
        let check = |body: &str| {
            ServiceAnswer::from_code(body.as_bytes(), &["code", "StatusCode"], "msg", &[7])
        };
        assert_eq!(
            check(r#"{"code":0,"msg":"success"}"#),
            ServiceAnswer::Accepted
        );
        assert_eq!(check(r#"{"StatusCode":0}"#), ServiceAnswer::Accepted);
        assert_eq!(check("ok"), ServiceAnswer::Accepted);
        assert_eq!(check(r#"{"other":1}"#), ServiceAnswer::Accepted);
        assert_eq!(
            check(r#"{"code":19021,"msg":"sign match fail"}"#),
            ServiceAnswer::Refused {
                code: 19021,
                message: "sign match fail".into(),
                retry: false
            }
        );
        assert_eq!(
            check(r#"{"code":7}"#),
            ServiceAnswer::Refused {
                code: 7,
                message: String::new(),
                retry: true
            }
        );
    }
}
