//! The benchmark harness behind `ax-bench`: real `ax-scheduler` and `ax-worker` processes on
//! loopback, driven and observed only through the public gRPC API (plus `/proc` for CPU and
//! memory, and direct SQL for the bulk history of W7 and W11, which no API creates).
//!
//! Every workload module is named for what it measures, and [`run_workload`] maps the ids of
//! `--workload` (S0, W1 … W12, U1) to them; each has `run(&Env) -> anyhow::Result<Measurement>`. A
//! run starts its own [`Cluster`] on a fresh store, so one workload never sees another's rows,
//! and ends with the correctness checks of [`Cluster::verify_runs`].

pub mod chain_latency;
pub mod cron_lateness;
pub mod fan_out_fan_in;
pub mod history_reads;
pub mod idle_workers;
pub mod large_history;
pub mod log_throughput;
pub mod mapped_fan_out;
pub mod poisson_arrivals;
pub mod report;
pub mod seed_load;
pub mod spawn_ceiling;
pub mod throughput;
pub mod web_ui;
pub mod worker_kill;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use futures::StreamExt;
use serde::Serialize;
use sqlx::Connection;
use tonic::transport::Channel;

use crate::process::{ProcessCluster, RedisChoice, SchedulerSettings, Site, WorkerSettings};
use crate::unique_suffix;

/// Every workload the harness knows, in the order `all` runs them (S0 first, so W1's ratio to
/// the spawn ceiling is measured in the same invocation).
pub const WORKLOADS: &[&str] = &[
    "S0", "W1", "W1H", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "W10", "W11", "W12", "U1",
];

/// Calls the harness makes at once when it reads back results: enough to hide round trips,
/// few enough not to be the load being measured.
const READ_CONCURRENCY: usize = 16;

/// Where each run's store lives.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    /// A fresh SQLite file per run, in this directory.
    Sqlite(PathBuf),
    /// A MySQL/MariaDB server url without a database; each run creates and drops its own.
    MySql(String),
}

impl StoreChoice {
    /// Parses `--store`: `sqlite` (or empty), `sqlite://DIR`, or `mysql://USER@HOST:PORT`.
    pub fn parse(url: Option<&str>, scratch: &Path) -> anyhow::Result<StoreChoice> {
        match url {
            None | Some("") | Some("sqlite") | Some("sqlite://") => {
                Ok(StoreChoice::Sqlite(scratch.to_path_buf()))
            }
            Some(url) if url.starts_with("sqlite://") => {
                let dir = PathBuf::from(&url["sqlite://".len()..]);
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating the SQLite directory {}", dir.display()))?;
                Ok(StoreChoice::Sqlite(dir))
            }
            Some(url) if url.starts_with("mysql://") => {
                let rest = url["mysql://".len()..].trim_end_matches('/');
                if rest.contains('/') {
                    bail!(
                        "--store {url}: give the server without a database (mysql://USER@HOST:PORT); \
                         the harness creates and drops a database of its own for every run"
                    );
                }
                Ok(StoreChoice::MySql(format!("mysql://{rest}")))
            }
            Some(url) => {
                bail!("--store {url}: expected sqlite, sqlite://DIR or mysql://USER@HOST:PORT")
            }
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            StoreChoice::Sqlite(_) => "sqlite",
            StoreChoice::MySql(_) => "mysql",
        }
    }

    /// Fails with a clear message when the store cannot be reached, before any workload starts.
    pub async fn check_reachable(&self) -> anyhow::Result<()> {
        if let StoreChoice::MySql(server) = self {
            let connect = sqlx::MySqlConnection::connect(server);
            match tokio::time::timeout(Duration::from_secs(5), connect).await {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                }
                Ok(Err(err)) => bail!("cannot reach the store {server}: {err}"),
                Err(_) => bail!("cannot reach the store {server}: no answer within 5 s"),
            }
        }
        Ok(())
    }
}

/// What every workload shares: where the binaries are, which store and Redis to use, quick or
/// full sizes, and a scratch directory that outlives the runs.
pub struct Env {
    pub bin_dir: PathBuf,
    pub store: StoreChoice,
    pub redis: Option<String>,
    pub quick: bool,
    /// W9 steps its arrival rate up until the p99 passes 100 ms (`--sweep`).
    pub sweep: bool,
    /// W9 offers this rate for a minute instead, counting refusals for load (`--overload`).
    pub overload: Option<f64>,
    /// W9 compares one node with this many, the same three workers behind each (`--nodes`).
    pub nodes: Option<usize>,
    /// Flags every scheduler node is given besides the harness's own (`--max-waiting` …).
    pub scheduler_args: Vec<String>,
    pub scratch: PathBuf,
    /// MySQL databases created by this harness that are not dropped yet.
    databases: Mutex<Vec<String>>,
}

