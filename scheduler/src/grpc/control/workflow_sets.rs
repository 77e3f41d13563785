//! `ApplyWorkflows` (a folder of files stored in one transaction, with prune and dry run:
//! `axctl apply -f DIR`, `axctl diff`) and `DeleteWorkflow`.
//!
//! A set is checked whole before anything is stored: every file is parsed, and the checks
//! across files (one name per file, `after` cycles and upstreams as they will be once the set
//! is applied, the caller's app scope, secrets) run over all of it; any refusal lists every
//! file's errors, one `FILE:LINE: FIELD: WHY` line each, and stores nothing. The store then
//! applies the set and its prune in one transaction (`Store::apply_workflow_set`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use ax_core::app_scope::hide_invisible;
use ax_core::dependency::find_cycle;
use ax_core::ids::RunId;
use ax_core::run::RunState;
use ax_core::spec::{ParsedWorkflow, is_valid_name, parse_workflow};
use ax_core::workflow_set::{self, Member};
use ax_proto::v1 as pb;
use ax_store::{
    ApplyOutcome, BatchApplied, BatchItem, BusyWorkflow, Deleted, GoneWorkflow, PrunePlan,
};
use tonic::{Code, Response, Status};

use super::access::Call;
use super::{ControlApi, MAX_SOURCE_BYTES, next_fire};
use crate::clock::now_ms;
use crate::grpc::convert::store_status;

/// The files of one set, in all.
pub(crate) const MAX_SET_BYTES: usize = 16 << 20;

/// The refusals of a set: every line, and whether one of them is the caller's scope's.
#[derive(Default)]
struct Refusals {
    lines: Vec<String>,
    denied: bool,
}

impl Refusals {
    /// A check's refusal of one file, as `FILE:0: message` unless it names its place already.
    fn add(&mut self, file: &str, status: &Status) {
        self.denied |= status.code() == Code::PermissionDenied;
        let message = status.message();
        if message.starts_with(&format!("{file}:")) {
            self.lines.push(message.to_string());
        } else {
            self.lines.push(format!("{file}:0: {message}"));
        }
    }

    fn into_status(self) -> Result<(), Status> {
        if self.lines.is_empty() {
            return Ok(());
        }
        let message = self.lines.join("\n");
        Err(if self.denied {
            Status::permission_denied(message)
        } else {
            Status::invalid_argument(message)
        })
    }
}

/// A file of the set, parsed.
struct Parsed {
    file: String,
    source: String,
    workflow: ParsedWorkflow,
}

fn outcome_of(outcome: ApplyOutcome) -> pb::ApplyOutcome {
    match outcome {
        ApplyOutcome::Created => pb::ApplyOutcome::Created,
        ApplyOutcome::Updated => pb::ApplyOutcome::Updated,
        ApplyOutcome::Unchanged => pb::ApplyOutcome::Unchanged,
    }
}

fn removed(workflow: &GoneWorkflow) -> pb::RemovedWorkflow {
    pb::RemovedWorkflow {
        name: workflow.name.clone(),
        app: workflow.app.clone(),
        version: workflow.version,
    }
}

