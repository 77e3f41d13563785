//! The store of record: one trait, a MySQL and a SQLite backend.
//!
//! Only this module knows SQL. Every instance transition is a conditional update keyed by
//! (instance, attempt, from-state); the decisions themselves (is the transition legal, is a
//! downstream task ready, does the run end, when does a retry start) come from `ax-core`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};

mod sql;
#[cfg(test)]
mod tests;

pub use sql::SqlStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported store url {0:?}: expected sqlite://PATH or mysql://USER@HOST/DB")]
    UnsupportedUrl(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database cannot serve ax as it is (read-only, keys missing).
    #[error("{0}")]
    Unusable(String),
}

impl StoreError {
    /// The database could not be reached (connection lost or refused, pool exhausted or
    /// closed), as opposed to a statement it refused.
    pub fn is_unreachable(&self) -> bool {
        sql::db_errors::is_unreachable(self)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    MySql,
}

/// Opens the store at `url` (`sqlite://PATH` or `mysql://…`) and runs its migrations.
pub async fn open(url: &str) -> Result<Arc<dyn Store>> {
    open_with(url, &StoreOptions::default()).await
}

/// [`open`] with `options`.
pub async fn open_with(url: &str, options: &StoreOptions) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(SqlStore::connect_with(url, options).await?))
}

/// How a store's connections behave.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// MySQL: how long the server keeps a session that sends nothing (`wait_timeout`, whole
    /// seconds, at least 1) before it drops it and rolls back its open transaction. A node cut
    /// off from the database in the middle of a transaction holds that transaction's row locks
    /// for this long, and every other node needing those rows waits for it.
    pub silent_client_timeout: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            silent_client_timeout: std::time::Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    pub id: WorkflowId,
    pub name: String,
    /// Starts at 1; a new version is stored only when the applied spec differs.
    pub version: u32,
    pub spec: WorkflowSpec,
    /// The workflow file's text as applied.
    pub source: String,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A workflow and its latest version number, without the version's spec: what a list of many
/// workflows reads before it takes their specs from a cache (versions never change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowHead {
    pub id: WorkflowId,
    pub name: String,
    pub version: u32,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    Created,
    Updated,
    Unchanged,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub state: RunState,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    pub idempotency_key: Option<String>,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
    pub created_at: Millis,
    pub finished_at: Option<Millis>,
    pub cancel_requested: bool,
    /// The key of keyed concurrency (`concurrency.key` over the params); `None` when the
    /// workflow had no key when the run was created.
    pub run_key: Option<String>,
}

/// A run to create. Unique per (workflow, dedup key): a second create with the same key returns
/// the first run and creates nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub workflow_id: WorkflowId,
    pub workflow_version: u32,
    pub trigger: TriggerKind,
    pub logical_time: Millis,
    /// `cron:<logical ms>` for cron fires, `key:<idempotency key>` for keyed triggers,
    /// `dep:<logical ms>` for a run started by its upstream workflows, none else.
    pub dedup_key: Option<String>,
    pub idempotency_key: Option<String>,
    pub params: BTreeMap<String, String>,
    pub triggered_by: String,
    pub now: Millis,
    /// For a run someone asked for (a manual or API trigger): who asked. A new run then gets
    /// its `trigger` audit row (by `triggered_by`, on `workflow/<name>`) in its own
    /// transaction.
    pub audit_from: Option<Caller>,
}

/// Where a call came from, as its audit row records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client's address.
    pub remote: String,
    /// The name of the token it came with; empty without authentication.
    pub token: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRecord {
    pub id: InstanceId,
    pub run_id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub task: String,
    pub state: InstanceState,
    /// The current attempt: the fencing token every report must carry.
    pub attempt: Attempt,
    pub worker_id: Option<String>,
    pub priority: i32,
    /// A retry waits until this instant (its backoff).
    pub not_before: Millis,
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub exit_code: Option<i32>,
    /// Set on a shard of a `sharded_broadcast` task: its parent instance, index, total and the
    /// worker it is pinned to.
    pub shard: Option<Shard>,
}

/// One try of an instance; never erased by a retry.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub state: InstanceState,
    pub worker_id: Option<String>,
    /// The scheduler node that dispatched it.
    pub node_id: Option<String>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub pid: Option<u32>,
    pub log_lines: u64,
    pub message: String,
}

/// A WAITING instance whose backoff has passed, with what a dispatch needs from its run.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingInstance {
    pub instance: InstanceRecord,
    pub logical_time: Millis,
    pub params: BTreeMap<String, String>,
    /// Set for a shard of a sharded broadcast (see [`Store::fan_out`]).
    pub shard: Option<Shard>,
}

/// A shard of a sharded task: which one, of how many, and the worker it is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub parent: InstanceId,
    pub index: u32,
    pub total: u32,
    pub worker: String,
}

/// The decision to send one attempt to one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchClaim {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub worker_id: String,
    pub node_id: String,
    pub at: Millis,
    /// The concurrency limits the instance counts against (`ax_core::limits::limits_for`);
    /// the claim is refused when one of them is full.
    pub limits: Vec<ax_core::limits::Limit>,
}

