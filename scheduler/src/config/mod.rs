//! The `ax-scheduler` binary's settings. Each is declared once, in [`Settings`]: its flag, its
//! environment variable, its key in the TOML file (the field's name), its type and its help.
//! Every source fills the same struct, a layer, and figment merges the layers: defaults < file
//! < environment < flags, where a layer's unset values (`None`, an empty list, `false`) leave
//! the layers below them alone and a `[pools]` table merges pool by pool. [`Args::into_options`]
//! turns the merged settings into the library's [`SchedulerOptions`], whose `Default` holds the
//! defaults.
//!
//! A bad value names its setting and where it came from: clap names the flag, the file gives
//! the line and column, and a value out of range names the flag, the environment variable or
//! the file's line and column that set it. No error quotes the file: `--config` may name the
//! wrong file (a key, a token).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ax_core::placement::Strategy;
use ax_core::spec::Retention;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use figment::Figment;
use serde::{Deserialize, Serialize};

use crate::SchedulerOptions;
use crate::alerts::AlertsConfig;
use crate::auth::AuthMode;
use crate::connections::ConnectionLimits;
use crate::secrets::SecretKey;
use crate::tls::TlsFiles;

mod file;
mod layers;

use file::SettingsFile;
use layers::{Layer, Source, as_text, name_the_variable, origin, pool_table, read};

/// The command line as clap reads it: flags, each falling back on its environment variable.
#[derive(Debug, Parser)]
#[command(name = "ax-scheduler", version, about = "The ax scheduler node")]
struct Cli {
    /// A TOML file with any of the settings below (keys as the long flags, with underscores).
    #[arg(long, env = "AX_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Option<Command>,
}

/// The command line and the environment, as two layers of settings.
#[derive(Debug)]
pub struct Args {
    pub config: Option<PathBuf>,
    environment: Settings,
    flags: Settings,
    pub command: Option<Command>,
}

