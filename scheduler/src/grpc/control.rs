//! `ControlService`: what axctl, the UI and other services call. Any node serves it.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ax_core::audit_text;
use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec, parse_workflow};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use ax_store::{
    AttemptRecord, AuditRecord, Caller, InstanceCounts, InstanceRecord, LogStream, ManualRetry,
    NewRun, WorkflowRecord,
};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::convert::{self, store_status};
use crate::clock::now_ms;
use crate::node::Node;
use crate::specs::VersionedSpec;

mod access;
mod admission;
mod backfill;
mod dag;
mod grid;
mod items;
mod mark;
mod purge;
mod secrets;
mod selection;
mod sub_workflows;
mod watch;
mod workflow_sets;

use access::Call;

/// Workflow files larger than this are refused.
const MAX_SOURCE_BYTES: usize = 4 << 20;
/// The largest control request the server decodes: a set of workflow files at the limit
/// (`ApplyWorkflows`) plus room for the other fields, so an oversized file or set meets the
/// clear "the limit is" refusal rather than the transport's generic one (tonic decodes at most
/// 4 MiB by default).
pub(crate) const MAX_REQUEST_BYTES: usize = workflow_sets::MAX_SET_BYTES + (1 << 20);
const MAX_KEY_BYTES: usize = 255;
/// Lines read from the store per page of GetLogs.
const LOG_PAGE: u32 = 20_000;
/// Text per GetLogs message.
const MAX_CHUNK_BYTES: usize = 1 << 20;
/// The most recent runs ListWorkflows attaches to each workflow.
const MAX_RECENT_RUNS: u32 = 50;

pub struct ControlApi {
    node: Arc<Node>,
}

impl ControlApi {
    pub fn new(node: Arc<Node>) -> Self {
        ControlApi { node }
    }

    /// The node it serves (the web edge's `/metrics` and sign-in).
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The graph and layout `GetDag` answers with, for renderings the API does not carry (the
    /// web UI's exports), to a caller who may see the workflow.
    pub async fn dag(
        &self,
        request: tonic::Request<pb::GetDagRequest>,
    ) -> Result<(ax_core::render::Graph, Option<crate::dag_layouts::Laid>), Status> {
        let call = Call::of(&request);
        self.check_dag_scope(&call, request.get_ref()).await?;
        super::views::dag(&self.node, request.get_ref()).await
    }

    /// Refuses a scoped caller the graph of another app's workflow, or of a run of another
    /// app's workflow drawn on one of its own, each exactly as a missing one is refused.
    async fn check_dag_scope(
        &self,
        call: &Call,
        request: &pb::GetDagRequest,
    ) -> Result<(), Status> {
        if call.app_scope().is_none() {
            return Ok(());
        }
        // A run is checked by itself: a deleted workflow's run keeps its graph.
        if request.run_id > 0 {
            self.visible_run(call, RunId(request.run_id)).await?;
        } else {
            self.workflow_named(call, &request.workflow).await?;
        }
        Ok(())
    }

    /// Changes whenever runs, instances or logs change on this node.
    pub fn watch_progress(&self) -> tokio::sync::watch::Receiver<u64> {
        self.node.watch_progress()
    }

    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: String,
        detail: String,
        caller: &Caller,
    ) {
        let record = AuditRecord {
            at: now_ms(),
            actor: if actor.trim().is_empty() {
                "anonymous".into()
            } else {
                actor.trim().into()
            },
            action: action.into(),
            target,
            detail,
            remote: caller.remote.clone(),
            token: caller.token.clone(),
        };
        if let Err(err) = self.node.audit.record(record).await {
            tracing::error!(error = %err, action, "writing the audit row failed");
        }
    }

