//! The control API's DAG semantics: `rerun --from TASK`, the status of every task of a run
//! (`upstream_failed`, `pending`), and the cross-workflow checks at apply.

use std::collections::{HashMap, HashSet};

use ax_core::app_scope::hide_invisible;
use ax_core::dependency;
use ax_core::ids::RunId;
use ax_core::spec::WorkflowSpec;
use ax_core::task_status::task_statuses;
use ax_proto::v1 as pb;
use ax_store::{InstanceRecord, RerunFrom, RunRecord};
use tonic::Status;

use super::ControlApi;
use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::{self, store_status};

impl ControlApi {
    /// Reruns `task` of run `id` and everything below it; refuses, changing nothing, an unknown
    /// run or task (NotFound) and a task that cannot run again now (FailedPrecondition).
    pub(super) async fn rerun_from_task(
        &self,
        id: RunId,
        task: &str,
        actor: &str,
        caller: &ax_store::Caller,
    ) -> Result<pb::Run, Status> {
        let answer = self
            .node
            .store
            .rerun_from(id, task, now_ms())
            .await
            .map_err(store_status)?;
        let (again, pending) = match answer {
            RerunFrom::Rerun { again, pending } => (again, pending),
            why => return Err(rerun_refused(id, task, why)),
        };
        let pending: Vec<String> = pending.iter().map(ToString::to_string).collect();
        let detail = format!(
            "from task {task}: instance {again} again, {} downstream instances pending ({})",
            pending.len(),
            pending.join(", ")
        );
        self.audit(actor, "rerun", format!("run/{id}"), detail, caller)
            .await;
        self.node.dispatch_wake.notify_one();
        self.node.bump_progress();
        self.run_message(id).await
    }

    /// Every task of the run's workflow version, in file order, with its status.
    pub(super) async fn task_statuses(
        &self,
        run: &RunRecord,
        instances: &[InstanceRecord],
    ) -> Result<Vec<pb::TaskStatus>, Status> {
        let version = self
            .node
            .store
            .get_workflow_version(run.workflow_id, run.workflow_version)
            .await
            .map_err(store_status)?
            .ok_or_else(|| {
                Status::internal(format!(
                    "run {} names workflow version {} which is not stored",
                    run.id, run.workflow_version
                ))
            })?;
        let dag = version
            .spec
            .dag()
            .map_err(|err| Status::internal(format!("stored workflow DAG: {err}")))?;
        // A task is its latest own instance; a shard of a sharded task never stands for it.
        let mut by_task: HashMap<&str, &InstanceRecord> = HashMap::new();
        for instance in instances.iter().filter(|i| i.shard.is_none()) {
            let entry = by_task.entry(instance.task.as_str()).or_insert(instance);
            if entry.id.0 < instance.id.0 {
                *entry = instance;
            }
        }
        let states = by_task
            .iter()
            .map(|(task, i)| (task.to_string(), i.state))
            .collect();
        // Only a workflow with a mapped task has items to count.
        let items: HashMap<i64, pb::ItemCounts> =
            if version.spec.tasks.iter().any(|t| t.for_each.is_some()) {
                self.node
                    .store
                    .item_summaries(run.id)
                    .await
                    .map_err(store_status)?
                    .iter()
                    .map(|s| (s.parent.0, convert::item_counts(s)))
                    .collect()
            } else {
                HashMap::new()
            };
        Ok(task_statuses(&dag, &states)
            .into_iter()
            .map(|(task, status)| {
                let instance = by_task.get(task.as_str());
                pb::TaskStatus {
                    status: status.as_str().to_string(),
                    instance_id: instance.map_or(0, |i| i.id.0),
                    attempt: instance.map_or(0, |i| i.attempt.0),
                    items: instance.and_then(|i| items.get(&i.id.0).cloned()),
                    task,
                }
            })
            .collect())
    }

