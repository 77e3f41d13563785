//! The three-node MariaDB Galera cluster the multi-primary tests run on, started by
//! `integration-tests/scripts/galera-cluster.sh` (`.ci/run` starts it): its members answer on
//! 127.0.0.1:4401–4403, and `AX_TEST_GALERA_DIR` names the directory the script keeps them in.
//! Each test creates a database of its own (on member 1; the cluster replicates it) and points
//! each scheduler node at a member of its own. Tests that kill a member take [`exclusive`]
//! first: the cluster is shared by every Galera test of the run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::Connection;

use crate::harness::Requirement;

/// A running cluster of `galera-cluster.sh`.
pub static GALERA: Requirement = Requirement::env(
    "AX_TEST_GALERA_DIR",
    "start a Galera cluster with integration-tests/scripts/galera-cluster.sh start DIR (needs \
     Debian's galera-4, mariadb-server and rsync) and set AX_TEST_GALERA_DIR=DIR to run the \
     multi-primary tests",
);

/// Members of the cluster.
pub const MEMBERS: usize = 3;

/// `mysql://…` of member `n` (1-based), without a database.
pub fn server_url(n: usize) -> String {
    format!("mysql://root@127.0.0.1:{}", 4400 + n)
}

/// The store url of `database` on member `n`.
pub fn store_url(n: usize, database: &str) -> String {
    format!("{}/{database}", server_url(n))
}

fn dir() -> anyhow::Result<PathBuf> {
    match std::env::var("AX_TEST_GALERA_DIR") {
        Ok(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => bail!("AX_TEST_GALERA_DIR is not set: register the test with `.requires(&GALERA)`"),
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/galera-cluster.sh")
}

async fn run_script(args: &[&str]) -> anyhow::Result<()> {
    let dir = dir()?;
    let output = tokio::process::Command::new(script())
        .args(args)
        .arg(&dir)
        .output()
        .await
        .context("running galera-cluster.sh")?;
    if !output.status.success() {
        bail!(
            "galera-cluster.sh {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// kill -9 of member `n`.
pub async fn kill(n: usize) -> anyhow::Result<()> {
    run_script(&["kill", &n.to_string()]).await
}

/// Starts member `n` again and waits until it is Synced (it catches up by IST or SST).
pub async fn rejoin(n: usize) -> anyhow::Result<()> {
    run_script(&["rejoin", &n.to_string()]).await
}

/// Whether member `n` answers and says it is Synced.
pub async fn synced(n: usize) -> bool {
    let Ok(mut conn) = sqlx::MySqlConnection::connect(&server_url(n)).await else {
        return false;
    };
    let state: Result<(String, String), _> =
        sqlx::query_as("SHOW STATUS LIKE 'wsrep_local_state_comment'")
            .fetch_one(&mut conn)
            .await;
    matches!(state, Ok((_, value)) if value == "Synced")
}

/// Every member Synced, waiting up to `within` (a member a previous test killed rejoins).
pub async fn all_synced(within: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut unsynced = Vec::new();
        for n in 1..=MEMBERS {
            if !synced(n).await {
                unsynced.push(n);
            }
        }
        if unsynced.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("Galera members {unsynced:?} are not Synced after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Member `n` with its applying of the others' commits paused, until [`Paused::resume`]:
/// `FLUSH TABLES WITH READ LOCK` desyncs it, so the others commit on without waiting for it,
/// its plain reads fall behind theirs, and its own writes wait. A causal read there
/// (`wsrep_sync_wait`) waits for the resume. Dropped, its connection closes, which resumes too.
pub struct Paused {
    conn: sqlx::MySqlConnection,
}

pub async fn pause_applying(n: usize) -> anyhow::Result<Paused> {
    let mut conn = sqlx::MySqlConnection::connect(&server_url(n))
        .await
        .with_context(|| format!("connecting to Galera member {n}"))?;
    sqlx::query("FLUSH TABLES WITH READ LOCK")
        .execute(&mut conn)
        .await
        .with_context(|| format!("pausing member {n}"))?;
    Ok(Paused { conn })
}

impl Paused {
    pub async fn resume(mut self) -> anyhow::Result<()> {
        sqlx::query("UNLOCK TABLES")
            .execute(&mut self.conn)
            .await
            .context("resuming the member")?;
        Ok(())
    }
}

/// A database of one test on the cluster: created on member 1, dropped by
/// [`GaleraDb::drop_database`].
pub struct GaleraDb {
    pub name: String,
}

impl GaleraDb {
    pub async fn create() -> anyhow::Result<GaleraDb> {
        let name = format!("ax_galera_{}", crate::unique_suffix());
        let mut conn = sqlx::MySqlConnection::connect(&server_url(1))
            .await
            .context("connecting to Galera member 1")?;
        // The name is ours (digits and underscores), never user input.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut conn)
            .await?;
        Ok(GaleraDb { name })
    }

    /// The store url of this database on member `n` (1-based).
    pub fn url(&self, n: usize) -> String {
        store_url(n, &self.name)
    }

    pub async fn drop_database(self) -> anyhow::Result<()> {
        for n in 1..=MEMBERS {
            let Ok(mut conn) = sqlx::MySqlConnection::connect(&server_url(n)).await else {
                continue;
            };
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{}`",
                self.name
            )))
            .execute(&mut conn)
            .await?;
            return Ok(());
        }
        bail!("no Galera member answers to drop {}", self.name)
    }
}

static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of a Galera test, so that one test's killed member never fails another's
/// (the suite runs tests in parallel). Starts again a member an earlier test left down (it
/// failed before its rejoin), and waits until every member is Synced.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = EXCLUSIVE.lock().await;
    for n in 1..=MEMBERS {
        if sqlx::MySqlConnection::connect(&server_url(n))
            .await
            .is_err()
        {
            rejoin(n).await.expect("a member left down starts again");
        }
    }
    all_synced(Duration::from_secs(120))
        .await
        .expect("the Galera cluster is whole");
    guard
}
