//! A sandbox of real processes: the built `ax-scheduler`, `ax-worker` and `axctl` binaries, each
//! with its output in a file of the test's own temporary directory. Every child is killed when the
//! sandbox is dropped, and a panicking test prints every child's log, so a failure shows what the
//! scheduler and the workers were doing. Waits give up after generous hang guards; nothing here
//! measures time.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::client::TestClient;
use crate::{Backend, TestDb, binary, redis_url, unique_suffix};

/// How long any single wait may take before the test gives up. A hang guard, not a measurement.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// The interval of worker heartbeats in the sandbox, short so liveness shows up quickly.
const HEARTBEAT_INTERVAL: &str = "500ms";

/// How often a scheduler start is retried when its port was taken by someone else meanwhile.
const BIND_ATTEMPTS: u32 = 10;

/// One child process with its stdout and stderr in one log file.
pub struct Process {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
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
        // level is the tests', not the caller's environment's.
        command.env("RUST_LOG", "info");
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Process {
            name: name.into(),
            child,
            log,
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
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -TERM {pid} ({}) failed: {status}", self.name);
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

    /// Kills the child with SIGKILL and reaps it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("killing {}", self.name))
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

/// Where the scheduler process of a [`ProcessCluster`] keeps its start locks and dedup markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisChoice {
    /// In-process guards.
    None,
    /// The shared test Redis of `AX_TEST_REDIS_URL` (the cluster is `None` when it is unset).
    FromEnv,
    /// A Redis of the test's own, e.g. a [`crate::redis_server::RedisServer`].
    Url(String),
}

/// How the scheduler process of a [`ProcessCluster`] is started. Durations are in the flags'
/// syntax (`300ms`, `2s`); `None` keeps the scheduler's default.
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub redis: RedisChoice,
    pub heartbeat_interval: String,
    pub task_heartbeat_interval: Option<String>,
    pub dead_after_missed_heartbeats: Option<u32>,
    pub timeout_grace: Option<String>,
    /// `--node-lease`: short, so a node restarted after kill -9 takes its id back within a
    /// second (it watches the old lease for two fifths of it).
    pub node_lease: String,
    /// Runs the scheduler under `faketime -f SHIFT` (e.g. `+30s`): its own clock is off by it.
    pub clock_shift: Option<String>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        SchedulerSettings {
            redis: RedisChoice::None,
            heartbeat_interval: HEARTBEAT_INTERVAL.into(),
            task_heartbeat_interval: None,
            dead_after_missed_heartbeats: None,
            timeout_grace: None,
            node_lease: "2s".into(),
            clock_shift: None,
        }
    }
}

/// How a worker process of a [`ProcessCluster`] is started. `None` keeps the worker's default,
/// except the heartbeat interval, which defaults to the sandbox's short one.
#[derive(Debug, Clone, Default)]
pub struct WorkerSettings {
    /// The scheduler endpoint it connects to, e.g. a [`crate::proxy::TcpProxy`] in front of the
    /// scheduler; the scheduler itself when `None`.
    pub endpoint: Option<String>,
    pub capacity: Option<u32>,
    pub heartbeat_interval: Option<String>,
    pub task_heartbeat_interval: Option<String>,
    pub kill_grace: Option<String>,
    /// `--self-fence-after` (a duration, or `off`).
    pub self_fence_after: Option<String>,
}

/// A scheduler process, its workers, its store and its temporary directory.
pub struct ProcessCluster {
    dir: tempfile::TempDir,
    db: Option<TestDb>,
    store_url: String,
    redis: Option<(String, String)>,
    settings: SchedulerSettings,
    port: u16,
    scheduler: Option<Process>,
    scheduler_starts: u32,
    workers: Vec<Process>,
    /// Every log file written, in start order, for the dump of a failed test.
    logs: Vec<(String, PathBuf)>,
}