/// A first attempt the store is about to create in a transaction: what a node needs to choose
/// its worker (see [`Placement`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewAttempt {
    pub instance_id: InstanceId,
    pub run_id: RunId,
    pub workflow_id: WorkflowId,
    pub workflow_version: u32,
    pub task: String,
    pub priority: i32,
    pub created_at: Millis,
}

/// Chooses, inside the transaction that creates a first attempt (a run's root task, or a task
/// whose upstreams have just succeeded), the worker it goes to now. A placed attempt is created
/// DISPATCHED with its attempt row, as a claim would leave it, so a task that can start at once
/// costs one commit between becoming ready and its dispatch instead of two (the creation, then
/// the dispatcher's claim). The caller sends it after the commit. `place` is called while the
/// transaction holds its locks: it must answer from memory. A transaction retried after a
/// deadlock calls it again for new instance ids; only the attempts returned with the result
/// were created.
pub trait Placement: Send {
    /// The node that claims what it places.
    fn node_id(&self) -> &str;
    /// The worker for `attempt` when it can go now; `None` leaves it WAITING.
    fn place(&mut self, attempt: &NewAttempt) -> Option<String>;
}

/// Places nothing: every first attempt is created WAITING.
pub struct NoPlacement;

impl Placement for NoPlacement {
    fn node_id(&self) -> &str {
        ""
    }

    fn place(&mut self, _: &NewAttempt) -> Option<String> {
        None
    }
}

/// A first attempt created DISPATCHED to `worker_id`, with what its dispatch carries.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedAttempt {
    pub attempt: NewAttempt,
    pub worker_id: String,
    pub dispatched_at: Millis,
    pub logical_time: Millis,
    pub params: BTreeMap<String, String>,
}

/// How an attempt ended, as far as the store is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Finished(Outcome),
    /// The process never started.
    SpawnFailed,
}

/// A worker's report about one attempt. Applied only if (instance, attempt) is current, the
/// instance is in the state the report expects, and the report comes from the worker the
/// attempt was dispatched to; otherwise the result is `Stale`. `worker_id` is `None` for the
/// scheduler's own verdicts on a running attempt (the liveness backstop). A `Rejected` the
/// scheduler decides (a withdrawal, an undeliverable dispatch) names the worker the dispatch
/// went to: a dispatch refused by its worker goes out again under the same attempt number,
/// possibly to another worker, and a withdrawal decided on an older read must not end that one.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// DISPATCHED → WAITING. With `withdrawn` false (the worker refused the dispatch, or it
    /// never left the scheduler) the same attempt may go out again. With `withdrawn` true the
    /// dispatch may have reached a worker that never confirmed a start (it died, or came back
    /// without it): the attempt ends FAILED with `reason` and the instance waits as attempt + 1,
    /// which does not count against its retries (a withdrawn attempt's number never goes out
    /// again). A withdrawal that finds its attempt RUNNING (the Started report landed first)
    /// ends it as lost instead.
    Rejected {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        reason: String,
        withdrawn: bool,
        /// The dispatch a scheduler's verdict is about (the attempt's `dispatched_at` as read):
        /// applied only while that dispatch is the attempt's, not a later one of the same
        /// attempt number to the same worker. `None` applies to whichever dispatch it is.
        dispatched_at: Option<Millis>,
    },
    /// DISPATCHED → RUNNING.
    Started {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: String,
        pid: u32,
        at: Millis,
    },
    /// Last-active time of a RUNNING attempt.
    TaskHeartbeat {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        at: Millis,
    },
    /// RUNNING (or DISPATCHED for a spawn failure) → terminal, or → WAITING as the next attempt
    /// when the task's retries allow. A success advances the run's DAG in the same transaction.
    /// From the worker, about an attempt the scheduler already ended CANCELLED or TIMEOUT, it
    /// is applied as that attempt's late ending: the attempt keeps its state and records the
    /// exit code, signal and line count.
    Finished {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        end: AttemptEnd,
        exit_code: Option<i32>,
        signal: Option<i32>,
        at: Millis,
        log_lines: u64,
        message: String,
    },
}

