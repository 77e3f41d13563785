//! The [`Store`]: its connections to MySQL or SQLite, and what the SQL of every subject shares.
//!
//! One implementation over `sqlx::AnyPool`, its methods in the subject files below; the few
//! statements that differ between the two backends come from [`Dialect`]. Every write runs in a
//! transaction through [`write_tx!`], which serializes SQLite writers (one process lock plus
//! `BEGIN IMMEDIATE`, so a reader never has to upgrade its lock and fail with SQLITE_BUSY) and
//! retries a MySQL deadlock a few times.

mod access;
mod audit;
mod cancel;
mod checkpointer;
mod conditions;
mod counted;
pub(crate) mod db_errors;
mod deadlines;
mod decisions;
mod dependents;
mod dispatch;
mod downstream_tasks;
pub(crate) mod engine;
mod fan_out;
mod gauges;
mod grid;
mod ids;
mod instance_locks;
mod items;
mod locks;
mod logs;
mod mark;
mod nodes;
mod outputs;
mod patch;
mod placing;
mod purge;
mod queue;
mod reports;
mod rerun;
mod rows;
mod run_create;
mod run_end;
mod run_roots;
mod runs;
mod schema_check;
pub(crate) mod schema_release;
mod shard_retry;
mod sub_workflows;
mod workers;
mod workflow_sets;
mod workflows;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyConnection, AnyPool, Executor};

use crate::{Backend, Result, StoreError};
use ids::IdBlocks;

/// How often a transaction that deadlocked (MySQL) or found the database busy (SQLite) is tried.
pub(crate) const MAX_TRIES: u32 = 6;