/// `run 12 RUNNING, run 13 QUEUED`.
fn runs_text(runs: &[(RunId, RunState)]) -> String {
    runs.iter()
        .map(|(id, state)| format!("run {id} {state}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a workflow with unfinished runs is not deleted, and what to do.
fn busy_text(busy: &BusyWorkflow) -> String {
    format!(
        "workflow {} has unfinished runs ({}): wait for them to end, or cancel them \
         (`axctl delete workflow {} --cancel-runs` cancels them and deletes it)",
        busy.name,
        runs_text(&busy.runs),
        busy.name
    )
}

impl ControlApi {
    pub(super) async fn apply_set(
        &self,
        call: &Call,
        request: pb::ApplyWorkflowsRequest,
    ) -> Result<Response<pb::ApplyWorkflowsResponse>, Status> {
        let prune = self.prune_app(call, &request)?;
        let parsed = self.parse_set(call, &request.files).await?;
        let members: Vec<Member<'_>> = parsed
            .iter()
            .map(|p| Member {
                file: &p.file,
                source: &p.source,
                name: &p.workflow.spec.name,
                after: &p.workflow.spec.schedule.after,
            })
            .collect();
        let plan = match prune {
            Some(app) => {
                let keep = members.iter().map(|m| m.name.to_string()).collect();
                self.node
                    .store
                    .plan_prune(app, &keep)
                    .await
                    .map_err(store_status)?
            }
            None => PrunePlan::default(),
        };
        let pruned: BTreeSet<String> = plan.gone.iter().map(|w| w.name.clone()).collect();
        let (mut warnings, set_warnings) = self.check_set_after(call, &members, &pruned).await?;
        let calls: Vec<ax_core::sub_workflow::Member<'_>> = parsed
            .iter()
            .map(|p| ax_core::sub_workflow::Member {
                file: &p.file,
                source: &p.source,
                spec: &p.workflow.spec,
            })
            .collect();
        self.check_run_workflows(&calls, &pruned).await?;
        let now = now_ms();
        let mut items = Vec::with_capacity(parsed.len());
        let mut refusals = Refusals::default();
        for p in &parsed {
            match next_fire(&p.workflow.spec, now) {
                Ok(next_fire_at) => items.push(BatchItem {
                    spec: &p.workflow.spec,
                    source: &p.source,
                    next_fire_at,
                }),
                Err(status) => refusals.add(&p.file, &status),
            }
        }
        refusals.into_status()?;
        for (file_warnings, p) in warnings.iter_mut().zip(&parsed) {
            file_warnings.splice(0..0, p.workflow.warnings.iter().cloned());
        }
        if request.dry_run {
            if !plan.busy.is_empty() {
                let lines: Vec<String> = plan.busy.iter().map(busy_text).collect();
                return Err(Status::failed_precondition(format!(
                    "cannot prune: {}",
                    lines.join("; ")
                )));
            }
            let specs: Vec<_> = items.iter().map(|item| item.spec).collect();
            let planned = self
                .node
                .store
                .plan_apply(&specs)
                .await
                .map_err(store_status)?;
            let files = parsed
                .iter()
                .zip(planned)
                .zip(warnings)
                .map(|((p, planned), warnings)| {
                    let (version, stored_source) = planned.stored.unwrap_or_default();
                    pb::AppliedFile {
                        source_name: p.file.clone(),
                        name: p.workflow.spec.name.clone(),
                        app: p.workflow.spec.app.clone(),
                        outcome: outcome_of(planned.outcome) as i32,
                        version,
                        stored_source,
                        warnings,
                    }
                })
                .collect();
            return Ok(Response::new(pb::ApplyWorkflowsResponse {
                files,
                deleted: plan.gone.iter().map(removed).collect(),
                warnings: set_warnings,
                dry_run: true,
            }));
        }
        let answer = self
            .node
            .store
            .apply_workflow_set(&items, prune, now)
            .await
            .map_err(store_status)?;
        let (applied, deleted) = match answer {
            BatchApplied::Applied { applied, deleted } => (applied, deleted),
            BatchApplied::Busy(busy) => {
                let lines: Vec<String> = busy.iter().map(busy_text).collect();
                return Err(Status::failed_precondition(format!(
                    "nothing applied: cannot prune: {}",
                    lines.join("; ")
                )));
            }
        };
        let count = parsed.len();
        for ((record, outcome), p) in applied.iter().zip(&parsed) {
            let detail = format!(
                "version {} ({}) from {}, one of {count} files applied together",
                record.version,
                outcome_of(*outcome).as_str_name(),
                p.file
            );
            self.audit(
                &request.actor,
                "apply",
                format!("workflow/{}", record.name),
                detail,
                &call.caller,
            )
            .await;
        }
        for workflow in &deleted {
            let detail = format!(
                "pruned: not in the files applied for app {} (version {}; its runs are kept)",
                workflow.app, workflow.version
            );
            self.audit(
                &request.actor,
                "delete",
                format!("workflow/{}", workflow.name),
                detail,
                &call.caller,
            )
            .await;
        }
        self.node.schedule_wake.notify_one();
        self.node.dispatch_wake.notify_one();
        let files = applied
            .iter()
            .zip(&parsed)
            .zip(warnings)
            .map(|(((record, outcome), p), warnings)| pb::AppliedFile {
                source_name: p.file.clone(),
                name: record.name.clone(),
                app: record.spec.app.clone(),
                outcome: outcome_of(*outcome) as i32,
                version: record.version,
                stored_source: String::new(),
                warnings,
            })
            .collect();
        Ok(Response::new(pb::ApplyWorkflowsResponse {
            files,
            deleted: deleted.iter().map(removed).collect(),
            warnings: set_warnings,
            dry_run: false,
        }))
    }

    /// The app a request prunes, if it prunes; refuses a prune without an app, an app without
    /// a prune, and a scoped caller another app's prune.
    fn prune_app<'r>(
        &self,
        call: &Call,
        request: &'r pb::ApplyWorkflowsRequest,
    ) -> Result<Option<&'r str>, Status> {
        let app = request.app.trim();
        match (request.prune, app.is_empty()) {
            (false, true) => return Ok(None),
            (false, false) => {
                return Err(Status::invalid_argument(
                    "app names what a prune deletes: give prune too, or no app",
                ));
            }
            (true, true) => {
                return Err(Status::invalid_argument(
                    "prune needs an app: the workflows of that app that no file declares are \
                     deleted",
                ));
            }
            (true, false) => {}
        }
        if !is_valid_name(app) {
            return Err(Status::invalid_argument(format!(
                "app: invalid app name {app:?}: expected [a-z0-9][a-z0-9_.-]{{0,63}}"
            )));
        }
        if let Some(scope) = call.app_scope()
            && scope != app
        {
            return Err(Status::permission_denied(format!(
                "app {app:?} cannot be pruned with a token scoped to app {scope:?}"
            )));
        }
        Ok(Some(app))
    }

    /// Every file parsed and checked on its own and against the others (one name per file,
    /// the caller's scope, secrets); refused with every file's errors.
    async fn parse_set(
        &self,
        call: &Call,
        files: &[pb::WorkflowFile],
    ) -> Result<Vec<Parsed>, Status> {
        if files.is_empty() {
            return Err(Status::invalid_argument("no workflow files given"));
        }
        let total: usize = files.iter().map(|f| f.source.len()).sum();
        if total > MAX_SET_BYTES {
            return Err(Status::invalid_argument(format!(
                "the workflow files are {total} bytes in all; the limit is {MAX_SET_BYTES}: \
                 apply them in smaller sets"
            )));
        }
        let mut refusals = Refusals::default();
        let mut parsed = Vec::with_capacity(files.len());
        for (i, file) in files.iter().enumerate() {
            let name = if file.source_name.is_empty() {
                format!("<file {}>", i + 1)
            } else {
                file.source_name.clone()
            };
            if file.source.len() > MAX_SOURCE_BYTES {
                refusals.lines.push(format!(
                    "{name}:0: (file): workflow file is {} bytes; the limit is \
                     {MAX_SOURCE_BYTES}",
                    file.source.len()
                ));
                continue;
            }
            match parse_workflow(&file.source, &name) {
                Ok(workflow) => parsed.push(Parsed {
                    file: name,
                    source: file.source.clone(),
                    workflow,
                }),
                Err(err) => refusals.lines.push(err.to_string()),
            }
        }
        let members: Vec<Member<'_>> = parsed
            .iter()
            .map(|p| Member {
                file: &p.file,
                source: &p.source,
                name: &p.workflow.spec.name,
                after: &p.workflow.spec.schedule.after,
            })
            .collect();
        refusals
            .lines
            .extend(workflow_set::duplicate_names(&members));
        for p in &parsed {
            if let Err(status) = self.check_apply_scope(call, &p.workflow.spec).await {
                refusals.add(&p.file, &status);
                continue;
            }
            if let Err(status) = self.check_secret_references(call, &p.workflow.spec).await {
                refusals.add(&p.file, &status);
            }
        }
        refusals.into_status()?;
        Ok(parsed)
    }

    /// The `after` checks of a set against the workflows as they will be once it is applied:
    /// cycles, a scoped caller's upstreams (its app's workflows that exist, or files of the
    /// set), warnings for upstreams that do not exist yet. Answers each file's warnings and
    /// the set's (workflows left naming a pruned one).
    async fn check_set_after(
        &self,
        call: &Call,
        members: &[Member<'_>],
        pruned: &BTreeSet<String>,
    ) -> Result<(Vec<Vec<String>>, Vec<String>), Status> {
        let stored = self
            .node
            .store
            .workflow_dependencies()
            .await
            .map_err(store_status)?;
        let apps = self
            .node
            .store
            .live_workflow_apps()
            .await
            .map_err(store_status)?;
        let live: BTreeSet<String> = apps.keys().cloned().collect();
        let graph = workflow_set::dependencies_after(&stored, members, pruned);
        let exists = workflow_set::names_after(&live, members, pruned);
        let in_set: HashSet<&str> = members.iter().map(|m| m.name).collect();
        // A scoped caller's files are all of its app (checked already); of the rest it sees
        // its app's.
        let visible = |name: &str| match call.app_scope() {
            None => true,
            Some(scope) => {
                in_set.contains(name) || apps.get(name).map(String::as_str) == Some(scope)
            }
        };
        let mut refusals = Refusals::default();
        let mut warnings = Vec::with_capacity(members.len());
        for member in members {
            let mut own = Vec::new();
            if let Some(scope) = call.app_scope()
                && let Some(upstream) = member
                    .after
                    .iter()
                    .find(|up| !exists.contains(*up) || !visible(up))
            {
                refusals.add(
                    member.file,
                    &Status::invalid_argument(format!(
                        "schedule.after: workflow {upstream} not found: a token scoped to app \
                         {scope} may name only its app's workflows that exist (apply it first)"
                    )),
                );
                warnings.push(own);
                continue;
            }
            if let Err(mut cycle) = find_cycle(member.name, member.after, &graph) {
                cycle.path = hide_invisible(&cycle.path, |name| visible(name));
                refusals.add(member.file, &Status::invalid_argument(cycle.to_string()));
            }
            for upstream in member.after.iter().filter(|up| !exists.contains(*up)) {
                own.push(format!(
                    "schedule.after: workflow {upstream} does not exist yet; {} runs only once \
                     it is applied and succeeds",
                    member.name
                ));
            }
            warnings.push(own);
        }
        refusals.into_status()?;
        let visible_graph: BTreeMap<String, Vec<String>> = graph
            .into_iter()
            .filter(|(name, _)| visible(name))
            .collect();
        Ok((
            warnings,
            workflow_set::orphaned_dependents(&visible_graph, pruned),
        ))
    }

    /// Refuses a retry or rerun of a deleted workflow's run: its history is kept, but it runs
    /// no more.
    pub(super) async fn refuse_deleted(
        &self,
        workflow_id: ax_core::ids::WorkflowId,
        name: &str,
    ) -> Result<(), Status> {
        if self
            .node
            .store
            .workflow_deleted(workflow_id)
            .await
            .map_err(store_status)?
        {
            return Err(Status::failed_precondition(format!(
                "workflow {name} was deleted: its runs are kept as history but run no more                  (apply it again for a new workflow of that name)"
            )));
        }
        Ok(())
    }

    pub(super) async fn delete_one(
        &self,
        call: &Call,
        request: pb::DeleteWorkflowRequest,
    ) -> Result<Response<pb::DeleteWorkflowResponse>, Status> {
        let workflow = self.workflow_named(call, &request.name).await?;
        self.refuse_called(&workflow.name, &workflow.spec.app)
            .await?;
        let mut cancelled_runs = Vec::new();
        let mut tries = 0;
        let gone = loop {
            tries += 1;
            if request.cancel_runs {
                cancelled_runs.extend(
                    self.cancel_unfinished(&workflow.name, &request.actor, call)
                        .await?,
                );
            }
            match self
                .node
                .store
                .delete_workflow(workflow.id, now_ms())
                .await
                .map_err(store_status)?
            {
                Deleted::Deleted(gone) => break gone,
                // A fire or trigger between the cancels and the delete: cancel it too.
                Deleted::Busy(_) if request.cancel_runs && tries < 3 => continue,
                Deleted::Busy(busy) => {
                    return Err(Status::failed_precondition(busy_text(&busy)));
                }
                Deleted::NotFound => {
                    return Err(Status::not_found(format!(
                        "workflow {:?} not found",
                        request.name
                    )));
                }
            }
        };
        let mut detail = format!("version {}; its runs are kept", gone.version);
        if !cancelled_runs.is_empty() {
            detail.push_str(&format!(
                "; {} unfinished runs cancelled first",
                cancelled_runs.len()
            ));
        }
        self.audit(
            &request.actor,
            "delete",
            format!("workflow/{}", gone.name),
            detail,
            &call.caller,
        )
        .await;
        self.node.schedule_wake.notify_one();
        self.node.bump_progress();
        let graph = self
            .node
            .store
            .workflow_dependencies()
            .await
            .map_err(store_status)?;
        let visible: BTreeMap<String, Vec<String>> = match call.app_scope() {
            None => graph,
            Some(scope) => {
                let apps = self
                    .node
                    .store
                    .live_workflow_apps()
                    .await
                    .map_err(store_status)?;
                graph
                    .into_iter()
                    .filter(|(name, _)| apps.get(name).map(String::as_str) == Some(scope))
                    .collect()
            }
        };
        let warnings =
            workflow_set::orphaned_dependents(&visible, &BTreeSet::from([gone.name.clone()]));
        Ok(Response::new(pb::DeleteWorkflowResponse {
            workflow: Some(removed(&gone)),
            cancelled_runs: cancelled_runs.iter().map(|id| id.0).collect(),
            warnings,
        }))
    }

    /// Refuses deleting a workflow its app's live workflows still call with `run_workflow`
    /// (FailedPrecondition naming them): apply keeps every call naming a live workflow, and a
    /// delete keeps it so too.
    async fn refuse_called(&self, name: &str, app: &str) -> Result<(), Status> {
        let store = &self.node.store;
        let calls = store.workflow_calls().await.map_err(store_status)?;
        if !calls.values().flatten().any(|callee| callee == name) {
            return Ok(());
        }
        let apps = store.live_workflow_apps().await.map_err(store_status)?;
        match ax_core::sub_workflow::callers_refusal(name, app, &calls, &apps) {
            Some(refusal) => Err(Status::failed_precondition(refusal)),
            None => Ok(()),
        }
    }

    /// Cancels the workflow's RUNNING and QUEUED runs as `CancelRun` does, each with its audit
    /// row; answers their ids.
    async fn cancel_unfinished(
        &self,
        name: &str,
        actor: &str,
        call: &Call,
    ) -> Result<Vec<RunId>, Status> {
        let mut ids = Vec::new();
        for state in [RunState::Queued, RunState::Running] {
            let runs = self
                .node
                .store
                .list_runs(Some(name), Some(state), None, 1_000)
                .await
                .map_err(store_status)?;
            ids.extend(runs.iter().map(|run| run.id));
        }
        let reason = format!("workflow {name} deleted");
        for id in &ids {
            let Some(cancelled) = self
                .node
                .store
                .cancel_run(*id, now_ms())
                .await
                .map_err(store_status)?
            else {
                continue;
            };
            crate::schedules::send_cancels(&self.node.registry, &cancelled, &reason);
            self.node.traces.run_ended(*id);
            let detail = format!("{} attempts stopped; {reason}", cancelled.len());
            self.audit(actor, "cancel", format!("run/{id}"), detail, &call.caller)
                .await;
        }
        if !ids.is_empty() {
            self.node.dispatch_wake.notify_one();
        }
        Ok(ids)
    }
}
