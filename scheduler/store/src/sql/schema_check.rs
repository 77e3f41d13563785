//! What a MySQL store must be before a node uses it: the primary (a replica refuses writes),
//! migrated by one node at a time, and with the unique keys ax's guarantees rest on. A database someone altered after ax created it,
//! or a copy made without its indexes, would let a cron slot fire twice or an attempt be
//! claimed twice, silently; so a node refuses to start on it and names the missing key.

use sqlx::Row;

use super::Store;
use crate::{Result, StoreError};

/// A unique key ax relies on: its table, its columns in order, and what it guarantees.
struct RequiredKey {
    table: &'static str,
    columns: &'static [&'static str],
    guarantees: &'static str,
}

const REQUIRED_KEYS: [RequiredKey; 8] = [
    RequiredKey {
        table: "run",
        columns: &["workflow_id", "dedup_key"],
        guarantees: "each cron slot and idempotency key makes one run",
    },
    RequiredKey {
        table: "task_instance",
        columns: &["run_id", "task_name", "shard_slot"],
        guarantees: "a run has one instance per task",
    },
    RequiredKey {
        table: "task_attempt",
        columns: &["instance_id", "attempt"],
        guarantees: "an attempt is dispatched once",
    },
    RequiredKey {
        table: "execution_log",
        columns: &["instance_id", "attempt", "first_seq"],
        guarantees: "a replayed log batch is stored once",
    },
    RequiredKey {
        table: "workflow",
        columns: &["live_name"],
        guarantees: "a live workflow's name is applied once",
    },
    RequiredKey {
        table: "worker",
        columns: &["id"],
        guarantees: "a worker has one row",
    },
    RequiredKey {
        table: "concurrency_slot",
        columns: &["scope"],
        guarantees: "a concurrency limit has one counter",
    },
    RequiredKey {
        table: "scheduler_node",
        columns: &["node_id"],
        guarantees: "a node id has one lease",
    },
];

/// Refuses a server that does not take writes: a read replica, or a primary set read-only.
pub(crate) async fn refuse_read_only(store: &Store) -> Result<()> {
    let row = sqlx::query("SELECT @@global.read_only AS read_only")
        .fetch_one(&store.pool)
        .await?;
    let read_only: i64 = row.try_get("read_only")?;
    if read_only != 0 {
        return Err(StoreError::Unusable(
            "the MySQL server is read-only (read_only = ON: a replica?); ax writes every \
             transition, so point --store at the primary"
                .into(),
        ));
    }
    Ok(())
}

/// How long a node waits for another node's migrations before it gives up.
const MIGRATION_WAIT_S: i64 = 600;

/// Runs the migrations while holding a named lock on the database, so nodes started together
/// on a new database migrate one after the other (the others then find nothing to do). The
/// migrator's own lock asks for an infinite wait with a negative timeout, which MariaDB answers
/// at once with NULL, so without this lock two nodes apply migration 1 side by side and one of
/// them finds it "partially applied".
pub(crate) async fn migrate_alone(
    store: &Store,
    migrations: &[(i64, &'static str, &'static str)],
) -> Result<()> {
    let mut holder = store.pool.acquire().await?;
    // The holder sits idle while the migrations run on other connections: the server must not
    // drop it (and the lock with it) after the pool's short `wait_timeout`.
    sqlx::query("SET SESSION wait_timeout = 28800")
        .execute(&mut *holder)
        .await?;
    let row = sqlx::query("SELECT GET_LOCK(CONCAT('ax-migrate-', DATABASE()), ?) AS got")
        .bind(MIGRATION_WAIT_S)
        .fetch_one(&mut *holder)
        .await?;
    let got: Option<i64> = row.try_get("got")?;
    if got != Some(1) {
        return Err(StoreError::Unusable(format!(
            "another scheduler node has been migrating this database for {MIGRATION_WAIT_S} s; \
             start this node again once it is done"
        )));
    }
    let migrated = store.migrate(migrations).await;
    // The lock goes with the connection anyway; releasing it lets a waiting node in at once.
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('ax-migrate-', DATABASE()))")
        .execute(&mut *holder)
        .await;
    // Its long `wait_timeout` must not serve a transaction later: the pool opens another.
    let _ = holder.close().await;
    migrated
}

/// Refuses a database that lacks one of [`REQUIRED_KEYS`] (as a primary or unique key on
/// exactly those columns, whatever its name).
pub(crate) async fn require_unique_keys(store: &Store) -> Result<()> {
    let rows = sqlx::query(
        "SELECT TABLE_NAME AS table_name, INDEX_NAME AS index_name, \
         GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',') AS columns \
         FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND NON_UNIQUE = 0 \
         GROUP BY TABLE_NAME, INDEX_NAME",
    )
    .fetch_all(&store.pool)
    .await?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in &rows {
        let table: String = row.try_get("table_name")?;
        let columns: String = row.try_get("columns")?;
        keys.push((table, columns));
    }
    let missing: Vec<String> = REQUIRED_KEYS
        .iter()
        .filter(|key| {
            let columns = key.columns.join(",");
            !keys.iter().any(|(t, c)| t == key.table && *c == columns)
        })
        .map(|key| {
            format!(
                "table {} has no unique key on ({}), which makes sure {}",
                key.table,
                key.columns.join(", "),
                key.guarantees
            )
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(StoreError::Unusable(format!(
        "this database lacks keys ax relies on: {}; it was changed after ax created it (restore \
         the keys from ax's migrations, or start on a database ax creates)",
        missing.join("; ")
    )))
}