/// The embedded migrations of each backend, paired by number (a test checks the pairing).
pub(crate) const MYSQL_MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/mysql/0001_init.sql")),
    (
        2,
        "dispatch_queue_index",
        include_str!("../migrations/mysql/0002_dispatch_queue_index.sql"),
    ),
    (
        3,
        "decision_log",
        include_str!("../migrations/mysql/0003_decision_log.sql"),
    ),
    (
        4,
        "run_queue",
        include_str!("../migrations/mysql/0004_run_queue.sql"),
    ),
    (
        5,
        "workflow_dependency",
        include_str!("../migrations/mysql/0005_workflow_dependency.sql"),
    ),
    (
        6,
        "dispatch_limits_shards",
        include_str!("../migrations/mysql/0006_dispatch_limits_shards.sql"),
    ),
    (
        7,
        "run_queue_order",
        include_str!("../migrations/mysql/0007_run_queue_order.sql"),
    ),
    (
        8,
        "run_state_covers_shards",
        include_str!("../migrations/mysql/0008_run_state_covers_shards.sql"),
    ),
    (
        9,
        "withdrawn_attempts",
        include_str!("../migrations/mysql/0009_withdrawn_attempts.sql"),
    ),
    (
        10,
        "scheduler_node",
        include_str!("../migrations/mysql/0010_scheduler_node.sql"),
    ),
    (
        11,
        "scheduler_node_pools",
        include_str!("../migrations/mysql/0011_scheduler_node_pools.sql"),
    ),
    (
        12,
        "tokens_secrets",
        include_str!("../migrations/mysql/0012_tokens_secrets.sql"),
    ),
    (
        13,
        "retention",
        include_str!("../migrations/mysql/0013_retention.sql"),
    ),
    (
        14,
        "secret_app",
        include_str!("../migrations/mysql/0014_secret_app.sql"),
    ),
    (
        15,
        "worker_token_scope",
        include_str!("../migrations/mysql/0015_worker_token_scope.sql"),
    ),
    (
        16,
        "workflow_semantics",
        include_str!("../migrations/mysql/0016_workflow_semantics.sql"),
    ),
    (
        17,
        "workflow_delete",
        include_str!("../migrations/mysql/0017_workflow_delete.sql"),
    ),
    (
        18,
        "conditions",
        include_str!("../migrations/mysql/0018_conditions.sql"),
    ),
    (
        19,
        "sub_workflows",
        include_str!("../migrations/mysql/0019_sub_workflows.sql"),
    ),
    (
        20,
        "deadlines",
        include_str!("../migrations/mysql/0020_deadlines.sql"),
    ),
    (
        21,
        "for_each",
        include_str!("../migrations/mysql/0021_for_each.sql"),
    ),
    (
        22,
        "schema_release",
        include_str!("../migrations/mysql/0022_schema_release.sql"),
    ),
    (
        23,
        "queue_in_ready_order",
        include_str!("../migrations/mysql/0023_queue_in_ready_order.sql"),
    ),
    (
        24,
        "lock_version",
        include_str!("../migrations/mysql/0024_lock_version.sql"),
    ),
];
pub(crate) const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../migrations/sqlite/0001_init.sql"),
    ),
    (
        2,
        "dispatch_queue_index",
        include_str!("../migrations/sqlite/0002_dispatch_queue_index.sql"),
    ),
    (
        3,
        "decision_log",
        include_str!("../migrations/sqlite/0003_decision_log.sql"),
    ),
    (
        4,
        "run_queue",
        include_str!("../migrations/sqlite/0004_run_queue.sql"),
    ),
    (
        5,
        "workflow_dependency",
        include_str!("../migrations/sqlite/0005_workflow_dependency.sql"),
    ),
    (
        6,
        "dispatch_limits_shards",
        include_str!("../migrations/sqlite/0006_dispatch_limits_shards.sql"),
    ),
    (
        7,
        "run_queue_order",
        include_str!("../migrations/sqlite/0007_run_queue_order.sql"),
    ),
    (
        8,
        "run_state_covers_shards",
        include_str!("../migrations/sqlite/0008_run_state_covers_shards.sql"),
    ),
    (
        9,
        "withdrawn_attempts",
        include_str!("../migrations/sqlite/0009_withdrawn_attempts.sql"),
    ),
    (
        10,
        "scheduler_node",
        include_str!("../migrations/sqlite/0010_scheduler_node.sql"),
    ),
    (
        11,
        "scheduler_node_pools",
        include_str!("../migrations/sqlite/0011_scheduler_node_pools.sql"),
    ),
    (
        12,
        "tokens_secrets",
        include_str!("../migrations/sqlite/0012_tokens_secrets.sql"),
    ),
    (
        13,
        "retention",
        include_str!("../migrations/sqlite/0013_retention.sql"),
    ),
    (
        14,
        "secret_app",
        include_str!("../migrations/sqlite/0014_secret_app.sql"),
    ),
    (
        15,
        "worker_token_scope",
        include_str!("../migrations/sqlite/0015_worker_token_scope.sql"),
    ),
    (
        16,
        "workflow_semantics",
        include_str!("../migrations/sqlite/0016_workflow_semantics.sql"),
    ),
    (
        17,
        "workflow_delete",
        include_str!("../migrations/sqlite/0017_workflow_delete.sql"),
    ),
    (
        18,
        "conditions",
        include_str!("../migrations/sqlite/0018_conditions.sql"),
    ),
    (
        19,
        "sub_workflows",
        include_str!("../migrations/sqlite/0019_sub_workflows.sql"),
    ),
    (
        20,
        "deadlines",
        include_str!("../migrations/sqlite/0020_deadlines.sql"),
    ),
    (
        21,
        "for_each",
        include_str!("../migrations/sqlite/0021_for_each.sql"),
    ),
    (
        22,
        "schema_release",
        include_str!("../migrations/sqlite/0022_schema_release.sql"),
    ),
    (
        23,
        "queue_in_ready_order",
        include_str!("../migrations/sqlite/0023_queue_in_ready_order.sql"),
    ),
    (
        24,
        "lock_version",
        include_str!("../migrations/sqlite/0024_lock_version.sql"),
    ),
];

/// The statements that differ between the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    MySql,
    Sqlite,
}