/// How one cluster is started.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Workers as (id, capacity).
    pub workers: Vec<(String, u32)>,
    /// `--heartbeat-interval` and `--task-heartbeat-interval` of the scheduler and the workers;
    /// the product defaults when `None`.
    pub heartbeat: Option<&'static str>,
    /// Scheduler nodes on the one store (more than one needs MySQL); every worker is given
    /// every node's endpoint.
    pub nodes: usize,
}

impl ClusterSpec {
    pub fn one_worker(capacity: u32) -> ClusterSpec {
        ClusterSpec {
            workers: vec![("bench-w1".into(), capacity)],
            heartbeat: None,
            nodes: 1,
        }
    }

    /// `nodes` scheduler nodes and `workers` workers of `capacity` each.
    pub fn nodes(nodes: usize, workers: usize, capacity: u32) -> ClusterSpec {
        ClusterSpec {
            workers: (1..=workers)
                .map(|n| (format!("bench-w{n}"), capacity))
                .collect(),
            heartbeat: None,
            nodes,
        }
    }
}

impl Env {
    pub fn new(
        bin_dir: PathBuf,
        store: StoreChoice,
        redis: Option<String>,
        quick: bool,
        scratch: PathBuf,
    ) -> Env {
        Env {
            bin_dir,
            store,
            redis,
            quick,
            sweep: false,
            overload: None,
            nodes: None,
            scheduler_args: Vec::new(),
            scratch,
            databases: Mutex::new(Vec::new()),
        }
    }

    /// Starts the spec's scheduler nodes on a fresh store, then its workers, and waits until
    /// they are live.
    pub async fn start(&self, spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        let dir = self.scratch.join(format!("run_{}", unique_suffix()));
        std::fs::create_dir_all(&dir)?;
        let store_url = match &self.store {
            StoreChoice::Sqlite(base) => {
                let file = base.join(format!("ax_{}.db", unique_suffix()));
                format!("sqlite://{}", file.display())
            }
            StoreChoice::MySql(server) => {
                let name = format!("ax_bench_{}", unique_suffix());
                let mut conn = sqlx::MySqlConnection::connect(server)
                    .await
                    .with_context(|| format!("connecting to {server}"))?;
                // The name is ours (digits and underscores), never user input.
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut conn)
                    .await?;
                let _ = conn.close().await;
                self.lock_databases().push(name.clone());
                format!("{server}/{name}")
            }
        };
        // The product's intervals and log level, unless the spec shortens the heartbeats (both
        // layers alike: the lost-attempt rule waits for the task heartbeat too) or AX_BENCH_LOG
        // asks for another level (a RUST_LOG filter, for looking into a run with --keep).
        let heartbeat = spec.heartbeat.map(String::from);
        let settings = SchedulerSettings {
            redis: match &self.redis {
                Some(url) => RedisChoice::Url(url.clone()),
                None => RedisChoice::None,
            },
            heartbeat_interval: heartbeat.clone(),
            task_heartbeat_interval: heartbeat.clone(),
            node_lease: None,
            spread_interval: None,
            nodes: spec.nodes.max(1),
            rust_log: std::env::var("AX_BENCH_LOG").ok(),
            extra_args: self.scheduler_args.clone(),
            ..SchedulerSettings::default()
        };
        let site = Site {
            bin_dir: self.bin_dir.clone(),
            store_url: store_url.clone(),
            dir,
        };
        let processes = ProcessCluster::start_at(site, settings).await?;
        let endpoints: Vec<String> = (0..processes.node_count())
            .map(|index| processes.node_endpoint(index))
            .collect();
        let control = connect(&endpoints[0]).await?;
        let mut cluster = Cluster {
            endpoint: endpoints[0].clone(),
            worker: WorkerSettings {
                endpoint: Some(endpoints.join(",")),
                heartbeat_interval: heartbeat.clone(),
                task_heartbeat_interval: heartbeat,
                ..WorkerSettings::default()
            },
            endpoints,
            store_url,
            processes,
            control,
            runs: Vec::new(),
        };
        for (id, capacity) in &spec.workers {
            cluster.add_worker(id, *capacity)?;
        }
        cluster
            .wait_for_workers(spec.workers.len(), Duration::from_secs(30))
            .await?;
        Ok(cluster)
    }

    fn lock_databases(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.databases
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Drops every MySQL database a run created (also after a failed run).
    pub async fn drop_databases(&self) -> anyhow::Result<()> {
        let names: Vec<String> = std::mem::take(&mut *self.lock_databases());
        if let (StoreChoice::MySql(server), false) = (&self.store, names.is_empty()) {
            let mut conn = sqlx::MySqlConnection::connect(server).await?;
            for name in names {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS `{name}`"
                )))
                .execute(&mut conn)
                .await?;
            }
        }
        Ok(())
    }
}