impl Report {
    /// The attempt the report is about: (instance, attempt).
    pub fn key(&self) -> (InstanceId, Attempt) {
        match self {
            Report::Rejected {
                instance_id,
                attempt,
                ..
            }
            | Report::Started {
                instance_id,
                attempt,
                ..
            }
            | Report::TaskHeartbeat {
                instance_id,
                attempt,
                ..
            }
            | Report::Finished {
                instance_id,
                attempt,
                ..
            } => (*instance_id, *attempt),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportResult {
    Applied(Applied),
    /// The attempt is not current, or the instance is not in the state the report expects.
    Stale {
        current_attempt: Attempt,
        state: InstanceState,
    },
    NotFound,
    /// A worker's report about an attempt that was not dispatched to it: another worker's, or
    /// one that does not exist (yet). Nothing is written.
    NotYours,
}

/// An attempt the store believes is on a worker (DISPATCHED or RUNNING), with what the
/// liveness rules of `ax_core::liveness` need.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveAttempt {
    pub instance_id: InstanceId,
    pub run_id: RunId,
    pub attempt: Attempt,
    pub state: InstanceState,
    pub worker_id: Option<String>,
    /// The scheduler node that dispatched the attempt.
    pub dispatched_by: Option<String>,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub last_heartbeat_at: Option<Millis>,
    /// The task's timeout in its workflow version.
    pub timeout_ms: Option<std::num::NonZeroU64>,
}

/// The answer to a manual retry of one instance.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per manual retry: size does not matter here
pub enum ManualRetry {
    /// The instance is WAITING again as its next attempt; its run is running again.
    Retried(InstanceRecord),
    /// Only FAILED, TIMEOUT and CANCELLED instances can be retried.
    NotRetryable(InstanceState),
    NotFound,
    /// The instance is a shard: its sharded task's instance `parent` is what is retried (it
    /// fans out again).
    Shard {
        parent: InstanceId,
    },
    /// A sharded task's instance that ended on a failed shard while `unfinished` shards still
    /// go: retried now, it would fan out beside them.
    ShardsActive {
        unfinished: u32,
    },
}

/// The answer to `rerun_failed` (`axctl rerun RUN --failed`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RerunFailed {
    /// The instances now WAITING as their next attempt.
    pub retried: Vec<InstanceId>,
    /// Failed sharded tasks' instances left alone because shards of them still go: (instance,
    /// unfinished shards).
    pub shards_active: Vec<(InstanceId, u32)>,
}

/// The answer to `rerun_from` (`axctl rerun RUN --from TASK`).
#[derive(Debug, Clone, PartialEq)]
pub enum RerunFrom {
    /// The task's instance is WAITING as its next attempt; `pending` are the instances below it
    /// that ran before and now wait for their upstreams again (PENDING). The run is running.
    Rerun {
        again: InstanceId,
        pending: Vec<InstanceId>,
    },
    RunNotFound,
    /// No such task in the run's workflow version; `tasks` are its tasks in file order.
    UnknownTask {
        tasks: Vec<String>,
    },
    /// The task has no finished instance to run again (`None`: never created because an upstream
    /// did not succeed; `Some(PENDING)`: it waits for an upstream rerun).
    NotRun {
        state: Option<InstanceState>,
    },
    /// Instances of the task or below it are still waiting, dispatched or running.
    Active {
        busy: Vec<(String, InstanceState)>,
    },
    /// Sharded tasks of the task or below it still have shards going (task, how many): their
    /// instance ended on a failed shard while the others still run.
    ShardsActive {
        shards: Vec<(String, u32)>,
    },
}

/// What an applied report changed, so the engine knows whom to wake.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    /// Instances that became WAITING (downstream created, or a retry scheduled).
    pub new_waiting: u32,
    /// The instance's attempt ended (its start lock can be released).
    pub attempt_ended: bool,
    /// How it ended (SUCCESS, FAILED or TIMEOUT), for a Finished report.
    pub attempt_state: Option<InstanceState>,
    /// The instance goes on to its next attempt (a retry after its backoff).
    pub retry_scheduled: bool,
    /// The run reached a terminal state.
    pub run_finished: Option<(RunId, RunState)>,
}

/// An instance that was DISPATCHED or RUNNING when it was cancelled: its worker must kill it.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledAttempt {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    pub worker_id: Option<String>,
}