impl Dialect {
    /// An insert that skips rows whose unique key is taken (and reports only inserted rows).
    pub(crate) fn insert_ignore(self) -> &'static str {
        match self {
            Dialect::MySql => "INSERT IGNORE INTO",
            Dialect::Sqlite => "INSERT OR IGNORE INTO",
        }
    }

    /// The database's clock, in milliseconds since the epoch. MySQL sessions run in UTC
    /// (sqlx sets `time_zone`), so `UNIX_TIMESTAMP` of `NOW(3)` is the epoch time.
    pub(crate) fn now_ms(self) -> &'static str {
        match self {
            Dialect::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            Dialect::Sqlite => {
                "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
            }
        }
    }

    /// Row lock for a read inside a transaction. SQLite writers are serialized already.
    pub(crate) fn for_update(self) -> &'static str {
        match self {
            Dialect::MySql => " FOR UPDATE",
            Dialect::Sqlite => "",
        }
    }

    /// An index hint for a locking read: on MySQL, a read that locks the rows it finds through
    /// an index whose key a concurrent transaction can change (`state`) can miss a row that
    /// moved within the range meanwhile (its old entry is delete-marked and skipped, its new
    /// one lands where the scan has passed). Through an index whose key never changes, the
    /// read waits for the row's lock and then judges the row as committed. SQLite: nothing.
    pub(crate) fn force_index(self, index: &str) -> String {
        match self {
            Dialect::MySql => format!(" FORCE INDEX ({index})"),
            Dialect::Sqlite => String::new(),
        }
    }

    /// The tail of an insert that updates `columns` when the row with the same `key` exists.
    /// `VALUES(col)` works on MySQL 8 and MariaDB alike (the `AS new` alias is MySQL-only).
    pub(crate) fn upsert_tail(self, key: &[&str], columns: &[&str]) -> String {
        match self {
            Dialect::MySql => {
                let sets: Vec<String> = columns
                    .iter()
                    .map(|c| format!("{c} = VALUES({c})"))
                    .collect();
                format!(" ON DUPLICATE KEY UPDATE {}", sets.join(", "))
            }
            Dialect::Sqlite => {
                let sets: Vec<String> = columns
                    .iter()
                    .map(|c| format!("{c} = excluded.{c}"))
                    .collect();
                format!(
                    " ON CONFLICT ({}) DO UPDATE SET {}",
                    key.join(", "),
                    sets.join(", ")
                )
            }
        }
    }
}

impl Dialect {
    /// Like [`Dialect::upsert_tail`], but an existing row changes only when the new one is at
    /// least as recent by `newer` (which must be one of `columns`): an update that arrives late
    /// never takes a row back in time.
    pub(crate) fn upsert_newer_tail(self, key: &[&str], columns: &[&str], newer: &str) -> String {
        match self {
            Dialect::MySql => {
                // Assignments apply left to right and later ones see earlier results, so
                // `newer` itself is assigned last.
                let fresh = format!("VALUES({newer}) >= {newer}");
                let sets: Vec<String> = columns
                    .iter()
                    .filter(|c| **c != newer)
                    .chain(std::iter::once(&newer))
                    .map(|c| format!("{c} = IF({fresh}, VALUES({c}), {c})"))
                    .collect();
                format!(" ON DUPLICATE KEY UPDATE {}", sets.join(", "))
            }
            Dialect::Sqlite => format!(
                "{} WHERE excluded.{newer} >= {newer}",
                self.upsert_tail(key, columns)
            ),
        }
    }
}

/// `(?, ?, …), (?, ?, …)` for a multi-row insert.
pub(crate) fn values_rows(rows: usize, columns: usize) -> String {
    let one = format!("({})", vec!["?"; columns].join(", "));
    vec![one; rows].join(", ")
}

/// `?, ?, …` for an `IN (…)` list.
pub(crate) fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// How many items a list of `n` is padded to: the next power of two up to 512, then the next
/// multiple of 512. Both backends prepare and cache a statement per SQL text; lists of every
/// length would give every batch a text of its own, evicting cached statements (on MySQL each
/// eviction is a COM_STMT_CLOSE written right before the next command, which Nagle's algorithm
/// holds back for a delayed ACK: about 40 ms) and paying a prepare each time.
pub(crate) fn padded_len(n: usize) -> usize {
    const STEP: usize = 512;
    if n <= STEP {
        n.next_power_of_two()
    } else {
        n.div_ceil(STEP) * STEP
    }
}

/// An `IN (…)` list for `items`: its placeholders and the values to bind, padded to
/// [`padded_len`] by repeating the last item (a repeated value changes nothing in `IN`).
pub(crate) fn in_list<T: Clone>(items: impl IntoIterator<Item = T>) -> (String, Vec<T>) {
    let mut values: Vec<T> = items.into_iter().collect();
    if let Some(last) = values.last().cloned() {
        values.resize(padded_len(values.len()), last);
    }
    (placeholders(values.len()), values)
}

