//! What a MySQL store must be before a node uses it: the primary (a replica refuses writes),
//! migrated by one node at a time, and with the unique keys ax's guarantees rest on. A database someone altered after ax created it,
//! or a copy made without its indexes, would let a cron slot fire twice or an attempt be
//! claimed twice, silently; so a node refuses to start on it and names the missing key.

use std::time::{Duration, Instant};

use sqlx::Row;

use super::{Store, write_tx};
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
const MIGRATION_WAIT: Duration = Duration::from_secs(600);
/// How long the migration lock holds without renewal: a node killed while it migrates leaves a
/// row that the others may take after this.
const LOCK_TTL_MS: i64 = 60_000;
/// How often the holder renews the lock while its migrations run.
const LOCK_RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often a waiting node tries to take the lock.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// Runs the migrations while holding the database's migration lock, so nodes started together
/// on a new database migrate one after the other (the others then find nothing to do).
///
/// The lock is a committed row (`ax_migration_lock`: its owner and an expiry in the database's
/// clock), not a named lock: `GET_LOCK` holds on one server only, so on a multi-primary
/// cluster (Galera, Group Replication) nodes on two database servers both took it and applied
/// migration 1 side by side. Taking the row is a write, which every engine orders: two takers
/// on two servers conflict at commit (a deadlock error, retried) and the loser then reads the
/// winner's row. The holder renews the expiry while it migrates and deletes the row after; a
/// node killed while it migrates leaves a row that expires. The table is created outside the
/// migrations, since it guards them (a DDL statement every engine applies in order, and a no-op
/// on every node but the first).
pub(crate) async fn migrate_alone(
    store: &Store,
    migrations: &[(i64, &'static str, &'static str)],
) -> Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ax_migration_lock (id BIGINT NOT NULL PRIMARY KEY, \
         owner VARCHAR(191) NOT NULL, expires_at BIGINT NOT NULL) ENGINE=InnoDB",
    )
    .execute(&store.pool)
    .await?;
    let owner = format!(
        "pid {} at {:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let waited = Instant::now();
    let mut holder = take_migration_lock(store, &owner).await?;
    while holder != owner {
        if waited.elapsed() >= MIGRATION_WAIT {
            return Err(StoreError::Unusable(format!(
                "another scheduler node ({holder}) has been migrating this database for {} s; \
                 start this node again once it is done",
                MIGRATION_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(LOCK_POLL).await;
        holder = take_migration_lock(store, &owner).await?;
    }
    // The node before may have just released the lock: on a cluster member its migrations may
    // not be applied here yet (seen on Galera: the schema release record missing).
    store.catch_up_with_the_cluster().await?;
    let renewing = async {
        loop {
            tokio::time::sleep(LOCK_RENEW_EVERY).await;
            if let Err(err) = take_migration_lock(store, &owner).await {
                tracing::warn!(error = %err, "renewing the migration lock failed; retrying");
            }
        }
    };
    let migrated = tokio::select! {
        migrated = store.migrate(migrations) => migrated,
        never = renewing => never,
    };
    // The row expires anyway; deleting it lets a waiting node in at once.
    let _ = sqlx::query("DELETE FROM ax_migration_lock WHERE id = 1 AND owner = ?")
        .bind(&owner)
        .execute(&store.pool)
        .await;
    migrated
}

/// Takes the migration lock for `owner` when it is free or expired, or renews it when `owner`
/// holds it; returns who holds it now.
async fn take_migration_lock(store: &Store, owner: &str) -> Result<String> {
    // The assignments apply left to right: `expires_at` sees the owner just set.
    write_tx!(store, |c| async {
        sqlx::query(
            "INSERT INTO ax_migration_lock (id, owner, expires_at) \
             VALUES (1, ?, ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) + ?) \
             ON DUPLICATE KEY UPDATE \
             owner = IF(expires_at < ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000), VALUES(owner), owner), \
             expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)",
        )
        .bind(owner)
        .bind(LOCK_TTL_MS)
        .execute(&mut *c)
        .await?;
        let row = sqlx::query("SELECT owner FROM ax_migration_lock WHERE id = 1")
            .fetch_one(&mut *c)
            .await?;
        Ok::<String, StoreError>(row.try_get("owner")?)
    })
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
