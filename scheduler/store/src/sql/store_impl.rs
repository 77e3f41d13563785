//! The [`Store`] trait for [`SqlStore`], as a table of contents: each method hands its work to
//! the file of its subject. Where the subject's function takes the caller's connection (most
//! are `_tx` functions, which other transactions call too), the method opens the transaction
//! here with [`write_tx!`]; the other functions take the store and read or write on their own.
//!
//! The subjects: `workflows.rs` (workflows and their schedules), `run_create.rs` and `runs.rs`
//! (creating and reading runs and instances), `cancel.rs`, `rerun.rs` (reruns and manual
//! retries), `dispatch.rs` (the waiting queue, claims, limits and shards), `reports.rs` (worker
//! reports), `logs.rs`, `workers.rs`, `nodes.rs`, `audit.rs`, `decisions.rs`, `dependents.rs`
//! (dependencies between workflows) and `purge.rs` (retention).

use std::collections::HashMap;

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;

use super::counted::Counted;
use super::placing::Placing;
use super::{
    SqlStore, access, audit, cancel, decisions, dependents, dispatch, gauges, logs, nodes, purge,
    reports, rerun, run_create, runs, workers, workflows, write_tx,
};
use crate::{
    ActiveAttempt, ActiveCounts, ApplyOutcome, AttemptRecord, AuditFilter, AuditRecord, Backend,
    CancelledAttempt, DecisionRecord, DispatchClaim, DueSchedule, InstanceCounts, InstanceRecord,
    LeaseClaim, LogChunk, ManualRetry, NewRun, NewToken, NodeLease, PlacedAttempt, Placement,
    PurgeProgress, PurgeStep, QueueShare, Report, ReportResult, RerunFailed, Result, RunRecord,
    SecretRecord, Store, StoredLine, TokenRecord, WaitingInstance, WorkerRecord, WorkflowHead,
    WorkflowRecord,
};

#[async_trait::async_trait]
impl Store for SqlStore {
    fn backend(&self) -> Backend {
        self.backend_kind()
    }

    async fn apply_workflow(
        &self,
        spec: &WorkflowSpec,
        source: &str,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<(WorkflowRecord, ApplyOutcome)> {
        workflows::apply_workflow(self, spec, source, next_fire_at, now).await
    }

    async fn get_workflow(&self, name: &str) -> Result<Option<WorkflowRecord>> {
        workflows::get_workflow(self, name).await
    }

    async fn latest_version(&self, name: &str) -> Result<Option<(WorkflowId, u32)>> {
        workflows::latest_version(self, name).await
    }

    async fn get_workflow_version(
        &self,
        id: WorkflowId,
        version: u32,
    ) -> Result<Option<WorkflowRecord>> {
        workflows::get_workflow_version(self, id, version).await
    }

    async fn list_workflows(&self, app: Option<&str>) -> Result<Vec<WorkflowRecord>> {
        workflows::list_workflows(self, app).await
    }

    async fn list_workflow_heads(&self, app: Option<&str>) -> Result<Vec<WorkflowHead>> {
        workflows::list_workflow_heads(self, app).await
    }

    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire_at: Option<Millis>,
        now: Millis,
    ) -> Result<Option<WorkflowRecord>> {
        workflows::set_paused(self, name, paused, next_fire_at, now).await
    }

    async fn due_schedules(&self, now: Millis, limit: u32) -> Result<Vec<DueSchedule>> {
        workflows::due_schedules(self, now, limit).await
    }

    async fn advance_schedules(&self, moves: &[(WorkflowId, Millis, Millis)]) -> Result<Vec<bool>> {
        workflows::advance_schedules(self, moves).await
    }

    async fn create_run(&self, run: &NewRun) -> Result<(RunRecord, bool)> {
        run_create::create_run(self, run).await
    }

    async fn create_runs_placed(
        &self,
        runs: &[NewRun],
        placement: &mut dyn Placement,
    ) -> Result<(Vec<(RunRecord, bool)>, Vec<PlacedAttempt>)> {
        run_create::create_runs(self, runs, placement).await
    }

    async fn get_run(&self, id: RunId) -> Result<Option<RunRecord>> {
        runs::get_run(self, id).await
    }

    async fn list_runs(
        &self,
        workflow: Option<&str>,
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        runs::list_runs(self, workflow, state, before, limit).await
    }

