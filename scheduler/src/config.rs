//! Configuration of the `ax-scheduler` binary: flags, then environment, then a TOML file, then
//! the embedded defaults (SQLite under `.ax/`, in-process guards).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ax_core::placement::Strategy;
use clap::Parser;
use serde::Deserialize;

use crate::SchedulerOptions;
use crate::auth::AuthMode;
use crate::connections::ConnectionLimits;
use crate::secrets::SecretKey;
use crate::tls::TlsFiles;

#[derive(Debug, Parser)]
#[command(name = "ax-scheduler", version, about = "The ax scheduler node")]
pub struct Args {
    /// A TOML file with any of the settings below (keys as the long flags, with underscores).
    #[arg(long, env = "AX_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address.
    #[arg(long, env = "AX_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Store url: sqlite://PATH (default sqlite://.ax/ax.db) or mysql://USER:PASS@HOST:PORT/DB.
    #[arg(long, env = "AX_STORE")]
    pub store: Option<String>,
    /// Redis url for start locks and dedup markers; in-process guards without it.
    #[arg(long, env = "AX_REDIS")]
    pub redis: Option<String>,
    /// Prefix of this cluster's Redis keys.
    #[arg(long, env = "AX_REDIS_NAMESPACE")]
    pub redis_namespace: Option<String>,
    /// This node's name in the cluster (default: hostname).
    #[arg(long, env = "AX_NODE_ID")]
    pub node_id: Option<String>,
    /// The address workers and clients reach this node at, for its lease (default: the listen
    /// address), e.g. http://sched-1.internal:7070.
    #[arg(long, env = "AX_ADVERTISE")]
    pub advertise: Option<String>,
    /// How long this node's lease lasts without a renewal, e.g. 10s; renewed every fifth of it.
    #[arg(long, env = "AX_NODE_LEASE", value_parser = parse_duration)]
    pub node_lease: Option<Duration>,
    /// How often this node compares its share of the workers with the other nodes' and, holding
    /// more than its share, asks one of its workers to move, e.g. 10s; 0 never asks.
    #[arg(long, env = "AX_SPREAD_INTERVAL", value_parser = parse_duration)]
    pub spread_interval: Option<Duration>,
    /// A difference between this machine's clock and the database's past this is logged as an
    /// error, e.g. 1s (the node goes by the database's clock either way).
    #[arg(long, env = "AX_MAX_CLOCK_OFFSET", value_parser = parse_duration)]
    pub max_clock_offset: Option<Duration>,
    /// Worker choice: least_running, round_robin or random.
    #[arg(long, env = "AX_STRATEGY")]
    pub strategy: Option<Strategy>,
    /// Expected worker heartbeat interval, e.g. 5s.
    #[arg(long, env = "AX_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// Expected task heartbeat interval, e.g. 30s.
    #[arg(long, env = "AX_TASK_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub task_heartbeat_interval: Option<Duration>,
    /// Missed worker heartbeats before a worker is dead.
    #[arg(long, env = "AX_DEAD_AFTER_MISSED_HEARTBEATS")]
    pub dead_after_missed_heartbeats: Option<u32>,
    /// How long past a task's timeout to wait for its worker's report before recording TIMEOUT
    /// and killing the attempt from here, e.g. 15s (more than the workers' --kill-grace).
    #[arg(long, env = "AX_TIMEOUT_GRACE", value_parser = parse_duration)]
    pub timeout_grace: Option<Duration>,
    /// How long the log writer waits to fill a batch, e.g. 20ms.
    #[arg(long, env = "AX_LOG_FLUSH_INTERVAL", value_parser = parse_duration)]
    pub log_flush_interval: Option<Duration>,
    /// The most runs one backfill may create.
    #[arg(long, env = "AX_MAX_BACKFILL_RUNS")]
    pub max_backfill_runs: Option<u32>,
    /// How long ended runs are kept when their workflow sets no `retention`, e.g. 90d; `forever`
    /// (the default) keeps them.
    #[arg(long, env = "AX_RETENTION", value_parser = parse_retention)]
    pub retention: Option<RetentionSetting>,
    /// How long audit rows are kept, e.g. 400d; `forever` keeps them. Default 365d.
    #[arg(long, env = "AX_AUDIT_RETENTION", value_parser = parse_retention)]
    pub audit_retention: Option<RetentionSetting>,
    /// How often the purger looks for runs past their retention, e.g. 10m (the default).
    #[arg(long, env = "AX_PURGE_INTERVAL", value_parser = parse_duration)]
    pub purge_interval: Option<Duration>,
    /// A pool's cluster-wide limit, NAME=N (repeat the flag, or AX_POOLS=etl=4,gpu=2); these
    /// override the file's `[pools]` table pool by pool.
    #[arg(long = "pool", env = "AX_POOLS", value_delimiter = ',', value_parser = parse_pool)]
    pub pools: Vec<(String, u32)>,
    /// Whether callers need a token: tokens or none (default: tokens, except on a loopback
    /// listen address).
    #[arg(long, env = "AX_AUTH")]
    pub auth: Option<AuthMode>,
    /// The node's TLS certificate chain (PEM); read again when it changes.
    #[arg(long, env = "AX_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "AX_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// A CA (PEM): workers must then present a certificate it signed that names their id.
    #[arg(long, env = "AX_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Listen on a non-loopback address without TLS or without authentication.
    #[arg(long, env = "AX_INSECURE")]
    pub insecure: bool,
    /// A file holding the key secrets are sealed with: 32 random bytes in base64 (every node
    /// needs the same one). AX_SECRET_KEY may hold the key itself instead.
    #[arg(long, env = "AX_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
    /// The ops listener, e.g. 0.0.0.0:7071: plaintext and unauthenticated, it serves only
    /// GET /metrics and the gRPC health service, for probes and Prometheus. Off without it.
    #[arg(long, env = "AX_OPS_LISTEN")]
    pub ops_listen: Option<SocketAddr>,
    /// Export traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (spans go to
    /// its /v1/traces). Off without it.
    #[arg(long, env = "AX_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// A URL (or host name) a proxy or DNS name serves this node at, e.g.
    /// https://ax.example.com (repeat the flag, or AX_PUBLIC_URL=a,b). Requests naming any
    /// other host than these, the node's own names, localhost or an IP address are refused.
    #[arg(long = "public-url", env = "AX_PUBLIC_URL", value_delimiter = ',')]
    pub public_urls: Vec<String>,
    /// The most connections open at once, on the port and the ops listener together (default
    /// 10000); lowered to what the open-file limit leaves. Past it, a new connection closes the
    /// one quiet the longest (never one with a request open).
    #[arg(long, env = "AX_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// How long a new connection has to send its first request, its TLS handshake included,
    /// e.g. 10s (the default).
    #[arg(long, env = "AX_FIRST_REQUEST_TIMEOUT", value_parser = parse_duration)]
    pub first_request_timeout: Option<Duration>,
    /// How long a connection with no request open (no worker stream, no event stream, no call)
    /// stays open, e.g. 5m (the default).
    #[arg(long, env = "AX_IDLE_CONNECTION_TIMEOUT", value_parser = parse_duration)]
    pub idle_connection_timeout: Option<Duration>,
    /// How often HTTP/2 connections are pinged, e.g. 10s (the default).
    #[arg(long, env = "AX_KEEPALIVE_INTERVAL", value_parser = parse_duration)]
    pub keepalive_interval: Option<Duration>,
    /// A ping unanswered for this long closes its connection, e.g. 20s (the default).
    #[arg(long, env = "AX_KEEPALIVE_TIMEOUT", value_parser = parse_duration)]
    pub keepalive_timeout: Option<Duration>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What the binary does besides serving.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Tokens made on the store directly, with the node's store settings: the first admin
    /// token of a new cluster (later ones come from `axctl token create`).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Creates a token and prints it once (only its hash is stored).
    Create {
        #[arg(long)]
        name: String,
        /// viewer, operator, admin or worker.
        #[arg(long)]
        role: ax_core::access::Role,
        /// Scope the token to this app's workflows; a worker token may name several (repeat
        /// the flag): it is sent only their tasks.
        #[arg(long)]
        app: Vec<String>,
        /// Worker tokens (required): a worker id the token may register, a prefix such as
        /// `etl-*`, or `*` for any id (anyone holding the token may then take any worker's
        /// place); repeatable.
        #[arg(long = "worker-id")]
        worker_id: Vec<String>,
        /// Worker tokens: a label the worker may claim, as key=value; repeatable (default:
        /// any labels).
        #[arg(long)]
        label: Vec<String>,
        /// How long it lasts, e.g. 90d, 12h (default: until revoked).
        #[arg(long, value_parser = ax_core::access::parse_lifetime_ms)]
        expires: Option<i64>,
    },
}