/// Every setting of a node but the secret key itself (`AX_SECRET_KEY`, read from the
/// environment alone: a flag would show it in `ps`). A layer: what one source sets.
#[derive(Debug, Default, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
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
    #[arg(long, env = "AX_NODE_LEASE", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub node_lease: Option<Duration>,
    /// How often this node compares its share of the workers with the other nodes' and, holding
    /// more than its share, asks one of its workers to move, e.g. 10s; 0 never asks.
    #[arg(long, env = "AX_SPREAD_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub spread_interval: Option<Duration>,
    /// A difference between this machine's clock and the database's past this is logged as an
    /// error, e.g. 1s (the node goes by the database's clock either way).
    #[arg(long, env = "AX_MAX_CLOCK_OFFSET", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub max_clock_offset: Option<Duration>,
    /// Worker choice: least_running, round_robin or random.
    #[arg(long, env = "AX_STRATEGY", value_parser = read::<Strategy>)]
    #[serde(with = "as_text")]
    pub strategy: Option<Strategy>,
    /// Expected worker heartbeat interval, e.g. 5s.
    #[arg(long, env = "AX_HEARTBEAT_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub heartbeat_interval: Option<Duration>,
    /// Expected task heartbeat interval, e.g. 30s.
    #[arg(long, env = "AX_TASK_HEARTBEAT_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub task_heartbeat_interval: Option<Duration>,
    /// Missed worker heartbeats before a worker is dead.
    #[arg(long, env = "AX_DEAD_AFTER_MISSED_HEARTBEATS")]
    pub dead_after_missed_heartbeats: Option<u32>,
    /// How long past a task's timeout to wait for its worker's report before recording TIMEOUT
    /// and killing the attempt from here, e.g. 15s (more than the workers' --kill-grace).
    #[arg(long, env = "AX_TIMEOUT_GRACE", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub timeout_grace: Option<Duration>,
    /// How long the log writer waits to fill a batch, e.g. 20ms.
    #[arg(long, env = "AX_LOG_FLUSH_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub log_flush_interval: Option<Duration>,
    /// The most runs one backfill may create.
    #[arg(long, env = "AX_MAX_BACKFILL_RUNS")]
    pub max_backfill_runs: Option<u32>,
    /// The most task instances waiting to start in the whole cluster: at it, API triggers and
    /// backfills are refused (RESOURCE_EXHAUSTED, HTTP 429) with a hint of when to try again;
    /// cron and dependency fires still go in. 0 for no bound (default 10000).
    #[arg(long, env = "AX_MAX_WAITING")]
    pub max_waiting: Option<u64>,
    /// The same bound for the workflows of one app (those without an app count as one app).
    /// 0 for no bound (default 5000).
    #[arg(long, env = "AX_MAX_WAITING_PER_APP")]
    pub max_waiting_per_app: Option<u64>,
    /// How long ended runs are kept when their workflow sets no `retention`, e.g. 90d; `forever`
    /// (the default) keeps them.
    #[arg(long, env = "AX_RETENTION", value_parser = read::<Retention>)]
    #[serde(with = "as_text")]
    pub retention: Option<Retention>,
    /// How long audit rows are kept, e.g. 400d; `forever` keeps them. Default 365d.
    #[arg(long, env = "AX_AUDIT_RETENTION", value_parser = read::<Retention>)]
    #[serde(with = "as_text")]
    pub audit_retention: Option<Retention>,
    /// How often the purger looks for runs past their retention, e.g. 10m (the default).
    #[arg(long, env = "AX_PURGE_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub purge_interval: Option<Duration>,
    /// Where failures are announced: the file's `[[alerts.channels]]` tables (file only).
    #[arg(skip)]
    #[serde(skip_serializing)]
    pub alerts: Option<AlertsConfig>,
    /// A pool's cluster-wide limit, NAME=N (repeat the flag, or AX_POOLS=etl=4,gpu=2); these
    /// override the file's `[pools]` table pool by pool.
    #[arg(long = "pool", env = "AX_POOLS", value_delimiter = ',', value_parser = parse_pool)]
    #[serde(with = "pool_table")]
    pub pools: Vec<(String, u32)>,
    /// Whether callers need a token: tokens or none (default: tokens, except on a loopback
    /// listen address).
    #[arg(long, env = "AX_AUTH", value_parser = read::<AuthMode>)]
    #[serde(with = "as_text")]
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
    #[arg(long, env = "AX_FIRST_REQUEST_TIMEOUT", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub first_request_timeout: Option<Duration>,
    /// How long a connection with no request open (no worker stream, no event stream, no call)
    /// stays open, e.g. 5m (the default).
    #[arg(long, env = "AX_IDLE_CONNECTION_TIMEOUT", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub idle_connection_timeout: Option<Duration>,
    /// How often HTTP/2 connections are pinged, e.g. 10s (the default).
    #[arg(long, env = "AX_KEEPALIVE_INTERVAL", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub keepalive_interval: Option<Duration>,
    /// A ping unanswered for this long closes its connection, e.g. 20s (the default).
    #[arg(long, env = "AX_KEEPALIVE_TIMEOUT", value_parser = read::<Duration>)]
    #[serde(with = "as_text")]
    pub keepalive_timeout: Option<Duration>,
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

impl Args {
    /// Reads the process's command line and environment; prints the error and exits on a bad one.
    pub fn parse() -> Args {
        Args::try_parse_from(std::env::args_os()).unwrap_or_else(|err| err.exit())
    }

