//! The schema across releases (the version policy, docs/operations.md): where each migration is
//! recorded so that the release before this one still starts on the schema, and the record of
//! which release migrated it, judged (`ax_core::release::judge_schema`) before anything is
//! migrated.
//!
//! Migrations 1 to 21 are recorded in sqlx's own table, `_sqlx_migrations`. ax 0.1.0 runs
//! sqlx's migrator over it as sqlx has it by default, which refuses to start on a table holding
//! a migration the binary does not know; so every later migration is recorded in
//! `ax_migrations`, which 0.1.0 never reads, and 0.1.0 starts on a schema that 0.2.0 migrated.
//! From 0.2.0 on, both tables are read ignoring migrations the binary does not know (a newer
//! release applied them, and the record says whether this node may run beside them). A release
//! that must keep 0.1.0 from starting (one that drops what 0.1.0 needs) adds a row to
//! `_sqlx_migrations` as a fence: 0.1.0 refuses it, and 0.2.0 and later ignore it.

use ax_core::release::{Release, SchemaRelease, judge_schema, oldest_compatible};
use sqlx::Row;
use sqlx::migrate::{Migration, MigrationType, Migrator};

use super::{Dialect, Store};
use crate::{Result, StoreError};

/// The last migration recorded in [`SQLX_TABLE`]; later ones go to [`AX_TABLE`].
const SQLX_TABLE_LAST: i64 = 21;
const SQLX_TABLE: &str = "_sqlx_migrations";
const AX_TABLE: &str = "ax_migrations";

/// The release of this build (the workspace's version).
pub(crate) fn this_release() -> Release {
    Release::parse(env!("CARGO_PKG_VERSION"))
        .expect("Cargo refuses a package version that is not MAJOR.MINOR.PATCH")
}

/// Judges the schema for a node of `node`, migrates it, and records `node` as the release that
/// migrated it when it is newer than the one recorded (a node rolled back to the release before
/// leaves the newer record alone: the schema is still the newer one's).
pub(crate) async fn migrate(
    store: &Store,
    migrations: &[(i64, &'static str, &'static str)],
    node: &Release,
) -> Result<()> {
    let oldest = oldest_compatible(node);
    let found = recorded_or_inferred(store).await?;
    judge_schema(found.as_ref(), node, &oldest).map_err(StoreError::Unusable)?;
    let (in_sqlx_table, in_ax_table): (Vec<_>, Vec<_>) = migrations
        .iter()
        .partition(|(version, _, _)| *version <= SQLX_TABLE_LAST);
    run(store, &in_sqlx_table, SQLX_TABLE).await?;
    run(store, &in_ax_table, AX_TABLE).await?;
    if found.as_ref().is_none_or(|found| found.release < *node) {
        let newest = migrations.last().map_or(0, |(version, _, _)| *version);
        record(
            store,
            &SchemaRelease {
                release: node.clone(),
                migration: newest,
                oldest_release: oldest,
            },
        )
        .await?;
    }
    Ok(())
}

async fn run(
    store: &Store,
    migrations: &[&(i64, &'static str, &'static str)],
    table: &'static str,
) -> Result<()> {
    let migrations = migrations
        .iter()
        .map(|&&(version, description, sql)| {
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                sqlx::SqlSafeStr::into_sql_str(sql),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table);
    // A migration this build does not know was applied by a newer release, which the record
    // (judged before) allows to run beside this one.
    migrator.set_ignore_missing(true);
    migrator.run(&store.pool).await?;
    Ok(())
}

impl Store {
    /// The release that migrated this store's schema, its highest migration, and the oldest
    /// release that may still run on it; `None` before any release recorded itself (a schema
    /// of 0.1.0, which recorded nothing).
    pub async fn schema_release(&self) -> Result<Option<SchemaRelease>> {
        if !table_exists(self, "schema_release").await? {
            return Ok(None);
        }
        let Some(row) = sqlx::query(
            "SELECT release_name, migration, oldest_release FROM schema_release WHERE id = 1",
        )
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let release = |column: &str| -> Result<Release> {
            let text: String = row.try_get(column)?;
            Release::parse(&text)
                .map_err(|err| StoreError::Corrupt(format!("schema_release.{column}: {err}")))
        };
        Ok(Some(SchemaRelease {
            release: release("release_name")?,
            migration: row.try_get("migration")?,
            oldest_release: release("oldest_release")?,
        }))
    }
}

/// The record, or for a schema that has migrations and no record, 0.1.0's (the only release
/// that recorded nothing); `None` for a new database.
async fn recorded_or_inferred(store: &Store) -> Result<Option<SchemaRelease>> {
    if let Some(found) = store.schema_release().await? {
        return Ok(Some(found));
    }
    if !table_exists(store, SQLX_TABLE).await? {
        return Ok(None);
    }
    let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(&store.pool)
        .await?;
    let first = Release {
        major: 0,
        minor: 1,
        patch: 0,
        suffix: String::new(),
    };
    Ok(newest.map(|migration| SchemaRelease {
        release: first.clone(),
        migration,
        oldest_release: first,
    }))
}

async fn record(store: &Store, release: &SchemaRelease) -> Result<()> {
    let mut write = store.begin_write().await?;
    sqlx::query("DELETE FROM schema_release")
        .execute(&mut *write.tx)
        .await?;
    sqlx::query(
        "INSERT INTO schema_release (id, release_name, migration, oldest_release) \
         VALUES (1, ?, ?, ?)",
    )
    .bind(release.release.to_string())
    .bind(release.migration)
    .bind(release.oldest_release.to_string())
    .execute(&mut *write.tx)
    .await?;
    write.tx.commit().await?;
    Ok(())
}

async fn table_exists(store: &Store, table: &str) -> Result<bool> {
    let sql = match store.dialect {
        Dialect::MySql => {
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?"
        }
        Dialect::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
    };
    let found: i64 = sqlx::query_scalar(sql)
        .bind(table)
        .fetch_one(&store.pool)
        .await?;
    Ok(found > 0)
}
