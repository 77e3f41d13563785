//! Tokens and secrets: a token is found by its hash and keeps its first revocation, names are
//! unique; a secret is keyed by its app and name, replaced in place and deleted by both, and
//! the secrets stored before apps existed become global. Runs on SQLite and MySQL through the
//! suite's `conformance!` macro.

use super::support::*;
use crate::*;

conformance!(
    tokens_are_found_by_hash_unique_by_name_and_revoked_once,
    secrets_are_replaced_in_place_and_deleted_by_app_and_name,
    secrets_stored_before_apps_become_global,
    a_worker_tokens_scope_round_trips_and_an_older_one_reads_as_any,
);

mod scenarios {
    use super::*;
    use ax_core::access::Role;

    fn new_token(name: &str, role: Role, hash: &str) -> NewToken {
        NewToken {
            name: name.into(),
            role,
            app: None,
            hash: hash.into(),
            created_at: T0,
            created_by: "store".into(),
            expires_at: None,
            worker: None,
        }
    }

    pub(super) async fn tokens_are_found_by_hash_unique_by_name_and_revoked_once(ctx: Ctx) {
        let s = ctx.s();
        let admin = new_token("root", Role::Admin, &"a".repeat(64));
        let scoped = NewToken {
            app: Some("sales".into()),
            expires_at: Some(T0 + 1_000),
            ..new_token("sales-ci", Role::Operator, &"b".repeat(64))
        };
        assert!(s.create_token(&admin).await.unwrap());
        assert!(s.create_token(&scoped).await.unwrap());
        // A taken name changes nothing, whatever the rest of the token.
        let clash = new_token("root", Role::Viewer, &"c".repeat(64));
        assert!(!s.create_token(&clash).await.unwrap());
        assert_eq!(s.token_by_hash(&"c".repeat(64)).await.unwrap(), None);

        let found = s.token_by_hash(&"b".repeat(64)).await.unwrap().unwrap();
        assert_eq!(found.name, "sales-ci");
        assert_eq!(found.role, Role::Operator);
        assert_eq!(found.app.as_deref(), Some("sales"));
        assert!(found.is_valid_at(T0 + 999));
        assert!(!found.is_valid_at(T0 + 1_000), "expired at its expiry");
        let names: Vec<String> = s
            .list_tokens()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["root", "sales-ci"]);