    /// The latest version of the workflow called `name`, its spec from the node's cache: one
    /// light read instead of the whole stored row on every trigger.
    async fn latest_spec(&self, call: &Call, name: &str) -> Result<LatestSpec, Status> {
        require_name(name)?;
        let (id, version) = self
            .node
            .store
            .latest_version(name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("workflow {name:?} not found")))?;
        let versioned = self
            .node
            .specs
            .get(id, version)
            .await
            .map_err(store_status)?;
        call.sees(&versioned.spec.app, || {
            format!("workflow {name:?} not found")
        })?;
        Ok(LatestSpec {
            id,
            version,
            versioned,
        })
    }

    /// The answer to a trigger whose dedup key already has a run of `workflow`: that run, not
    /// created now.
    async fn existing_run(
        &self,
        workflow: WorkflowId,
        dedup_key: &str,
    ) -> Result<Option<pb::TriggerWorkflowResponse>, Status> {
        let run = self
            .node
            .store
            .run_by_dedup_key(workflow, dedup_key)
            .await
            .map_err(store_status)?;
        match run {
            Some(run) => Ok(Some(self.answer_existing(run).await?)),
            None => Ok(None),
        }
    }

    /// The answer to a trigger that found its run already there: the run with its counts read.
    async fn answer_existing(
        &self,
        run: ax_store::RunRecord,
    ) -> Result<pb::TriggerWorkflowResponse, Status> {
        let counts = self
            .node
            .store
            .run_counts(run.id)
            .await
            .map_err(store_status)?;
        Ok(pb::TriggerWorkflowResponse {
            run: Some(convert::run(&run, Some(&counts))),
            created: false,
        })
    }

    /// The workflow called `name`, if it exists and the caller may see it.
    async fn workflow_named(&self, call: &Call, name: &str) -> Result<WorkflowRecord, Status> {
        require_name(name)?;
        let not_found = || format!("workflow {name:?} not found");
        let record = self
            .node
            .store
            .get_workflow(name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(not_found()))?;
        call.sees(&record.spec.app, not_found)?;
        Ok(record)
    }

    /// Pauses or resumes a workflow's schedule. The slots that passed while paused are handled
    /// by the workflow's misfire policy on resume, as after a downtime (`schedules::resume_point`).
    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        actor: &str,
        call: &Call,
    ) -> Result<Response<pb::Workflow>, Status> {
        let current = self.workflow_named(call, name).await?;
        let now = now_ms();
        let (next, decisions) = if paused {
            (None, Vec::new())
        } else {
            crate::schedules::resume_point(
                &self.node.store,
                &self.node.options.node_id,
                &current,
                now,
            )
            .await
            .map_err(|err| Status::internal(format!("resume: {err:#}")))?
        };
        let record = self
            .node
            .store
            .set_paused(name, paused, next, now)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("workflow {name:?} not found")))?;
        if let Err(err) = self.node.store.record_decisions(&decisions).await {
            tracing::warn!(workflow = %name, error = %err, "recording decisions failed");
        }
        let action = if paused { "pause" } else { "resume" };
        self.audit(
            actor,
            action,
            format!("workflow/{}", record.name),
            String::new(),
            &call.caller,
        )
        .await;
        self.node.schedule_wake.notify_one();
        Ok(Response::new(convert::workflow(&record, now)))
    }

    /// An instance with its attempts, as the API shows it.
    async fn instance_message(&self, record: &InstanceRecord) -> Result<pb::Instance, Status> {
        let mut attempts = self
            .node
            .store
            .list_attempts(record.id)
            .await
            .map_err(store_status)?;
        // An attempt's line count is written when it ends; until then the log says how far
        // it has come.
        for attempt in attempts.iter_mut().filter(|a| !a.state.is_terminal()) {
            attempt.log_lines = self
                .node
                .store
                .last_log_seq(record.id, attempt.attempt)
                .await
                .map_err(store_status)?;
        }
        let mut message = convert::instance(record, &attempts);
        if record.started_at.is_some() {
            super::sub_workflows::add_child_runs(&self.node.store, record, &mut message).await?;
        }
        Ok(message)
    }

    /// A run with its instance counts, as the API shows it.
    async fn run_message(&self, id: RunId) -> Result<pb::Run, Status> {
        let record = self
            .node
            .store
            .get_run(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("run {id} not found")))?;
        let counts = self.node.store.run_counts(id).await.map_err(store_status)?;
        let mut message = convert::run(&record, Some(&counts));
        super::sub_workflows::add_links(&self.node.store, &record, &mut message).await?;
        Ok(message)
    }
}

/// A workflow's latest version: its id, number and spec (cached).
struct LatestSpec {
    id: WorkflowId,
    version: u32,
    versioned: Arc<VersionedSpec>,
}

/// The counts of a run as it was created: a started run has its root tasks WAITING, a queued
/// one nothing yet.
fn counts_at_creation(state: RunState, spec: &WorkflowSpec) -> InstanceCounts {
    let tasks = u32::try_from(spec.tasks.len()).unwrap_or(u32::MAX);
    let waiting = match state {
        RunState::Running => {
            let roots = spec.tasks.iter().filter(|t| t.upstream.is_empty()).count();
            u32::try_from(roots).unwrap_or(u32::MAX)
        }
        _ => 0,
    };
    InstanceCounts {
        waiting,
        not_created: if state.is_terminal() {
            0
        } else {
            tasks - waiting
        },
        ..InstanceCounts::default()
    }
}

fn require_name(name: &str) -> Result<(), Status> {
    if name.trim().is_empty() {
        return Err(Status::invalid_argument("workflow name is empty"));
    }
    Ok(())
}

/// The next fire of a cron-triggered spec after `now`, if any.
fn next_fire(spec: &WorkflowSpec, now: i64) -> Result<Option<i64>, Status> {
    if spec.schedule.trigger != TriggerKind::Cron {
        return Ok(None);
    }
    let Some(expression) = spec.schedule.cron.as_deref() else {
        return Ok(None);
    };
    let cron = CronSchedule::parse(expression)
        .map_err(|err| Status::invalid_argument(format!("schedule.cron: {err}")))?;
    let tz = parse_timezone(&spec.schedule.timezone)
        .map_err(|err| Status::invalid_argument(format!("schedule.timezone: {err}")))?;
    Ok(ax_core::firing::first_slot(
        &cron,
        tz,
        now,
        ax_core::firing::Window::of(&spec.schedule),
    ))
}

/// The rules are `ax_core::params`: names that can become `AX_PARAM_<NAME>`, sizes that fit in
/// a task's environment.
fn validate_params(params: &std::collections::HashMap<String, String>) -> Result<(), Status> {
    ax_core::params::check(params).map_err(|err| Status::invalid_argument(err.to_string()))
}

fn positive_id(id: i64, what: &str) -> Result<i64, Status> {
    if id <= 0 {
        return Err(Status::invalid_argument(format!(
            "{what} id must be a positive number, got {id}"
        )));
    }
    Ok(id)
}

/// What a followed stream ends with when its node stops serving: the client follows on at
/// another node, or this one once it is back.
fn stopping_status(node: &Node) -> Status {
    Status::unavailable(format!(
        "scheduler node {} is stopping; follow on at another node",
        node.options.node_id
    ))
}