impl ProcessCluster {
    /// A fresh store (and, with `with_redis`, a fresh Redis namespace) and a running scheduler
    /// process; `None` when the backend or Redis is not configured here (never under CI).
    pub async fn start(backend: Backend, with_redis: bool) -> anyhow::Result<Option<Self>> {
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

    /// Like [`ProcessCluster::start`], with the scheduler's intervals and Redis chosen by the
    /// test; a restart of the scheduler keeps them.
    pub async fn start_with(
        backend: Backend,
        settings: SchedulerSettings,
    ) -> anyhow::Result<Option<Self>> {
        let namespace = format!("ax-proc-{}", unique_suffix());
        let redis = match &settings.redis {
            RedisChoice::None => None,
            RedisChoice::FromEnv => match redis_url() {
                Some(url) => Some((url, namespace)),
                None => return Ok(None),
            },
            RedisChoice::Url(url) => Some((url.clone(), namespace)),
        };
        let dir = tempfile::tempdir()?;
        let Some(db) = TestDb::create(backend, dir.path()).await? else {
            return Ok(None);
        };
        let mut cluster = ProcessCluster {
            store_url: db.url.clone(),
            db: Some(db),
            dir,
            redis,
            settings,
            port: 0,
            scheduler: None,
            scheduler_starts: 0,
            workers: Vec::new(),
            logs: Vec::new(),
        };
        cluster.start_scheduler().await?;
        Ok(Some(cluster))
    }

    /// The test's scratch directory; it lives as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts the scheduler process and waits until it accepts connections. The first start
    /// takes a free port; a restart keeps the port, so workers find the node again. Either way a
    /// start that lost its port to another process is retried.
    pub async fn start_scheduler(&mut self) -> anyhow::Result<()> {
        if self.scheduler.is_some() {
            bail!("the scheduler is already running");
        }
        let keep_port = self.port != 0;
        for _ in 0..BIND_ATTEMPTS {
            if !keep_port {
                self.port = free_port()?;
            }
            let mut process = self.spawn_scheduler()?;
            match wait_listening(&mut process, self.port).await? {
                true => {
                    self.scheduler = Some(process);
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
            "the scheduler could not bind a port in {BIND_ATTEMPTS} attempts (last {})",
            self.port
        )
    }

    fn spawn_scheduler(&mut self) -> anyhow::Result<Process> {
        self.scheduler_starts += 1;
        let name = format!("ax-scheduler#{}", self.scheduler_starts);
        let mut args = vec![
            "--store".to_string(),
            self.store_url.clone(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.port),
            "--node-id".into(),
            "n1".into(),
            "--heartbeat-interval".into(),
            self.settings.heartbeat_interval.clone(),
        ];
        if let Some(interval) = &self.settings.task_heartbeat_interval {
            args.extend(["--task-heartbeat-interval".into(), interval.clone()]);
        }
        if let Some(missed) = self.settings.dead_after_missed_heartbeats {
            args.extend(["--dead-after-missed-heartbeats".into(), missed.to_string()]);
        }
        if let Some(grace) = &self.settings.timeout_grace {
            args.extend(["--timeout-grace".into(), grace.clone()]);
        }
        args.extend(["--node-lease".into(), self.settings.node_lease.clone()]);
        if let Some((url, namespace)) = &self.redis {
            args.extend([
                "--redis".into(),
                url.clone(),
                "--redis-namespace".into(),
                namespace.clone(),
            ]);
        }
        match self.settings.clock_shift.clone() {
            Some(shift) => {
                let scheduler = binary("ax-scheduler")?;
                let mut shifted = vec!["-f".to_string(), shift, scheduler.display().to_string()];
                shifted.extend(args);
                let log = self.log_path(&name);
                Process::spawn(&name, Path::new("faketime"), &shifted, self.dir.path(), log)
            }
            None => self.spawn(&name, "ax-scheduler", &args),
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

    fn spawn(&mut self, name: &str, program: &str, args: &[String]) -> anyhow::Result<Process> {
        let log = self.log_path(name);
        Process::spawn(name, &binary(program)?, args, self.dir.path(), log)
    }

    /// Starts a worker process connected to the scheduler. It is not waited for: see
    /// [`TestClient::wait_worker_live`].
    pub fn start_worker(&mut self, id: &str) -> anyhow::Result<()> {
        self.start_worker_with(id, &WorkerSettings::default())
    }

    /// Starts a worker process with the test's settings. It is not waited for.
    pub fn start_worker_with(&mut self, id: &str, settings: &WorkerSettings) -> anyhow::Result<()> {
        let heartbeat = settings
            .heartbeat_interval
            .clone()
            .unwrap_or_else(|| HEARTBEAT_INTERVAL.into());
        let mut args = vec![
            "--scheduler".to_string(),
            settings.endpoint.clone().unwrap_or_else(|| self.endpoint()),
            "--id".into(),
            id.into(),
            "--heartbeat-interval".into(),
            heartbeat,
        ];
        let optional = [
            ("--capacity", settings.capacity.map(|c| c.to_string())),
            (
                "--task-heartbeat-interval",
                settings.task_heartbeat_interval.clone(),
            ),
            ("--kill-grace", settings.kill_grace.clone()),
            ("--self-fence-after", settings.self_fence_after.clone()),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                args.extend([flag.to_string(), value]);
            }
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
        let process = self.spawn(&name, "ax-worker", &args)?;
        self.workers.push(process);
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

    /// The port the scheduler listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything the running scheduler process wrote so far, or every scheduler process's log
    /// after it was taken out.
    pub fn scheduler_logs(&self) -> String {
        self.logs
            .iter()
            .filter(|(name, _)| name.starts_with("ax-scheduler"))
            .map(|(_, path)| std::fs::read_to_string(path).unwrap_or_default())
            .collect()
    }

    /// A client of the scheduler's control API.
    pub async fn client(&self) -> anyhow::Result<TestClient> {
        TestClient::connect(&self.endpoint()).await
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

    pub fn scheduler(&mut self) -> anyhow::Result<&mut Process> {
        self.scheduler
            .as_mut()
            .context("the scheduler is not running")
    }

    /// Takes the scheduler process out of the cluster, e.g. to stop it and start another.
    pub fn take_scheduler(&mut self) -> anyhow::Result<Process> {
        self.scheduler
            .take()
            .context("the scheduler is not running")
    }

    pub fn worker(&mut self, id: &str) -> anyhow::Result<&mut Process> {
        let name = format!("ax-worker {id}");
        let again = format!("{name}#");
        // The latest process started under this id.
        self.workers
            .iter_mut()
            .rev()
            .find(|w| w.name == name || w.name.starts_with(&again))
            .with_context(|| format!("no worker {id}"))
    }

    /// Runs the real `axctl` against this cluster, under the hang guard.
    pub async fn axctl(&self, args: &[&str]) -> anyhow::Result<CtlOutput> {
        let mut command = tokio::process::Command::new(binary("axctl")?);
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

    /// Stops the workers, then the scheduler, each with SIGTERM, checks that every one exits
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
            if !status.success() {
                bail!("{} exited with {status}", worker.name);
            }
        }
        if let Some(mut scheduler) = self.scheduler.take() {
            scheduler.terminate()?;
            let status = scheduler.wait_exit(HANG_GUARD).await?;
            if !status.success() {
                bail!("{} exited with {status}", scheduler.name);
            }
        }
        if let Some(db) = self.db.take() {
            db.drop_database().await?;
        }
        Ok(())
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        // The children are killed by `kill_on_drop`. A test that failed before its `shutdown`
        // still drops its MySQL database, from a thread of its own because `Drop` is not async
        // and may run on a runtime thread.
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

/// A port that was free a moment ago. Another process may take it before the scheduler binds it;
/// [`ProcessCluster::start_scheduler`] retries then.
fn free_port() -> anyhow::Result<u16> {
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

fn is_bind_failure(log: &str) -> bool {
    let log = log.to_lowercase();
    log.contains("address already in use") || log.contains("addrinuse")
}