/// Scheduler nodes and their workers, one fresh store, and a control client (on the first node).
pub struct Cluster {
    /// The first node's.
    pub endpoint: String,
    /// Every node's.
    pub endpoints: Vec<String>,
    pub store_url: String,
    processes: ProcessCluster,
    /// How its workers are started: every node's endpoint, the spec's heartbeats.
    worker: WorkerSettings,
    control: ControlServiceClient<Channel>,
    /// Runs this cluster triggered, for the final store-wide checks.
    pub runs: Vec<i64>,
}

impl Cluster {
    /// The first node's process.
    pub fn scheduler_pid(&self) -> anyhow::Result<u32> {
        self.scheduler_pids()
            .first()
            .copied()
            .context("the scheduler is not running")
    }

    /// Every node's process, in node order.
    pub fn scheduler_pids(&self) -> Vec<u32> {
        self.processes.node_pids()
    }

    /// Every worker's process.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.processes.worker_pids()
    }

    pub fn worker_pid(&self, id: &str) -> anyhow::Result<u32> {
        self.processes.worker_pid(id)
    }

    pub fn add_worker(&mut self, id: &str, capacity: u32) -> anyhow::Result<()> {
        let settings = WorkerSettings {
            capacity: Some(capacity),
            ..self.worker.clone()
        };
        self.processes.start_worker_with(id, &settings)
    }

    /// SIGKILL of one worker: no drain, no goodbye.
    pub async fn kill_worker(&mut self, id: &str) -> anyhow::Result<()> {
        self.processes.kill_worker(id).await.map(|_| ())
    }

    /// A clone of the control client (clones share one HTTP/2 connection).
    pub fn control(&self) -> ControlServiceClient<Channel> {
        self.control.clone()
    }

    pub async fn wait_for_workers(&self, count: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let live = self.live_workers().await?;
            if live.len() >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} of {count} workers live after {timeout:?}", live.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn live_workers(&self) -> anyhow::Result<Vec<pb::WorkerInfo>> {
        let workers = self
            .control()
            .list_workers(pb::ListWorkersRequest {})
            .await?
            .into_inner()
            .workers;
        Ok(workers
            .into_iter()
            .filter(|w| w.state == pb::WorkerState::Live as i32)
            .collect())
    }

    pub async fn apply(&self, source: &str) -> anyhow::Result<pb::Workflow> {
        let response = self
            .control()
            .apply_workflow(pb::ApplyWorkflowRequest {
                source: source.into(),
                source_name: "bench.yaml".into(),
                dry_run: false,
                actor: "ax-bench".into(),
            })
            .await
            .context("applying a workflow")?
            .into_inner();
        response.workflow.context("apply returned no workflow")
    }

    pub async fn trigger(&mut self, workflow: &str) -> anyhow::Result<pb::Run> {
        let run = trigger(&mut self.control(), workflow).await?;
        self.runs.push(run.id);
        Ok(run)
    }

    /// Polls the run until it is terminal; fails after `timeout`.
    pub async fn wait_run(
        &self,
        id: i64,
        timeout: Duration,
        poll: Duration,
    ) -> anyhow::Result<pb::Run> {
        let mut control = self.control();
        let deadline = Instant::now() + timeout;
        loop {
            let run = control
                .get_run(pb::GetRunRequest { id })
                .await?
                .into_inner();
            if run.state != pb::RunState::Running as i32 {
                return Ok(run);
            }
            if Instant::now() > deadline {
                bail!("run {id} still running after {timeout:?}: {:?}", run.counts);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// Waits until none of the runs `ids` is RUNNING and returns them as they are then. Runs
    /// end about in the order they were started, so it asks about the oldest one still
    /// running until it ends, and only then about the next: a poll costs one read, not one per
    /// run, and leaves the store to the workload being measured.
    pub async fn wait_runs(&self, ids: &[i64], timeout: Duration) -> anyhow::Result<Vec<pb::Run>> {
        let deadline = Instant::now() + timeout;
        let mut ended = Vec::with_capacity(ids.len());
        for &id in ids {
            let left = deadline.saturating_duration_since(Instant::now());
            ended.push(self.wait_run(id, left, Duration::from_millis(200)).await?);
        }
        Ok(ended)
    }

    /// The run's instances (without attempts).
    pub async fn list_instances(&self, run: i64) -> anyhow::Result<Vec<pb::Instance>> {
        Ok(self
            .control()
            .list_instances(pb::ListInstancesRequest {
                run_id: run,
                attempts: false,
                ..Default::default()
            })
            .await?
            .into_inner()
            .instances)
    }

    /// Every line of one attempt, in order.
    pub async fn logs(
        &self,
        instance: i64,
        attempt: u32,
    ) -> anyhow::Result<Vec<pb::StoredLogLine>> {
        let mut stream = self
            .control()
            .get_logs(pb::GetLogsRequest {
                instance_id: instance,
                attempt,
                follow: false,
                after_seq: 0,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut lines = Vec::new();
        while let Some(chunk) = stream.message().await? {
            lines.extend(chunk.lines);
        }
        Ok(lines)
    }

    /// The correctness checks every workload ends with, read through the API:
    /// every run has `tasks_per_run` instances, all terminal (and SUCCESS when `expect_success`);
    /// attempt numbers are unique per instance and each was started at most once (exactly one
    /// attempt per instance when `single_attempt`); every attempt's log is complete (as many
    /// lines as the worker reported, numbered 1..n without a gap); and no run in the whole store
    /// is left RUNNING. Returns every instance with its attempts, for the workload's figures.
    pub async fn verify_runs(
        &self,
        runs: &[i64],
        tasks_per_run: usize,
        expect_success: bool,
        single_attempt: bool,
        checks: &mut Checks,
    ) -> anyhow::Result<Vec<pb::Instance>> {
        let control = self.control();
        // One read per run, each instance with its attempts.
        let listed: Vec<anyhow::Result<Vec<pb::Instance>>> =
            futures::stream::iter(runs.iter().copied())
                .map(|run| {
                    let mut control = control.clone();
                    async move {
                        Ok(control
                            .list_instances(pb::ListInstancesRequest {
                                run_id: run,
                                attempts: true,
                                ..Default::default()
                            })
                            .await?
                            .into_inner()
                            .instances)
                    }
                })
                .buffer_unordered(READ_CONCURRENCY)
                .collect()
                .await;
        let mut instances = Vec::new();
        let mut short_runs = 0usize;
        for list in listed {
            let list = list?;
            if list.len() != tasks_per_run {
                short_runs += 1;
            }
            instances.extend(list);
        }
        checks.add(
            "every task of every run has an instance",
            short_runs == 0,
            format!(
                "{short_runs} of {} runs differ from {tasks_per_run} instances",
                runs.len()
            ),
        );
        instances.sort_by_key(|i| i.id);

        let terminal = |state: i32| {
            [
                pb::InstanceState::Success,
                pb::InstanceState::Failed,
                pb::InstanceState::Timeout,
                pb::InstanceState::Cancelled,
            ]
            .iter()
            .any(|s| *s as i32 == state)
        };
        let stuck = instances.iter().filter(|i| !terminal(i.state)).count();
        checks.add(
            "no instance left in a non-terminal state",
            stuck == 0,
            format!("{stuck} of {} instances not terminal", instances.len()),
        );
        if expect_success {
            let failed = instances
                .iter()
                .filter(|i| i.state != pb::InstanceState::Success as i32)
                .count();
            checks.add(
                "every instance ended SUCCESS",
                failed == 0,
                format!("{failed} of {} instances not SUCCESS", instances.len()),
            );
        }
        let mut twice = 0usize;
        let mut extra = 0usize;
        for instance in &instances {
            let mut numbers: Vec<u32> = instance.attempts.iter().map(|a| a.attempt).collect();
            numbers.sort_unstable();
            let before = numbers.len();
            numbers.dedup();
            if numbers.len() != before {
                twice += 1;
            }
            let started = instance
                .attempts
                .iter()
                .filter(|a| a.started_at_ms > 0)
                .count();
            if single_attempt && (instance.attempts.len() != 1 || started != 1) {
                extra += 1;
            }
        }
        checks.add(
            "attempt numbers unique per instance (no attempt started twice)",
            twice == 0,
            format!("{twice} instances repeat an attempt number"),
        );
        if single_attempt {
            checks.add(
                "exactly one attempt per instance, started once",
                extra == 0,
                format!("{extra} instances have another attempt count"),
            );
        }
        let with_logs: Vec<(i64, u32, u64)> = instances
            .iter()
            .flat_map(|i| {
                i.attempts
                    .iter()
                    .filter(|a| a.log_lines > 0)
                    .map(move |a| (i.id, a.attempt, a.log_lines))
            })
            .collect();
        let attempts_with_logs = with_logs.len();
        let incomplete: Vec<anyhow::Result<bool>> = futures::stream::iter(with_logs)
            .map(|(id, attempt, expected)| async move {
                let lines = self.logs(id, attempt).await?;
                let in_order = lines
                    .iter()
                    .enumerate()
                    .all(|(n, line)| line.seq == n as u64 + 1);
                Ok(lines.len() as u64 != expected || !in_order)
            })
            .buffer_unordered(4)
            .collect()
            .await;
        let mut lost = 0usize;
        for attempt in incomplete {
            if attempt? {
                lost += 1;
            }
        }
        checks.add(
            "every attempt's log complete and in order",
            lost == 0,
            format!("{lost} of {attempts_with_logs} attempts with output have missing or misordered lines"),
        );
        self.check_nothing_running(checks).await?;
        Ok(instances)
    }

    /// No run anywhere in the store is still RUNNING.
    pub async fn check_nothing_running(&self, checks: &mut Checks) -> anyhow::Result<()> {
        let running = self
            .control()
            .list_runs(pb::ListRunsRequest {
                workflow: String::new(),
                limit: 1_000,
                state: pb::RunState::Running as i32,
                ..Default::default()
            })
            .await?
            .into_inner()
            .runs
            .len();
        checks.add(
            "no run left RUNNING in the store",
            running == 0,
            format!("{running} runs still RUNNING"),
        );
        Ok(())
    }

    /// Stops the workers (SIGTERM, they drain), then the scheduler; SIGKILL after a grace.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.processes
            .stop(Duration::from_secs(15), Duration::from_secs(20))
            .await;
        Ok(())
    }
}

/// A control client of the node at `endpoint`, with room for big answers (10,000 instances).
pub async fn connect(endpoint: &str) -> anyhow::Result<ControlServiceClient<Channel>> {
    let channel = Channel::from_shared(endpoint.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    Ok(ControlServiceClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(64 << 20))
}

pub async fn trigger(
    control: &mut ControlServiceClient<Channel>,
    workflow: &str,
) -> anyhow::Result<pb::Run> {
    control
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: workflow.into(),
            params: Default::default(),
            idempotency_key: String::new(),
            actor: "ax-bench".into(),
            logical_time_ms: 0,
        })
        .await
        .with_context(|| format!("triggering {workflow}"))?
        .into_inner()
        .run
        .context("trigger returned no run")
}

/// User + system CPU time of a process so far, in seconds, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let (_, rest) = stat.rsplit_once(')').context("malformed /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    // SAFETY: sysconf with a valid name has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    Ok((utime + stime) as f64 / ticks)
}

/// The local MySQL/MariaDB server's process, when it runs on this machine (its CPU is part of
/// what a workload costs).
pub fn store_server_pid() -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            matches!(comm.trim(), "mariadbd" | "mysqld").then_some(pid)
        })
}

