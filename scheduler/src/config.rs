//! Configuration of the `ax-scheduler` binary: flags, then environment, then a TOML file, then
//! the embedded defaults (SQLite under `.ax/`, in-process guards).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ax_core::placement::Strategy;
use ax_core::spec::parse_duration_ms;
use clap::Parser;
use serde::Deserialize;

use crate::SchedulerOptions;

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
    /// A pool's cluster-wide limit, NAME=N (repeat the flag, or AX_POOLS=etl=4,gpu=2); these
    /// override the file's `[pools]` table pool by pool.
    #[arg(long = "pool", env = "AX_POOLS", value_delimiter = ',', value_parser = parse_pool)]
    pub pools: Vec<(String, u32)>,
    /// The ops listener, e.g. 0.0.0.0:7071: plaintext and unauthenticated, it serves only
    /// GET /metrics and the gRPC health service, for probes and Prometheus. Off without it.
    #[arg(long, env = "AX_OPS_LISTEN")]
    pub ops_listen: Option<SocketAddr>,
    /// Export traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (spans go to
    /// its /v1/traces). Off without it.
    #[arg(long, env = "AX_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
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
    alerts: Option<crate::alerts::AlertsConfig>,
    pools: Option<BTreeMap<String, u32>>,
    ops_listen: Option<SocketAddr>,
    otlp_endpoint: Option<String>,
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
    parse_duration_ms(text).map(Duration::from_millis)
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
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
        let options = SchedulerOptions {
            listen: self.listen.or(file.listen).unwrap_or(defaults.listen),
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
        };
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
        assert!(text.contains("ax.toml") && text.contains("etl"), "{text}");
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
    fn a_bad_file_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ax.toml");
        std::fs::write(&path, "heartbeat_interval = \"soon\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        assert!(err.to_string().contains("heartbeat_interval"), "{err}");
        std::fs::write(&path, "colour = \"blue\"\n").unwrap();
        let err = Args::parse_from(["ax-scheduler", "--config", path.to_str().unwrap()])
            .into_options()
            .unwrap_err();
        assert!(format!("{err:#}").contains("colour"), "{err:#}");
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
}
