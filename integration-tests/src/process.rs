//! A sandbox of real processes: the built `ax-scheduler`, `ax-worker` and `axctl` binaries, each
//! with its output in a file of the test's own temporary directory. Every child is killed when the
//! sandbox is dropped, and a panicking test prints every child's log, so a failure shows what the
//! schedulers and the workers were doing. Waits give up after generous hang guards; nothing here
//! measures time.
//!
//! A sandbox has one scheduler node or several (`n1` … `nN` on one MySQL database, each on a
//! port of its own that a restart keeps, optionally each behind a [`TcpProxy`] to MySQL that the
//! test can cut or blackhole). Workers are given every node's endpoint, each starting at a
//! different node, so they spread over the nodes and move to the next when theirs goes away.
//! The single-node calls ([`ProcessCluster::endpoint`], [`ProcessCluster::start_scheduler`],
//! [`ProcessCluster::take_scheduler`]) are about `n1`.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::client::TestClient;
use crate::proxy::TcpProxy;
use crate::{Backend, TestDb, binary, built, redis_url, unique_suffix};

/// How long any single wait may take before the test gives up. A hang guard, not a measurement.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// The interval of worker heartbeats in the sandbox, short so liveness shows up quickly.
const HEARTBEAT_INTERVAL: &str = "500ms";

/// The log level of a test's processes: tests read their `info` lines.
/// The `RUST_LOG` of the processes a test starts: `AX_TEST_TRACE` when set (it must keep
/// `info`, which tests read: `info,ax_worker=debug`), else `info`.
fn test_log() -> String {
    std::env::var("AX_TEST_TRACE").unwrap_or_else(|_| "info".into())
}

/// How often a scheduler start is retried when its port was taken by someone else meanwhile.
const BIND_ATTEMPTS: u32 = 10;

/// One child process with its stdout and stderr in one log file.
pub struct Process {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
    /// The child is a wrapper (`faketime`) that runs the program as a child of its own: the
    /// wrapper leads a process group, and every signal goes to the whole group, so that the
    /// program never outlives it.
    group: bool,
}

impl Process {
    /// Starts `program` in `dir`, without any inherited `AX_*` setting that could point it
    /// elsewhere, writing its stdout and stderr to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        Self::start(name, program, args, dir, log, false, Some(&test_log()))
    }

    /// [`Process::spawn`] for a wrapper whose program is its child (`faketime PROGRAM …`): both
    /// get every signal, and both die when the process is dropped. The wrapper dies of a
    /// SIGTERM (it does not pass it on), so after [`Process::terminate`] its exit status says
    /// only that it was signalled.
    pub fn spawn_wrapper(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        Self::start(name, program, args, dir, log, true, Some(&test_log()))
    }

    /// `RUST_LOG` is `rust_log`, or unset (the program's default) when `None`.
    fn start(
        name: &str,
        program: &Path,
        args: &[String],
        dir: &Path,
        log: PathBuf,
        group: bool,
        rust_log: Option<&str>,
    ) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let stderr = file.try_clone()?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .kill_on_drop(true);
        clear_ax_env(&mut command);
        // Tests read these logs (a scheduler's "scheduler starting", a worker's fencing): the
        // level is the cluster's, not the caller's environment's.
        match rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        if group {
            command.process_group(0);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Process {
            name: name.into(),
            child,
            log,
            group,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's pid while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGTERM. The child is not reaped before [`Process::wait_exit`], so its pid cannot
    /// have been reused by another process.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let pid = self
            .child
            .id()
            .with_context(|| format!("{} has already been reaped", self.name))?;
        let target = if self.group {
            format!("-{pid}")
        } else {
            pid.to_string()
        };
        let status = std::process::Command::new("kill")
            .args(["-TERM", "--", &target])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -TERM {target} ({}) failed: {status}", self.name);
        }
        Ok(())
    }

    /// Waits for the child to exit, or fails (leaving it to be killed on drop) after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => bail!("{} did not exit within {timeout:?}", self.name),
        }
    }

    /// Whether `status`, the child's after [`Process::terminate`], is a clean exit: status 0,
    /// or for a wrapper the SIGTERM it dies of.
    pub fn exited_cleanly(&self, status: ExitStatus) -> bool {
        status.success() || (self.group && status.signal() == Some(libc::SIGTERM))
    }

    /// Kills the child (and, for a wrapper, its program) with SIGKILL and reaps it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.kill_group();
        self.child
            .kill()
            .await
            .with_context(|| format!("killing {}", self.name))
    }

    /// SIGKILL to a wrapper's process group while the wrapper is not reaped (so the group id
    /// is still its own).
    fn kill_group(&self) {
        if let Some(pid) = self.child.id().filter(|_| self.group)
            && let Ok(pid) = i32::try_from(pid)
            && pid > 1
        {
            // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses a
            // group.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }

    /// The exit status when the child has already exited.
    pub fn try_exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Everything the child wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // `kill_on_drop` kills the wrapper alone; its program would be left running.
        self.kill_group();
    }
}

