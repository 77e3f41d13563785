//! Which MySQL server the store is on: a single server (or a primary with replicas), or one
//! member of a multi-primary cluster, MariaDB Galera or MySQL Group Replication.
//!
//! A cluster member certifies a transaction against the others' by the rows both *wrote*: a row
//! lock (`SELECT … FOR UPDATE`, `LOCK IN SHARE MODE`) holds on its own server only. Where ax
//! decides on rows it locked but does not change (a workflow's row while it counts its active
//! runs, a run's row while it looks for the run's last unfinished task), two nodes on two
//! servers would each decide as if alone. On a cluster member those locks also write the row
//! (`touch`: its `lock_version` goes up), so the second of two racing decisions fails
//! certification, is rolled back with a deadlock error and is tried again, seeing the first.
//! A single server keeps plain locks.
//!
//! A member that is not ready for clients (Galera: not Synced or outside the primary
//! component; Group Replication: not ONLINE) is refused at start, as a read-only server is.

use std::time::Duration;

use sqlx::{AnyConnection, AnyPool, Row};

use super::counted::Counted;
use super::{Store, in_list};
use crate::Result;

/// The kind of MySQL server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// One server, or the primary of a primary-replica setup (SQLite too).
    Single,
    /// A MariaDB Galera cluster member (`wsrep_on`).
    Galera,
    /// A MySQL Group Replication member.
    GroupReplication,
}

impl Engine {
    /// Whether a row lock holds on this server only, so decisions must write what they lock.
    pub fn locks_are_local(self) -> bool {
        self != Engine::Single
    }

    pub fn name(self) -> &'static str {
        match self {
            Engine::Single => "single server",
            Engine::Galera => "Galera",
            Engine::GroupReplication => "Group Replication",
        }
    }
}

/// Tells what the server at `pool` is.
pub(crate) async fn detect(pool: &AnyPool) -> Result<Engine> {
    let mut c = pool.acquire().await?;
    if variable(&mut c, "wsrep_on")
        .await?
        .is_some_and(|on| on.eq_ignore_ascii_case("ON"))
    {
        return Ok(Engine::Galera);
    }
    // MySQL only; MariaDB has no Group Replication and no such table.
    let members = sqlx::query(
        "SELECT COUNT(*) AS n FROM information_schema.tables \
         WHERE table_schema = 'performance_schema' AND table_name = 'replication_group_members'",
    )
    .fetch_one(&mut *c)
    .await?;
    if members.try_get::<i64, _>("n")? > 0 {
        let online = sqlx::query(
            "SELECT COUNT(*) AS n FROM performance_schema.replication_group_members \
             WHERE member_state <> 'OFFLINE'",
        )
        .fetch_one(&mut *c)
        .await?;
        if online.try_get::<i64, _>("n")? > 0 {
            return Ok(Engine::GroupReplication);
        }
    }
    Ok(Engine::Single)
}

/// Waits until this server has applied what the cluster committed before the call: a causal
/// read (Galera's `wsrep_sync_wait`, Group Replication's `group_replication_consistency =
/// BEFORE`), after which every read on this server, on any connection, sees at least that.
/// Nothing on a single server. A member certifies what a transaction *writes*; a decision that
/// writes nothing (a worker's attempt judged unknown and killed) needs this instead.
pub(crate) async fn catch_up(pool: &AnyPool, engine: Engine) -> Result<()> {
    let (set, reset) = match engine {
        Engine::Single => return Ok(()),
        Engine::Galera => (
            "SET SESSION wsrep_sync_wait = 1",
            "SET SESSION wsrep_sync_wait = DEFAULT",
        ),
        Engine::GroupReplication => (
            "SET SESSION group_replication_consistency = 'BEFORE'",
            "SET SESSION group_replication_consistency = DEFAULT",
        ),
    };
    let mut c = pool.acquire().await?;
    sqlx::query(set).execute(&mut *c).await?;
    let read = sqlx::query("SELECT COUNT(*) FROM ax_migration_lock")
        .fetch_one(&mut *c)
        .await;
    if sqlx::query(reset).execute(&mut *c).await.is_err() {
        // The session would keep waiting on every read: it is not handed out again.
        c.close_on_drop();
    }
    read?;
    Ok(())
}

/// How long the cluster may hold every commit while it drops a member that stopped answering:
/// Galera waits `evs.suspect_timeout` (5 s by default) before it suspects the member, and only
/// then forms a new view. `None` on a single server, and on Group Replication (whose members
/// are expelled after `group_replication_member_expel_timeout`, but whose commits go on while
/// a majority answers).
pub(crate) async fn commit_stall(pool: &AnyPool, engine: Engine) -> Result<Option<Duration>> {
    if engine != Engine::Galera {
        return Ok(None);
    }
    let mut c = pool.acquire().await?;
    let options = variable(&mut c, "wsrep_provider_options")
        .await?
        .unwrap_or_default();
    Ok(Some(
        provider_option(&options, "evs.suspect_timeout")
            .and_then(iso_duration)
            .unwrap_or(Duration::from_secs(5)),
    ))
}

/// The value of `name` in Galera's `wsrep_provider_options` (`a = 1; b = PT5S; …`).
fn provider_option<'a>(options: &'a str, name: &str) -> Option<&'a str> {
    options.split(';').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then_some(value.trim())
    })
}