/// A `/proc/PID/status` memory field (VmRSS, VmHWM) in MiB.
pub fn memory_mib(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(field) && line[field.len()..].starts_with(':'))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    let kib: f64 = line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// A comparison a figure must meet.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
}

impl Target {
    pub fn met(self, value: f64) -> bool {
        match self {
            Target::AtMost(limit) => value <= limit,
            Target::AtLeast(limit) => value >= limit,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Target::AtMost(limit) => format!("<= {}", report::number(limit)),
            Target::AtLeast(limit) => format!(">= {}", report::number(limit)),
        }
    }
}

/// One number of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub value: f64,
    pub target: Option<Target>,
}

/// One correctness check of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Default, Clone)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    pub fn add(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        self.0.push(Check {
            name: name.into(),
            ok,
            detail: if ok { String::new() } else { detail.into() },
        });
    }
}

/// What one run of one workload measured.
#[derive(Debug, Default, Clone)]
pub struct Measurement {
    pub figures: Vec<Figure>,
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
    /// The product cannot do this workload yet (the reason); figures may be partial.
    pub unsupported: Option<String>,
}

impl Measurement {
    pub fn figure(&mut self, name: &str, unit: &str, value: f64, target: Option<Target>) {
        self.figures.push(Figure {
            name: name.into(),
            unit: unit.into(),
            value,
            target,
        });
    }
}