/// Prepared statements each MySQL connection keeps, unless the URL says otherwise: room for
/// every statement text the store sends (see [`padded_len`]), so none is closed and prepared
/// again. sqlx keeps 100 by default.
const MYSQL_STATEMENT_CACHE: usize = 256;

fn with_statement_cache(url: &str) -> String {
    if url.contains("statement-cache-capacity=") {
        return url.to_string();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}statement-cache-capacity={MYSQL_STATEMENT_CACHE}")
}

/// Task names per `IN (…)` list of task names.
pub(crate) const NAMES_PER_STATEMENT: usize = 500;

/// Rows per multi-row insert: far below both backends' limits on bound parameters.
pub(crate) const INSERT_CHUNK: usize = 500;

/// `rows` split for multi-row inserts into chunks whose sizes are powers of two (at most 256),
/// largest first: a few statement texts for batches of every size, as [`padded_len`] gives
/// `IN` lists.
pub(crate) fn pow2_chunks<T>(rows: &[T]) -> Vec<&[T]> {
    const LARGEST: usize = 256;
    let mut chunks = Vec::new();
    let mut rest = rows;
    while !rest.is_empty() {
        let size = if rest.len() >= LARGEST {
            LARGEST
        } else {
            1 << rest.len().ilog2()
        };
        let (chunk, tail) = rest.split_at(size);
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// The store over one pool, for MySQL or SQLite. Its methods are by subject in `sql/`: see the
/// crate's doc.
pub struct Store {
    pub(crate) pool: AnyPool,
    pub(crate) dialect: Dialect,
    /// A single server or a member of a multi-primary cluster (`engine.rs`).
    pub(crate) engine: engine::Engine,
    /// Whether decisions write the rows they lock: on a cluster member, or when asked.
    pub(crate) locks_are_local: bool,
    /// How long the cluster may stall every commit while it drops a silent member.
    commit_stall: Option<Duration>,
    /// MySQL only: a small pool of its own for id reservations, so a transaction that needs a new
    /// block never waits for a connection its own pool may not have.
    id_pool: Option<AnyPool>,
    /// MySQL: the connection of the node's lease renewals, so a main pool busy with a burst of
    /// work never delays a renewal into a false "cut off from the store".
    pub(crate) lease_pool: Option<AnyPool>,
    pub(crate) ids: IdBlocks,
    /// SQLite only: one writer at a time in this process.
    write_lock: Option<Arc<tokio::sync::Mutex<()>>>,
    /// SQLite file only: the write-ahead log's checkpoints, outside the commits.
    checkpointer: Option<checkpointer::Checkpointer>,
    /// Statements sent by `apply_reports` (see [`Store::report_statements`]).
    report_statements: AtomicU64,
    /// Statements sent by `create_runs` (see [`Store::create_statements`]).
    create_statements: AtomicU64,
    /// Each finished task's direct downstream tasks, read once (versions never change).
    pub(crate) downstream_tasks: downstream_tasks::DownstreamTasks,
    /// The node's bounds on waiting instances, asked when a run that is never refused is
    /// created (`run_create.rs`); unset, no such decision is recorded.
    pub(crate) waiting_bounds: std::sync::OnceLock<Arc<dyn crate::WaitingBounds>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Connects to `sqlite://PATH` (file and parent directory created when missing),
    /// `sqlite::memory:` (one connection, gone when the store is dropped) or `mysql://…`, and
    /// runs the backend's migrations.
    pub async fn connect(url: &str) -> Result<Store> {
        Self::connect_with(url, &crate::StoreOptions::default()).await
    }

    /// [`Store::connect`] with `options`.
    pub async fn connect_with(url: &str, options: &crate::StoreOptions) -> Result<Store> {
        sqlx::any::install_default_drivers();
        if url.starts_with("sqlite:") {
            Self::connect_sqlite(url).await
        } else if url.starts_with("mysql://") {
            Self::connect_mysql(url, options).await
        } else {
            Err(StoreError::UnsupportedUrl(url.to_string()))
        }
    }

    async fn connect_sqlite(url: &str) -> Result<Store> {
        let rest = url.trim_start_matches("sqlite:");
        let memory = rest == ":memory:" || rest == "//:memory:";
        let (url, max) = if memory {
            // Every connection to `:memory:` would see its own database: keep exactly one.
            ("sqlite::memory:".to_string(), 1)
        } else {
            let path = rest.trim_start_matches("//");
            let (file, query) = match path.split_once('?') {
                Some((file, query)) => (file, Some(query)),
                None => (path, None),
            };
            if file.is_empty() {
                return Err(StoreError::UnsupportedUrl(url.to_string()));
            }
            if let Some(parent) = Path::new(file)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
            {
                std::fs::create_dir_all(parent).map_err(|err| {
                    StoreError::Database(sqlx::Error::Configuration(
                        format!("cannot create {}: {err}", parent.display()).into(),
                    ))
                })?;
            }
            let query = match query {
                Some(q) if q.contains("mode=") => q.to_string(),
                Some(q) => format!("{q}&mode=rwc"),
                None => "mode=rwc".to_string(),
            };
            (format!("sqlite://{file}?{query}"), 4)
        };
        let options = AnyConnectOptions::from_str(&url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .min_connections(if memory { 1 } else { 0 })
            .idle_timeout(if memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if memory {
                None
            } else {
                Some(Duration::from_secs(1800))
            })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    // busy_timeout is 5 s by default in sqlx; NORMAL is durable enough with WAL.
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                    if !memory {
                        // The checkpointer does it, outside any commit.
                        conn.execute("PRAGMA wal_autocheckpoint = 0").await?;
                        conn.execute(sqlx::AssertSqlSafe(format!(
                            "PRAGMA journal_size_limit = {}",
                            checkpointer::WAL_SIZE_LIMIT
                        )))
                        .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await?;
        let write_lock = Arc::new(tokio::sync::Mutex::new(()));
        let checkpointer = if memory {
            None
        } else {
            // WAL lets readers go on beside the writer. It is a property of the file, set once;
            // switching needs an exclusive lock, so it is done before the pool is shared.
            pool.execute("PRAGMA journal_mode = WAL").await?;
            Some(checkpointer::Checkpointer::start(&options, write_lock.clone()).await?)
        };
        let store = Store {
            pool,
            dialect: Dialect::Sqlite,
            engine: engine::Engine::Single,
            locks_are_local: false,
            commit_stall: None,
            id_pool: None,
            lease_pool: None,
            ids: IdBlocks::default(),
            write_lock: Some(write_lock),
            checkpointer,
            report_statements: AtomicU64::new(0),
            create_statements: AtomicU64::new(0),
            downstream_tasks: Default::default(),
            waiting_bounds: Default::default(),
        };
        store.migrate(SQLITE_MIGRATIONS).await?;
        Ok(store)
    }

    async fn connect_mysql(url: &str, store_options: &crate::StoreOptions) -> Result<Store> {
        let silent_client_timeout = store_options.silent_client_timeout;
        let options = AnyConnectOptions::from_str(&with_statement_cache(url))?;
        // A node that falls silent in the middle of a transaction (partitioned from the database
        // while its connection stays open) would keep its row locks, and stall every node that
        // needs those rows, until the server gave up on it: after `wait_timeout` (8 hours by
        // default). A short one makes the server roll such a transaction back within seconds.
        // No ax transaction is idle between its statements for anywhere near that long, and the
        // pools close their idle connections before the server would.
        let silent_s = silent_client_timeout.as_secs().max(1);
        let pool_options = |max: u32| {
            AnyPoolOptions::new()
                .max_connections(max)
                .idle_timeout(Some(Duration::from_millis(silent_s * 1000 / 2)))
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        conn.execute(sqlx::AssertSqlSafe(format!(
                            "SET SESSION wait_timeout = {silent_s}"
                        )))
                        .await?;
                        // Each statement sees the latest committed rows; the fan-in check
                        // relies on it after it has locked the run row.
                        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .await?;
                        Ok(())
                    })
                })
        };
        let pool = pool_options(16).connect_with(options.clone()).await?;
        let id_pool = pool_options(2).connect_with(options.clone()).await?;
        let lease_pool = pool_options(1).connect_with(options).await?;
        let engine = engine::detect(&pool).await?;
        let commit_stall = engine::commit_stall(&pool, engine).await?;
        let store = Store {
            pool,
            dialect: Dialect::MySql,
            engine,
            locks_are_local: engine.locks_are_local() || store_options.write_locked_rows,
            commit_stall,
            id_pool: Some(id_pool),
            lease_pool: Some(lease_pool),
            ids: IdBlocks::default(),
            write_lock: None,
            checkpointer: None,
            report_statements: AtomicU64::new(0),
            create_statements: AtomicU64::new(0),
            downstream_tasks: Default::default(),
            waiting_bounds: Default::default(),
        };
        schema_check::refuse_read_only(&store).await?;
        if let Some(why) = engine::unready(&store.pool, engine).await? {
            return Err(StoreError::Unusable(why));
        }
        schema_check::migrate_alone(&store, MYSQL_MIGRATIONS).await?;
        schema_check::require_unique_keys(&store).await?;
        Ok(store)
    }

    /// Runs `migrations` as this release of ax, under the version policy
    /// (`schema_release.rs`).
    async fn migrate(&self, migrations: &[(i64, &'static str, &'static str)]) -> Result<()> {
        schema_release::migrate(self, migrations, &schema_release::this_release()).await
    }

    /// The database this store is on.
    pub fn backend(&self) -> Backend {
        match self.dialect {
            Dialect::MySql => Backend::MySql,
            Dialect::Sqlite => Backend::Sqlite,
        }
    }

    /// A single server, or the member of a multi-primary cluster this node writes to.
    pub fn engine(&self) -> engine::Engine {
        self.engine
    }

    /// Waits until this node's database server has applied what its cluster committed before
    /// the call, so that the reads after it are at least that new; returns at once on a single
    /// server. A member of a multi-primary cluster applies the others' commits a moment after
    /// they return (longer while the cluster drops a member), and a read there may not see them.
    pub async fn catch_up_with_the_cluster(&self) -> Result<()> {
        engine::catch_up(&self.pool, self.engine).await
    }

    /// How long the database may hold every commit while its cluster drops a member that
    /// stopped answering (Galera's `evs.suspect_timeout`); `None` on a single server. A node
    /// must not take such a stall for being cut off.
    pub fn commit_stall(&self) -> Option<Duration> {
        self.commit_stall
    }

    /// Why the database server may not serve ax now (a cluster member out of sync or outside
    /// the primary component); `None` when it may, and always on a single server.
    pub async fn unready(&self) -> Result<Option<String>> {
        engine::unready(&self.pool, self.engine).await
    }

    /// The statements `apply_reports` has sent to the database since this store was opened:
    /// every try of its transaction, without BEGIN and COMMIT and without the id allocator's
    /// block reservations (shared by many calls). Tests read it to show that one advance costs
    /// the same whatever the size of the workflow or the number of runs in the store.
    pub fn report_statements(&self) -> u64 {
        self.report_statements.load(Ordering::Relaxed)
    }

    pub(crate) fn count_report_statements(&self, n: u64) {
        self.report_statements.fetch_add(n, Ordering::Relaxed);
    }

    /// The statements `create_run` and `create_runs` have sent, counted as
    /// [`Store::report_statements`] are: without the run queue's admission of a run of a
    /// limited workflow (its lock, counts and decision row), a hook on the plain connection.
    /// Tests read it to show that a group of runs costs what one run costs.
    pub fn create_statements(&self) -> u64 {
        self.create_statements.load(Ordering::Relaxed)
    }

    pub(crate) fn count_create_statements(&self, n: u64) {
        self.create_statements.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives the store the node's bounds on waiting instances: from now on, a run that is never
    /// refused (a cron or dependency fire, a child run, a backfill slot) created past one gets an
    /// `admitted_over_bound` decision in its transaction. Set once; false when already set.
    pub fn set_waiting_bounds(&self, bounds: Arc<dyn crate::WaitingBounds>) -> bool {
        self.waiting_bounds.set(bounds).is_ok()
    }

    /// Closes the pools (tests drop their MySQL database afterwards).
    pub async fn close(&self) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.stop().await;
        }
        self.pool.close().await;
        for pool in self.id_pool.iter().chain(&self.lease_pool) {
            pool.close().await;
        }
    }

    /// Begins a write transaction; on SQLite also takes the process's writer lock.
    pub(crate) async fn begin_write(&self) -> Result<WriteTx<'_>> {
        let guard = match &self.write_lock {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        let tx = match self.dialect {
            Dialect::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::MySql => self.pool.begin().await?,
        };
        Ok(WriteTx { tx, _guard: guard })
    }

    /// Fresh ids of `kind`, reserved through the transaction's connection on SQLite and through
    /// the allocator pool on MySQL.
    pub(crate) async fn take_ids(
        &self,
        conn: &mut AnyConnection,
        kind: ids::IdKind,
        n: usize,
    ) -> Result<Vec<i64>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        match &self.id_pool {
            Some(pool) => {
                let mut own = pool.acquire().await?;
                self.ids.take(&mut own, kind, n).await
            }
            None => self.ids.take(conn, kind, n).await,
        }
    }

    /// After a failed transaction: SQLite may have rolled back a block reservation.
    pub(crate) fn after_failed_tx(&self) {
        if self.dialect == Dialect::Sqlite {
            self.ids.forget();
        }
    }
}

