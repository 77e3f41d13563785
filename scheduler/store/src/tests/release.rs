//! The schema across releases (`sql/schema_release.rs`): the record of the release that
//! migrated it, the release before this one starting on it (0.1.0's own migrator, exactly as it
//! runs), a node running on a schema of the next version and refusing one further ahead.

use super::support::*;
use crate::*;

conformance!(
    a_new_store_records_this_release_and_the_oldest_that_may_run_on_it,
    the_previous_release_starts_on_a_schema_this_release_migrated,
    a_schema_of_the_previous_release_is_migrated_and_recorded,
    a_node_runs_on_a_schema_the_next_version_migrated_and_keeps_its_record,
    a_node_refuses_a_schema_more_than_one_version_ahead_naming_both,
);

#[test]
fn this_release_is_the_crates_version() {
    assert_eq!(
        crate::sql::schema_release::this_release().to_string(),
        env!("CARGO_PKG_VERSION")
    );
}

mod scenarios {
    use ax_core::release::{Release, SchemaRelease};
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    use super::*;

    fn r(text: &str) -> Release {
        Release::parse(text).expect("a release")
    }

    /// The migrations 0.1.0 embeds (1 to 21), run as 0.1.0 runs them: sqlx's migrator as it is
    /// by default, which refuses a recorded migration it does not know.
    async fn migrate_as_0_1_0(
        store: &Store,
    ) -> std::result::Result<(), sqlx::migrate::MigrateError> {
        let migrations = crate::sql::MYSQL_MIGRATIONS
            .iter()
            .zip(crate::sql::SQLITE_MIGRATIONS)
            .filter(|((version, _, _), _)| *version <= 21)
            .map(|(&(version, description, mysql), &(_, _, sqlite))| {
                let sql = match store.backend() {
                    Backend::MySql => mysql,
                    Backend::Sqlite => sqlite,
                };
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sqlx::SqlSafeStr::into_sql_str(sql),
                    false,
                )
            })
            .collect();
        Migrator::with_migrations(migrations).run(&store.pool).await
    }

    /// A migration of a later release: past any this build has.
    const LATER: i64 = 1_000;

    /// Records a migration this build does not know in `table`, as a newer release would.
    async fn record_unknown_migration(store: &Store, table: &str, version: i64) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) \
             VALUES (?, 'a later release', 1, X'00', 0)"
        )))
        .bind(version)
        .execute(&store.pool)
        .await
        .expect("record a migration");
    }

    async fn set_record(store: &Store, release: &str, migration: i64, oldest: &str) {
        sqlx::query(
            "UPDATE schema_release SET release_name = ?, migration = ?, oldest_release = ? \
             WHERE id = 1",
        )
        .bind(release)
        .bind(migration)
        .bind(oldest)
        .execute(&store.pool)
        .await
        .expect("rewrite the record");
    }

    async fn newest_in(store: &Store, table: &str) -> Option<i64> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT MAX(version) FROM {table}"
        )))
        .fetch_one(&store.pool)
        .await
        .expect("read the migrations table")
    }

    pub(super) async fn a_new_store_records_this_release_and_the_oldest_that_may_run_on_it(
        ctx: Ctx,
    ) {
        let this = crate::sql::schema_release::this_release();
        let newest = crate::sql::MYSQL_MIGRATIONS.last().expect("migrations").0;
        assert_eq!(
            ctx.s().schema_release().await.unwrap(),
            Some(SchemaRelease {
                release: this.clone(),
                migration: newest,
                oldest_release: ax_core::release::oldest_compatible(&this),
            })
        );
        assert_eq!(
            ctx.s()
                .schema_release()
                .await
                .unwrap()
                .unwrap()
                .oldest_release,
            r("0.1.0")
        );
        // 0.1.0's table ends where 0.1.0's migrations end; the rest are in ax's own.
        assert_eq!(newest_in(ctx.s(), "_sqlx_migrations").await, Some(21));
        assert_eq!(newest_in(ctx.s(), "ax_migrations").await, Some(newest));
        // Opening it again changes nothing.
        let again = ctx.second_store().await;
        assert_eq!(
            again.schema_release().await.unwrap(),
            ctx.s().schema_release().await.unwrap()
        );
        again.close().await;
    }

    pub(super) async fn the_previous_release_starts_on_a_schema_this_release_migrated(ctx: Ctx) {
        migrate_as_0_1_0(ctx.s())
            .await
            .expect("0.1.0's migrator accepts the schema");
    }

    pub(super) async fn a_schema_of_the_previous_release_is_migrated_and_recorded(ctx: Ctx) {
        // What 0.1.0 leaves: migrations 1 to 21, no record, no ax_migrations, none of the
        // columns later migrations add (migration 23 rebuilds an index under its own name).
        for table in ["schema_release", "ax_migrations"] {
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
                .execute(&ctx.store.pool)
                .await
                .unwrap();
        }
        for table in ["workflow", "run"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ALTER TABLE {table} DROP COLUMN lock_version"
            )))
            .execute(&ctx.store.pool)
            .await
            .unwrap();
        }
        assert_eq!(ctx.s().schema_release().await.unwrap(), None);
        let upgraded = ctx.second_store().await;
        let record = upgraded.schema_release().await.unwrap().expect("a record");
        assert_eq!(record.release, crate::sql::schema_release::this_release());
        assert_eq!(record.oldest_release, r("0.1.0"));
        migrate_as_0_1_0(&upgraded)
            .await
            .expect("0.1.0 still starts after the upgrade");
        upgraded.close().await;
    }

    pub(super) async fn a_node_runs_on_a_schema_the_next_version_migrated_and_keeps_its_record(
        ctx: Ctx,
    ) {
        // What 0.3.0 would leave: a migration of its own, a fence that keeps 0.1.0 out, and its
        // record (0.2.0 may still run).
        record_unknown_migration(ctx.s(), "ax_migrations", LATER).await;
        record_unknown_migration(ctx.s(), "_sqlx_migrations", 10_023).await;
        set_record(ctx.s(), "0.3.0", LATER, "0.2.0").await;

        let node = ctx.second_store().await;
        let record = node.schema_release().await.unwrap().expect("a record");
        assert_eq!(
            (record.release, record.migration, record.oldest_release),
            (r("0.3.0"), LATER, r("0.2.0")),
            "a node of the version before leaves the newer record"
        );
        node.apply_workflow(&spec("on-next", vec![task("a", &[])]), "", None, T0)
            .await
            .expect("the node works on the schema");
        node.close().await;
        // The fence does what it is for.
        assert!(matches!(
            migrate_as_0_1_0(ctx.s()).await,
            Err(sqlx::migrate::MigrateError::VersionMissing(10_023))
        ));
    }

    pub(super) async fn a_node_refuses_a_schema_more_than_one_version_ahead_naming_both(ctx: Ctx) {
        record_unknown_migration(ctx.s(), "ax_migrations", LATER).await;
        set_record(ctx.s(), "0.4.0", LATER, "0.3.0").await;
        let node = crate::sql::schema_release::this_release();
        let refused = crate::sql::schema_release::migrate(
            ctx.s(),
            match ctx.s().backend() {
                Backend::MySql => crate::sql::MYSQL_MIGRATIONS,
                Backend::Sqlite => crate::sql::SQLITE_MIGRATIONS,
            },
            &r("0.2.0"),
        )
        .await;
        match refused {
            Err(StoreError::Unusable(message)) => assert_eq!(
                message,
                "the store's schema is of ax 0.4.0 (migration 1000); this node is ax 0.2.0 and \
                 runs on schemas of 0.2.x or 0.3.x: upgrade this node"
            ),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Opening the store as this build does refuses too (this build is not 0.3.x).
        if node.series() < r("0.3.0").series() {
            match Store::connect(&ctx.url).await {
                Err(StoreError::Unusable(message)) => {
                    assert!(message.contains("upgrade this node"), "{message}")
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // The record is untouched.
        assert_eq!(
            ctx.s().schema_release().await.unwrap().unwrap().release,
            r("0.4.0")
        );
    }
}
