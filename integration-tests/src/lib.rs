//! A sandbox for end-to-end tests: a scheduler on loopback gRPC over a real store (a fresh SQLite
//! file, or a fresh MySQL database), real workers running real shell commands, and a
//! [`TestClient`] of its control API whose waits give up after a timeout instead of hanging.
pub mod browser;
pub mod client;
pub mod fault_kit;
pub mod flood;
pub mod galera;
pub mod mariadb_server;
pub mod previous_release;
pub mod process;
pub mod proto_worker;
pub mod proxy;
pub mod redis_server;
pub mod requirements;
pub mod workflows;

pub mod bench;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use ax_scheduler::{RunningScheduler, SchedulerOptions, Strategy};
use ax_worker::WorkerOptions;
use sqlx::Connection;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use ax_test_harness as harness;
pub use client::TestClient;

/// How long the workers of a starting sandbox may take to connect. A hang guard.
const WORKERS_GUARD: Duration = Duration::from_secs(20);

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    MySql,
}

/// `AX_TEST_MYSQL_URL` (server url without a database). A test that calls this requires
/// [`requirements::MYSQL`], so the harness has checked it is set.
pub fn mysql_server_url() -> anyhow::Result<String> {
    required("AX_TEST_MYSQL_URL", "MYSQL").map(|url| url.trim_end_matches('/').to_string())
}

/// `AX_TEST_REDIS_URL`, for a test that requires [`requirements::REDIS`].
pub fn redis_url() -> anyhow::Result<String> {
    required("AX_TEST_REDIS_URL", "REDIS")
}

/// `AX_TEST_REDIS_URL` for a test that uses Redis when there is one and in-process guards
/// otherwise; under `CI=true` it must be set.
pub fn redis_url_if_set() -> Option<String> {
    match std::env::var("AX_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true but AX_TEST_REDIS_URL is not set: Redis tests cannot be skipped")
        }
        _ => None,
    }
}

fn required(var: &str, requirement: &str) -> anyhow::Result<String> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Ok(value),
        _ => bail!("{var} is not set: register the test with `.requires(&{requirement})`"),
    }
}

/// A database of one test: created fresh, dropped by [`TestDb::drop_database`].
pub struct TestDb {
    pub url: String,
    server: Option<(String, String)>,
}

static DB_COUNTER: AtomicU32 = AtomicU32::new(0);

