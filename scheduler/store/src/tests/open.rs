//! Opening a store: the urls it takes, SQLite in memory and in a file (whose log is
//! checkpointed outside the commits and rewound under load), a MySQL session gone silent, and
//! the migrations of both backends.

use std::sync::Arc;

use super::support::*;
use crate::*;

#[tokio::test]
async fn other_url_schemes_are_refused() {
    for url in ["postgres://localhost/ax", "redis://localhost", "ax.db", ""] {
        match Store::connect(url).await {
            Err(StoreError::UnsupportedUrl(got)) => assert_eq!(got, url),
            other => panic!("{url}: expected UnsupportedUrl, got {other:?}"),
        }
    }
    assert!(matches!(
        open("file:///tmp/x").await,
        Err(StoreError::UnsupportedUrl(_))
    ));
}

#[tokio::test]
async fn open_returns_a_working_store_and_in_memory_sqlite_works() {
    let store = open("sqlite::memory:").await.expect("in-memory store");
    assert_eq!(store.backend(), Backend::Sqlite);
    let wf = store
        .apply_workflow(&spec("m", vec![task("a", &[])]), "", None, T0)
        .await
        .unwrap()
        .0;
    assert_eq!(store.get_workflow("m").await.unwrap().unwrap().id, wf.id);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/er/ax.db");
    let store = open(&format!("sqlite://{}", path.display()))
        .await
        .expect("file store");
    assert!(path.exists());
    drop(store);
    // Opening again runs no migration twice and keeps the data.
    let again = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(again.list_workflows(None).await.unwrap().is_empty());
}