/// What is active in the whole store now, for a node's gauges (`Store::active_counts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ActiveCounts {
    pub waiting: u64,
    pub dispatched: u64,
    pub running: u64,
    /// Runs in the run queue (QUEUED): its depth.
    pub queued_runs: u64,
    pub running_runs: u64,
    /// Since when the oldest WAITING instance has been ready to go (its creation, or the end
    /// of its retry backoff), when one is.
    pub oldest_ready_since: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceCounts {
    pub waiting: u32,
    pub dispatched: u32,
    pub running: u32,
    pub success: u32,
    pub failed: u32,
    pub timeout: u32,
    pub cancelled: u32,
    /// Tasks of the run's workflow version with no instance yet.
    pub not_created: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Consecutive lines of one attempt, stored as one row. Appending a chunk whose
/// (instance, attempt, first_seq) is already stored is a no-op (a resend after a reconnect).
///
/// The lines are kept packed, as the worker sends them and as the row stores them: one stream
/// per line, and the lines' text joined by `'\n'` (no line contains one). A batch of a thousand
/// lines is two buffers, never a thousand strings.
#[derive(Debug, Clone, PartialEq)]
pub struct LogChunk {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    /// 1-based line number of the first line.
    pub first_seq: u64,
    streams: Vec<LogStream>,
    body: String,
    pub at: Millis,
}

/// Why packed lines were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{lines} stream entries for {newlines} line breaks; packed lines need one entry per line")]
pub struct MispackedLines {
    pub lines: usize,
    pub newlines: usize,
}

impl LogChunk {
    /// A chunk of separate lines; a `'\n'` inside a line is replaced with a space.
    pub fn from_lines<S: AsRef<str>>(
        instance_id: InstanceId,
        attempt: Attempt,
        first_seq: u64,
        lines: impl IntoIterator<Item = (LogStream, S)>,
        at: Millis,
    ) -> LogChunk {
        let mut streams = Vec::new();
        let mut body = String::new();
        for (stream, text) in lines {
            if !streams.is_empty() {
                body.push('\n');
            }
            streams.push(stream);
            let text = text.as_ref();
            if text.contains('\n') {
                body.push_str(&text.replace('\n', " "));
            } else {
                body.push_str(text);
            }
        }
        LogChunk {
            instance_id,
            attempt,
            first_seq,
            streams,
            body,
            at,
        }
    }

    /// A chunk of packed lines: `body` holds the lines joined by `'\n'`, one per entry of
    /// `streams`.
    pub fn packed(
        instance_id: InstanceId,
        attempt: Attempt,
        first_seq: u64,
        streams: Vec<LogStream>,
        body: String,
        at: Millis,
    ) -> Result<LogChunk, MispackedLines> {
        let newlines = memchr::memchr_iter(b'\n', body.as_bytes()).count();
        let consistent = if streams.is_empty() {
            body.is_empty()
        } else {
            newlines == streams.len() - 1
        };
        if !consistent {
            return Err(MispackedLines {
                lines: streams.len(),
                newlines,
            });
        }
        Ok(LogChunk {
            instance_id,
            attempt,
            first_seq,
            streams,
            body,
            at,
        })
    }

    pub fn line_count(&self) -> usize {
        self.streams.len()
    }

    /// The line number of the last line (`first_seq - 1` when there is none).
    pub fn last_seq(&self) -> u64 {
        (self.first_seq + self.streams.len() as u64).saturating_sub(1)
    }

    /// The stream of each line, in order.
    pub fn streams(&self) -> &[LogStream] {
        &self.streams
    }

    /// The lines' text joined by `'\n'`.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// Masks every occurrence of each of `values` (none holding a line break) with `mask`: in a
    /// line, across the lines of a stream (where a worker cut a long line), and pieces of at
    /// least `min_piece` bytes at the chunk's edges ([`ax_core::mask`]). The lines stay as
    /// they are otherwise.
    /// Whether [`LogChunk::mask`] with these values would mask anything.
    pub fn would_mask(&self, values: &[String], min_piece: usize) -> bool {
        let rules = ax_core::mask::MaskRules {
            starts_attempt: self.first_seq <= 1,
            min_piece,
        };
        ax_core::mask::mask_lines(&self.streams, &self.body, values, "", rules).is_some()
    }

    pub fn mask(&mut self, values: &[String], mask: &str, min_piece: usize) {
        let rules = ax_core::mask::MaskRules {
            starts_attempt: self.first_seq <= 1,
            min_piece,
        };
        if let Some(masked) =
            ax_core::mask::mask_lines(&self.streams, &self.body, values, mask, rules)
        {
            self.body = masked;
        }
    }

    /// The lines in order.
    pub fn lines(&self) -> impl Iterator<Item = (LogStream, &str)> {
        let texts = (!self.streams.is_empty())
            .then(|| self.body.split('\n'))
            .into_iter()
            .flatten();
        self.streams.iter().copied().zip(texts)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredLine {
    pub seq: u64,
    pub stream: LogStream,
    pub text: String,
    pub at: Millis,
}

/// A scheduler node's lease: who holds the node id, where it listens, and until when. Times are
/// on the database's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLease {
    pub node_id: String,
    /// Random per process start: tells a restarted node from the one it replaces.
    pub incarnation: String,
    /// The address workers and clients reach the node at.
    pub address: String,
    pub version: String,
    pub started_at: Millis,
    pub renewed_at: Millis,
    pub expires_at: Millis,
    /// The node's clock minus the database's, as the node last measured it.
    pub clock_offset_ms: i64,
    /// Its `[pools]` as `name=limit` pairs in name order, comma-separated.
    pub pools: String,
}

/// What [`Store::claim_node_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseClaim {
    /// The lease is the caller's until `db_now + lease_ms`.
    Claimed { db_now: Millis },
    /// Live leases stand in the way: the same node id held by another incarnation, or (on
    /// SQLite, which serves one node) any other node.
    Refused {
        db_now: Millis,
        holders: Vec<NodeLease>,
    },
}

/// One node's share of the WAITING queue, so that nodes do not all claim the same instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueShare {
    pub nodes: u32,
    pub index: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRecord {
    pub id: String,
    pub version: String,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub running: u32,
    pub started_at: Millis,
    pub last_heartbeat: Millis,
    pub node_id: String,
    pub draining: bool,
    pub connected: bool,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Vec<String>>,
    /// The incarnation its worker process registered with (empty: none), so another node can
    /// tell the same process moving from a second one.
    pub incarnation: String,
}

/// A cron schedule whose next fire time has come.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSchedule {
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub cron: String,
    pub timezone: String,
    pub next_fire_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub at: Millis,
    /// Who: the actor the client named, or "anonymous".
    pub actor: String,
    /// What: `apply`, `trigger`, `cancel`, `pause`, `resume`, …
    pub action: String,
    /// Which object: `workflow/NAME`, `run/ID`, `instance/ID`.
    pub target: String,
    /// Free text (JSON is fine).
    pub detail: String,
    /// From where: the client's address.
    pub remote: String,
    /// The name of the token the call came with; empty when the node runs without
    /// authentication.
    pub token: String,
}

/// An API token as stored: never the token itself, which only its creator saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    pub role: ax_core::access::Role,
    /// `Some(app)`: the token sees and acts on that app's workflows only.
    pub app: Option<String>,
    pub created_at: Millis,
    /// The token name (or `store` for a token made on the store directly) that created it.
    pub created_by: String,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// A worker token's scope (worker ids, apps, labels); `None` for the other roles. A worker
    /// token stored before scopes existed reads as `WorkerScope::any()`.
    pub worker: Option<ax_core::worker_scope::WorkerScope>,
}