fn clear_ax_env(command: &mut tokio::process::Command) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("AX_") {
            command.env_remove(key);
        }
    }
}

/// What one `axctl` invocation did.
#[derive(Debug)]
pub struct CtlOutput {
    pub args: Vec<String>,
    /// `None` when it was killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for CtlOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "axctl {} exited with {:?}\n--- stdout\n{}--- stderr\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }
}

/// Where the scheduler processes of a [`ProcessCluster`] keep its start locks and dedup markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisChoice {
    /// In-process guards.
    None,
    /// The shared test Redis of `AX_TEST_REDIS_URL` (the test requires
    /// [`crate::requirements::REDIS`]).
    FromEnv,
    /// A Redis of the test's own, e.g. a [`crate::redis_server::RedisServer`].
    Url(String),
}

/// How many scheduler processes a [`ProcessCluster`] has and how they are started. Durations
/// are in the flags' syntax (`300ms`, `2s`); `None` keeps the scheduler's default. The default
/// is the test sandbox's: short intervals, so that liveness, leases and moves show up quickly.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub redis: RedisChoice,
    /// The worker heartbeat interval of the nodes, and of the workers that set none.
    pub heartbeat_interval: Option<String>,
    pub task_heartbeat_interval: Option<String>,
    pub dead_after_missed_heartbeats: Option<u32>,
    pub timeout_grace: Option<String>,
    /// `--node-lease`: short, so a node restarted after kill -9 takes its id back within a
    /// second (it watches the old lease for two fifths of it).
    pub node_lease: Option<String>,
    /// Runs the scheduler under `faketime -f SHIFT` (e.g. `+30s`): its own clock is off by it.
    pub clock_shift: Option<String>,
    /// Scheduler nodes `n1` … `nN` on the one store; more than one needs MySQL.
    pub nodes: usize,
    /// Puts a [`TcpProxy`] between each node and MySQL, so that a test can partition one node
    /// from the database ([`ProcessCluster::database_proxy`]).
    pub database_proxies: bool,
    /// `--spread-interval`: short, so workers spread over the nodes within seconds.
    pub spread_interval: Option<String>,
    /// `--otlp-endpoint`: the nodes export traces there.
    pub otlp_endpoint: Option<String>,
    /// Runs the scheduler under `prlimit --nofile=N`: it may hold at most N open files.
    pub open_files: Option<u32>,
    /// Each node's own store url, node `i` taking the `i`-th (a member of a multi-primary
    /// cluster each); every node takes the cluster's when empty.
    pub node_store_urls: Vec<String>,
    /// Further flags, given as they are.
    pub extra_args: Vec<String>,
    /// `RUST_LOG` of every process; unset (the programs' default) when `None`. The cluster
    /// waits for a node's `info` line "scheduler starting".
    pub rust_log: Option<String>,
    /// The directory of another build's `ax-scheduler` (a previous release) that every node
    /// starts from until [`ProcessCluster::set_node_binaries`] says otherwise; the cluster's own
    /// build when `None`.
    pub binaries: Option<PathBuf>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        SchedulerSettings {
            redis: RedisChoice::None,
            heartbeat_interval: Some(HEARTBEAT_INTERVAL.into()),
            task_heartbeat_interval: None,
            dead_after_missed_heartbeats: None,
            timeout_grace: None,
            node_lease: Some("2s".into()),
            spread_interval: Some("1s".into()),
            clock_shift: None,
            nodes: 1,
            database_proxies: false,
            otlp_endpoint: None,
            open_files: None,
            node_store_urls: Vec::new(),
            extra_args: Vec::new(),
            rust_log: Some(test_log()),
            binaries: None,
        }
    }
}

/// How a worker process of a [`ProcessCluster`] is started. `None` keeps the worker's default,
/// except the heartbeat interval, which defaults to the nodes'.
#[derive(Debug, Clone, Default)]
pub struct WorkerSettings {
    /// The scheduler endpoint it connects to, e.g. a [`TcpProxy`] in front of the scheduler;
    /// every node's when `None`, starting at the next node in turn (the first worker id at
    /// `n1`, the second at `n2`, …; a worker started again under its id starts where it did).
    pub endpoint: Option<String>,
    pub capacity: Option<u32>,
    pub heartbeat_interval: Option<String>,
    pub task_heartbeat_interval: Option<String>,
    pub kill_grace: Option<String>,
    /// `--self-fence-after` (a duration, or `off`).
    pub self_fence_after: Option<String>,
    /// `--label KEY=VALUE` each.
    pub labels: Vec<(String, String)>,
    /// `--otlp-endpoint`: the worker exports its spans there.
    pub otlp_endpoint: Option<String>,
    /// The directory of another build's `ax-worker` (a previous release,
    /// [`crate::previous_release`]); this build's when `None`. Such a worker is given its state
    /// directory as `--spill-dir`, the name 0.1.0 knows (this build takes it too).
    pub binaries: Option<PathBuf>,
}