    async fn list_runs_of(
        &self,
        workflows: &[WorkflowId],
        state: Option<RunState>,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<Vec<RunRecord>> {
        runs::list_runs_of(self, workflows, state, before, limit).await
    }

    async fn run_counts(&self, id: RunId) -> Result<InstanceCounts> {
        runs::run_counts(self, id).await
    }

    async fn runs_counts(&self, ids: &[RunId]) -> Result<HashMap<RunId, InstanceCounts>> {
        runs::runs_counts(self, ids).await
    }

    async fn cancel_run(&self, id: RunId, now: Millis) -> Result<Option<Vec<CancelledAttempt>>> {
        write_tx!(self, |c| cancel::cancel_run_tx(self, c, id, now))
    }

    async fn get_instance(&self, id: InstanceId) -> Result<Option<InstanceRecord>> {
        runs::get_instance(self, id).await
    }

    async fn list_instances(&self, run: RunId) -> Result<Vec<InstanceRecord>> {
        runs::list_instances(self, run).await
    }

    async fn list_attempts(&self, id: InstanceId) -> Result<Vec<AttemptRecord>> {
        runs::list_attempts(self, id).await
    }

    async fn list_run_attempts(&self, run: RunId) -> Result<Vec<AttemptRecord>> {
        runs::list_run_attempts(self, run).await
    }

    async fn cancel_instance(
        &self,
        id: InstanceId,
        now: Millis,
    ) -> Result<Option<(InstanceRecord, Option<CancelledAttempt>)>> {
        write_tx!(self, |c| cancel::cancel_instance_tx(self, c, id, now))
    }

    async fn waiting(&self, now: Millis, limit: u32) -> Result<Vec<WaitingInstance>> {
        dispatch::waiting(self, now, limit, None).await
    }

    async fn waiting_share(
        &self,
        now: Millis,
        limit: u32,
        share: QueueShare,
    ) -> Result<Vec<WaitingInstance>> {
        dispatch::waiting(self, now, limit, Some(share)).await
    }

    async fn retry_instance(&self, id: InstanceId, now: Millis) -> Result<ManualRetry> {
        write_tx!(self, |c| rerun::retry_instance_tx(self, c, id, now))
    }

    async fn rerun_failed(&self, run: RunId, now: Millis) -> Result<Option<RerunFailed>> {
        write_tx!(self, |c| rerun::rerun_failed_tx(self, c, run, now))
    }

    async fn active_attempts(
        &self,
        worker: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ActiveAttempt>> {
        dispatch::active_attempts(self, worker, limit).await
    }

    async fn mark_dispatched(&self, claims: &[DispatchClaim]) -> Result<Vec<bool>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| dispatch::mark_dispatched(self, c, claims))
    }

    async fn limit_usage(
        &self,
        scopes: &[String],
    ) -> Result<std::collections::BTreeMap<String, u32>> {
        dispatch::limit_usage(self, scopes).await
    }