pub(crate) struct WriteTx<'a> {
    pub(crate) tx: sqlx::Transaction<'static, sqlx::Any>,
    _guard: Option<tokio::sync::MutexGuard<'a, ()>>,
}

/// Runs `$body` (an expression using the connection `$conn`) in a write transaction, commits,
/// and retries the whole transaction after a deadlock or a busy database.
macro_rules! write_tx {
    ($store:expr, |$conn:ident| $body:expr) => {{
        let store: &$crate::sql::Store = $store;
        let mut tries = 0u32;
        loop {
            tries += 1;
            let result = async {
                let mut w = store.begin_write().await?;
                let value = {
                    let $conn: &mut sqlx::AnyConnection = &mut w.tx;
                    $body.await
                };
                match value {
                    Ok(value) => {
                        w.tx.commit().await?;
                        Ok(value)
                    }
                    Err(err) => {
                        // A failed rollback leaves nothing behind: the connection is reset.
                        let _ = w.tx.rollback().await;
                        Err(err)
                    }
                }
            }
            .await;
            match result {
                Ok(value) => break Ok(value),
                Err(err) => {
                    store.after_failed_tx();
                    if tries < $crate::sql::MAX_TRIES && $crate::sql::db_errors::is_retryable(&err) {
                        tracing::debug!(tries, error = %err, "retrying a store transaction");
                        let pause = 5u64 * (1 << tries) + rand::random_range(0..10u64);
                        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                        continue;
                    }
                    break Err(err);
                }
            }
        }
    }};
}
pub(crate) use write_tx;