type LogStreamOut = Pin<Box<dyn Stream<Item = Result<pb::LogChunk, Status>> + Send>>;
type RunStreamOut = Pin<Box<dyn Stream<Item = Result<pb::Run, Status>> + Send>>;

#[tonic::async_trait]
impl ControlService for ControlApi {
    async fn apply_workflow(
        &self,
        request: Request<pb::ApplyWorkflowRequest>,
    ) -> Result<Response<pb::ApplyWorkflowResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let source_name = if request.source_name.is_empty() {
            "<request>"
        } else {
            &request.source_name
        };
        if request.source.len() > MAX_SOURCE_BYTES {
            return Err(Status::invalid_argument(format!(
                "{source_name}: workflow file is {} bytes; the limit is {MAX_SOURCE_BYTES}",
                request.source.len()
            )));
        }
        let mut parsed = parse_workflow(&request.source, source_name)
            .map_err(|err| Status::invalid_argument(err.to_string()))?;
        self.check_apply_scope(&call, &parsed.spec).await?;
        self.check_secret_references(&call, &parsed.spec).await?;
        parsed
            .warnings
            .extend(self.check_after(&call, &parsed.spec).await?);
        let member = ax_core::sub_workflow::Member {
            file: source_name,
            source: &request.source,
            spec: &parsed.spec,
        };
        self.check_run_workflows(&[member], &Default::default())
            .await?;
        let now = now_ms();
        let next = next_fire(&parsed.spec, now)?;
        if request.dry_run {
            let record = WorkflowRecord {
                id: ax_core::ids::WorkflowId(0),
                name: parsed.spec.name.clone(),
                version: 0,
                spec: parsed.spec,
                source: request.source,
                paused: false,
                created_at: now,
                updated_at: now,
            };
            return Ok(Response::new(pb::ApplyWorkflowResponse {
                workflow: Some(convert::workflow(&record, now)),
                outcome: pb::ApplyOutcome::Valid as i32,
                warnings: parsed.warnings,
            }));
        }
        let (record, outcome) = self
            .node
            .store
            .apply_workflow(&parsed.spec, &request.source, next, now)
            .await
            .map_err(store_status)?;
        let outcome = match outcome {
            ax_store::ApplyOutcome::Created => pb::ApplyOutcome::Created,
            ax_store::ApplyOutcome::Updated => pb::ApplyOutcome::Updated,
            ax_store::ApplyOutcome::Unchanged => pb::ApplyOutcome::Unchanged,
        };
        let detail = format!("version {} ({})", record.version, outcome.as_str_name());
        self.audit(
            &request.actor,
            "apply",
            format!("workflow/{}", record.name),
            detail,
            &call.caller,
        )
        .await;
        self.node.schedule_wake.notify_one();
        Ok(Response::new(pb::ApplyWorkflowResponse {
            workflow: Some(convert::workflow(&record, now)),
            outcome: outcome as i32,
            warnings: parsed.warnings,
        }))
    }

    async fn apply_workflows(
        &self,
        request: Request<pb::ApplyWorkflowsRequest>,
    ) -> Result<Response<pb::ApplyWorkflowsResponse>, Status> {
        let call = Call::of(&request);
        self.apply_set(&call, request.into_inner()).await
    }

    async fn delete_workflow(
        &self,
        request: Request<pb::DeleteWorkflowRequest>,
    ) -> Result<Response<pb::DeleteWorkflowResponse>, Status> {
        let call = Call::of(&request);
        self.delete_one(&call, request.into_inner()).await
    }

    async fn list_workflows(
        &self,
        request: Request<pb::ListWorkflowsRequest>,
    ) -> Result<Response<pb::ListWorkflowsResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let app = (!request.app.is_empty()).then_some(request.app.as_str());
        if let (Some(scope), Some(asked)) = (call.app_scope(), app)
            && scope != asked
        {
            return Ok(Response::new(pb::ListWorkflowsResponse::default()));
        }
        let app = call.app_scope().or(app);
        let now = now_ms();
        // A summary reads one row per workflow and takes each spec from the node's cache: a
        // 10,000-task definition is not read and parsed again on every list.
        let listed: Vec<pb::Workflow> = if request.summary {
            let heads = self
                .node
                .store
                .list_workflow_heads(app)
                .await
                .map_err(store_status)?;
            let mut listed = Vec::with_capacity(heads.len());
            for head in &heads {
                let versioned = self
                    .node
                    .specs
                    .get(head.id, head.version)
                    .await
                    .map_err(store_status)?;
                listed.push(convert::head_summary(head, &versioned.spec, now));
            }
            listed
        } else {
            self.node
                .store
                .list_workflows(app)
                .await
                .map_err(store_status)?
                .iter()
                .map(|record| convert::workflow(record, now))
                .collect()
        };
        let recent = request.recent_runs.min(MAX_RECENT_RUNS);
        let mut workflows = Vec::with_capacity(listed.len());
        for mut workflow in listed {
            if recent > 0 {
                let runs = self
                    .node
                    .store
                    .list_runs(Some(&workflow.name), None, None, recent)
                    .await
                    .map_err(store_status)?;
                workflow.recent_runs = runs
                    .iter()
                    .map(|run| pb::RunBrief {
                        id: run.id.0,
                        state: convert::run_state(run.state) as i32,
                        logical_time_ms: run.logical_time,
                    })
                    .collect();
            }
            workflows.push(workflow);
        }
        Ok(Response::new(pb::ListWorkflowsResponse { workflows }))
    }

    async fn get_workflow(
        &self,
        request: Request<pb::GetWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        let call = Call::of(&request);
        let record = self
            .workflow_named(&call, &request.into_inner().name)
            .await?;
        Ok(Response::new(convert::workflow(&record, now_ms())))
    }

    async fn pause_workflow(
        &self,
        request: Request<pb::PauseWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        self.set_paused(&request.name, true, &request.actor, &call)
            .await
    }

    async fn resume_workflow(
        &self,
        request: Request<pb::ResumeWorkflowRequest>,
    ) -> Result<Response<pb::Workflow>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        self.set_paused(&request.name, false, &request.actor, &call)
            .await
    }

    async fn trigger_workflow(
        &self,
        request: Request<pb::TriggerWorkflowRequest>,
    ) -> Result<Response<pb::TriggerWorkflowResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        validate_params(&request.params)?;
        if request.idempotency_key.len() > MAX_KEY_BYTES {
            return Err(Status::invalid_argument(format!(
                "idempotency_key is {} bytes; the limit is {MAX_KEY_BYTES}",
                request.idempotency_key.len()
            )));
        }
        if request.logical_time_ms < 0 {
            return Err(Status::invalid_argument(
                "logical_time_ms must not be negative",
            ));
        }
        let workflow = self.latest_spec(&call, &request.name).await?;
        // The run's params as its tasks and its concurrency key see them: the declared
        // defaults filled in, the declared rules met.
        let mut params: BTreeMap<String, String> = request.params.clone().into_iter().collect();
        ax_core::params::apply_declared(&workflow.versioned.spec.params, &mut params).map_err(
            |err| {
                Status::invalid_argument(format!(
                    "workflow {}: {err}",
                    workflow.versioned.spec.name
                ))
            },
        )?;
        ax_core::params::check(&params).map_err(|err| Status::invalid_argument(err.to_string()))?;
        keyed_trigger_check(&workflow.versioned.spec, &params)?;
        let key = (!request.idempotency_key.is_empty()).then(|| request.idempotency_key.clone());
        let dedup_key = key.as_ref().map(|key| format!("key:{key}"));
        // A refusal creates nothing, so a retry of a refused trigger with its key is the first
        // try. A key that already has a run is answered with it, bound or not: a client that
        // lost the answer to an accepted trigger gets its run instead of a refusal.
        let ticket = match admission::admit(&self.node, &call, &workflow.versioned.spec, 1) {
            Ok(ticket) => ticket,
            Err(refusal) => {
                let Some(dedup_key) = &dedup_key else {
                    return Err(refusal);
                };
                return match self.existing_run(workflow.id, dedup_key).await? {
                    Some(answer) => Ok(Response::new(answer)),
                    None => Err(refusal),
                };
            }
        };
        let now = now_ms();
        let actor = if request.actor.is_empty() {
            "anonymous".to_string()
        } else {
            request.actor.clone()
        };
        let new_run = NewRun {
            workflow_id: workflow.id,
            workflow_version: workflow.version,
            trigger: if key.is_some() {
                TriggerKind::Api
            } else {
                TriggerKind::Manual
            },
            logical_time: if request.logical_time_ms > 0 {
                request.logical_time_ms
            } else {
                now
            },
            dedup_key,
            idempotency_key: key,
            params,
            triggered_by: actor,
            now,
            audit_from: Some(call.caller.clone()),
        };
        let (run, created, placed) = self
            .node
            .runs
            .create_placed(new_run)
            .await
            .map_err(store_status)?;
        // Root tasks placed on a worker at once never wait.
        let waiting = counts_at_creation(run.state, &workflow.versioned.spec).waiting;
        let left_waiting = if created {
            u64::from(waiting.saturating_sub(placed))
        } else {
            0
        };
        ticket.settle(left_waiting);
        if created {
            // Its audit row was written with it (`audit_from`).
            self.node.bump_progress();
        }
        if left_waiting > 0 {
            // Only what is left WAITING needs a dispatch pass: waking it for a run whose tasks
            // were all placed costs a read of the queue that finds nothing (one per trigger).
            self.node.dispatch_wake.notify_one();
        }
        if !created {
            return Ok(Response::new(self.answer_existing(run).await?));
        }
        // A new run's counts are known from its spec as created.
        let counts = counts_at_creation(run.state, &workflow.versioned.spec);
        Ok(Response::new(pb::TriggerWorkflowResponse {
            run: Some(convert::run(&run, Some(&counts))),
            created: true,
        }))
    }

    async fn list_runs(
        &self,
        request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let bound = |ms: i64, field: &str| match ms {
            0 => Ok(None),
            ms if ms > 0 => Ok(Some(ms)),
            ms => Err(Status::invalid_argument(format!(
                "{field}: {ms} is before 1970; give milliseconds since the epoch, or 0 for no bound"
            ))),
        };
        let filter = ax_store::RunFilter {
            state: convert::run_state_from(request.state)?,
            trigger: convert::trigger_from(request.trigger)?,
            logical_from: bound(request.logical_from_ms, "logical_from_ms")?,
            logical_to: bound(request.logical_to_ms, "logical_to_ms")?,
        };
        if let (Some(from), Some(to)) = (filter.logical_from, filter.logical_to)
            && from > to
        {
            return Err(Status::invalid_argument(format!(
                "logical_from_ms {from} is after logical_to_ms {to}: the range is reversed"
            )));
        }
        let workflow = (!request.workflow.is_empty()).then_some(request.workflow.as_str());
        if let Some(name) = workflow {
            self.workflow_named(&call, name).await?;
        }
        let limit = if request.limit == 0 {
            50
        } else {
            request.limit.min(1_000)
        };
        let before = match request.before_id {
            0 => None,
            id => Some(RunId(positive_id(id, "before_id: run")?)),
        };
        // One run more than the page tells whether another page follows. Across workflows, a
        // scoped caller's page is read from its app's workflows' runs alone: whether another
        // page follows, and where, says nothing of other apps' runs.
        let mut records = match (workflow, call.app_scope()) {
            (None, Some(scope)) => {
                // Deleted workflows' runs are history, kept and listed like any other run.
                let own: Vec<WorkflowId> = self
                    .node
                    .store
                    .history_heads(Some(scope))
                    .await
                    .map_err(store_status)?
                    .iter()
                    .map(|head| head.id)
                    .collect();
                self.node
                    .store
                    .find_runs_of(&own, &filter, before, limit + 1)
                    .await
            }
            _ => {
                self.node
                    .store
                    .find_runs(workflow, &filter, before, limit + 1)
                    .await
            }
        }
        .map_err(store_status)?;
        let next_before_id = if records.len() > limit as usize {
            records.truncate(limit as usize);
            records.last().map_or(0, |run| run.id.0)
        } else {
            0
        };
        if workflow.is_none() && call.app_scope().is_some() {
            // A run is its version's app's: a run of a version from before its workflow moved
            // to this app (an unscoped admin's doing) is left out, as `GetRun` leaves it out.
            let mut visible = Vec::with_capacity(records.len());
            for record in records {
                if call
                    .sees(&self.app_of_run(&record).await?, String::new)
                    .is_ok()
                {
                    visible.push(record);
                }
            }
            records = visible;
        }
        let ids: Vec<RunId> = records.iter().map(|record| record.id).collect();
        let counts = self
            .node
            .store
            .runs_counts(&ids)
            .await
            .map_err(store_status)?;
        let runs = records
            .iter()
            .map(|record| convert::run(record, counts.get(&record.id)))
            .collect();
        Ok(Response::new(pb::ListRunsResponse {
            runs,
            next_before_id,
        }))
    }

    async fn get_run(
        &self,
        request: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let call = Call::of(&request);
        let id = RunId(positive_id(request.into_inner().id, "run")?);
        if call.app_scope().is_some() {
            self.visible_run(&call, id).await?;
        }
        Ok(Response::new(self.run_message(id).await?))
    }

    type WatchRunStream = RunStreamOut;

    async fn watch_run(
        &self,
        request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = RunId(positive_id(request.id, "run")?);
        let settle = watch::settle_time(request.settle_ms)?;
        self.visible_run(&call, id).await?;
        let (sender, receiver) = mpsc::channel(4);
        let api = ControlApi {
            node: self.node.clone(),
        };
        self.node.tasks.spawn(async move {
            let outcome = tokio::select! {
                watched = api.stream_run_changes(id, settle, &sender) => watched,
                () = api.node.serving.cancelled() => Err(stopping_status(&api.node)),
            };
            if let Err(status) = outcome {
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = RunId(positive_id(request.id, "run")?);
        let before = self.visible_run(&call, id).await?;
        // Cancelling a cancelled run again is harmless; a run that ended otherwise stays as it is.
        if before.state.is_terminal() && before.state != ax_core::run::RunState::Cancelled {
            return Err(Status::failed_precondition(format!(
                "run {id} already ended {}",
                before.state
            )));
        }
        let cancelled = self
            .node
            .store
            .cancel_run(id, now_ms())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("run {id} not found")))?;
        let reason = if request.reason.is_empty() {
            "run cancelled".to_string()
        } else {
            request.reason.clone()
        };
        crate::schedules::send_cancels(&self.node.registry, &cancelled, &reason);
        self.node.traces.run_ended(id);
        // Ending a run may have started queued runs of its workflow.
        self.node.dispatch_wake.notify_one();
        let detail = format!("{} attempts stopped; {reason}", cancelled.len());
        self.audit(
            &request.actor,
            "cancel",
            format!("run/{id}"),
            detail,
            &call.caller,
        )
        .await;
        self.node.bump_progress();
        Ok(Response::new(self.run_message(id).await?))
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = RunId(positive_id(request.run_id, "run")?);
        let run = self.visible_run(&call, id).await?;
        if request.items_of != 0 {
            return self.list_items(&run, &request).await.map(Response::new);
        }
        let records = if request.group_items {
            self.node.store.list_instances_without_items(id).await
        } else {
            self.node.store.list_instances(id).await
        }
        .map_err(store_status)?;
        let mut attempts: HashMap<InstanceId, Vec<AttemptRecord>> = HashMap::new();
        if request.attempts {
            let listed = if request.group_items {
                self.node.store.list_run_attempts_without_items(id).await
            } else {
                self.node.store.list_run_attempts(id).await
            };
            for attempt in listed.map_err(store_status)? {
                attempts
                    .entry(attempt.instance_id)
                    .or_default()
                    .push(attempt);
            }
        }
        let mut instances: Vec<pb::Instance> = records
            .iter()
            .map(|record| {
                let of_instance = attempts.get(&record.id).map_or(&[][..], Vec::as_slice);
                convert::instance(record, of_instance)
            })
            .collect();
        if request.attempts {
            super::sub_workflows::add_child_runs_to_list(&self.node.store, id, &mut instances)
                .await?;
        }
        let tasks = self.task_statuses(&run, &records).await?;
        Ok(Response::new(pb::ListInstancesResponse {
            instances,
            tasks,
            next_items_from: 0,
        }))
    }

    async fn get_instance(
        &self,
        request: Request<pb::GetInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        let call = Call::of(&request);
        let id = InstanceId(positive_id(request.into_inner().id, "instance")?);
        let record = self.visible_instance(&call, id).await?;
        Ok(Response::new(self.instance_message(&record).await?))
    }

    async fn cancel_instance(
        &self,
        request: Request<pb::CancelInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = InstanceId(positive_id(request.id, "instance")?);
        let before = self.visible_instance(&call, id).await?;
        if before.state == ax_core::state::InstanceState::Pending {
            return Err(Status::failed_precondition(format!(
                "instance {id} is PENDING: it waits for an upstream rerun and has nothing to cancel"
            )));
        }
        if !before.state.is_active() && before.state != ax_core::state::InstanceState::Cancelled {
            return Err(Status::failed_precondition(format!(
                "instance {id} already ended {}",
                before.state
            )));
        }
        let (record, cancelled) = self
            .node
            .store
            .cancel_instance(id, now_ms())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("instance {id} not found")))?;
        let reason = if request.reason.is_empty() {
            "instance cancelled".to_string()
        } else {
            request.reason.clone()
        };
        crate::schedules::send_cancels(&self.node.registry, cancelled.as_slice(), &reason);
        self.node
            .traces
            .run_ended_if_over(&self.node.store, record.run_id)
            .await;
        self.node.dispatch_wake.notify_one();
        self.audit(
            &request.actor,
            "cancel",
            format!("instance/{id}"),
            reason,
            &call.caller,
        )
        .await;
        self.node.bump_progress();
        Ok(Response::new(self.instance_message(&record).await?))
    }

    async fn retry_instance(
        &self,
        request: Request<pb::RetryInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = InstanceId(positive_id(request.id, "instance")?);
        let instance = self.visible_instance(&call, id).await?;
        self.refuse_deleted(instance.workflow_id, &instance.workflow)
            .await?;
        let record = match self
            .node
            .store
            .retry_instance(id, now_ms())
            .await
            .map_err(store_status)?
        {
            ManualRetry::Retried(record) => record,
            ManualRetry::NotFound => {
                return Err(Status::not_found(format!("instance {id} not found")));
            }
            ManualRetry::NotRetryable(state) => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} is {state}; only FAILED, TIMEOUT and CANCELLED instances can be retried"
                )));
            }
            ManualRetry::Shard { parent } => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} is a shard: retry the sharded task's instance {parent} instead \
                     (it fans out again)"
                )));
            }
            ManualRetry::NotFannedOut => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} maps over a list and ended before it fanned out, so it has no \
                     items to retry: rerun the run from the task its list comes from"
                )));
            }
            ManualRetry::ShardsActive { unfinished } => {
                return Err(Status::failed_precondition(format!(
                    "instance {id} still has {unfinished} unfinished shards: wait for them or \
                     cancel them first"
                )));
            }
        };
        let detail = format!("attempt {}", record.attempt);
        self.audit(
            &request.actor,
            "retry",
            format!("instance/{id}"),
            detail,
            &call.caller,
        )
        .await;
        self.node.dispatch_wake.notify_one();
        self.node.bump_progress();
        Ok(Response::new(self.instance_message(&record).await?))
    }

    async fn mark_instance(
        &self,
        request: Request<pb::MarkInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        let call = Call::of(&request);
        Ok(Response::new(self.mark(&call, request.into_inner()).await?))
    }

    async fn rerun_run(
        &self,
        request: Request<pb::RerunRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = RunId(positive_id(request.id, "run")?);
        let run = self.visible_run(&call, id).await?;
        self.refuse_deleted(run.workflow_id, &run.workflow).await?;
        let from_task = request.from_task.trim();
        if !request.tasks.is_empty() {
            let run = self.rerun_selection(id, &request, &call.caller).await?;
            return Ok(Response::new(run));
        }
        if !from_task.is_empty() && request.failed {
            return Err(Status::invalid_argument(
                "say one thing to rerun: failed = true or from_task, not both",
            ));
        }
        if !from_task.is_empty() {
            let run = self
                .rerun_from_task(id, from_task, &request.actor, &call.caller)
                .await?;
            return Ok(Response::new(run));
        }
        if !request.failed {
            return Err(Status::invalid_argument(
                "say what to rerun: failed = true reruns the failed part, from_task = TASK \
                 reruns that task and everything below it",
            ));
        }
        let answer = self
            .node
            .store
            .rerun_failed(id, now_ms())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("run {id} not found")))?;
        let skipped: Vec<String> = answer
            .shards_active
            .iter()
            .map(|(instance, n)| format!("instance {instance} still has {n} unfinished shards"))
            .collect();
        let retried = answer.retried;
        if retried.is_empty() && !skipped.is_empty() {
            return Err(Status::failed_precondition(format!(
                "run {id}: nothing rerun, {}: wait for them or cancel them first",
                skipped.join(", ")
            )));
        }
        if retried.is_empty() {
            return Err(Status::failed_precondition(format!(
                "run {id} has no FAILED, TIMEOUT or CANCELLED instance to rerun"
            )));
        }
        let mut detail = format!(
            "failed part: instances {}",
            audit_text::capped_list(&retried)
        );
        if !skipped.is_empty() {
            tracing::warn!(run = %id, "rerun --failed left alone: {}", skipped.join(", "));
            detail.push_str(&format!("; left alone: {}", skipped.join(", ")));
        }
        self.audit(
            &request.actor,
            "rerun",
            format!("run/{id}"),
            detail,
            &call.caller,
        )
        .await;
        self.node.dispatch_wake.notify_one();
        self.node.bump_progress();
        Ok(Response::new(self.run_message(id).await?))
    }

    type GetLogsStream = LogStreamOut;

    async fn get_logs(
        &self,
        request: Request<pb::GetLogsRequest>,
    ) -> Result<Response<Self::GetLogsStream>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let id = InstanceId(positive_id(request.instance_id, "instance")?);
        let instance = self.visible_instance(&call, id).await?;
        let attempt = match request.attempt {
            0 => instance.attempt,
            n if n > instance.attempt.0 => {
                return Err(Status::invalid_argument(format!(
                    "instance {id} has no attempt {n} (current attempt is {})",
                    instance.attempt
                )));
            }
            n => Attempt(n),
        };
        let (sender, receiver) = mpsc::channel(16);
        let node = self.node.clone();
        self.node.tasks.spawn(async move {
            let outcome = tokio::select! {
                streamed = stream_logs(&node, id, attempt, &request, &sender) => streamed,
                () = node.serving.cancelled() => Err(stopping_status(&node)),
            };
            if let Err(status) = outcome {
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn get_dag(
        &self,
        request: Request<pb::GetDagRequest>,
    ) -> Result<Response<pb::Dag>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        self.check_dag_scope(&call, &request).await?;
        super::views::get_dag(&self.node, request)
            .await
            .map(Response::new)
    }

    async fn get_grid(
        &self,
        request: Request<pb::GetGridRequest>,
    ) -> Result<Response<pb::Grid>, Status> {
        let call = Call::of(&request);
        self.grid(&call, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn explain_workflow(
        &self,
        request: Request<pb::ExplainWorkflowRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        if call.app_scope().is_some() {
            self.workflow_named(&call, &request.name).await?;
        }
        super::views::explain_workflow(&self.node, request)
            .await
            .map(Response::new)
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        Call::of(&request).unscoped("the audit trail")?;
        super::views::list_audit(&self.node, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn backfill_workflow(
        &self,
        request: Request<pb::BackfillWorkflowRequest>,
    ) -> Result<Response<pb::BackfillWorkflowResponse>, Status> {
        let call = Call::of(&request);
        let request = request.into_inner();
        let workflow = self.workflow_named(&call, &request.name).await?;
        let response = backfill::backfill(&self.node, &call, &workflow, &request).await?;
        if !request.dry_run {
            let detail = format!(
                "{} .. {}: {} runs created, {} slots already had one",
                ax_core::rfc3339(request.from_ms),
                ax_core::rfc3339(request.to_ms),
                response.created,
                response.existing
            );
            self.audit(
                &request.actor,
                "backfill",
                format!("workflow/{}", workflow.name),
                detail,
                &call.caller,
            )
            .await;
        }
        Ok(Response::new(response))
    }

    async fn purge_runs(
        &self,
        request: Request<pb::PurgeRunsRequest>,
    ) -> Result<Response<pb::PurgeRunsResponse>, Status> {
        let call = Call::of(&request);
        self.purge_runs_call(&call, request.into_inner()).await
    }

    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let (store_now, leases) = self
            .node
            .store
            .list_node_leases()
            .await
            .map_err(store_status)?;
        let workers = self
            .list_workers(Request::new(pb::ListWorkersRequest {}))
            .await?
            .into_inner()
            .workers;
        let nodes = leases
            .into_iter()
            .map(|lease| pb::NodeInfo {
                workers: workers
                    .iter()
                    .filter(|w| {
                        w.scheduler_node == lease.node_id && w.state != pb::WorkerState::Dead as i32
                    })
                    .count() as u32,
                live: lease.expires_at > store_now,
                node_id: lease.node_id,
                address: lease.address,
                version: lease.version,
                started_at_ms: lease.started_at,
                renewed_at_ms: lease.renewed_at,
                expires_at_ms: lease.expires_at,
                clock_offset_ms: lease.clock_offset_ms,
                pools: lease.pools,
            })
            .collect();
        let schema = self
            .node
            .store
            .schema_release()
            .await
            .map_err(store_status)?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes,
            store_now_ms: store_now,
            schema_release: schema
                .as_ref()
                .map_or_else(String::new, |s| s.release.to_string()),
            schema_migration: schema.as_ref().map_or(0, |s| s.migration),
            schema_oldest_release: schema
                .as_ref()
                .map_or_else(String::new, |s| s.oldest_release.to_string()),
        }))
    }

    async fn list_workers(
        &self,
        _request: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let now = now_ms();
        let options = &self.node.options;
        let dead_after = options.heartbeat_interval.as_millis() as i64
            * options.dead_after_missed_heartbeats as i64;
        let mut workers: BTreeMap<String, pb::WorkerInfo> = BTreeMap::new();
        // Workers of other nodes come from the store; this node's own view is fresher.
        for record in self.node.store.list_workers().await.map_err(store_status)? {
            let alive = record.connected && now - record.last_heartbeat <= dead_after;
            let state = if alive {
                pb::WorkerState::Live
            } else {
                pb::WorkerState::Dead
            };
            workers.insert(
                record.id.clone(),
                pb::WorkerInfo {
                    id: record.id,
                    version: record.version,
                    labels: record.labels.into_iter().collect(),
                    capacity: record.capacity,
                    running: if alive { record.running } else { 0 },
                    hostname: record.hostname,
                    started_at_ms: record.started_at,
                    last_heartbeat_ms: record.last_heartbeat,
                    state: state as i32,
                    scheduler_node: record.node_id,
                },
            );
        }
        for view in self.node.registry.views() {
            let state = if view.draining {
                pb::WorkerState::Draining
            } else {
                pb::WorkerState::Live
            };
            let profile = view.profile;
            workers.insert(
                profile.id.clone(),
                pb::WorkerInfo {
                    id: profile.id,
                    version: profile.version,
                    labels: profile.labels.into_iter().collect(),
                    capacity: profile.capacity,
                    running: view.running,
                    hostname: profile.hostname,
                    started_at_ms: profile.started_at,
                    last_heartbeat_ms: view.last_heartbeat,
                    state: state as i32,
                    scheduler_node: options.node_id.clone(),
                },
            );
        }
        Ok(Response::new(pb::ListWorkersResponse {
            workers: workers.into_values().collect(),
        }))
    }

    async fn who_am_i(
        &self,
        request: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::Identity>, Status> {
        Ok(Response::new(self.identity_of(&Call::of(&request))))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let call = Call::of(&request);
        self.token_create(&call, request.into_inner()).await
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        self.token_list(&Call::of(&request)).await
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::Token>, Status> {
        let call = Call::of(&request);
        self.token_revoke(&call, request.into_inner()).await
    }

    async fn set_secret(
        &self,
        request: Request<pb::SetSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        let call = Call::of(&request);
        self.secret_set(&call, request.into_inner()).await
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let call = Call::of(&request);
        self.secret_list(&call, request.into_inner()).await
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        let call = Call::of(&request);
        self.secret_delete(&call, request.into_inner()).await
    }
}

/// Sends an attempt's stored lines in order; with `follow`, keeps going until the attempt has
/// ended and every line it produced was sent.
async fn stream_logs(
    node: &Node,
    instance: InstanceId,
    attempt: Attempt,
    request: &pb::GetLogsRequest,
    sender: &mpsc::Sender<Result<pb::LogChunk, Status>>,
) -> Result<(), Status> {
    let follow = request.follow;
    let mut after = request.after_seq;
    // Lines still to send: a page of a log viewer asks for a few thousand of a million.
    let mut left = match request.limit {
        0 => u64::MAX,
        _ if follow => u64::MAX,
        limit => u64::from(limit),
    };
    let contains = request.contains.as_str();
    let mut progress = node.watch_progress();
    // Lines queued on this node are made readable first, so a finished attempt reads whole.
    node.logs.flush().await;
    let mut idle_since_end: Option<tokio::time::Instant> = None;
    loop {
        let page = if contains.is_empty() {
            LOG_PAGE.min(u32::try_from(left).unwrap_or(u32::MAX))
        } else {
            LOG_PAGE
        };
        let lines = node
            .store
            .read_logs(instance, attempt, after, page)
            .await
            .map_err(store_status)?;
        let full_page = lines.len() as u32 == page;
        if let Some(last) = lines.last() {
            after = last.seq;
            idle_since_end = None;
            // Chunks stay well under a client's default message limit (4 MiB), however long
            // the lines.
            let mut chunk = pb::LogChunk {
                attempt: attempt.0,
                lines: Vec::new(),
            };
            let mut bytes = 0;
            for line in lines {
                if !line.text.contains(contains) {
                    continue;
                }
                if left == 0 {
                    break;
                }
                left -= 1;
                if bytes + line.text.len() > MAX_CHUNK_BYTES && !chunk.lines.is_empty() {
                    let full = std::mem::replace(
                        &mut chunk,
                        pb::LogChunk {
                            attempt: attempt.0,
                            lines: Vec::new(),
                        },
                    );
                    if sender.send(Ok(full)).await.is_err() {
                        return Ok(());
                    }
                    bytes = 0;
                }
                bytes += line.text.len();
                chunk.lines.push(pb::StoredLogLine {
                    seq: line.seq,
                    stream: match line.stream {
                        LogStream::Stdout => pb::LogStream::Stdout,
                        LogStream::Stderr => pb::LogStream::Stderr,
                    } as i32,
                    text: line.text,
                    at_ms: line.at,
                });
            }
            if !chunk.lines.is_empty() && sender.send(Ok(chunk)).await.is_err() {
                return Ok(());
            }
        }
        if left == 0 {
            return Ok(());
        }
        if full_page {
            continue;
        }
        if !follow {
            return Ok(());
        }
        let attempts = node
            .store
            .list_attempts(instance)
            .await
            .map_err(store_status)?;
        let record = attempts.iter().find(|record| record.attempt == attempt);
        if let Some(record) =
            record.filter(|record| record.state.is_terminal() && record.finished_at.is_some())
        {
            if after >= record.log_lines {
                return Ok(());
            }
            // The attempt ended but some lines are not stored yet: wait for them, within reason.
            let since = *idle_since_end.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > Duration::from_secs(10) {
                return Err(Status::data_loss(format!(
                    "attempt {attempt} of instance {instance} produced {} lines but only {after} are stored",
                    record.log_lines
                )));
            }
        }
        tokio::select! {
            _ = progress.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = sender.closed() => return Ok(()),
        }
    }
}

/// Refuses a trigger of a keyed workflow that lacks a param its `concurrency.key` names.
fn keyed_trigger_check(
    spec: &ax_core::spec::WorkflowSpec,
    params: &BTreeMap<String, String>,
) -> Result<(), Status> {
    spec.concurrency
        .check_trigger_params(params)
        .map_err(|message| Status::invalid_argument(format!("workflow {}: {message}", spec.name)))
}