/// Runs one workload by id.
pub async fn run_workload(id: &str, env: &Env) -> anyhow::Result<Measurement> {
    match id {
        "S0" => spawn_ceiling::run(env).await,
        "W1" => throughput::run(env).await,
        "W1H" => throughput::run_held(env).await,
        "W2" => chain_latency::run(env).await,
        "W3" => fan_out_fan_in::run(env).await,
        "W4" => log_throughput::run(env).await,
        "W5" => idle_workers::run(env).await,
        "W6" => worker_kill::run(env).await,
        "W7" => large_history::run(env).await,
        "W8" => cron_lateness::run(env).await,
        "W9" => poisson_arrivals::run(env).await,
        "W10" => seed_load::run(env).await,
        "W11" => history_reads::run(env).await,
        "W12" => mapped_fan_out::run(env).await,
        "U1" => web_ui::run(env).await,
        other => bail!("unknown workload {other}"),
    }
}

/// Parses `--workload W1,W2` or `all`; unknown names are refused with the list of known ones.
pub fn parse_workloads(spec: &str) -> anyhow::Result<Vec<&'static str>> {
    if spec.trim().eq_ignore_ascii_case("all") {
        return Ok(WORKLOADS.to_vec());
    }
    let mut chosen = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(known) = WORKLOADS.iter().find(|w| w.eq_ignore_ascii_case(name)) else {
            bail!(
                "unknown workload {name:?}; known workloads: {} (or all)",
                WORKLOADS.join(", ")
            );
        };
        if !chosen.contains(known) {
            chosen.push(*known);
        }
    }
    if chosen.is_empty() {
        bail!(
            "no workload given; known workloads: {} (or all)",
            WORKLOADS.join(", ")
        );
    }
    Ok(chosen)
}