/// One scheduler node of a [`ProcessCluster`].
struct SchedulerNode {
    id: String,
    /// Chosen at the first start, kept by every restart so that workers find the node again.
    port: u16,
    /// The store url the node is started with: the cluster's, or its proxy's in front of MySQL.
    store_url: String,
    database_proxy: Option<TcpProxy>,
    process: Option<Process>,
    starts: u32,
    /// The directory of another build's `ax-scheduler` (a previous release); the cluster's when
    /// `None`. Taken by the node's next start.
    binaries: Option<PathBuf>,
}

/// Where a [`ProcessCluster`] that is not a test's sandbox runs: the benchmark harness's
/// binaries, a store it made (and drops), and a directory it may keep.
pub struct Site {
    pub bin_dir: PathBuf,
    pub store_url: String,
    pub dir: PathBuf,
}

/// A cluster's scratch directory: a test's, removed with it, or a [`Site`]'s.
enum Scratch {
    Test(tempfile::TempDir),
    Site(PathBuf),
}

impl Scratch {
    fn path(&self) -> &Path {
        match self {
            Scratch::Test(dir) => dir.path(),
            Scratch::Site(dir) => dir,
        }
    }
}

/// Scheduler processes, their workers, their store and their scratch directory.
pub struct ProcessCluster {
    dir: Scratch,
    /// The test's database, dropped with the cluster; `None` on a [`Site`].
    db: Option<TestDb>,
    store_url: String,
    /// Where the binaries are: next to the test executable when `None`.
    bin_dir: Option<PathBuf>,
    redis: Option<(String, String)>,
    settings: SchedulerSettings,
    nodes: Vec<SchedulerNode>,
    workers: Vec<Process>,
    /// Every worker id started, in order of first start: where each starts among the nodes.
    worker_ids: Vec<String>,
    /// Every log file written, in start order, for the dump of a failed test.
    logs: Vec<(String, PathBuf)>,
}

impl ProcessCluster {
    /// A fresh store (and, with `with_redis`, a fresh Redis namespace) and a running scheduler
    /// process.
    pub async fn start(backend: Backend, with_redis: bool) -> anyhow::Result<Self> {
        let redis = if with_redis {
            RedisChoice::FromEnv
        } else {
            RedisChoice::None
        };
        let settings = SchedulerSettings {
            redis,
            ..SchedulerSettings::default()
        };
        Self::start_with(backend, settings).await
    }

    /// Like [`ProcessCluster::start`], with the number of nodes, their intervals and Redis
    /// chosen by the test; a restart of a node keeps them. Every node is up when it returns.
    pub async fn start_with(backend: Backend, settings: SchedulerSettings) -> anyhow::Result<Self> {
        if backend == Backend::Sqlite && (settings.nodes > 1 || settings.database_proxies) {
            bail!("one SQLite file serves one node, reached without a proxy: use MySQL");
        }
        let dir = tempfile::tempdir()?;
        let db = TestDb::create(backend, dir.path()).await?;
        let store_url = db.url.clone();
        Self::launch(Scratch::Test(dir), Some(db), store_url, None, settings).await
    }

    /// The nodes of `settings` on `db` of the Galera cluster, node `i` on member `i` (wrapping
    /// around), unless `settings` names the members. The database is the caller's to drop.
    pub async fn start_on_galera(
        db: &crate::galera::GaleraDb,
        mut settings: SchedulerSettings,
    ) -> anyhow::Result<Self> {
        if settings.node_store_urls.is_empty() {
            settings.node_store_urls = (0..settings.nodes)
                .map(|i| db.url(i % crate::galera::MEMBERS + 1))
                .collect();
        }
        let dir = tempfile::tempdir()?;
        Self::launch(Scratch::Test(dir), None, db.url(1), None, settings).await
    }

    /// The nodes of `settings` on a [`Site`]'s store, binaries and directory. The store is the
    /// site's to drop.
    pub async fn start_at(site: Site, settings: SchedulerSettings) -> anyhow::Result<Self> {
        if site.store_url.starts_with("sqlite:") && settings.nodes > 1 {
            bail!(
                "{} scheduler nodes need MySQL: one SQLite file serves one node",
                settings.nodes
            );
        }
        Self::launch(
            Scratch::Site(site.dir),
            None,
            site.store_url,
            Some(site.bin_dir),
            settings,
        )
        .await
    }

    async fn launch(
        dir: Scratch,
        db: Option<TestDb>,
        store_url: String,
        bin_dir: Option<PathBuf>,
        settings: SchedulerSettings,
    ) -> anyhow::Result<Self> {
        if settings.nodes == 0 {
            bail!("a cluster needs at least one scheduler node");
        }
        let namespace = format!("ax-proc-{}", unique_suffix());
        let redis = match &settings.redis {
            RedisChoice::None => None,
            RedisChoice::FromEnv => Some((redis_url()?, namespace)),
            RedisChoice::Url(url) => Some((url.clone(), namespace)),
        };
        let mut nodes = Vec::with_capacity(settings.nodes);
        for n in 1..=settings.nodes {
            let (node_store_url, database_proxy) = if settings.database_proxies {
                let proxy = TcpProxy::start(mysql_address(&store_url)?)
                    .await
                    .context("starting a proxy to MySQL")?;
                (mysql_url_through(&store_url, proxy.addr())?, Some(proxy))
            } else if let Some(url) = settings.node_store_urls.get(n - 1) {
                (url.clone(), None)
            } else {
                (store_url.clone(), None)
            };
            nodes.push(SchedulerNode {
                id: format!("n{n}"),
                port: 0,
                store_url: node_store_url,
                database_proxy,
                process: None,
                starts: 0,
                binaries: settings.binaries.clone(),
            });
        }
        let mut cluster = ProcessCluster {
            db,
            dir,
            store_url,
            bin_dir,
            redis,
            settings,
            nodes,
            workers: Vec::new(),
            worker_ids: Vec::new(),
            logs: Vec::new(),
        };
        for index in 0..cluster.nodes.len() {
            cluster.start_node(index).await?;
        }
        Ok(cluster)
    }