/// The same settings as they appear in the TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    store: Option<String>,
    redis: Option<String>,
    redis_namespace: Option<String>,
    node_id: Option<String>,
    advertise: Option<String>,
    node_lease: Option<String>,
    spread_interval: Option<String>,
    max_clock_offset: Option<String>,
    strategy: Option<String>,
    heartbeat_interval: Option<String>,
    task_heartbeat_interval: Option<String>,
    dead_after_missed_heartbeats: Option<u32>,
    timeout_grace: Option<String>,
    log_flush_interval: Option<String>,
    max_backfill_runs: Option<u32>,
    retention: Option<String>,
    audit_retention: Option<String>,
    purge_interval: Option<String>,
    alerts: Option<crate::alerts::AlertsConfig>,
    pools: Option<BTreeMap<String, u32>>,
    auth: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    insecure: Option<bool>,
    secret_key_file: Option<PathBuf>,
    ops_listen: Option<SocketAddr>,
    otlp_endpoint: Option<String>,
    public_urls: Option<Vec<String>>,
    max_connections: Option<u32>,
    first_request_timeout: Option<String>,
    idle_connection_timeout: Option<String>,
    keepalive_interval: Option<String>,
    keepalive_timeout: Option<String>,
}

/// `NAME=N`: a pool and its limit.
pub fn parse_pool(text: &str) -> Result<(String, u32), String> {
    let (name, limit) = text
        .split_once('=')
        .ok_or_else(|| format!("pool limit {text:?}: expected NAME=LIMIT, e.g. etl=4"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("pool limit {text:?}: the pool name is empty"));
    }
    let limit = limit.trim().parse::<u32>().map_err(|_| {
        format!("pool limit {text:?}: the limit must be a whole number, e.g. etl=4")
    })?;
    Ok((name.to_string(), limit))
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    ax_core::duration::parse(text).map_err(|err| err.to_string())
}

