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

/// A scheduler process, its workers, its store and its temporary directory.
pub struct ProcessCluster {
    dir: tempfile::TempDir,
    db: Option<TestDb>,
    store_url: String,
    redis: Option<(String, String)>,
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
            match redis_url() {
                Some(url) => Some((url, format!("ax-proc-{}", unique_suffix()))),
                None => return Ok(None),
            }
        } else {
            None
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
            HEARTBEAT_INTERVAL.into(),
        ];
        if let Some((url, namespace)) = &self.redis {
            args.extend([
                "--redis".into(),
                url.clone(),
                "--redis-namespace".into(),
                namespace.clone(),
            ]);
        }
        self.spawn(&name, "ax-scheduler", &args)
    }

    fn spawn(&mut self, name: &str, program: &str, args: &[String]) -> anyhow::Result<Process> {
        let log = self
            .dir
            .path()
            .join(format!("{}.log", name.replace('#', "-")));
        self.logs.push((name.to_string(), log.clone()));
        Process::spawn(name, &binary(program)?, args, self.dir.path(), log)
    }

    /// Starts a worker process connected to the scheduler. It is not waited for: see
    /// [`ProcessCluster::wait_worker_live`].
    pub fn start_worker(&mut self, id: &str) -> anyhow::Result<()> {
        let args = vec![
            "--scheduler".to_string(),
            self.endpoint(),
            "--id".into(),
            id.into(),
            "--heartbeat-interval".into(),
            HEARTBEAT_INTERVAL.into(),
        ];
        let process = self.spawn(&format!("ax-worker {id}"), "ax-worker", &args)?;
        self.workers.push(process);
        Ok(())
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
        self.workers
            .iter_mut()
            .find(|w| w.name == name)
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
            for (name, path) in &self.logs {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                eprintln!(
                    "===== {name} ({})\n{text}===== end of {name}",
                    path.display()
                );
            }
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

/// `true` once `port` accepts connections, `false` when the process exited first.
async fn wait_listening(process: &mut Process, port: u16) -> anyhow::Result<bool> {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        if process.try_exited()?.is_some() {
            return Ok(false);
        }
        if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
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