impl TokenRecord {
    /// Whether a request may use the token at `now`.
    pub fn is_valid_at(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| now < at)
    }
}

/// A token to store: its hash, never the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub name: String,
    pub role: ax_core::access::Role,
    pub app: Option<String>,
    /// SHA-256 of the token, as lowercase hex.
    pub hash: String,
    pub created_at: Millis,
    pub created_by: String,
    pub expires_at: Option<Millis>,
    /// A worker token's scope; `None` for the other roles.
    pub worker: Option<ax_core::worker_scope::WorkerScope>,
}

/// A secret as stored: its value sealed with the nodes' key (base64), never in the clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    /// The app whose workflows may name it; '' for a global secret, which every app's may.
    /// Each app has its own namespace of names: (app, name) is the key.
    pub app: String,
    pub name: String,
    pub sealed: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub updated_by: String,
}

/// Which audit rows to list: exact matches on the fields that are set, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub limit: u32,
    pub action: Option<String>,
    pub target: Option<String>,
    pub actor: Option<String>,
    /// The name of the token the calls came with.
    pub token: Option<String>,
}

/// One step of a purge of history (retention, `axctl purge`): the ended runs of one workflow
/// that ended before `ended_before`, taken in end order after `after`, a bounded batch at a
/// time. See [`Store::purge_runs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeStep {
    pub workflow_id: WorkflowId,
    /// Runs that ended (SUCCESS, FAILED or CANCELLED) before this instant go.
    pub ended_before: Millis,
    /// Where the previous step of the same pass stopped; `None` for the first step.
    pub after: Option<PurgeCursor>,
    /// Runs per step, at most.
    pub max_runs: u32,
    /// Rows per step besides the runs' own (instances, attempts, log chunks, decisions), at
    /// most, except that a step always takes at least one instance.
    pub max_rows: u32,
    /// Count what the step would delete; delete nothing.
    pub dry_run: bool,
}

/// A position in a workflow's ended runs: end time, then run id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PurgeCursor {
    pub finished_at: Millis,
    pub run: RunId,
}

/// Rows a purge deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeCounts {
    pub runs: u64,
    pub instances: u64,
    pub attempts: u64,
    pub log_chunks: u64,
    pub decisions: u64,
}

impl PurgeCounts {
    /// Every row, runs included.
    pub fn rows(&self) -> u64 {
        self.runs + self.instances + self.attempts + self.log_chunks + self.decisions
    }
}

impl std::ops::AddAssign for PurgeCounts {
    fn add_assign(&mut self, other: PurgeCounts) {
        self.runs += other.runs;
        self.instances += other.instances;
        self.attempts += other.attempts;
        self.log_chunks += other.log_chunks;
        self.decisions += other.decisions;
    }
}

/// What one [`Store::purge_runs`] step did, and where the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeProgress {
    pub counts: PurgeCounts,
    /// `None` when no ended run past the cutoff is left after this step (in a dry run: after the
    /// runs it counted).
    pub next: Option<PurgeCursor>,
}

/// A scheduling decision worth explaining later (`axctl why`): see [`ax_core::decision`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRecord {
    /// When it was decided.
    pub at: Millis,
    pub workflow_id: WorkflowId,
    /// The instant the decision is about: a cron slot's logical time, or `at`.
    pub slot_at: Millis,
    pub run_id: Option<RunId>,
    pub instance_id: Option<InstanceId>,
    pub task: Option<String>,
    pub kind: DecisionKind,
    /// One line for a person: "previous run 41 still running", "no live worker with gpu=a100".
    pub detail: String,
    /// The scheduler node that decided.
    pub node_id: String,
}

