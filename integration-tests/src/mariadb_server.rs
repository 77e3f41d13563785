//! A private `mariadbd` for one test, on a free loopback port, with a data directory of its own,
//! started with whatever server options the test needs (`--read-only`, say): options of the
//! shared test server cannot be changed without changing them for every other test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::process::{HANG_GUARD, Process, free_port};
use crate::redis_server::which;

pub struct MariaDbServer {
    port: u16,
    _process: Process,
}

impl MariaDbServer {
    /// Creates a data directory under `dir`, starts `mariadbd` on it with `options` (root
    /// without a password), and waits until it accepts connections.
    pub async fn start(dir: &Path, options: &[&str]) -> anyhow::Result<Self> {
        let data = dir.join("mariadb-data");
        let install = tokio::process::Command::new(which("mariadb-install-db")?)
            .args([
                "--no-defaults".to_string(),
                format!("--datadir={}", data.display()),
                "--user=root".into(),
                "--auth-root-authentication-method=normal".into(),
                "--skip-test-db".into(),
            ])
            .output()
            .await
            .context("running mariadb-install-db")?;
        if !install.status.success() {
            bail!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&install.stderr)
            );
        }
        let port = free_port()?;
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--socket={}", dir.join("mariadb.sock").display()),
            "--user=root".into(),
            "--skip-grant-tables".into(),
            "--skip-log-bin".into(),
            "--innodb-buffer-pool-size=16M".into(),
        ];
        args.extend(options.iter().map(|option| option.to_string()));
        let mut process = Process::spawn(
            "mariadbd",
            &server_binary()?,
            &args,
            dir,
            dir.join("mariadbd.log"),
        )?;
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        let url = format!("mysql://root@127.0.0.1:{port}/mysql");
        loop {
            if let Some(status) = process.try_exited()? {
                bail!("mariadbd exited with {status}:\n{}", process.log_text());
            }
            if sqlx::MySqlPool::connect(&url).await.is_ok() {
                return Ok(MariaDbServer {
                    port,
                    _process: process,
                });
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "mariadbd does not answer on port {port}:\n{}",
                    process.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The url of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }
}

/// `mariadbd` lives in `/usr/sbin`, which is not on every user's PATH.
fn server_binary() -> anyhow::Result<PathBuf> {
    which("mariadbd").or_else(|_| {
        let fallback = PathBuf::from("/usr/sbin/mariadbd");
        if fallback.is_file() {
            Ok(fallback)
        } else {
            bail!("mariadbd is not installed")
        }
    })
}