/// A SQLite file store with a table of eight rows to overwrite, and the path of its log.
async fn sqlite_store_with_filler(dir: &std::path::Path) -> (Arc<Store>, std::path::PathBuf) {
    let path = dir.join("ax.db");
    let store = Store::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE filler (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .execute(&store.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO filler (id, body) SELECT value, x'' FROM json_each('[0,1,2,3,4,5,6,7]')",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    (Arc::new(store), dir.join("ax.db-wal"))
}

/// About 20 KiB of pages through the log per commit (a 16 KiB row and its page), at most one
/// commit a millisecond, each through the store's writer lock as the store's own writes go.
async fn overwrite_filler(store: &Store, commits: i64) {
    for i in 0..commits {
        let mut write = store.begin_write().await.unwrap();
        sqlx::query("UPDATE filler SET body = randomblob(16384) WHERE id = ?")
            .bind(i % 8)
            .execute(&mut *write.tx)
            .await
            .unwrap();
        write.tx.commit().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_store_checkpoints_outside_the_commits_and_its_log_rewinds_under_load() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = sqlite_store_with_filler(dir.path()).await;
    let automatic: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(automatic, 0, "a commit never checkpoints");
    // Readers that keep the log in use all the time, as a busy node's reads do: beside them a
    // checkpoint that only ever copies never sees the log wholly copied, and the log would
    // never rewind.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop, reads) = (store.clone(), stop.clone(), reads.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _: Option<i64> = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
                        .fetch_one(&store.pool)
                        .await
                        .unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // About 60 MiB of pages through the log: steady load for a few seconds.
    overwrite_filler(&store, 3_000).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    assert!(
        reads.load(Ordering::Relaxed) > 100,
        "the readers ran beside the writes"
    );
    // The log file keeps its largest size: it says how far the log ever grew before it was
    // written from its start again.
    let wal_bytes = file_len(&wal);
    assert!(
        wal_bytes < 24 * 1024 * 1024,
        "the log grew to {wal_bytes} bytes: it was not rewound under load"
    );
    let total: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(total, 8 * 16384, "every row holds its last write");
    // Closed, the store leaves nothing in the log: the checkpointer's connection is closed too,
    // so the last connection's close checkpoints and removes it.
    store.close().await;
    let left = file_len(&wal);
    assert_eq!(left, 0, "the closed store left {left} bytes in its log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_read_on_a_sqlite_file_store_holds_up_neither_the_writers_nor_later_rewinds() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = sqlite_store_with_filler(dir.path()).await;
    // A read transaction that stays open across 1,500 commits: no checkpoint can copy past its
    // snapshot, so every rewinding pass meanwhile finds it on the log and gives up.
    let mut reader = store.pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *reader).await.unwrap();
    let before: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    assert_eq!(before, 0);
    // A generous bound that catches writers stuck behind the checkpointer's waits.
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        overwrite_filler(&store, 1_500),
    )
    .await
    .expect("the writers went on beside the long read");
    let seen: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    assert_eq!(seen, 0, "the long read kept its snapshot");
    sqlx::query("COMMIT").execute(&mut *reader).await.unwrap();
    drop(reader);
    let grown = file_len(&wal);
    assert!(
        grown > 24 * 1024 * 1024,
        "the log grew to {grown} bytes behind the long read"
    );
    // Once the reader is gone the log is rewound again, after the back-off (at most 16 ticks)
    // and a copy of what the read held back: another 60 MiB through the log grow the file by
    // less than that.
    overwrite_filler(&store, 3_000).await;
    let after = file_len(&wal);
    assert!(
        after < grown + 24 * 1024 * 1024,
        "the log grew from {grown} to {after} bytes after the long read ended"
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    ax_test_without_mysql,
    ignore = "set AX_TEST_MYSQL_URL=mysql://USER@HOST:PORT to run the MySQL variants"
)]
async fn a_mysql_session_gone_silent_in_a_transaction_frees_its_locks_after_the_timeout() {
    on_backend(Backend::MySql, |ctx| async move {
        ctx.store
            .apply_workflow(&spec("held", vec![task("a", &[])]), "", None, T0)
            .await
            .unwrap();
        let options = StoreOptions {
            silent_client_timeout: std::time::Duration::from_secs(1),
            ..StoreOptions::default()
        };
        let silent = Store::connect_with(&ctx.url, &options).await.unwrap();
        let mut tx = silent.pool.begin().await.unwrap();
        let timeout: i64 = sqlx::query_scalar("SELECT @@session.wait_timeout")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(timeout, 1);
        sqlx::query("SELECT id FROM workflow WHERE name = 'held' FOR UPDATE")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        // The transaction stays open and sends nothing, like a node cut off from the database.
        let started = std::time::Instant::now();
        sqlx::query("UPDATE workflow SET paused = 1 WHERE name = 'held'")
            .execute(&ctx.store.pool)
            .await
            .expect("the lock is freed when the server drops the silent session");
        // The server's lock wait would give up after innodb_lock_wait_timeout (50 s); the
        // default silent timeout is 10 s.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(6),
            "the row stayed locked for {:?}",
            started.elapsed()
        );
        drop(tx);
        silent.close().await;
    })
    .await;
}

#[tokio::test]
#[cfg_attr(
    ax_test_without_mysql,
    ignore = "set AX_TEST_MYSQL_URL=mysql://USER@HOST:PORT to run the MySQL variants"
)]
async fn a_mysql_node_waits_for_a_migration_lock_another_holds_until_it_expires() {
    on_backend(Backend::MySql, |ctx| async move {
        async fn rows(store: &Store) -> i64 {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM ax_migration_lock")
                .fetch_one(&store.pool)
                .await
                .unwrap()
        }
        assert_eq!(rows(&ctx.store).await, 0, "released after migrating");
        // A node on another database server holds the lock, and then dies: its row expires.
        sqlx::query(
            "INSERT INTO ax_migration_lock (id, owner, expires_at) \
             VALUES (1, 'pid 1 at elsewhere', ROUND(UNIX_TIMESTAMP(NOW(3)) * 1000) + 1500)",
        )
        .execute(&ctx.store.pool)
        .await
        .unwrap();
        let started = std::time::Instant::now();
        let second = Store::connect(&ctx.url)
            .await
            .expect("the node starts once the lock expires");
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(1_200),
            "the node migrated beside the lock's holder ({:?})",
            started.elapsed()
        );
        assert_eq!(
            rows(&second).await,
            0,
            "the expired row was taken, then released"
        );
        second.close().await;
    })
    .await;
}

#[test]
fn migrations_are_paired_per_backend() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let list = |backend: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(backend))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(list("mysql"), list("sqlite"));
    let embedded: Vec<String> = crate::sql::MYSQL_MIGRATIONS
        .iter()
        .map(|(v, d, _)| format!("{v:04}_{d}.sql"))
        .collect();
    assert_eq!(embedded, list("mysql"), "every migration file is embedded");
    let sqlite: Vec<i64> = crate::sql::SQLITE_MIGRATIONS.iter().map(|m| m.0).collect();
    let mysql: Vec<i64> = crate::sql::MYSQL_MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(sqlite, mysql);
}
