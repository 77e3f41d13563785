//! A private `redis-server` for one test, on a free loopback port, without persistence, that the
//! test can stop (as a crash: SIGKILL) and start again on the same port. The shared test Redis
//! cannot be stopped without breaking every other test; this one can.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::{HANG_GUARD, Process, free_port};

/// How often a start is retried when another process took the port meanwhile.
const BIND_ATTEMPTS: u32 = 10;

pub struct RedisServer {
    dir: PathBuf,
    port: u16,
    process: Option<Process>,
    starts: u32,
}

impl RedisServer {
    /// Starts `redis-server` with its log in `dir`, and waits until it answers PING.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let mut server = RedisServer {
            dir: dir.to_path_buf(),
            port: 0,
            process: None,
            starts: 0,
        };
        for _ in 0..BIND_ATTEMPTS {
            server.port = free_port()?;
            if server.spawn_and_wait().await? {
                return Ok(server);
            }
        }
        bail!("redis-server could not bind a port in {BIND_ATTEMPTS} attempts")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Kills the server with SIGKILL, as a crash would, and reaps it. Everything it held is
    /// gone: it persists nothing.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let mut process = self.process.take().context("redis-server is not running")?;
        process.kill().await
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.process.is_some() {
            bail!("redis-server is already running");
        }
        // The port was ours a moment ago; if someone took it, retrying is all we can do.
        for _ in 0..BIND_ATTEMPTS {
            if self.spawn_and_wait().await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("redis-server could not bind port {} again", self.port)
    }

    /// Every log the server wrote, all starts included.
    pub fn log_text(&self) -> String {
        (1..=self.starts)
            .map(|n| std::fs::read_to_string(self.log_path(n)).unwrap_or_default())
            .collect()
    }

    fn log_path(&self, start: u32) -> PathBuf {
        self.dir.join(format!("redis-server-{start}.log"))
    }

    /// `true` when the server answers PING; `false` when it exited first (port taken).
    async fn spawn_and_wait(&mut self) -> anyhow::Result<bool> {
        self.starts += 1;
        let args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &self.dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let program = which("redis-server")?;
        let mut process = Process::spawn(
            "redis-server",
            &program,
            &args,
            &self.dir,
            self.log_path(self.starts),
        )?;
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if process.try_exited()?.is_some() {
                return Ok(false);
            }
            if ping(self.port).await {
                self.process = Some(process);
                return Ok(true);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "redis-server does not answer on port {} after {HANG_GUARD:?}:\n{}",
                    self.port,
                    process.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether a Redis answers `PING` on the port.
async fn ping(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut buffer = [0u8; 16];
        let read = stream.read(&mut buffer).await?;
        Ok::<bool, std::io::Error>(buffer[..read].starts_with(b"+PONG"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(true))
    )
}

pub(crate) fn which(program: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{program} is not on PATH"))
}