/// The cluster's default retention as set: a duration, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionSetting {
    Forever,
    Keep(Duration),
}

/// `90d`, `12h`, … (with a unit, more than zero) or `forever`, as a workflow's `retention`.
pub fn parse_retention(text: &str) -> Result<RetentionSetting, String> {
    match ax_core::spec::parse_retention(text).map_err(|err| format!("retention: {err}"))? {
        ax_core::spec::Retention::Forever => Ok(RetentionSetting::Forever),
        ax_core::spec::Retention::Keep { ms } => {
            Ok(RetentionSetting::Keep(Duration::from_millis(ms)))
        }
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).map_err(|err| {
        anyhow::anyhow!(
            "config file {}: {}",
            path.display(),
            toml_error(&text, &err)
        )
    })
}

/// What is wrong with a TOML document and where, without quoting it: `--config` may name the
/// wrong file (a key, a token), and the toml crate's own message prints the line it failed on.
/// A position reads `line L, column C` (both from 1, the column in characters); the message
/// is the parser's (what it expected, from TOML's grammar or the file's keys) with anything it
/// quotes from the document left out: an unknown key or value is named by its position.
fn toml_error(text: &str, err: &toml::de::Error) -> String {
    let what = toml_message(err.message());
    match err.span() {
        Some(span) => {
            let at = span.start.min(text.len());
            let before = &text.as_bytes()[..at];
            let line = before.iter().filter(|&&byte| byte == b'\n').count() + 1;
            let line_start = before
                .iter()
                .rposition(|&byte| byte == b'\n')
                .map_or(0, |newline| newline + 1);
            // `at` may fall inside a character of a file that is not text; count what decodes.
            let column = String::from_utf8_lossy(&before[line_start..])
                .chars()
                .count()
                + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}

/// The parser's message without what serde and toml quote from the document: the key of
/// `unknown field`, the value of `unknown variant`, `invalid type` and `invalid value`, the key
/// of `duplicate key`. Its expectations (after ", expected ") come from TOML's grammar or the
/// schema and stay; so do TOML's syntax messages (its grammar's words) and the messages of ax's
/// own checks (which name a setting's key and value).
fn toml_message(message: &str) -> String {
    let message = message.trim();
    let (what, expected) = match message.find(", expected ") {
        Some(at) => message.split_at(at),
        None => (message, ""),
    };
    let what = if what.starts_with("unknown field") {
        "unknown key".to_string()
    } else if what.starts_with("unknown variant") {
        "unknown value".to_string()
    } else if what.starts_with("invalid type")
        || what.starts_with("invalid value")
        || what.starts_with("duplicate key")
    {
        without_quoted(what)
    } else {
        what.to_string()
    };
    format!("{what}{expected}")
}

/// `text` up to its first quoted part (`` `…` `` or `\"…\"`): `invalid type: string \"…\"` reads
/// `invalid type: string`.
fn without_quoted(text: &str) -> String {
    match text.find(['`', '"']) {
        Some(at) => text[..at].trim_end().trim_end_matches(':').to_string(),
        None => text.to_string(),
    }
}

fn file_duration(
    value: Option<String>,
    key: &str,
    path: &Path,
) -> anyhow::Result<Option<Duration>> {
    value
        .map(|text| parse_duration(&text))
        .transpose()
        .map_err(|err| anyhow::anyhow!("config file {}: {key}: {err}", path.display()))
}

impl Args {
    pub fn into_options(self) -> anyhow::Result<SchedulerOptions> {
        let defaults = SchedulerOptions::default();
        let (file, path) = match &self.config {
            Some(path) => (read_file(path)?, path.clone()),
            None => (FileConfig::default(), PathBuf::new()),
        };
        let file_strategy = file
            .strategy
            .map(|text| text.parse::<Strategy>())
            .transpose()
            .map_err(|err| anyhow::anyhow!("config file {}: strategy: {err}", path.display()))?;
        let listen = self.listen.or(file.listen).unwrap_or(defaults.listen);
        let file_retention = file
            .retention
            .as_deref()
            .map(parse_retention)
            .transpose()
            .map_err(|err| anyhow::anyhow!("config file {}: {err}", path.display()))?;
        let file_audit_retention = file
            .audit_retention
            .as_deref()
            .map(parse_retention)
            .transpose()
            .map_err(|err| {
                anyhow::anyhow!("config file {}: audit_retention: {err}", path.display())
            })?;
        let file_auth = file
            .auth
            .map(|text| text.parse::<AuthMode>())
            .transpose()
            .map_err(|err| anyhow::anyhow!("config file {}: {err}", path.display()))?;
        let auth = self
            .auth
            .or(file_auth)
            .unwrap_or(if listen.ip().is_loopback() {
                AuthMode::Off
            } else {
                AuthMode::Tokens
            });
        let tls = match (
            self.tls_cert.or(file.tls_cert),
            self.tls_key.or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.tls_client_ca.or(file.tls_client_ca),
            }),
            (None, None) => {
                if self.tls_client_ca.is_some() || file.tls_client_ca.is_some() {
                    bail!("--tls-client-ca needs --tls-cert and --tls-key");
                }
                None
            }
            (Some(_), None) => bail!("--tls-cert needs --tls-key (the certificate's private key)"),
            (None, Some(_)) => bail!("--tls-key needs --tls-cert (the certificate chain)"),
        };
        // The key itself is read from the environment only: a flag would show it in `ps`.
        let secret_key = match (
            self.secret_key_file.or(file.secret_key_file),
            std::env::var("AX_SECRET_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty()),
        ) {
            (Some(path), _) => Some(SecretKey::from_file(&path)?),
            (None, Some(text)) => Some(SecretKey::from_base64(&text).context("AX_SECRET_KEY")?),
            (None, None) => None,
        };
        let options = SchedulerOptions {
            listen,
            secret_key,
            auth,
            auth_failures_per_address: defaults.auth_failures_per_address,
            tls,
            insecure: self.insecure || file.insecure.unwrap_or(false),
            store_url: self.store.or(file.store).unwrap_or(defaults.store_url),
            redis_url: self.redis.or(file.redis).filter(|url| !url.is_empty()),
            redis_namespace: self
                .redis_namespace
                .or(file.redis_namespace)
                .unwrap_or(defaults.redis_namespace),
            node_id: self
                .node_id
                .or(file.node_id)
                .unwrap_or_else(|| ax_proto::hostname().unwrap_or(defaults.node_id)),
            advertise: self.advertise.or(file.advertise),
            node_lease: self
                .node_lease
                .or(file_duration(file.node_lease, "node_lease", &path)?)
                .unwrap_or(defaults.node_lease),
            spread_interval: match self.spread_interval.or(file_duration(
                file.spread_interval,
                "spread_interval",
                &path,
            )?) {
                Some(interval) if interval.is_zero() => None,
                Some(interval) => Some(interval),
                None => defaults.spread_interval,
            },
            max_clock_offset: self
                .max_clock_offset
                .or(file_duration(
                    file.max_clock_offset,
                    "max_clock_offset",
                    &path,
                )?)
                .unwrap_or(defaults.max_clock_offset),
            strategy: self.strategy.or(file_strategy).unwrap_or(defaults.strategy),
            heartbeat_interval: self
                .heartbeat_interval
                .or(file_duration(
                    file.heartbeat_interval,
                    "heartbeat_interval",
                    &path,
                )?)
                .unwrap_or(defaults.heartbeat_interval),
            task_heartbeat_interval: self
                .task_heartbeat_interval
                .or(file_duration(
                    file.task_heartbeat_interval,
                    "task_heartbeat_interval",
                    &path,
                )?)
                .unwrap_or(defaults.task_heartbeat_interval),
            dead_after_missed_heartbeats: self
                .dead_after_missed_heartbeats
                .or(file.dead_after_missed_heartbeats)
                .unwrap_or(defaults.dead_after_missed_heartbeats),
            timeout_grace: self
                .timeout_grace
                .or(file_duration(file.timeout_grace, "timeout_grace", &path)?)
                .unwrap_or(defaults.timeout_grace),
            log_flush_interval: self
                .log_flush_interval
                .or(file_duration(
                    file.log_flush_interval,
                    "log_flush_interval",
                    &path,
                )?)
                .unwrap_or(defaults.log_flush_interval),
            max_backfill_runs: self
                .max_backfill_runs
                .or(file.max_backfill_runs)
                .unwrap_or(defaults.max_backfill_runs),
            retention: match self.retention.or(file_retention) {
                Some(RetentionSetting::Forever) => None,
                Some(RetentionSetting::Keep(keep)) => Some(keep),
                None => defaults.retention,
            },
            audit_retention: match self.audit_retention.or(file_audit_retention) {
                Some(RetentionSetting::Forever) => None,
                Some(RetentionSetting::Keep(keep)) => Some(keep),
                None => defaults.audit_retention,
            },
            purge_interval: self
                .purge_interval
                .or(file_duration(file.purge_interval, "purge_interval", &path)?)
                .unwrap_or(defaults.purge_interval),
            alerts: file
                .alerts
                .map(|alerts| alerts.channels)
                .unwrap_or_default(),
            pools: {
                let mut pools = file.pools.unwrap_or_default();
                pools.extend(self.pools);
                pools
            },
            ops_listen: self.ops_listen.or(file.ops_listen),
            otlp_endpoint: self
                .otlp_endpoint
                .or(file.otlp_endpoint)
                .filter(|endpoint| !endpoint.is_empty()),
            public_urls: if self.public_urls.is_empty() {
                file.public_urls.unwrap_or_default()
            } else {
                self.public_urls
            },
            connections: ConnectionLimits {
                max_connections: self
                    .max_connections
                    .or(file.max_connections)
                    .unwrap_or(defaults.connections.max_connections),
                first_request_timeout: self
                    .first_request_timeout
                    .or(file_duration(
                        file.first_request_timeout,
                        "first_request_timeout",
                        &path,
                    )?)
                    .unwrap_or(defaults.connections.first_request_timeout),
                idle_timeout: self
                    .idle_connection_timeout
                    .or(file_duration(
                        file.idle_connection_timeout,
                        "idle_connection_timeout",
                        &path,
                    )?)
                    .unwrap_or(defaults.connections.idle_timeout),
                keepalive_interval: self
                    .keepalive_interval
                    .or(file_duration(
                        file.keepalive_interval,
                        "keepalive_interval",
                        &path,
                    )?)
                    .unwrap_or(defaults.connections.keepalive_interval),
                keepalive_timeout: self
                    .keepalive_timeout
                    .or(file_duration(
                        file.keepalive_timeout,
                        "keepalive_timeout",
                        &path,
                    )?)
                    .unwrap_or(defaults.connections.keepalive_timeout),
            },
        };
        ax_core::cross_site::NodeNames::new([], &options.public_urls)
            .map_err(|why| anyhow::anyhow!("--public-url: {why}"))?;
        for channel in &options.alerts {
            channel
                .validate()
                .map_err(|err| anyhow::anyhow!("config file {}: {err}", path.display()))?;
        }
        if let Some(endpoint) = &options.otlp_endpoint {
            crate::telemetry::traces_url(endpoint)?;
        }
        if options.heartbeat_interval.is_zero() || options.task_heartbeat_interval.is_zero() {
            bail!("heartbeat intervals must be greater than zero");
        }
        if options.node_lease < Duration::from_secs(1) {
            // Renewed every fifth of it: shorter leases renew faster than a busy store answers.
            bail!("node_lease must be at least 1s");
        }
        if options.purge_interval < Duration::from_millis(100) {
            bail!("purge_interval must be at least 100ms");
        }
        let limits = &options.connections;
        if limits.max_connections == 0 {
            bail!("max_connections must be at least 1");
        }
        for (key, value) in [
            ("first_request_timeout", limits.first_request_timeout),
            ("idle_connection_timeout", limits.idle_timeout),
            ("keepalive_interval", limits.keepalive_interval),
            ("keepalive_timeout", limits.keepalive_timeout),
        ] {
            if value < Duration::from_millis(100) {
                bail!("{key} must be at least 100ms");
            }
        }
        if options.dead_after_missed_heartbeats < 2 {
            // A threshold equal to one interval kills healthy workers on any jitter.
            bail!("dead_after_missed_heartbeats must be at least 2");
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(
            &path,
            "store = \"mysql://root@127.0.0.1/ax\"\nstrategy = \"random\"\nheartbeat_interval = \"2s\"\n",
        )
        .unwrap();
        let args = Args::parse_from([
            "ax-scheduler",
            "--config",
            path.to_str().unwrap(),
            "--strategy",
            "round_robin",
        ]);
        let options = args.into_options().unwrap();
        assert_eq!(options.store_url, "mysql://root@127.0.0.1/ax");
        assert_eq!(options.strategy, Strategy::RoundRobin);
        assert_eq!(options.heartbeat_interval, Duration::from_secs(2));
        assert_eq!(options.task_heartbeat_interval, Duration::from_secs(30));
    }

    #[test]
    fn pool_limits_come_from_the_file_and_flags_override_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "[pools]\netl = 4\ngpu = 2\n").unwrap();
        let options = Args::parse_from([
            "ax-scheduler",
            "--config",
            path.to_str().unwrap(),
            "--pool",
            "gpu=1",
            "--pool",
            "io=8",
        ])
        .into_options()
        .unwrap();
        let want: BTreeMap<String, u32> = [("etl", 4), ("gpu", 1), ("io", 8)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(options.pools, want);
        let err = Args::try_parse_from(["ax-scheduler", "--pool", "etl"]).unwrap_err();
        assert!(err.to_string().contains("expected NAME=LIMIT"), "{err}");
        let err = Args::try_parse_from(["ax-scheduler", "--pool", "etl=many"]).unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
        std::fs::write(&path, "[pools]\netl = \"four\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("ax.toml: line 2, column 7: invalid type: string, expected u32"),
            "{text}"
        );
    }

    #[test]
    fn the_ops_listener_comes_from_flags_or_the_file_and_is_off_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "ops_listen = \"0.0.0.0:7071\"\n").unwrap();
        let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
        let from_file = Args::parse_from(args).into_options().unwrap();
        assert_eq!(from_file.ops_listen, Some(([0, 0, 0, 0], 7071).into()));
        let flag = Args::parse_from([&args[..], &["--ops-listen", "127.0.0.1:9100"]].concat())
            .into_options()
            .unwrap();
        assert_eq!(flag.ops_listen, Some(([127, 0, 0, 1], 9100).into()));
        let off = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
        assert_eq!(off.ops_listen, None);
        let err = Args::try_parse_from(["ax-scheduler", "--ops-listen", "7071"]).unwrap_err();
        assert!(err.to_string().contains("--ops-listen"), "{err}");
    }

    #[test]
    fn retention_comes_from_flags_or_the_file_and_keeps_runs_forever_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "retention = \"90d\"\npurge_interval = \"1m\"\n").unwrap();
        let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
        let from_file = Args::parse_from(args).into_options().unwrap();
        assert_eq!(from_file.retention, Some(Duration::from_secs(90 * 86_400)));
        assert_eq!(from_file.purge_interval, Duration::from_secs(60));
        let flag = Args::parse_from([&args[..], &["--retention", "forever"]].concat())
            .into_options()
            .unwrap();
        assert_eq!(flag.retention, None);
        let defaults = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
        assert_eq!(
            (defaults.retention, defaults.purge_interval),
            (None, Duration::from_secs(600))
        );
        for (bad, says) in [
            ("90", "has no unit"),
            ("0d", "more than zero"),
            ("a while", "invalid duration"),
        ] {
            let err = Args::try_parse_from(["ax-scheduler", "--retention", bad]).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
        std::fs::write(&path, "retention = \"90\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("ax.toml") && text.contains("has no unit"),
            "{text}"
        );
    }

    #[test]
    fn connection_limits_come_from_flags_or_the_file_and_have_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(
            &path,
            "max_connections = 500\nfirst_request_timeout = \"3s\"\nidle_connection_timeout = \"1m\"\nkeepalive_interval = \"5s\"\nkeepalive_timeout = \"7s\"\n",
        )
        .unwrap();
        let args = ["ax-scheduler", "--config", path.to_str().unwrap()];
        let from_file = Args::parse_from(args).into_options().unwrap().connections;
        assert_eq!(
            from_file,
            ConnectionLimits {
                max_connections: 500,
                first_request_timeout: Duration::from_secs(3),
                idle_timeout: Duration::from_secs(60),
                keepalive_interval: Duration::from_secs(5),
                keepalive_timeout: Duration::from_secs(7),
            }
        );
        let flags = Args::parse_from(
            [
                &args[..],
                &[
                    "--max-connections",
                    "64",
                    "--first-request-timeout",
                    "1s",
                    "--idle-connection-timeout",
                    "2s",
                ],
            ]
            .concat(),
        )
        .into_options()
        .unwrap()
        .connections;
        assert_eq!(
            (
                flags.max_connections,
                flags.first_request_timeout,
                flags.idle_timeout,
                flags.keepalive_timeout
            ),
            (
                64,
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(7)
            )
        );
        let defaults = Args::parse_from(["ax-scheduler"])
            .into_options()
            .unwrap()
            .connections;
        assert_eq!(defaults, ConnectionLimits::default());
        assert_eq!(defaults.max_connections, 10_000);
        assert_eq!(defaults.first_request_timeout, Duration::from_secs(10));
        for (flag, value, says) in [
            (
                "--max-connections",
                "0",
                "max_connections must be at least 1",
            ),
            (
                "--first-request-timeout",
                "0s",
                "first_request_timeout must be at least 100ms",
            ),
            (
                "--idle-connection-timeout",
                "10ms",
                "idle_connection_timeout must be at least 100ms",
            ),
        ] {
            let err = Args::parse_from(["ax-scheduler", flag, value])
                .into_options()
                .unwrap_err();
            assert!(err.to_string().contains(says), "{flag} {value}: {err}");
        }
        std::fs::write(&path, "idle_connection_timeout = \"soon\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        assert!(err.to_string().contains("idle_connection_timeout"), "{err}");
    }

    #[test]
    fn a_bad_file_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "heartbeat_interval = \"soon\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        assert!(err.to_string().contains("heartbeat_interval"), "{err}");
        std::fs::write(&path, "listen = \"127.0.0.1:7070\"\ncolour = \"blue\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("ax.toml: line 2, column 1: unknown key, expected one of `listen`"),
            "{text}"
        );
    }

    /// `--config` given a file that is not TOML (a key, a token) says what is wrong and where,
    /// never what the file holds.
    #[test]
    fn a_file_that_is_not_toml_is_never_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.key");
        let secrets = [
            "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nmore\n",
            "axt_5hG7kQ2mN9pR4sT8vW1xY3zA6bC0dE=\n",
            "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n",
            "password: hunter2-very-secret\n",
            "[section\nsecret = 'sk_prod_4eC39HqLyjWDarjtT1zdp7dc\n",
            "sk_prod_4eC39HqLyjWDarjtT1zdp7dc = \"a\"\n",
            "listen = \"sk_prod_4eC39HqLyjWDarjtT1zdp7dc\"\n",
            "\u{feff}é sëcrét-ünïcødé-1234\n",
        ];
        for secret in secrets {
            std::fs::write(&path, secret).unwrap();
            let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
                .into_options()
                .unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.starts_with(&format!("config file {}: line ", path.display())),
                "{text}"
            );
            assert!(text.contains(", column "), "{text}");
            let said = &text[format!("config file {}: ", path.display()).len()..];
            let chars: Vec<char> = secret.chars().filter(|c| !c.is_whitespace()).collect();
            for piece in chars.windows(4) {
                let piece: String = piece.iter().collect();
                assert!(
                    !said.contains(&piece),
                    "{said:?} quotes {piece:?} of {secret:?}"
                );
            }
        }
        std::fs::write(&path, secrets[0]).unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            format!(
                "config file {}: line 1, column 22: key with no value, expected `=`",
                path.display()
            )
        );
    }

    #[test]
    fn the_lease_settings_come_from_flags_or_the_file_and_a_short_lease_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(
            &path,
            "advertise = \"http://sched-1:7070\"\nnode_lease = \"6s\"\nmax_clock_offset = \"250ms\"\n",
        )
        .unwrap();
        let options = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap();
        assert_eq!(options.advertise.as_deref(), Some("http://sched-1:7070"));
        assert_eq!(options.node_lease, Duration::from_secs(6));
        assert_eq!(options.max_clock_offset, Duration::from_millis(250));
        let defaults = Args::parse_from(["ax-scheduler"]).into_options().unwrap();
        assert_eq!(defaults.node_lease, Duration::from_secs(10));
        assert_eq!(defaults.advertise, None);
        assert_eq!(defaults.spread_interval, Some(Duration::from_secs(10)));
        let err = Args::parse_from(["ax-scheduler", "--node-lease", "500ms"])
            .into_options()
            .unwrap_err();
        assert!(
            err.to_string().contains("node_lease must be at least 1s"),
            "{err}"
        );
    }

    #[test]
    fn the_spread_interval_comes_from_flags_or_the_file_and_zero_turns_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "spread_interval = \"30s\"\n").unwrap();
        let from_file = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap();
        assert_eq!(from_file.spread_interval, Some(Duration::from_secs(30)));
        let off = Args::parse_from([
            "ax-scheduler",
            "--config",
            path.to_str().unwrap(),
            "--spread-interval",
            "0",
        ])
        .into_options()
        .unwrap();
        assert_eq!(off.spread_interval, None);
    }

    #[test]
    fn auth_defaults_to_tokens_off_loopback_and_tls_files_come_in_pairs() {
        let on = |args: &[&str]| {
            let mut all = vec!["ax-scheduler"];
            all.extend_from_slice(args);
            Args::parse_from(all).into_options()
        };
        assert_eq!(on(&[]).unwrap().auth, AuthMode::Off);
        assert_eq!(
            on(&["--listen", "0.0.0.0:7070"]).unwrap().auth,
            AuthMode::Tokens
        );
        assert_eq!(
            on(&["--listen", "127.0.0.1:7070", "--auth", "tokens"])
                .unwrap()
                .auth,
            AuthMode::Tokens
        );
        let err = on(&["--tls-cert", "a.pem"]).unwrap_err().to_string();
        assert!(err.contains("--tls-cert needs --tls-key"), "{err}");
        let err = on(&["--tls-client-ca", "ca.pem"]).unwrap_err().to_string();
        assert!(err.contains("--tls-client-ca needs --tls-cert"), "{err}");
        let tls = on(&["--tls-cert", "a.pem", "--tls-key", "a.key"])
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(tls.cert, PathBuf::from("a.pem"));
        assert_eq!(tls.client_ca, None);
        let err = Args::try_parse_from(["ax-scheduler", "--auth", "maybe"]).unwrap_err();
        assert!(err.to_string().contains("expected tokens or none"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("secret.key");
        std::fs::write(&key, "c2hvcnQ=\n").unwrap();
        let err = on(&["--secret-key-file", key.to_str().unwrap()]).unwrap_err();
        assert!(
            format!("{err:#}").contains("5 bytes; it must be 32"),
            "{err:#}"
        );
    }
}