#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    // --- workflows ---

    /// Stores `spec` as the workflow's next version unless it equals the latest one.
    /// `next_fire_at` is the schedule's next cron fire (None when not cron-triggered); it is
    /// stored only when the version changes or the workflow is new.
    /// Writes the version, its task definitions and dependency edges, and the schedule plan in
    /// one transaction.
    async fn apply_workflow(
        &self,
        spec: &WorkflowSpec,
        source: &str,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<(WorkflowRecord, ApplyOutcome)>;
    /// The latest version.
    async fn get_workflow(&self, name: &str) -> Result<Option<WorkflowRecord>>;
    /// The id and latest version number of the workflow called `name`, without its spec: one
    /// light read for callers that cache versions (a version never changes once stored).
    async fn latest_version(&self, name: &str) -> Result<Option<(WorkflowId, u32)>>;
    async fn get_workflow_version(
        &self,
        id: WorkflowId,
        version: u32,
    ) -> Result<Option<WorkflowRecord>>;
    async fn list_workflows(&self, app: Option<&str>) -> Result<Vec<WorkflowRecord>>;
    /// [`Store::list_workflows`] without the specs and sources, by name: one row per workflow,
    /// however large its definition.
    async fn list_workflow_heads(&self, app: Option<&str>) -> Result<Vec<WorkflowHead>>;
    /// Pauses or resumes a workflow's schedule. On resume `next_fire_at` replaces the stored one.
    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<WorkflowRecord>>;

    // --- schedules ---

    async fn due_schedules(&self, now: Millis, limit: u32) -> Result<Vec<DueSchedule>>;
    /// Moves a schedule's next fire time from `from` to `to`; false if someone else did.
    async fn advance_schedule(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
    ) -> Result<bool> {
        let won = self.advance_schedules(&[(workflow_id, from, to)]).await?;
        Ok(won.first().copied().unwrap_or(false))
    }
    /// `advance_schedule` for several schedules (workflow, from, to) in one transaction; says for
    /// each whether this call moved it.
    async fn advance_schedules(&self, moves: &[(WorkflowId, Millis, Millis)]) -> Result<Vec<bool>>;

    // --- runs ---

    /// Creates the run and a WAITING first attempt for each root task of its version, in one
    /// transaction. Returns the existing run and `false` when the dedup key is taken.
    /// Inside the same transaction (the workflow row locked on MySQL) the store decides, by
    /// `ax_core::firing::start_or_queue` with the latest version's limits, whether the run
    /// starts or is created QUEUED, without instances (a `queued` decision is recorded). When a
    /// run ends by any path, the oldest queued runs of its workflow that now fit are started in
    /// that transaction (`dequeued` decisions).
    async fn create_run(&self, run: &NewRun) -> Result<(RunRecord, bool)>;
    /// `create_run` for several runs in one transaction, in order (each sees the ones before
    /// it). On an error nothing is created; the caller may retry the runs one by one.
    async fn create_runs(&self, runs: &[NewRun]) -> Result<Vec<(RunRecord, bool)>> {
        Ok(self.create_runs_placed(runs, &mut NoPlacement).await?.0)
    }
    /// `create_runs`, with each new root instance offered to `placement`: the ones it places
    /// are created DISPATCHED and returned (see [`Placement`]).
    async fn create_runs_placed(
        &self,
        runs: &[NewRun],
        placement: &mut dyn Placement,
    ) -> Result<(Vec<(RunRecord, bool)>, Vec<PlacedAttempt>)>;
    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>>;
    /// Newest first; with `before`, only runs with a smaller id (the next page).
    async fn list_runs(
        &self,
        workflow: Option<&str>,
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>>;
    /// [`Store::list_runs`] over the runs of `workflows` only (none when it is empty): an app's
    /// page of runs, whatever other apps' runs lie between them.
    async fn list_runs_of(
        &self,
        workflows: &[WorkflowId],
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>>;
    async fn run_counts(&self, id: RunId) -> Result<InstanceCounts>;
    /// The counts of several runs in one read; a run that does not exist is left out.
    async fn runs_counts(&self, ids: &[RunId]) -> Result<HashMap<RunId, InstanceCounts>>;
    /// Marks the run cancel-requested, cancels its unfinished instances, ends it CANCELLED and
    /// returns the attempts that were dispatched or running (their workers must kill them).
    /// A QUEUED run (no instances) simply ends CANCELLED. Queued runs of the workflow that now
    /// fit are started in the same transaction.
    async fn cancel_run(&self, id: RunId, now: Millis) -> Result<Option<Vec<CancelledAttempt>>>;

    // --- instances ---

    async fn get_instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>>;
    async fn list_instances(&self, run: RunId) -> Result<Vec<InstanceRecord>>;
    async fn list_attempts(&self, id: InstanceId) -> Result<Vec<AttemptRecord>>;
    /// Every attempt of every instance of a run, by instance id then attempt number.
    async fn list_run_attempts(&self, run: RunId) -> Result<Vec<AttemptRecord>>;
    /// Cancels one unfinished instance (ending its run if nothing is left). `Ok(None)` when it
    /// does not exist; the returned attempt is set when it was dispatched or running.
    async fn cancel_instance(
        &self,
        id: InstanceId,
        now: Millis,
    ) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>>;

    /// A person asks for another attempt of a finished, unsuccessful instance: it becomes
    /// WAITING as attempt + 1 (the earlier attempts keep their records), and its run, if it had
    /// ended, is running again.
    async fn retry_instance(&self, id: InstanceId, now: Millis) -> Result<ManualRetry>;
    /// Retries every FAILED, TIMEOUT and CANCELLED task instance of a run (their downstream
    /// follows when they succeed), except sharded tasks' instances with shards still going.
    /// `None` when the run does not exist.
    async fn rerun_failed(&self, run: RunId, now: Millis) -> Result<Option<RerunFailed>>;

    // --- dispatch ---

    /// Attempts that are DISPATCHED or RUNNING, oldest first, for the liveness backstop; only
    /// those on `worker` when given (a worker re-registering).
    async fn active_attempts(&self, worker: Option<&str>, limit: u32)
    -> Result<Vec<ActiveAttempt>>;

    /// WAITING instances with `not_before <= now`, highest priority first, then oldest.
    async fn waiting(&self, now: Millis, limit: u32) -> Result<Vec<WaitingInstance>>;
    /// [`Store::waiting`], only the instances of one node's share of the queue: those whose id
    /// is `share.index` modulo `share.nodes`.
    async fn waiting_share(
        &self,
        now: Millis,
        limit: u32,
        share: QueueShare,
    ) -> Result<Vec<WaitingInstance>>;
    /// WAITING → DISPATCHED for each claim, each a conditional update on (id, attempt, WAITING),
    /// all in one transaction; records the attempt's worker and dispatch time. Returns, per
    /// claim, whether this call won it.
    async fn mark_dispatched(&self, claims: &[DispatchClaim]) -> Result<Vec<bool>>;
    /// The counters of these concurrency scopes (instances holding each now); a scope without a
    /// counter is absent.
    async fn limit_usage(&self, scopes: &[String]) -> Result<BTreeMap<String, u32>>;
    /// Fans a WAITING sharded task's instance (the parent) out into one WAITING shard per
    /// worker in `workers` (shard index = position), each pinned to its worker; the parent
    /// becomes RUNNING with no worker and is never dispatched. One transaction; false (and
    /// nothing changed) when the parent is no longer WAITING as `attempt`, or `workers` is empty.
    async fn fan_out(
        &self,
        parent: InstanceId,
        attempt: Attempt,
        workers: &[String],
        now: Millis,
    ) -> Result<bool>;
    /// A WAITING shard whose pinned worker is gone for good fails (no retry: it may run only
    /// there), with `reason` on its attempt; its parent and run end as the rules say. False when
    /// it is no longer WAITING as `attempt`.
    async fn fail_shard(
        &self,
        id: InstanceId,
        attempt: Attempt,
        reason: &str,
        now: Millis,
    ) -> Result<bool>;
    /// Applies worker reports in one transaction, in order; one result per report. A report
    /// that names its worker (`worker_id: Some`) is applied only from the worker its attempt was
    /// dispatched to; from any other it is [`ReportResult::NotYours`], as is one that would be
    /// stale or not found and whose attempt was never dispatched to that worker.
    async fn apply_reports(&self, reports: &[Report], now: Millis) -> Result<Vec<ReportResult>> {
        Ok(self
            .apply_reports_placed(reports, now, &mut NoPlacement)
            .await?
            .0)
    }
    /// `apply_reports`, with each first attempt the advance creates offered to `placement`:
    /// the ones it places are created DISPATCHED and returned (see [`Placement`]).
    async fn apply_reports_placed(
        &self,
        reports: &[Report],
        now: Millis,
        placement: &mut dyn Placement,
    ) -> Result<(Vec<ReportResult>, Vec<PlacedAttempt>)>;

    // --- logs ---

    async fn append_logs(&self, chunks: &[LogChunk]) -> Result<()>;
    /// Appends workers' chunks as [`Store::append_logs`] does, except those whose sender is
    /// not the worker the attempt was dispatched to. `senders[i]` is `None` for a chunk the
    /// node already knows is its sender's (an attempt it dispatched or re-attached on that
    /// stream), or `Some(worker)` to check, in the same transaction, that the attempt exists and
    /// was dispatched to `worker`. Answers, per chunk, whether it was kept: a refused chunk
    /// (another worker's attempt, one that does not exist yet) is not stored, so no line can be
    /// written ahead for an attempt to come.
    async fn append_worker_logs(
        &self,
        chunks: &[LogChunk],
        senders: &[Option<&str>],
    ) -> Result<Vec<bool>>;
    /// Lines with seq > `after_seq`, in order, at most `limit`.
    async fn read_logs(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredLine>>;
    /// The highest line number stored for an attempt (0 when none is): how far a running
    /// attempt's log has come, before its end report says how many lines it had.
    async fn last_log_seq(&self, instance: InstanceId, attempt: Attempt) -> Result<u64>;

    // --- workers ---

    /// Saves workers' rows (inserted or replaced, by id) in one transaction; a worker listed
    /// twice keeps its last record.
    async fn upsert_workers(&self, workers: &[WorkerRecord]) -> Result<()>;
    async fn list_workers(&self) -> Result<Vec<WorkerRecord>>;
    /// The row of the worker `id`, if any.
    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>>;
    /// Instances WAITING, DISPATCHED and RUNNING and runs QUEUED and RUNNING, store-wide: one
    /// indexed count per table, whatever the history's size.
    async fn active_counts(&self) -> Result<ActiveCounts>;

    // --- scheduler nodes ---

    /// Takes the lease of `lease.node_id` for `lease_ms` from the database's now, in one
    /// transaction, unless a live lease stands in the way (see [`LeaseClaim::Refused`]). A
    /// lease in `presumed_dead` that is unchanged since the caller read it (same node id,
    /// incarnation and `renewed_at`) counts as dead: its holder stopped renewing.
    /// `lease.started_at`, `renewed_at` and `expires_at` are set from the database's clock.
    async fn claim_node_lease(
        &self,
        lease: &NodeLease,
        lease_ms: u64,
        presumed_dead: &[NodeLease],
    ) -> Result<LeaseClaim>;
    /// Extends the caller's lease to `lease_ms` from the database's now and records its clock
    /// offset. `None` when the row is no longer this incarnation's (it expired and another
    /// node took the id); otherwise the database's now.
    async fn renew_node_lease(
        &self,
        node_id: &str,
        incarnation: &str,
        lease_ms: u64,
        clock_offset_ms: i64,
    ) -> Result<Option<Millis>>;
    /// Gives the lease up (a clean shutdown), if it is still this incarnation's.
    async fn release_node_lease(&self, node_id: &str, incarnation: &str) -> Result<()>;
    /// Every node's lease, live or expired, by node id, with the database's now.
    async fn list_node_leases(&self) -> Result<(Millis, Vec<NodeLease>)>;

    // --- audit ---

    /// Stores audit rows in one transaction: all of them or none.
    async fn insert_audits(&self, records: &[AuditRecord]) -> Result<()>;
    async fn insert_audit(&self, record: &AuditRecord) -> Result<()> {
        self.insert_audits(std::slice::from_ref(record)).await
    }
    /// Newest first.
    async fn list_audit(&self, limit: u32) -> Result<Vec<AuditRecord>> {
        self.query_audit(&AuditFilter {
            limit,
            ..AuditFilter::default()
        })
        .await
    }
    /// The rows matching every set field of `filter`, newest first, at most `filter.limit`.
    async fn query_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>>;

    // --- tokens and secrets ---

    /// Stores a new token; `false` (and nothing changed) when its name is taken.
    async fn create_token(&self, token: &NewToken) -> Result<bool>;
    /// Every token, revoked and expired ones too, by name.
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>>;
    /// The token whose hash is `hash`, whatever its state.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// Revokes the token called `name` at `now` (a second revocation keeps the first time);
    /// `None` when no token has that name.
    async fn revoke_token(&self, name: &str, now: Millis) -> Result<Option<TokenRecord>>;
    /// Creates or replaces the secret called `name` of `app` ('' for a global one); another
    /// app's secret of that name is a different secret and stays as it is.
    async fn put_secret(
        &self,
        app: &str,
        name: &str,
        sealed: &str,
        now: Millis,
        by: &str,
    ) -> Result<SecretRecord>;
    /// Every secret of every app, by app ('' first) then name.
    async fn list_secrets(&self) -> Result<Vec<SecretRecord>>;
    /// Deletes the secret called `name` of `app` ('' for the global one) and no other; `false`
    /// when that app has no secret of that name.
    async fn delete_secret(&self, app: &str, name: &str) -> Result<bool>;

    /// The runs of a workflow nearest to `at` by logical time: the latest with
    /// `logical_time <= at` and the earliest after it (either may be missing), in that order.
    async fn runs_near(&self, workflow_id: WorkflowId, at: Millis) -> Result<Vec<RunRecord>>;

    // --- run queue and schedule policies ---

    /// The workflow's runs that have not ended (RUNNING or QUEUED), oldest first, at most `limit`.
    async fn unfinished_runs(&self, workflow_id: WorkflowId, limit: u32) -> Result<Vec<RunRecord>>;
    /// The schedule's stored next fire time (kept while paused); `None` without a schedule.
    async fn schedule_next_fire(&self, workflow_id: WorkflowId) -> Result<Option<Millis>>;

    // --- decisions ---

    /// Stores decisions in one multi-row insert.
    async fn record_decisions(&self, decisions: &[DecisionRecord]) -> Result<()>;
    /// Stores the decisions whose (instance, kind, detail) is not stored yet (each must name an
    /// instance); returns how many it stored. For decisions a dispatcher would otherwise repeat
    /// every pass (throttled, no worker).
    async fn record_decisions_once(&self, decisions: &[DecisionRecord]) -> Result<u32>;
    /// A workflow's decisions with `from <= slot_at <= to`, oldest first, at most `limit`.
    async fn list_decisions(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>>;

    // --- DAG semantics ---

    /// Reruns `task` of a run and everything below it (transitively), in one transaction: the
    /// task's instance becomes WAITING as its next attempt, each instance below it that ran
    /// becomes PENDING (it runs again as its next attempt once its upstreams succeeded again),
    /// earlier attempts keep their records, and the run is running again. Changes nothing unless
    /// the answer is `Rerun`.
    async fn rerun_from(&self, run: RunId, task: &str, now: Millis) -> Result<RerunFrom>;
    /// Every stored workflow's `schedule.after` list, by workflow name.
    async fn workflow_dependencies(&self) -> Result<BTreeMap<String, Vec<String>>>;

    // --- retention ---

    /// One step of a purge: the next ended runs of the step's workflow (SUCCESS, FAILED or
    /// CANCELLED, `finished_at` before the cutoff) in end order, at most `max_runs` of them and
    /// as many as fit in `max_rows`, are deleted with their instances, attempts, log chunks and
    /// decisions, in one short transaction. The runs are read first without a lock, then
    /// locked by primary key and checked again: a run reopened meanwhile (a manual retry), or
    /// with an instance still active or holding a concurrency slot, is skipped. Every delete
    /// goes by primary key (or its prefix), so the transaction locks only the purged rows. A
    /// run too large for one step loses a batch of its instances per step and goes with the
    /// last. With `dry_run` the same runs are counted, nothing is locked or deleted.
    async fn purge_runs(&self, step: &PurgeStep) -> Result<PurgeProgress>;
    /// Deletes (or with `dry_run` counts) at most `limit` of the workflow's decisions that
    /// belong to no run or instance (dropped slots: misfired, skipped) with a slot before
    /// `before`; returns how many. A dry run counts them all.
    async fn purge_slot_decisions(
        &self,
        workflow_id: WorkflowId,
        before: Millis,
        limit: u32,
        dry_run: bool,
    ) -> Result<u64>;
    /// Deletes (or with `dry_run` counts) at most `limit` of the oldest audit rows written
    /// before `before`, by id; returns how many. A dry run counts them all.
    async fn purge_audit(&self, before: Millis, limit: u32, dry_run: bool) -> Result<u64>;
}