/// An ISO 8601 duration of hours, minutes and seconds as Galera writes them: `PT5S`, `PT0.5S`,
/// `PT1M30S`.
fn iso_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix("PT")?;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let end = rest.find(|c: char| c.is_ascii_alphabetic())?;
        let number: f64 = rest[..end].parse().ok()?;
        seconds += number
            * match rest.as_bytes()[end] {
                b'H' => 3600.0,
                b'M' => 60.0,
                b'S' => 1.0,
                _ => return None,
            };
        rest = &rest[end + 1..];
    }
    Duration::try_from_secs_f64(seconds).ok()
}

/// Why this member may not serve ax now; `None` when it may. Asked at start and by the health
/// check.
pub(crate) async fn unready(pool: &AnyPool, engine: Engine) -> Result<Option<String>> {
    let mut c = pool.acquire().await?;
    match engine {
        Engine::Single => Ok(None),
        Engine::Galera => {
            let state = status(&mut c, "wsrep_local_state_comment").await?;
            let cluster = status(&mut c, "wsrep_cluster_status").await?;
            let ready = status(&mut c, "wsrep_ready").await?;
            // A donor serves clients while it sends a state transfer (an rsync transfer blocks
            // its commits meanwhile, which the node rides out as a stall); a joiner does not.
            let synced = matches!(state.as_deref(), Some("Synced" | "Donor/Desynced"));
            let primary = cluster.as_deref() == Some("Primary");
            let is_ready = ready
                .as_deref()
                .is_some_and(|r| r.eq_ignore_ascii_case("ON"));
            if synced && primary && is_ready {
                return Ok(None);
            }
            Ok(Some(format!(
                "the Galera node is not ready for clients (state {}, cluster {}, ready {}); \
                 point --store at a Synced member of the primary component",
                state.as_deref().unwrap_or("unknown"),
                cluster.as_deref().unwrap_or("unknown"),
                ready.as_deref().unwrap_or("unknown"),
            )))
        }
        Engine::GroupReplication => {
            let row = sqlx::query(
                "SELECT member_state FROM performance_schema.replication_group_members \
                 WHERE member_id = @@server_uuid",
            )
            .fetch_optional(&mut *c)
            .await?;
            let state: Option<String> = row.map(|r| r.try_get("member_state")).transpose()?;
            if state.as_deref() == Some("ONLINE") {
                return Ok(None);
            }
            Ok(Some(format!(
                "the Group Replication member is not ONLINE (state {}); point --store at an \
                 ONLINE member",
                state.as_deref().unwrap_or("unknown")
            )))
        }
    }
}

async fn variable(c: &mut AnyConnection, name: &str) -> Result<Option<String>> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("SHOW VARIABLES LIKE '{name}'")))
        .fetch_optional(&mut *c)
        .await?;
    Ok(row.map(|row| row.try_get::<String, _>(1)).transpose()?)
}

async fn status(c: &mut AnyConnection, name: &str) -> Result<Option<String>> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("SHOW STATUS LIKE '{name}'")))
        .fetch_optional(&mut *c)
        .await?;
    Ok(row.map(|row| row.try_get::<String, _>(1)).transpose()?)
}

/// The tables whose rows a decision locks without changing them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Locked {
    Workflow,
    Run,
}

/// On a cluster member, writes the rows `ids` of `table` that the transaction holds locked, so
/// that a racing transaction on another server that locks them too fails certification; on a
/// single server, nothing (the lock is enough). Call it after the locking read, in the same
/// transaction: the rows are then locked here already, in the order the read took them.
pub(crate) async fn touch(
    store: &Store,
    c: &mut Counted<'_>,
    table: Locked,
    ids: &[i64],
) -> Result<()> {
    if !store.locks_are_local || ids.is_empty() {
        return Ok(());
    }
    let table = match table {
        Locked::Workflow => "workflow",
        Locked::Run => "run",
    };
    let (list, padded) = in_list(ids.iter().copied());
    let sql = format!("UPDATE {table} SET lock_version = lock_version + 1 WHERE id IN ({list})");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in padded {
        query = query.bind(id);
    }
    query.execute(&mut *c).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn galera_durations_and_options_are_read() {
        assert_eq!(iso_duration("PT5S"), Some(Duration::from_secs(5)));
        assert_eq!(iso_duration("PT0.5S"), Some(Duration::from_millis(500)));
        assert_eq!(iso_duration("PT1M30S"), Some(Duration::from_secs(90)));
        assert_eq!(iso_duration("PT1H"), Some(Duration::from_secs(3600)));
        assert_eq!(iso_duration("5S"), None);
        assert_eq!(iso_duration("PT5X"), None);
        assert_eq!(iso_duration("PTS"), None);
        let options =
            "evs.keepalive_period = PT1S; evs.suspect_timeout = PT7S; pc.wait_prim = true";
        assert_eq!(
            provider_option(options, "evs.suspect_timeout"),
            Some("PT7S")
        );
        assert_eq!(provider_option(options, "pc.wait_prim"), Some("true"));
        assert_eq!(provider_option(options, "evs.inactive_timeout"), None);
    }
}