    /// [`Args::try_parse_from`], exiting on a bad command line.
    pub fn parse_from<I, T>(argv: I) -> Args
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Args::try_parse_from(argv).unwrap_or_else(|err| err.exit())
    }

    /// Reads `argv` and the process's environment, keeping each setting's source.
    pub fn try_parse_from<I, T>(argv: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
        let matches = Cli::command()
            .try_get_matches_from(&argv)
            .map_err(|err| name_the_variable(err, &argv))?;
        let cli = Cli::from_arg_matches(&matches)?;
        let layer = |source: ValueSource| {
            let mut only = matches.clone();
            let mut other_sources_flags = Vec::new();
            for id in matches.ids() {
                let from = matches.value_source(id.as_str());
                let given = matches!(
                    from,
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                );
                if given && from != Some(source) {
                    // A flag without a value (`--insecure`) must stay in the matches for
                    // clap to read it; it is unset after the read instead.
                    if is_switch(id.as_str()) {
                        other_sources_flags.push(id.as_str().to_owned());
                    } else {
                        only.try_clear_id(id.as_str())
                            .expect("an id of these matches");
                    }
                }
            }
            let mut settings = Settings::from_arg_matches(&only)?;
            for id in &other_sources_flags {
                settings.unset_switch(id);
            }
            Ok::<_, clap::Error>(settings)
        };
        Ok(Args {
            config: cli.config,
            environment: layer(ValueSource::EnvVariable)?,
            flags: layer(ValueSource::CommandLine)?,
            command: cli.command,
        })
    }

    pub fn into_options(self) -> anyhow::Result<SchedulerOptions> {
        let mut file = match &self.config {
            Some(path) => SettingsFile::read(path)?,
            None => SettingsFile::default(),
        };
        let alerts = file.settings.alerts.take();
        let layers = Figment::new()
            .merge(Layer {
                source: Source::File,
                settings: &file.settings,
            })
            .merge(Layer {
                source: Source::Environment,
                settings: &self.environment,
            })
            .merge(Layer {
                source: Source::Flags,
                settings: &self.flags,
            });
        let settings: Settings = layers.extract().context("merging the settings")?;
        let origin = |key: &str| origin(&layers, &file, key);
        settings.into_options(alerts, &file.path, origin)
    }
}

impl Settings {
    /// The library's options: each setting as merged, or its default.
    fn into_options(
        self,
        alerts: Option<AlertsConfig>,
        file: &Path,
        origin: impl Fn(&str) -> String,
    ) -> anyhow::Result<SchedulerOptions> {
        let d = SchedulerOptions::default();
        let c = ConnectionLimits::default();
        let listen = self.listen.unwrap_or(d.listen);
        let auth = self.auth.unwrap_or(if listen.ip().is_loopback() {
            AuthMode::Off
        } else {
            AuthMode::Tokens
        });
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.tls_client_ca,
            }),
            (None, None) => {
                if self.tls_client_ca.is_some() {
                    bail!("--tls-client-ca needs --tls-cert and --tls-key");
                }
                None
            }
            (Some(_), None) => bail!("--tls-cert needs --tls-key (the certificate's private key)"),
            (None, Some(_)) => bail!("--tls-key needs --tls-cert (the certificate chain)"),
        };
        // The key itself is read from the environment only: a flag would show it in `ps`.
        let secret_key = match (
            self.secret_key_file,
            std::env::var("AX_SECRET_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty()),
        ) {
            (Some(path), _) => Some(SecretKey::from_file(&path)?),
            (None, Some(text)) => Some(SecretKey::from_base64(&text).context("AX_SECRET_KEY")?),
            (None, None) => None,
        };
        let retention = |setting: Option<Retention>, default: Option<Duration>| match setting {
            Some(Retention::Forever) => None,
            Some(Retention::Keep { ms }) => Some(Duration::from_millis(ms)),
            None => default,
        };
        // 0 is no bound, as 0 is off for the durations that can be switched off.
        let bound = |setting: Option<u64>, default: Option<u64>| match setting {
            Some(0) => None,
            Some(n) => Some(n),
            None => default,
        };
        let options = SchedulerOptions {
            listen,
            secret_key,
            auth,
            auth_failures_per_address: d.auth_failures_per_address,
            tls,
            insecure: self.insecure,
            store_url: self.store.unwrap_or(d.store_url),
            redis_url: self.redis.filter(|url| !url.is_empty()),
            redis_namespace: self.redis_namespace.unwrap_or(d.redis_namespace),
            node_id: self
                .node_id
                .unwrap_or_else(|| ax_proto::hostname().unwrap_or(d.node_id)),
            advertise: self.advertise,
            node_lease: self.node_lease.unwrap_or(d.node_lease),
            spread_interval: match self.spread_interval {
                Some(interval) if interval.is_zero() => None,
                Some(interval) => Some(interval),
                None => d.spread_interval,
            },
            max_clock_offset: self.max_clock_offset.unwrap_or(d.max_clock_offset),
            strategy: self.strategy.unwrap_or(d.strategy),
            heartbeat_interval: self.heartbeat_interval.unwrap_or(d.heartbeat_interval),
            task_heartbeat_interval: self
                .task_heartbeat_interval
                .unwrap_or(d.task_heartbeat_interval),
            dead_after_missed_heartbeats: self
                .dead_after_missed_heartbeats
                .unwrap_or(d.dead_after_missed_heartbeats),
            timeout_grace: self.timeout_grace.unwrap_or(d.timeout_grace),
            log_flush_interval: self.log_flush_interval.unwrap_or(d.log_flush_interval),
            max_backfill_runs: self.max_backfill_runs.unwrap_or(d.max_backfill_runs),
            retention: retention(self.retention, d.retention),
            audit_retention: retention(self.audit_retention, d.audit_retention),
            purge_interval: self.purge_interval.unwrap_or(d.purge_interval),
            alerts: alerts.map(|alerts| alerts.channels).unwrap_or_default(),
            pools: self.pools.into_iter().collect(),
            ops_listen: self.ops_listen,
            otlp_endpoint: self.otlp_endpoint.filter(|endpoint| !endpoint.is_empty()),
            public_urls: self.public_urls,
            connections: ConnectionLimits {
                max_connections: self.max_connections.unwrap_or(c.max_connections),
                first_request_timeout: self
                    .first_request_timeout
                    .unwrap_or(c.first_request_timeout),
                idle_timeout: self.idle_connection_timeout.unwrap_or(c.idle_timeout),
                keepalive_interval: self.keepalive_interval.unwrap_or(c.keepalive_interval),
                keepalive_timeout: self.keepalive_timeout.unwrap_or(c.keepalive_timeout),
            },
            admission: ax_core::admission::Bounds {
                total: bound(self.max_waiting, d.admission.total),
                per_app: bound(self.max_waiting_per_app, d.admission.per_app),
            },
        };
        check(&options, file, origin)?;
        Ok(options)
    }
}