    /// Refuses a `schedule.after` that closes a cycle of workflows (InvalidArgument, the cycle
    /// spelled out) and returns a warning for each upstream workflow not applied yet.
    ///
    /// A token scoped to an app may name only workflows of its app that exist: a dependency on
    /// another app's workflow would start this app's runs on that app's successes, and telling
    /// "not applied yet" from "another app's" would tell which names exist. Both read alike,
    /// and a cycle is spelled without the names of workflows it cannot see.
    pub(super) async fn check_after(
        &self,
        call: &Call,
        spec: &WorkflowSpec,
    ) -> Result<Vec<String>, Status> {
        if spec.schedule.after.is_empty() {
            return Ok(Vec::new());
        }
        let mut apps: HashMap<&str, Option<String>> = HashMap::new();
        for upstream in &spec.schedule.after {
            let app = self
                .node
                .store
                .get_workflow(upstream)
                .await
                .map_err(store_status)?
                .map(|record| record.spec.app);
            apps.insert(upstream.as_str(), app);
        }
        if let Some(scope) = call.app_scope() {
            for upstream in &spec.schedule.after {
                if apps[upstream.as_str()].as_deref() != Some(scope) {
                    return Err(Status::invalid_argument(format!(
                        "schedule.after: workflow {upstream} not found: a token scoped to app \
                         {scope} may name only its app's workflows that exist (apply it first)"
                    )));
                }
            }
        }
        let stored = self
            .node
            .store
            .workflow_dependencies()
            .await
            .map_err(store_status)?;
        if let Err(mut cycle) = dependency::find_cycle(&spec.name, &spec.schedule.after, &stored) {
            if let Some(scope) = call.app_scope() {
                let mut visible = HashSet::new();
                for name in &cycle.path {
                    let app = self
                        .node
                        .store
                        .get_workflow(name)
                        .await
                        .map_err(store_status)?
                        .map(|record| record.spec.app);
                    if *name == spec.name || app.as_deref() == Some(scope) {
                        visible.insert(name.clone());
                    }
                }
                cycle.path = hide_invisible(&cycle.path, |name| visible.contains(name));
            }
            return Err(Status::invalid_argument(cycle.to_string()));
        }
        Ok(spec
            .schedule
            .after
            .iter()
            .filter(|upstream| apps[upstream.as_str()].is_none())
            .map(|upstream| {
                format!(
                    "schedule.after: workflow {upstream} does not exist yet; {} runs only once it \
                     is applied and succeeds",
                    spec.name
                )
            })
            .collect())
    }
}

/// Why a rerun from `task` (alone or in a selection) of run `id` was refused, as a status that
/// says what to do instead.
pub(super) fn rerun_refused(id: RunId, task: &str, why: RerunFrom) -> Status {
    match why {
        RerunFrom::Rerun { .. } => Status::internal(format!(
            "run {id}: a rerun from {task:?} was refused and done at once"
        )),
        RerunFrom::RunNotFound => Status::not_found(format!("run {id} not found")),
        RerunFrom::UnknownTask { tasks } => Status::not_found(format!(
            "run {id} has no task {task:?}; its tasks are: {}",
            tasks.join(", ")
        )),
        RerunFrom::NotRun { state: None } => Status::failed_precondition(format!(
            "task {task:?} has not run in run {id} (an upstream did not succeed): \
                     rerun from that upstream instead"
        )),
        RerunFrom::NotRun { state: Some(state) } => Status::failed_precondition(format!(
            "task {task:?} of run {id} is {state} (waiting for an upstream rerun): \
                     rerun from that upstream instead"
        )),
        RerunFrom::NotFannedOut => Status::failed_precondition(format!(
            "task {task:?} of run {id} maps over a list and ended before it fanned out, \
                     so it has no items to run again: rerun from the task its list comes from"
        )),
        RerunFrom::Active { busy } => {
            let busy: Vec<String> = busy
                .iter()
                .map(|(task, state)| format!("{task} is {state}"))
                .collect();
            Status::failed_precondition(format!(
                "run {id} cannot rerun from {task:?} while it or its downstream is still \
                     active ({}): wait for it or cancel it first",
                busy.join(", ")
            ))
        }
        RerunFrom::ShardsActive { shards } => {
            let shards: Vec<String> = shards
                .iter()
                .map(|(task, n)| format!("{task} has {n} unfinished shards"))
                .collect();
            Status::failed_precondition(format!(
                "run {id} cannot rerun from {task:?} while shards of it or its downstream \
                     are still going ({}): wait for them or cancel them first",
                shards.join(", ")
            ))
        }
    }
}