    async fn fan_out(
        &self,
        parent: InstanceId,
        attempt: Attempt,
        workers: &[String],
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| dispatch::fan_out_tx(
            self, c, parent, attempt, workers, now
        ))
    }

    async fn fail_shard(
        &self,
        id: InstanceId,
        attempt: Attempt,
        reason: &str,
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| dispatch::fail_shard_tx(
            self, c, id, attempt, reason, now
        ))
    }

    async fn apply_reports_placed(
        &self,
        reports: &[Report],
        now: Millis,
        placement: &mut dyn Placement,
    ) -> Result<(Vec<ReportResult>, Vec<PlacedAttempt>)> {
        if reports.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        write_tx!(self, |c| async {
            let mut placing = Placing::new(&mut *placement, now);
            let results = reports::apply_reports(self, c, reports, now, &mut placing).await?;
            Ok((results, placing.finish(c).await?))
        })
    }

    async fn append_logs(&self, chunks: &[LogChunk]) -> Result<()> {
        if chunks.iter().all(|chunk| chunk.line_count() == 0) {
            return Ok(());
        }
        write_tx!(self, |c| logs::append_logs_tx(self, c, chunks))
    }

    async fn append_worker_logs(
        &self,
        chunks: &[LogChunk],
        senders: &[Option<&str>],
    ) -> Result<Vec<bool>> {
        if chunks.iter().all(|chunk| chunk.line_count() == 0) {
            return Ok(vec![true; chunks.len()]);
        }
        write_tx!(self, |c| logs::append_worker_logs_tx(
            self, c, chunks, senders
        ))
    }

    async fn read_logs(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredLine>> {
        logs::read_logs(self, instance, attempt, after_seq, limit).await
    }

    async fn last_log_seq(&self, instance: InstanceId, attempt: Attempt) -> Result<u64> {
        logs::last_log_seq(self, instance, attempt).await
    }

    async fn upsert_workers(&self, workers: &[WorkerRecord]) -> Result<()> {
        workers::upsert_workers(self, workers).await
    }

    async fn list_workers(&self) -> Result<Vec<WorkerRecord>> {
        workers::list_workers(self).await
    }

    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        workers::worker(self, id).await
    }

    async fn active_counts(&self) -> Result<ActiveCounts> {
        gauges::active_counts(self).await
    }

    async fn claim_node_lease(
        &self,
        lease: &NodeLease,
        lease_ms: u64,
        presumed_dead: &[NodeLease],
    ) -> Result<LeaseClaim> {
        nodes::claim_node_lease(self, lease, lease_ms, presumed_dead).await
    }

    async fn renew_node_lease(
        &self,
        node_id: &str,
        incarnation: &str,
        lease_ms: u64,
        clock_offset_ms: i64,
    ) -> Result<Option<Millis>> {
        nodes::renew_node_lease(self, node_id, incarnation, lease_ms, clock_offset_ms).await
    }

    async fn release_node_lease(&self, node_id: &str, incarnation: &str) -> Result<()> {
        nodes::release_node_lease(self, node_id, incarnation).await
    }

    async fn list_node_leases(&self) -> Result<(Millis, Vec<NodeLease>)> {
        nodes::list_node_leases(self).await
    }

    async fn insert_audits(&self, records: &[AuditRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        write_tx!(self, |c| async {
            audit::insert_rows(&mut Counted::new(c), records).await
        })
    }

    async fn query_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        audit::query_audit(self, filter).await
    }

    async fn create_token(&self, token: &NewToken) -> Result<bool> {
        access::create_token(self, token).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        access::list_tokens(self).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        access::token_by_hash(self, hash).await
    }

    async fn revoke_token(&self, name: &str, now: Millis) -> Result<Option<TokenRecord>> {
        access::revoke_token(self, name, now).await
    }

    async fn put_secret(
        &self,
        app: &str,
        name: &str,
        sealed: &str,
        now: Millis,
        by: &str,
    ) -> Result<SecretRecord> {
        access::put_secret(self, app, name, sealed, now, by).await
    }

    async fn list_secrets(&self) -> Result<Vec<SecretRecord>> {
        access::list_secrets(self).await
    }

    async fn delete_secret(&self, app: &str, name: &str) -> Result<bool> {
        access::delete_secret(self, app, name).await
    }

    async fn runs_near(&self, workflow_id: WorkflowId, at: Millis) -> Result<Vec<RunRecord>> {
        runs::runs_near(self, workflow_id, at).await
    }

    async fn unfinished_runs(&self, workflow_id: WorkflowId, limit: u32) -> Result<Vec<RunRecord>> {
        runs::unfinished_runs(self, workflow_id, limit).await
    }

    async fn schedule_next_fire(&self, workflow_id: WorkflowId) -> Result<Option<Millis>> {
        workflows::schedule_next_fire(self, workflow_id).await
    }

    async fn record_decisions(&self, decisions: &[DecisionRecord]) -> Result<()> {
        decisions::record_decisions(self, decisions).await
    }

    async fn record_decisions_once(&self, decisions: &[DecisionRecord]) -> Result<u32> {
        if decisions.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |c| decisions::record_decisions_once_tx(c, decisions))
    }

    async fn list_decisions(
        &self,
        workflow_id: WorkflowId,
        from: Millis,
        to: Millis,
        limit: u32,
    ) -> Result<Vec<DecisionRecord>> {
        decisions::list_decisions(self, workflow_id, from, to, limit).await
    }

    async fn rerun_from(&self, run: RunId, task: &str, now: Millis) -> Result<crate::RerunFrom> {
        write_tx!(self, |c| rerun::rerun_from_tx(self, c, run, task, now))
    }

    async fn workflow_dependencies(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Vec<String>>> {
        dependents::all_edges(self).await
    }

    async fn purge_runs(&self, step: &PurgeStep) -> Result<PurgeProgress> {
        purge::purge_runs(self, step).await
    }

    async fn purge_slot_decisions(
        &self,
        workflow_id: WorkflowId,
        before: Millis,
        limit: u32,
        dry_run: bool,
    ) -> Result<u64> {
        purge::purge_slot_decisions(self, workflow_id, before, limit, dry_run).await
    }

    async fn purge_audit(&self, before: Millis, limit: u32, dry_run: bool) -> Result<u64> {
        purge::purge_audit(self, before, limit, dry_run).await
    }
}