    /// The scratch directory; a test's lives as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The url of the cluster's store, straight to the database (not through a node's proxy),
    /// for a test to read it itself.
    pub fn store_url(&self) -> &str {
        &self.store_url
    }

    /// The endpoint of `n1`.
    pub fn endpoint(&self) -> String {
        self.node_endpoint(0)
    }

    /// How many scheduler nodes the cluster has, running or not.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The id of node `index` (from 0): `n1` for 0.
    pub fn node_id(&self, index: usize) -> &str {
        &self.nodes[index].id
    }

    /// The endpoint of node `index` (from 0), also while it is down.
    pub fn node_endpoint(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[index].port)
    }

    /// Whether node `index` has a process that has not been taken out.
    pub fn node_running(&self, index: usize) -> bool {
        self.nodes[index].process.is_some()
    }

    /// The proxy between node `index` and MySQL, when the cluster was started with
    /// `database_proxies`.
    pub fn database_proxy(&self, index: usize) -> anyhow::Result<&TcpProxy> {
        let node = &self.nodes[index];
        node.database_proxy
            .as_ref()
            .with_context(|| format!("node {} has no proxy to the database", node.id))
    }

    /// Starts `n1` again after it was taken out: [`ProcessCluster::start_node`] of node 0.
    pub async fn start_scheduler(&mut self) -> anyhow::Result<()> {
        self.start_node(0).await
    }

    /// Starts node `index` and waits until it accepts connections. The first start takes a free
    /// port; a restart keeps the node's id and port, so workers find the node again (after a
    /// kill -9 the node first waits out its old incarnation's lease). Either way a start that
    /// lost its port to another process is retried.
    pub async fn start_node(&mut self, index: usize) -> anyhow::Result<()> {
        if self.nodes[index].process.is_some() {
            bail!("scheduler {} is already running", self.nodes[index].id);
        }
        let keep_port = self.nodes[index].port != 0;
        for _ in 0..BIND_ATTEMPTS {
            if !keep_port {
                self.nodes[index].port = free_port()?;
            }
            let port = self.nodes[index].port;
            let mut process = self.spawn_scheduler(index)?;
            match wait_listening(&mut process, port).await? {
                true => {
                    self.nodes[index].process = Some(process);
                    return Ok(());
                }
                false if is_bind_failure(&process.log_text()) => {
                    // Someone took the port between our probe and the scheduler's bind.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                false => bail!(
                    "{} exited before listening:\n{}",
                    process.name(),
                    process.log_text()
                ),
            }
        }
        bail!(
            "scheduler {} could not bind a port in {BIND_ATTEMPTS} attempts (last {})",
            self.nodes[index].id,
            self.nodes[index].port
        )
    }

    /// Runs node `index`, from its next start on, from the `ax-scheduler` in `binaries` (another
    /// build: a previous release), or from the cluster's own with `None`.
    pub fn set_node_binaries(&mut self, index: usize, binaries: Option<PathBuf>) {
        self.nodes[index].binaries = binaries;
    }

    /// Kills node `index` with SIGKILL (a crash: no lease given up, no stream closed cleanly)
    /// and reaps it; its log stays in the dump of a failed test.
    pub async fn kill_node(&mut self, index: usize) -> anyhow::Result<()> {
        let mut process = self.take_node(index)?;
        process.kill().await
    }

    /// Stops node `index` with SIGTERM and waits, under the hang guard, for it to exit with
    /// status 0.
    pub async fn stop_node(&mut self, index: usize) -> anyhow::Result<()> {
        let mut process = self.take_node(index)?;
        process.terminate()?;
        let status = process.wait_exit(HANG_GUARD).await?;
        if !process.exited_cleanly(status) {
            bail!("{} exited with {status} after SIGTERM", process.name());
        }
        Ok(())
    }

    /// Takes node `index`'s process out of the cluster, e.g. to stop it and start another.
    pub fn take_node(&mut self, index: usize) -> anyhow::Result<Process> {
        let node = &mut self.nodes[index];
        node.process
            .take()
            .with_context(|| format!("scheduler {} is not running", node.id))
    }

    fn spawn_scheduler(&mut self, index: usize) -> anyhow::Result<Process> {
        let program = match &self.nodes[index].binaries {
            Some(dir) => built(dir, "ax-scheduler", ".ci/build-previous-release builds it")?,
            None => self.binary("ax-scheduler")?,
        };
        let node = &mut self.nodes[index];
        node.starts += 1;
        let name = format!("ax-scheduler {}#{}", node.id, node.starts);
        let listen = format!("127.0.0.1:{}", node.port);
        let mut args = vec![
            "--store".to_string(),
            node.store_url.clone(),
            "--listen".into(),
            listen.clone(),
            "--advertise".into(),
            format!("http://{listen}"),
            "--node-id".into(),
            node.id.clone(),
        ];
        let optional = [
            ("--heartbeat-interval", &self.settings.heartbeat_interval),
            (
                "--task-heartbeat-interval",
                &self.settings.task_heartbeat_interval,
            ),
            ("--node-lease", &self.settings.node_lease),
            ("--spread-interval", &self.settings.spread_interval),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                args.extend([flag.to_string(), value.clone()]);
            }
        }
        if let Some(endpoint) = &self.settings.otlp_endpoint {
            args.extend(["--otlp-endpoint".into(), endpoint.clone()]);
        }
        if let Some(missed) = self.settings.dead_after_missed_heartbeats {
            args.extend(["--dead-after-missed-heartbeats".into(), missed.to_string()]);
        }
        if let Some(grace) = &self.settings.timeout_grace {
            args.extend(["--timeout-grace".into(), grace.clone()]);
        }
        if let Some((url, namespace)) = &self.redis {
            args.extend([
                "--redis".into(),
                url.clone(),
                "--redis-namespace".into(),
                namespace.clone(),
            ]);
        }
        args.extend(self.settings.extra_args.iter().cloned());
        if let Some(limit) = self.settings.open_files {
            if self.settings.clock_shift.is_some() {
                bail!("a scheduler runs under faketime or prlimit, not both");
            }
            // prlimit sets the limit and execs the scheduler: the pid is the scheduler's.
            let mut limited = vec![
                format!("--nofile={limit}"),
                "--".into(),
                program.display().to_string(),
            ];
            limited.extend(args);
            return self.spawn_program(&name, Path::new("prlimit"), &limited, false);
        }
        match self.settings.clock_shift.clone() {
            Some(shift) => {
                let mut shifted = vec!["-f".to_string(), shift, program.display().to_string()];
                shifted.extend(args);
                self.spawn_program(&name, Path::new("faketime"), &shifted, true)
            }
            None => self.spawn_program(&name, &program, &args, false),
        }
    }

    fn log_path(&mut self, name: &str) -> PathBuf {
        let log = self
            .dir
            .path()
            .join(format!("{}.log", name.replace('#', "-")));
        self.logs.push((name.to_string(), log.clone()));
        log
    }

    /// Starts `program` (a wrapper of its child when `group`) with the cluster's log level and
    /// its log among the cluster's.
    fn spawn_program(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        group: bool,
    ) -> anyhow::Result<Process> {
        let log = self.log_path(name);
        let rust_log = self.settings.rust_log.clone();
        Process::start(
            name,
            program,
            args,
            self.dir.path(),
            log,
            group,
            rust_log.as_deref(),
        )
    }

    /// A binary of this workspace: the site's, or the one built next to the test executable.
    fn binary(&self, name: &str) -> anyhow::Result<PathBuf> {
        match &self.bin_dir {
            Some(dir) => built(
                dir,
                name,
                "build it with `cargo build --release --bins` or point --bin-dir at it",
            ),
            None => binary(name),
        }
    }

    /// Every node's endpoint, starting at node `first` and going round.
    fn endpoints_from(&self, first: usize) -> Vec<String> {
        (0..self.nodes.len())
            .map(|step| self.node_endpoint((first + step) % self.nodes.len()))
            .collect()
    }

    /// Starts a worker process connected to the schedulers. It is not waited for: see
    /// [`TestClient::wait_worker_live`].
    pub fn start_worker(&mut self, id: &str) -> anyhow::Result<()> {
        self.start_worker_with(id, &WorkerSettings::default())
    }

    /// Starts a worker process with the test's settings. It is not waited for.
    pub fn start_worker_with(&mut self, id: &str, settings: &WorkerSettings) -> anyhow::Result<()> {
        let heartbeat = settings
            .heartbeat_interval
            .clone()
            .or_else(|| self.settings.heartbeat_interval.clone());
        let first = match self.worker_ids.iter().position(|known| known == id) {
            Some(position) => position,
            None => {
                self.worker_ids.push(id.to_string());
                self.worker_ids.len() - 1
            }
        };
        let endpoints = match &settings.endpoint {
            Some(endpoint) => endpoint.clone(),
            None => self.endpoints_from(first % self.nodes.len()).join(","),
        };
        // The cluster's own state directory per id (kept across restarts under that id, as a
        // host's would be): parallel tests name their workers alike, and the default one in the
        // temp dir would mix their ends, spill and $AX_OUTPUT files.
        let state_dir = self.worker_state_dir(id);
        let state_flag = match settings.binaries {
            Some(_) => "--spill-dir",
            None => "--state-dir",
        };
        let mut args = vec![
            "--scheduler".to_string(),
            endpoints,
            "--id".into(),
            id.into(),
            state_flag.into(),
            state_dir.display().to_string(),
        ];
        let optional = [
            ("--heartbeat-interval", heartbeat),
            ("--capacity", settings.capacity.map(|c| c.to_string())),
            (
                "--task-heartbeat-interval",
                settings.task_heartbeat_interval.clone(),
            ),
            ("--kill-grace", settings.kill_grace.clone()),
            ("--self-fence-after", settings.self_fence_after.clone()),
            ("--otlp-endpoint", settings.otlp_endpoint.clone()),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                args.extend([flag.to_string(), value]);
            }
        }
        for (key, value) in &settings.labels {
            args.extend(["--label".to_string(), format!("{key}={value}")]);
        }
        // A worker started again under the same id gets a log file of its own.
        let starts = self
            .workers
            .iter()
            .filter(|w| w.name.starts_with(&format!("ax-worker {id}")))
            .count();
        let name = if starts == 0 {
            format!("ax-worker {id}")
        } else {
            format!("ax-worker {id}#{}", starts + 1)
        };
        let program = match &settings.binaries {
            Some(dir) => built(dir, "ax-worker", ".ci/build-previous-release builds it")?,
            None => self.binary("ax-worker")?,
        };
        let process = self.spawn_program(&name, &program, &args, false)?;
        self.workers.push(process);
        Ok(())
    }

    /// The state directory of worker `id` (`--state-dir`), kept across its restarts.
    pub fn worker_state_dir(&self, id: &str) -> PathBuf {
        self.dir().join(format!("state-{id}"))
    }

    /// The Redis the nodes keep their guards in and their namespace, when they use one.
    pub fn redis(&self) -> Option<(&str, &str)> {
        self.redis
            .as_ref()
            .map(|(url, namespace)| (url.as_str(), namespace.as_str()))
    }

    /// Stops worker `id` with SIGTERM (it drains: takes no new dispatch, lets its running
    /// attempts end and reports them) and waits, under the hang guard, for a clean exit; takes
    /// it out of the cluster.
    pub async fn stop_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let index = self
            .worker_index(id)
            .with_context(|| format!("no worker {id}"))?;
        let mut worker = self.workers.remove(index);
        worker.terminate()?;
        let status = worker.wait_exit(HANG_GUARD).await?;
        if !worker.exited_cleanly(status) {
            bail!("{} exited with {status} after SIGTERM", worker.name);
        }
        Ok(())
    }

    /// Starts a worker process with the test's settings and waits, under the hang guard, until
    /// the scheduler reports it LIVE.
    pub async fn start_live_worker(
        &mut self,
        id: &str,
        settings: &WorkerSettings,
    ) -> anyhow::Result<()> {
        self.start_worker_with(id, settings)?;
        self.client().await?.wait_worker_live(id, HANG_GUARD).await
    }

    /// Kills worker `id` with SIGKILL (a crash: it cannot clean up), reaps it and takes it out
    /// of the cluster; its log stays in the dump of a failed test. Returns the pid it had.
    pub async fn kill_worker(&mut self, id: &str) -> anyhow::Result<u32> {
        let pid = self
            .worker(id)?
            .pid()
            .context("the worker was already reaped")?;
        let index = self
            .workers
            .iter()
            .rposition(|w| w.pid() == Some(pid))
            .context("the worker vanished")?;
        let mut worker = self.workers.remove(index);
        worker.kill().await?;
        Ok(pid)
    }

    /// The pids of the running nodes, in node order.
    pub fn node_pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|node| node.process.as_ref()?.pid())
            .collect()
    }

    /// The pids of the running workers.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers.iter().filter_map(Process::pid).collect()
    }

    /// The pid of the latest process started as worker `id`.
    pub fn worker_pid(&self, id: &str) -> anyhow::Result<u32> {
        self.worker_index(id)
            .and_then(|index| self.workers[index].pid())
            .with_context(|| format!("no running worker {id}"))
    }

    /// Where the latest process started under worker id `id` is in `workers`.
    fn worker_index(&self, id: &str) -> Option<usize> {
        let name = format!("ax-worker {id}");
        let again = format!("{name}#");
        self.workers
            .iter()
            .rposition(|w| w.name == name || w.name.starts_with(&again))
    }

    /// The port `n1` listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.nodes[0].port
    }

    /// Everything every scheduler process wrote so far, running or taken out, in start order.
    pub fn scheduler_logs(&self) -> String {
        self.logs_of("ax-scheduler ")
    }

    /// Everything every process of node `index` wrote so far, in start order.
    pub fn node_logs(&self, index: usize) -> String {
        self.logs_of(&format!("ax-scheduler {}#", self.nodes[index].id))
    }

    fn logs_of(&self, prefix: &str) -> String {
        self.logs
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, path)| std::fs::read_to_string(path).unwrap_or_default())
            .collect()
    }

    /// A client of `n1`'s control API.
    pub async fn client(&self) -> anyhow::Result<TestClient> {
        TestClient::connect(&self.endpoint()).await
    }

    /// A client of node `index`'s control API. It reconnects by itself after a restart.
    pub async fn node_client(&self, index: usize) -> anyhow::Result<TestClient> {
        TestClient::connect(&self.node_endpoint(index)).await
    }

    /// Prints every log of the sandbox to stderr (a failing test does it by itself on drop).
    pub fn print_logs(&self) {
        for (name, path) in &self.logs {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            eprintln!(
                "===== {name} ({})\n{text}===== end of {name}",
                path.display()
            );
        }
    }

    /// `n1`'s process.
    pub fn scheduler(&mut self) -> anyhow::Result<&mut Process> {
        self.nodes[0]
            .process
            .as_mut()
            .context("the scheduler is not running")
    }

    /// Takes `n1`'s process out of the cluster, e.g. to stop it and start another.
    pub fn take_scheduler(&mut self) -> anyhow::Result<Process> {
        self.take_node(0)
    }

    /// The latest process started under worker id `id`.
    pub fn worker(&mut self, id: &str) -> anyhow::Result<&mut Process> {
        let index = self
            .worker_index(id)
            .with_context(|| format!("no worker {id}"))?;
        Ok(&mut self.workers[index])
    }

    /// Runs the real `axctl` against `n1`, under the hang guard.
    pub async fn axctl(&self, args: &[&str]) -> anyhow::Result<CtlOutput> {
        let mut command = tokio::process::Command::new(self.binary("axctl")?);
        clear_ax_env(&mut command);
        command
            .args(args)
            .env("AX_SERVER", self.endpoint())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(HANG_GUARD, command.output())
            .await
            .with_context(|| format!("axctl {} did not end within {HANG_GUARD:?}", args.join(" ")))?
            .context("running axctl")?;
        Ok(CtlOutput {
            args: args.iter().map(|a| a.to_string()).collect(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Stops the workers, then the schedulers, each with SIGTERM, checks that every one exits
    /// with status 0, and drops the test database.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let mut workers = std::mem::take(&mut self.workers);
        for worker in &workers {
            if worker.child.id().is_some() {
                worker.terminate()?;
            }
        }
        for worker in &mut workers {
            let status = worker.wait_exit(HANG_GUARD).await?;
            if !worker.exited_cleanly(status) {
                bail!("{} exited with {status}", worker.name);
            }
        }
        let mut schedulers: Vec<Process> = self
            .nodes
            .iter_mut()
            .filter_map(|node| node.process.take())
            .collect();
        // All at once: a node stopping alone would hand its workers to the others first.
        for scheduler in &schedulers {
            scheduler.terminate()?;
        }
        for scheduler in &mut schedulers {
            let status = scheduler.wait_exit(HANG_GUARD).await?;
            if !scheduler.exited_cleanly(status) {
                bail!("{} exited with {status}", scheduler.name);
            }
        }
        // A proxy's connections end with it, so none holds a lock the drop would wait for.
        self.nodes.clear();
        if let Some(db) = self.db.take() {
            db.drop_database().await?;
        }
        Ok(())
    }
}

impl ProcessCluster {
    /// Stops the workers, then the nodes, each with SIGTERM, and kills what has not exited
    /// within its grace; how they exited is not judged (a benchmark's end, not a test's).
    pub async fn stop(mut self, worker_grace: Duration, node_grace: Duration) {
        stop_all(std::mem::take(&mut self.workers), worker_grace).await;
        let nodes = self
            .nodes
            .iter_mut()
            .filter_map(|node| node.process.take())
            .collect();
        stop_all(nodes, node_grace).await;
    }
}

/// SIGTERM to every process, then SIGKILL to each still running after `grace`.
async fn stop_all(mut processes: Vec<Process>, grace: Duration) {
    for process in &processes {
        if process.pid().is_some() {
            let _ = process.terminate();
        }
    }
    for process in &mut processes {
        if process.wait_exit(grace).await.is_err() {
            let _ = process.kill().await;
        }
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        // The children go first (`kill_on_drop`), and the proxies with them: a connection that
        // a blackholed proxy holds open keeps its transaction's locks, and the DROP DATABASE
        // below would wait for them. A test that failed before its `shutdown` still drops its
        // MySQL database, from a thread of its own because `Drop` is not async and may run on a
        // runtime thread.
        self.workers.clear();
        self.nodes.clear();
        if let Some(db) = self.db.take() {
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(db.drop_database())
            })
            .join();
            if let Ok(Err(err)) = dropped {
                eprintln!("cannot drop the test database: {err:#}");
            }
        }
    }
}