impl TestDb {
    pub async fn create(backend: Backend, dir: &Path) -> anyhow::Result<TestDb> {
        match backend {
            Backend::Sqlite => Ok(TestDb {
                url: format!("sqlite://{}", dir.join("ax.db").display()),
                server: None,
            }),
            Backend::MySql => {
                let server = mysql_server_url()?;
                let name = format!("ax_e2e_{}", unique_suffix());
                let mut conn = sqlx::MySqlConnection::connect(&server)
                    .await
                    .with_context(|| format!("connecting to {server}"))?;
                // The name is ours (digits and underscores), never user input.
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut conn)
                    .await?;
                Ok(TestDb {
                    url: format!("{server}/{name}"),
                    server: Some((server, name)),
                })
            }
        }
    }

    pub async fn drop_database(self) -> anyhow::Result<()> {
        if let Some((server, name)) = self.server {
            let mut conn = sqlx::MySqlConnection::connect(&server).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{name}`"
            )))
            .execute(&mut conn)
            .await?;
        }
        Ok(())
    }
}

/// `<pid>_<counter>_<nanos>`: unique across the tests of one run and across parallel runs.
pub(crate) fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}_{}_{}",
        std::process::id(),
        DB_COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000
    )
}

/// A worker of the sandbox.
pub struct WorkerSpec {
    pub id: String,
    pub capacity: u32,
    pub labels: BTreeMap<String, String>,
}

pub struct ClusterBuilder {
    backend: Backend,
    strategy: Strategy,
    workers: Vec<WorkerSpec>,
    redis: bool,
    alerts: Vec<ax_scheduler::alerts::ChannelConfig>,
    pools: BTreeMap<String, u32>,
    max_line_bytes: Option<usize>,
    auth: ax_scheduler::AuthMode,
    auth_failures_per_address: u32,
    secret_key: Option<ax_scheduler::secrets::SecretKey>,
    ops_listener: bool,
    redis_url: Option<String>,
    retention: Option<Duration>,
    purge_interval: Option<Duration>,
    public_urls: Vec<String>,
    audit_retention: Option<Duration>,
    heartbeat_interval: Option<Duration>,
    admission: ax_core::admission::Bounds,
}

impl ClusterBuilder {
    /// The node's worker heartbeat interval (500 ms unset); its dead-worker threshold is four
    /// of them, and a worker stream silent for two is taken over by another.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// The bounds on waiting instances (the scheduler's `--max-waiting` and
    /// `--max-waiting-per-app`; the product's defaults unset).
    pub fn max_waiting(mut self, bounds: ax_core::admission::Bounds) -> Self {
        self.admission = bounds;
        self
    }

    /// How long audit rows are kept (the product's default unset).
    pub fn audit_retention(mut self, keep: Duration) -> Self {
        self.audit_retention = Some(keep);
        self
    }

    /// A URL a proxy serves the node at (the scheduler's `--public-url`).
    pub fn public_url(mut self, url: &str) -> Self {
        self.public_urls.push(url.to_string());
        self
    }

    /// Callers need tokens (the sandbox's own client and workers then have none: a test that
    /// turns this on starts no workers here and makes its own calls).
    pub fn auth(mut self, auth: ax_scheduler::AuthMode) -> Self {
        self.auth = auth;
        self
    }

    /// The key secrets are sealed with.
    pub fn secret_key(mut self, key: ax_scheduler::secrets::SecretKey) -> Self {
        self.secret_key = Some(key);
        self
    }

    /// Failed authentications an address may make within a minute before it is refused.
    pub fn auth_failures_per_address(mut self, limit: u32) -> Self {
        self.auth_failures_per_address = limit;
        self
    }

    /// Guards through this Redis url (e.g. one where nothing listens, to see the node go on
    /// without it), whatever `AX_TEST_REDIS_URL` says.
    pub fn redis_url(mut self, url: &str) -> Self {
        self.redis_url = Some(url.to_string());
        self
    }

    /// The node also serves its ops listener (metrics and health) on a loopback port of its
    /// own ([`RunningScheduler::ops_addr`]).
    pub fn ops_listener(mut self) -> Self {
        self.ops_listener = true;
        self
    }

    /// Workers split output lines longer than this (their default when unset).
    pub fn max_line_bytes(mut self, bytes: usize) -> Self {
        self.max_line_bytes = Some(bytes);
        self
    }

    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    pub fn worker(self, id: &str, capacity: u32) -> Self {
        self.labelled_worker(WorkerSpec {
            id: id.into(),
            capacity,
            labels: BTreeMap::new(),
        })
    }

    pub fn labelled_worker(mut self, spec: WorkerSpec) -> Self {
        self.workers.push(spec);
        self
    }

    /// A cluster-wide pool limit (the scheduler config's `[pools]`).
    pub fn pool(mut self, name: &str, limit: u32) -> Self {
        self.pools.insert(name.into(), limit);
        self
    }

    /// The cluster's default retention (the scheduler config's `retention`); forever unset.
    pub fn retention(mut self, keep: Duration) -> Self {
        self.retention = Some(keep);
        self
    }

    /// How often the purger looks for runs past their retention (the product's default unset).
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = Some(interval);
        self
    }

    /// Failures are announced to these channels.
    pub fn alert_channel(mut self, channel: ax_scheduler::alerts::ChannelConfig) -> Self {
        self.alerts.push(channel);
        self
    }

    /// Dedup markers and start locks through the test Redis when `AX_TEST_REDIS_URL` is set, in
    /// process otherwise ([`redis_url_if_set`]).
    pub fn redis(mut self) -> Self {
        self.redis = true;
        self
    }

    /// Starts the sandbox and waits until its workers are LIVE.
    pub async fn start(self) -> anyhow::Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let db = TestDb::create(self.backend, dir.path()).await?;
        let redis_url = match self.redis_url {
            Some(url) => Some(url),
            None if self.redis => redis_url_if_set(),
            None => None,
        };
        let options = SchedulerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            store_url: db.url.clone(),
            redis_url,
            // Test stores all number their instances from 1; their Redis keys must not meet.
            redis_namespace: format!("ax-test-{}", unique_suffix()),
            node_id: "test-node".into(),
            advertise: None,
            node_lease: Duration::from_secs(10),
            spread_interval: Some(Duration::from_secs(10)),
            max_clock_offset: Duration::from_secs(1),
            strategy: self.strategy,
            heartbeat_interval: self
                .heartbeat_interval
                .unwrap_or(Duration::from_millis(500)),
            task_heartbeat_interval: Duration::from_secs(2),
            dead_after_missed_heartbeats: 4,
            timeout_grace: Duration::from_secs(2),
            log_flush_interval: Duration::from_millis(10),
            alerts: self.alerts,
            max_backfill_runs: 1_000,
            retention: self.retention,
            purge_interval: self
                .purge_interval
                .unwrap_or(SchedulerOptions::default().purge_interval),
            pools: self.pools,
            auth: self.auth,
            auth_failures_per_address: self.auth_failures_per_address,
            tls: None,
            insecure: false,
            secret_key: self.secret_key,
            ops_listen: self
                .ops_listener
                .then(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            otlp_endpoint: None,
            public_urls: self.public_urls,
            audit_retention: self
                .audit_retention
                .or(SchedulerOptions::default().audit_retention),
            connections: Default::default(),
            admission: self.admission,
        };
        let scheduler = ax_scheduler::start(options).await?;
        let addr = scheduler.local_addr();
        let mut cluster = Cluster {
            scheduler,
            addr,
            workers: Vec::new(),
            dir,
            db,
            max_line_bytes: self.max_line_bytes,
        };
        let workers = self.workers.len();
        for spec in self.workers {
            cluster.add_worker(spec);
        }
        if workers > 0 {
            cluster
                .client()
                .await?
                .wait_for_workers(workers, WORKERS_GUARD)
                .await?;
        }
        Ok(cluster)
    }
}

pub struct Cluster {
    pub scheduler: RunningScheduler,
    pub addr: SocketAddr,
    workers: Vec<(String, CancellationToken, JoinHandle<anyhow::Result<()>>)>,
    dir: tempfile::TempDir,
    db: TestDb,
    max_line_bytes: Option<usize>,
}

impl Cluster {
    pub fn builder(backend: Backend) -> ClusterBuilder {
        ClusterBuilder {
            backend,
            strategy: Strategy::LeastRunning,
            workers: Vec::new(),
            redis: false,
            alerts: Vec::new(),
            pools: BTreeMap::new(),
            max_line_bytes: None,
            auth: ax_scheduler::AuthMode::Off,
            auth_failures_per_address: ax_scheduler::auth::FAILURES_PER_ADDRESS,
            secret_key: None,
            ops_listener: false,
            redis_url: None,
            retention: None,
            purge_interval: None,
            public_urls: Vec::new(),
            audit_retention: None,
            heartbeat_interval: None,
            admission: ax_core::admission::Bounds::DEFAULT,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The url of the cluster's store, to open a second handle on it in a test.
    pub fn store_url(&self) -> &str {
        &self.db.url
    }

    /// A scratch directory that lives as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn add_worker(&mut self, spec: WorkerSpec) {
        let options = WorkerOptions {
            endpoints: vec![self.endpoint()],
            worker_id: spec.id.clone(),
            labels: spec.labels,
            capacity: spec.capacity,
            heartbeat_interval: Duration::from_millis(500),
            task_heartbeat_interval: Duration::from_secs(2),
            max_line_bytes: self
                .max_line_bytes
                .unwrap_or(WorkerOptions::default().max_line_bytes),
            // The cluster's own: clusters of parallel tests name their workers alike, and a
            // shared default directory would mix their spill and $AX_OUTPUT files.
            state_dir: Some(self.dir().join(format!("state-{}", spec.id))),
            ..WorkerOptions::default()
        };
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run(options, cancel.clone()));
        self.workers.push((spec.id, cancel, handle));
    }

    /// A client of the cluster's scheduler.
    pub async fn client(&self) -> anyhow::Result<TestClient> {
        TestClient::connect(&self.endpoint()).await
    }

    /// Runs the real `axctl` binary against this cluster.
    pub fn axctl(&self, args: &[&str]) -> anyhow::Result<Output> {
        std::process::Command::new(binary("axctl")?)
            .args(args)
            .env("AX_SERVER", self.endpoint())
            .output()
            .context("running axctl")
    }

    /// Stops one worker (draining) and waits until it has stopped.
    pub async fn stop_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let index = self
            .workers
            .iter()
            .position(|(worker, _, _)| worker == id)
            .with_context(|| format!("no worker {id}"))?;
        let (_, cancel, handle) = self.workers.remove(index);
        cancel.cancel();
        match tokio::time::timeout(Duration::from_secs(30), handle).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => bail!("worker {id} failed: {err:#}"),
            Ok(Err(err)) => bail!("worker {id} panicked: {err}"),
            Err(_) => bail!("worker {id} did not stop within 30 s"),
        }
    }

    /// Stops the workers (draining), then the scheduler, then drops the test database.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        for (_, cancel, _) in &self.workers {
            cancel.cancel();
        }
        for (id, _, handle) in self.workers {
            match tokio::time::timeout(Duration::from_secs(30), handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => bail!("worker {id} failed: {err:#}"),
                Ok(Err(err)) => bail!("worker {id} panicked: {err}"),
                Err(_) => bail!("worker {id} did not stop within 30 s"),
            }
        }
        self.scheduler.shutdown().await?;
        self.db.drop_database().await
    }
}

/// A minimal HTTP endpoint on loopback that answers 200 to every POST and keeps the bodies,
/// standing in for a webhook receiver.
pub struct WebhookReceiver {
    pub url: String,
    bodies: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl WebhookReceiver {
    pub async fn start() -> anyhow::Result<WebhookReceiver> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buffer).to_string();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..head_end]
                            .lines()
                            .find_map(|line| {
                                let (name, value) = line.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buffer.len() < head_end + 4 + length {
                            continue;
                        }
                        let body =
                            String::from_utf8_lossy(&buffer[head_end + 4..head_end + 4 + length])
                                .to_string();
                        kept.lock().unwrap_or_else(|p| p.into_inner()).push(body);
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        buffer.clear();
                    }
                });
            }
        });
        Ok(WebhookReceiver { url, bodies, task })
    }

    pub fn bodies(&self) -> Vec<String> {
        self.bodies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A state directory of its own for an in-process worker (`WorkerOptions::state_dir`): the
/// default, `<temp dir>/ax-worker-<id>`, is shared by every worker of an id on the host, and
/// tests run side by side with the same ids would take each other's ends.
pub fn fresh_state_dir() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "ax-test-state-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A binary of this workspace, built next to the test executable (`cargo test --workspace`
/// builds every binary before it runs any test).
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test binary> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("locating the target directory")?;
    built(
        profile_dir,
        name,
        "run `cargo build --bins` (or `cargo test --workspace`) first",
    )
}

/// `dir/name` when it exists; otherwise an error that says where it was looked for and `how` to
/// build it.
pub(crate) fn built(dir: &Path, name: &str, how: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        bail!("{} is not built; {how}", path.display());
    }
    Ok(path)
}

/// The tests of each named scenario `async fn NAME(backend: Backend)` of the calling module, on
/// a four-thread runtime each: `MODULE::sqlite::NAME`, and `MODULE::mysql::NAME`, which
/// requires [`requirements::MYSQL`].
/// `on_every_backend!(requires(&BROWSER); NAME, …)` adds requirements to both.
#[macro_export]
macro_rules! on_every_backend {
    (requires($($requirement:expr),+ $(,)?); $($scenario:ident),* $(,)?) => {
        $crate::on_every_backend!($($scenario),*)
            .into_iter()
            .map(|test| test$(.requires($requirement))+)
            .collect::<Vec<_>>()
    };
    ($($scenario:ident),* $(,)?) => {
        vec![$(
            $crate::harness::Test::on_tokio(
                $crate::harness::test_name(module_path!(), concat!("sqlite::", stringify!($scenario))),
                $crate::harness::Runtime::MultiThread(Some(4)),
                || $scenario($crate::Backend::Sqlite),
            ),
            $crate::harness::Test::on_tokio(
                $crate::harness::test_name(module_path!(), concat!("mysql::", stringify!($scenario))),
                $crate::harness::Runtime::MultiThread(Some(4)),
                || $scenario($crate::Backend::MySql),
            )
            .requires(&$crate::harness::MYSQL),
        )*]
    };
}