/// The rules the merged settings must keep; a refusal names the setting and where it was set.
fn check(
    options: &SchedulerOptions,
    file: &Path,
    origin: impl Fn(&str) -> String,
) -> anyhow::Result<()> {
    let refuse = |key: &str, rule: &str| anyhow::anyhow!("{key} must be {rule} ({})", origin(key));
    ax_core::cross_site::NodeNames::new([], &options.public_urls)
        .map_err(|why| anyhow::anyhow!("--public-url: {why}"))?;
    for channel in &options.alerts {
        channel
            .validate()
            .map_err(|err| anyhow::anyhow!("config file {}: {err}", file.display()))?;
    }
    if let Some(endpoint) = &options.otlp_endpoint {
        crate::telemetry::traces_url(endpoint)?;
    }
    for (key, value) in [
        ("heartbeat_interval", options.heartbeat_interval),
        ("task_heartbeat_interval", options.task_heartbeat_interval),
    ] {
        if value.is_zero() {
            return Err(refuse(key, "greater than zero"));
        }
    }
    if options.node_lease < Duration::from_secs(1) {
        // Renewed every fifth of it: shorter leases renew faster than a busy store answers.
        return Err(refuse("node_lease", "at least 1s"));
    }
    if options.purge_interval < Duration::from_millis(100) {
        return Err(refuse("purge_interval", "at least 100ms"));
    }
    let limits = &options.connections;
    if limits.max_connections == 0 {
        return Err(refuse("max_connections", "at least 1"));
    }
    for (key, value) in [
        ("first_request_timeout", limits.first_request_timeout),
        ("idle_connection_timeout", limits.idle_timeout),
        ("keepalive_interval", limits.keepalive_interval),
        ("keepalive_timeout", limits.keepalive_timeout),
    ] {
        if value < Duration::from_millis(100) {
            return Err(refuse(key, "at least 100ms"));
        }
    }
    if options.dead_after_missed_heartbeats < 2 {
        // A threshold equal to one interval kills healthy workers on any jitter.
        return Err(refuse("dead_after_missed_heartbeats", "at least 2"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// Whether the setting `id` is a switch: a flag that takes no value.
fn is_switch(id: &str) -> bool {
    Cli::command()
        .get_arguments()
        .any(|arg| arg.get_id() == id && !arg.get_action().takes_values())
}

impl Settings {
    /// Unsets a switch another source gave, so this source's layer does not claim it.
    fn unset_switch(&mut self, id: &str) {
        match id {
            "insecure" => self.insecure = false,
            other => unreachable!("the switch {other} is not listed in Settings::unset_switch"),
        }
    }
}