/// A loopback port that was free a moment ago. Another process may take it before the
/// program it is for binds it: [`ProcessCluster::start_node`] and the private servers retry then.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}

/// `true` once the scheduler says it bound its port and the port accepts connections, `false`
/// when the process exited first. The scheduler claims its lease before it binds, so a port
/// that answers meanwhile may be another process's: its own "scheduler starting" line, written
/// after the bind, tells.
async fn wait_listening(process: &mut Process, port: u16) -> anyhow::Result<bool> {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        if process.try_exited()?.is_some() {
            return Ok(false);
        }
        if process.log_text().contains("scheduler starting")
            && tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .is_ok()
        {
            // The port answers; make sure it is our process that answers, not a squatter.
            if process.try_exited()?.is_none() {
                return Ok(true);
            }
            return Ok(false);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{} is not listening on port {port} after {HANG_GUARD:?}:\n{}",
                process.name,
                process.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A MySQL store url (`mysql://user@host:port/db`) cut into `mysql://user@`, `host:port` and
/// `/db`.
fn mysql_parts(url: &str) -> anyhow::Result<(&str, &str, &str)> {
    let rest = url
        .strip_prefix("mysql://")
        .with_context(|| format!("{url} is not a MySQL url"))?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let host_start = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    let prefix_end = "mysql://".len() + host_start;
    let path_start = "mysql://".len() + authority_end;
    Ok((
        &url[..prefix_end],
        &url[prefix_end..path_start],
        &url[path_start..],
    ))
}

/// The MySQL server's address in a store url.
fn mysql_address(url: &str) -> anyhow::Result<SocketAddr> {
    let (_, host_port, _) = mysql_parts(url)?;
    host_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {host_port} of {url}"))?
        .next()
        .with_context(|| format!("{host_port} of {url} resolves to no address"))
}

/// A store url with `address` in place of its MySQL server's.
fn mysql_url_through(url: &str, address: SocketAddr) -> anyhow::Result<String> {
    let (prefix, _, path) = mysql_parts(url)?;
    Ok(format!("{prefix}{address}{path}"))
}

fn is_bind_failure(log: &str) -> bool {
    let log = log.to_lowercase();
    log.contains("address already in use") || log.contains("addrinuse")
}

/// Whether process `pid` exists (`kill -0`).
pub fn process_alive(pid: i32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|status| status.success())
        .unwrap_or(false)
}

/// The pid a task wrote to `path` (`echo $$ > FILE`), once it has; panics after `within`, a hang
/// guard.
pub async fn pid_from_file(path: &Path, within: Duration) -> i32 {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no pid in {} after {within:?}: the task never started",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until process `pid` is gone; panics after `within`, a hang guard.
pub async fn wait_gone(pid: i32, within: Duration) {
    let until = tokio::time::Instant::now() + within;
    while process_alive(pid) {
        assert!(
            tokio::time::Instant::now() < until,
            "process {pid} still runs after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault_kit::{pid_alive, wait_pids_gone};

    /// Starts `sh` as a wrapper whose program (`sleep`) is its child, and returns the
    /// program's pid once the wrapper wrote it.
    async fn wrapper(dir: &Path, name: &str) -> (Process, u32) {
        let pid_file = dir.join(format!("{name}.pid"));
        let script = format!("sleep 30 & echo $! > '{}'; wait", pid_file.display());
        let process = Process::spawn_wrapper(
            name,
            Path::new("sh"),
            &["-c".to_string(), script],
            dir,
            dir.join(format!("{name}.log")),
        )
        .expect("the wrapper starts");
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file)
                .unwrap_or_default()
                .trim()
                .parse()
            {
                return (process, pid);
            }
            assert!(tokio::time::Instant::now() < deadline, "no pid written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_wrappers_program_dies_with_it_when_killed_dropped_or_terminated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut killed, program) = wrapper(dir.path(), "killed").await;
        assert!(pid_alive(program));
        killed.kill().await.expect("kill");
        assert_eq!(
            wait_pids_gone(&[program], HANG_GUARD).await,
            Vec::<u32>::new()
        );

        let (dropped, program) = wrapper(dir.path(), "dropped").await;
        drop(dropped);
        assert_eq!(
            wait_pids_gone(&[program], HANG_GUARD).await,
            Vec::<u32>::new()
        );

        let (mut terminated, program) = wrapper(dir.path(), "terminated").await;
        terminated.terminate().expect("SIGTERM");
        let status = terminated.wait_exit(HANG_GUARD).await.expect("exit");
        assert!(terminated.exited_cleanly(status), "{status}");
        assert_eq!(
            wait_pids_gone(&[program], HANG_GUARD).await,
            Vec::<u32>::new()
        );
    }

    #[test]
    fn a_store_url_goes_through_a_proxy() {
        let proxy = SocketAddr::from(([127, 0, 0, 1], 4000));
        assert_eq!(
            mysql_url_through("mysql://root@127.0.0.1:3306/ax_e2e_1", proxy).expect("url"),
            "mysql://root@127.0.0.1:4000/ax_e2e_1"
        );
        assert_eq!(
            mysql_url_through("mysql://u:p@w@127.0.0.1:3306", proxy).expect("url"),
            "mysql://u:p@w@127.0.0.1:4000"
        );
        assert_eq!(
            mysql_address("mysql://127.0.0.1:3306/db").expect("address"),
            SocketAddr::from(([127, 0, 0, 1], 3306))
        );
        assert!(mysql_address("sqlite:///tmp/ax.db").is_err());
    }
}