        let revoked = s.revoke_token("root", T0 + 5).await.unwrap().unwrap();
        assert_eq!(revoked.revoked_at, Some(T0 + 5));
        assert!(!revoked.is_valid_at(T0 + 6));
        let again = s.revoke_token("root", T0 + 9).await.unwrap().unwrap();
        assert_eq!(
            again.revoked_at,
            Some(T0 + 5),
            "the first revocation stands"
        );
        assert_eq!(s.revoke_token("nobody", T0).await.unwrap(), None);
        let by_hash = s.token_by_hash(&"a".repeat(64)).await.unwrap().unwrap();
        assert_eq!(by_hash.revoked_at, Some(T0 + 5));
    }

    pub(super) async fn a_worker_tokens_scope_round_trips_and_an_older_one_reads_as_any(ctx: Ctx) {
        use ax_core::worker_scope::WorkerScope;
        let s = ctx.s();
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let scope = WorkerScope::parse(
            &strings(&["etl-*", "w1"]),
            &strings(&["sales", "finance"]),
            &strings(&["pool=gpu", "zone=east"]),
        )
        .unwrap();
        let scoped = NewToken {
            worker: Some(scope.clone()),
            ..new_token("etl-workers", Role::Worker, &"d".repeat(64))
        };
        assert!(s.create_token(&scoped).await.unwrap());
        let found = s.token_by_hash(&"d".repeat(64)).await.unwrap().unwrap();
        assert_eq!(found.worker, Some(scope.clone()));
        assert_eq!(found.app, None);
        // A worker token stored with no ids (as before scopes existed) takes any id.
        let older = new_token("old-workers", Role::Worker, &"e".repeat(64));
        assert!(s.create_token(&older).await.unwrap());
        let found = s.token_by_hash(&"e".repeat(64)).await.unwrap().unwrap();
        assert_eq!(found.worker, Some(WorkerScope::any()));
        // Other roles have no worker scope.
        let admin = new_token("root", Role::Admin, &"f".repeat(64));
        assert!(s.create_token(&admin).await.unwrap());
        let listed = s.list_tokens().await.unwrap();
        let scopes: Vec<(&str, Option<&WorkerScope>)> = listed
            .iter()
            .map(|t| (t.name.as_str(), t.worker.as_ref()))
            .collect();
        let any = WorkerScope::any();
        assert_eq!(
            scopes,
            [
                ("etl-workers", Some(&scope)),
                ("old-workers", Some(&any)),
                ("root", None)
            ]
        );
    }

    pub(super) async fn secrets_are_replaced_in_place_and_deleted_by_app_and_name(ctx: Ctx) {
        let s = ctx.s();
        let first = s
            .put_secret("", "warehouse-db", "c2VhbGVk", T0, "root")
            .await
            .unwrap();
        assert_eq!(
            (
                first.app.as_str(),
                first.created_at,
                first.updated_at,
                first.sealed.as_str()
            ),
            ("", T0, T0, "c2VhbGVk")
        );
        s.put_secret("", "api-key", "b3RoZXI=", T0 + 1, "root")
            .await
            .unwrap();
        // Another app's secret of the same name is another secret.
        let finance = s
            .put_secret("finance", "warehouse-db", "ZmluYW5jZQ==", T0 + 1, "fin")
            .await
            .unwrap();
        s.put_secret("sales", "warehouse-db", "c2FsZXM=", T0 + 1, "sal")
            .await
            .unwrap();
        let second = s
            .put_secret("", "warehouse-db", "bmV3", T0 + 2, "ops")
            .await
            .unwrap();
        assert_eq!(
            second.created_at, T0,
            "a replacement keeps its creation time"
        );
        assert_eq!(
            (second.updated_at, second.updated_by.as_str()),
            (T0 + 2, "ops")
        );
        assert_eq!(second.sealed, "bmV3");
        let listed = s.list_secrets().await.unwrap();
        let keys: Vec<(&str, &str, &str)> = listed
            .iter()
            .map(|r| (r.app.as_str(), r.name.as_str(), r.sealed.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("", "api-key", "b3RoZXI="),
                ("", "warehouse-db", "bmV3"),
                ("finance", "warehouse-db", "ZmluYW5jZQ=="),
                ("sales", "warehouse-db", "c2FsZXM="),
            ],
            "by app, then name; a replacement touched its own app's row only"
        );
        // A delete takes the named app's secret and no other app's of that name.
        assert!(!s.delete_secret("sales", "api-key").await.unwrap());
        assert!(s.delete_secret("sales", "warehouse-db").await.unwrap());
        assert!(!s.delete_secret("sales", "warehouse-db").await.unwrap());
        assert!(s.delete_secret("", "api-key").await.unwrap());
        assert!(!s.delete_secret("", "api-key").await.unwrap());
        assert_eq!(s.list_secrets().await.unwrap(), [second, finance]);
    }

    /// Migration 0014 on a store holding secrets from before apps (0012's table): they become
    /// global, and the app's namespace is then open beside them.
    pub(super) async fn secrets_stored_before_apps_become_global(ctx: Ctx) {
        let pool = &ctx.store.pool;
        let old_table = match ctx.store.dialect {
            crate::sql::Dialect::Sqlite => {
                "CREATE TABLE secret (name TEXT NOT NULL PRIMARY KEY, sealed TEXT NOT NULL, \
                 created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, \
                 updated_by TEXT NOT NULL)"
            }
            crate::sql::Dialect::MySql => {
                "CREATE TABLE secret (name VARCHAR(191) NOT NULL PRIMARY KEY, \
                 sealed TEXT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, \
                 updated_by VARCHAR(191) NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 \
                 COLLATE=utf8mb4_bin"
            }
        };
        // The store as 0013 left it: the old table, a secret in it, 0014 not applied.
        for statement in [
            "DROP TABLE secret",
            old_table,
            "INSERT INTO secret (name, sealed, created_at, updated_at, updated_by) \
             VALUES ('warehouse-db', 'c2VhbGVk', 1700000000000, 1700000000001, 'root')",
            "DELETE FROM _sqlx_migrations WHERE version = 14",
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(pool)
                .await
                .unwrap_or_else(|err| panic!("{statement}: {err}"));
        }
        let migrated = ctx.second_store().await;
        let global = SecretRecord {
            app: String::new(),
            name: "warehouse-db".into(),
            sealed: "c2VhbGVk".into(),
            created_at: T0,
            updated_at: T0 + 1,
            updated_by: "root".into(),
        };
        assert_eq!(
            migrated.list_secrets().await.unwrap(),
            std::slice::from_ref(&global)
        );
        let sales = migrated
            .put_secret("sales", "warehouse-db", "c2FsZXM=", T0 + 2, "sal")
            .await
            .unwrap();
        assert_eq!(migrated.list_secrets().await.unwrap(), [global, sales]);
        migrated.close().await;
    }
}
