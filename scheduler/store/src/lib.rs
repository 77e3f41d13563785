//! The store of record: one trait, a MySQL and a SQLite backend.
//!
//! Only this module knows SQL. Every instance transition is a conditional update keyed by
//! (instance, attempt, from-state); the decisions themselves (is the transition legal, is a
//! downstream task ready, does the run end, when does a retry start) come from `ax-core`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;

mod records;
mod sql;
#[cfg(test)]
mod tests;

pub use records::access::{NewToken, SecretRecord, TokenRecord};
pub use records::audit::{AuditFilter, AuditRecord};
pub use records::decisions::DecisionRecord;
pub use records::dispatch::{ActiveAttempt, DispatchClaim, QueueShare, Shard, WaitingInstance};
pub use records::logs::{LogChunk, LogStream, MispackedLines, StoredLine};
pub use records::nodes::{LeaseClaim, NodeLease};
pub use records::placement::{NewAttempt, NoPlacement, PlacedAttempt, Placement};
pub use records::purge::{PurgeCounts, PurgeCursor, PurgeProgress, PurgeStep};
pub use records::reports::{Applied, AttemptEnd, Report, ReportResult};
pub use records::reruns::{ManualRetry, RerunFailed, RerunFrom};
pub use records::runs::{
    ActiveCounts, AttemptRecord, Caller, CancelledAttempt, InstanceCounts, InstanceRecord, NewRun,
    RunRecord,
};
pub use records::workers::WorkerRecord;
pub use records::workflows::{ApplyOutcome, DueSchedule, WorkflowHead, WorkflowRecord};
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