#[cfg(test)]
mod statement_shape_tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn lists_pad_to_few_lengths() {
        let lengths: BTreeSet<usize> = (1..=2000).map(padded_len).collect();
        assert_eq!(
            lengths.into_iter().collect::<Vec<_>>(),
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
        );
        let (list, values) = in_list([7, 8, 9]);
        assert_eq!(list, "?, ?, ?, ?");
        assert_eq!(values, vec![7, 8, 9, 9]);
        let (list, values) = in_list(Vec::<i64>::new());
        assert_eq!((list.as_str(), values.len()), ("", 0));
    }

    #[test]
    fn inserts_split_into_power_of_two_chunks_in_order() {
        let rows: Vec<u32> = (0..700).collect();
        let chunks = pow2_chunks(&rows);
        let sizes: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![256, 256, 128, 32, 16, 8, 4]);
        assert_eq!(chunks.concat(), rows);
        assert!(pow2_chunks::<u32>(&[]).is_empty());
    }

    #[test]
    fn the_statement_cache_is_raised_unless_the_url_sets_it() {
        assert_eq!(
            with_statement_cache("mysql://root@h:3306/ax"),
            "mysql://root@h:3306/ax?statement-cache-capacity=256"
        );
        assert_eq!(
            with_statement_cache("mysql://root@h/ax?ssl-mode=DISABLED"),
            "mysql://root@h/ax?ssl-mode=DISABLED&statement-cache-capacity=256"
        );
        let own = "mysql://root@h/ax?statement-cache-capacity=10";
        assert_eq!(with_statement_cache(own), own);
    }
}