/// Nearest-rank percentile (`p` in 0..=100) of unsorted values; 0 for none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// A YAML workflow file: `tasks` as (name, command, upstream names).
pub fn workflow_yaml(
    name: &str,
    cron: Option<&str>,
    tasks: &[(String, String, Vec<String>)],
) -> String {
    let mut out = format!("name: {name}\n");
    if let Some(cron) = cron {
        out.push_str(&format!("schedule:\n  cron: \"{cron}\"\n"));
    }
    out.push_str("tasks:\n");
    for (task, command, upstream) in tasks {
        out.push_str(&format!("  - name: {task}\n    command: \"{command}\"\n"));
        if !upstream.is_empty() {
            out.push_str(&format!("    upstream: [{}]\n", upstream.join(", ")));
        }
    }
    out
}

/// Milliseconds since the Unix epoch by the harness's wall clock (the API's time base).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn unknown_workloads_are_refused_with_the_known_list() {
        let err = parse_workloads("W1,W42").unwrap_err().to_string();
        assert!(err.contains("W42") && err.contains("S0, W1"), "{err}");
        assert_eq!(parse_workloads("all").unwrap().len(), WORKLOADS.len());
        assert_eq!(parse_workloads("w2, W2,S0").unwrap(), vec!["W2", "S0"]);
    }

    #[test]
    fn store_urls_are_checked() {
        let dir = Path::new("/tmp");
        assert!(matches!(
            StoreChoice::parse(None, dir).unwrap(),
            StoreChoice::Sqlite(_)
        ));
        assert!(matches!(
            StoreChoice::parse(Some("mysql://root@127.0.0.1:3306/"), dir).unwrap(),
            StoreChoice::MySql(url) if url == "mysql://root@127.0.0.1:3306"
        ));
        assert!(StoreChoice::parse(Some("mysql://root@h:3306/ax"), dir).is_err());
        assert!(StoreChoice::parse(Some("postgres://x"), dir).is_err());
    }
}
