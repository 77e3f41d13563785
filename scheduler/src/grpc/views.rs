//! The read-only views of `ControlService`: the task graph (`GetDag`), the explanation of a
//! workflow around a time (`ExplainWorkflow`) and the audit trail (`ListAudit`). Each gathers
//! its inputs from the store and the node, hands them to `ax_core::render` / `ax_core::why`,
//! and converts the answer to protobuf.

use std::collections::BTreeMap;

use ax_core::Millis;
use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::ids::RunId;
use ax_core::layout::{Layout, Omitted};
use ax_core::render::{Graph, RunInstance};
use ax_core::spec::TriggerKind;
use ax_core::state::InstanceState;
use ax_core::why::{self, Decision, InstanceFacts, RunFacts, WhyInput, WorkerFacts};
use ax_proto::v1 as pb;
use ax_store::{AuditFilter, RunRecord, WorkflowRecord};
use tonic::Status;

use super::convert::{self, store_status};
use crate::clock::now_ms;
use crate::dag_layouts::Laid;
use crate::node::Node;

/// Decisions are read from an hour before the time asked about (or its cron slot, if earlier)
/// to an hour after it.
const DECISION_MARGIN_MS: Millis = 3_600_000;
const MAX_DECISIONS_READ: u32 = 1_000;

async fn workflow_named(node: &Node, name: &str) -> Result<WorkflowRecord, Status> {
    if name.trim().is_empty() {
        return Err(Status::invalid_argument("workflow name is empty"));
    }
    node.store
        .get_workflow(name)
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("workflow {name:?} not found")))
}

/// Run `id` of the workflow called `name`. A deleted workflow's run is found by its id (its
/// history is kept), so a run's page still draws its graph.
async fn run_of(node: &Node, name: &str, id: i64) -> Result<RunRecord, Status> {
    if id < 0 {
        return Err(Status::invalid_argument(format!(
            "run id must be a positive number, got {id}"
        )));
    }
    let run = node
        .store
        .get_run(RunId(id))
        .await
        .map_err(store_status)?
        .ok_or_else(|| Status::not_found(format!("run {id} not found")))?;
    if run.workflow != name {
        return Err(Status::invalid_argument(format!(
            "run {id} is a run of workflow {:?}, not {name:?}",
            run.workflow
        )));
    }
    Ok(run)
}

pub async fn get_dag(node: &Node, request: pb::GetDagRequest) -> Result<pb::Dag, Status> {
    let (graph, laid) = dag(node, &request).await?;
    Ok(dag_message(&graph, laid.as_deref()))
}

/// The graph `GetDag` answers with, and its layout when asked for.
pub async fn dag(
    node: &Node,
    request: &pb::GetDagRequest,
) -> Result<(Graph, Option<Laid>), Status> {
    let (run, latest) = match request.run_id {
        0 => (None, workflow_named(node, &request.workflow).await?),
        id => {
            let run = run_of(node, &request.workflow, id).await?;
            let of_run = node
                .store
                .get_workflow_version(run.workflow_id, run.workflow_version)
                .await
                .map_err(store_status)?
                .ok_or_else(|| {
                    Status::internal(format!(
                        "run {id} names workflow version {} which is not stored",
                        run.workflow_version
                    ))
                })?;
            (Some(run), of_run)
        }
    };
    let version = match (&run, request.version) {
        (Some(run), 0) => run.workflow_version,
        (Some(run), v) if v != run.workflow_version => {
            return Err(Status::invalid_argument(format!(
                "run {} uses version {} of {:?}, not version {v}",
                run.id, run.workflow_version, latest.name
            )));
        }
        (None, 0) => latest.version,
        (_, v) => v,
    };
    let record = if version == latest.version {
        latest
    } else {
        node.store
            .get_workflow_version(latest.id, version)
            .await
            .map_err(store_status)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "workflow {:?} has no version {version}",
                    request.workflow
                ))
            })?
    };
    let mut graph = Graph::from_tasks(&record.name, record.version, &record.spec.tasks);
    if let Some(run) = &run {
        let instances = node
            .store
            .list_instances(run.id)
            .await
            .map_err(store_status)?;
        let instances: Vec<RunInstance> = instances
            .into_iter()
            .map(|instance| RunInstance {
                task: instance.task,
                instance_id: instance.id.0,
                state: instance.state,
                shard_of: instance.shard.as_ref().map(|shard| shard.parent.0),
            })
            .collect();
        graph.apply_run(run.id.0, &instances);
    }
    let laid = if request.layout {
        Some(node.dag_layouts.of(record.id, record.version, &graph).await)
    } else {
        None
    };
    Ok((graph, laid))
}

fn dag_message(graph: &Graph, laid: Option<&Result<Layout, Omitted>>) -> pb::Dag {
    let mut upstream: Vec<Vec<String>> = vec![Vec::new(); graph.nodes.len()];
    let mut has_edge = vec![false; graph.nodes.len()];
    for &(u, d) in &graph.edges {
        upstream[d].push(graph.nodes[u].task.clone());
        has_edge[u] = true;
        has_edge[d] = true;
    }
    // A graph of one task is not "isolated": being alone is the point (as `Dag::isolated` says).
    let tasks = graph.nodes.iter().filter(|n| n.handler.is_none()).count();
    let placed = |i: usize| match laid {
        Some(Ok(layout)) => layout.nodes.get(i).copied(),
        _ => None,
    };
    pb::Dag {
        workflow: graph.workflow.clone(),
        version: graph.version,
        run_id: graph.run_id.unwrap_or(0),
        nodes: graph
            .nodes
            .iter()
            .zip(upstream)
            .enumerate()
            .map(|(i, (node, upstream))| {
                let place = placed(i);
                pb::DagNode {
                    task: node.task.clone(),
                    state: node
                        .state
                        .map(|state| state.label().to_string())
                        .unwrap_or_default(),
                    instance_id: node.instance_id.unwrap_or(0),
                    upstream,
                    isolated: tasks > 1 && !has_edge[i] && node.handler.is_none(),
                    trigger_rule: node.rule.as_str().to_string(),
                    handler: node
                        .handler
                        .map(|h| h.field().to_string())
                        .unwrap_or_default(),
                    x: place.map_or(0.0, |p| p.x),
                    y: place.map_or(0.0, |p| p.y),
                    layer: place.map_or(0, |p| p.layer),
                }
            })
            .collect(),
        edges: graph
            .edges
            .iter()
            .map(|&(u, d)| pb::DagEdge {
                from: graph.nodes[u].task.clone(),
                to: graph.nodes[d].task.clone(),
            })
            .collect(),
        layout: laid.map(|laid| match laid {
            Ok(layout) => pb::DagLayout {
                width: layout.width,
                height: layout.height,
                node_width: ax_core::layout::NODE_WIDTH,
                node_height: ax_core::layout::NODE_HEIGHT,
                omitted: String::new(),
            },
            Err(omitted) => pb::DagLayout {
                omitted: omitted.to_string(),
                ..pb::DagLayout::default()
            },
        }),
    }
}

/// The workers this node knows: the store's rows (other nodes' workers), overridden by this
/// node's own registry, which is fresher.
async fn worker_facts(node: &Node, now: Millis) -> Result<Vec<WorkerFacts>, Status> {
    let options = &node.options;
    let dead_after =
        options.heartbeat_interval.as_millis() as i64 * options.dead_after_missed_heartbeats as i64;
    let mut workers: BTreeMap<String, WorkerFacts> = BTreeMap::new();
    for record in node.store.list_workers().await.map_err(store_status)? {
        let live = record.connected && now - record.last_heartbeat <= dead_after;
        workers.insert(
            record.id.clone(),
            WorkerFacts {
                id: record.id,
                labels: record.labels,
                live,
                draining: record.draining,
                capacity: record.capacity,
                running: record.running,
            },
        );
    }
    for view in node.registry.views() {
        workers.insert(
            view.profile.id.clone(),
            WorkerFacts {
                id: view.profile.id,
                labels: view.profile.labels,
                live: true,
                draining: view.draining,
                capacity: view.profile.capacity,
                running: view.running,
            },
        );
    }
    Ok(workers.into_values().collect())
}

fn decision(record: ax_store::DecisionRecord) -> Decision {
    Decision {
        at: record.at,
        slot_at: record.slot_at,
        kind: record.kind,
        run_id: record.run_id.map(|id| id.0),
        instance_id: record.instance_id.map(|id| id.0),
        task: record.task,
        detail: record.detail,
    }
}

pub async fn explain_workflow(
    node: &Node,
    request: pb::ExplainWorkflowRequest,
) -> Result<pb::Explanation, Status> {
    let workflow = workflow_named(node, &request.name).await?;
    if request.at_ms < 0 {
        return Err(Status::invalid_argument("at_ms must not be negative"));
    }
    let now = now_ms();
    let at = if request.at_ms == 0 {
        now
    } else {
        request.at_ms
    };
    let store = &node.store;

    // The cron slot at or before the time, so its decisions are read even when it is long ago.
    let schedule = &workflow.spec.schedule;
    let previous_slot = match (schedule.trigger, schedule.cron.as_deref()) {
        (TriggerKind::Cron, Some(expression)) => {
            match (
                CronSchedule::parse(expression),
                parse_timezone(&schedule.timezone),
            ) {
                (Ok(cron), Ok(tz)) => why::previous_fire(&cron, at, tz),
                _ => None,
            }
        }
        _ => None,
    };
    let from = previous_slot.unwrap_or(at).min(at - DECISION_MARGIN_MS);
    let mut decisions: Vec<Decision> = store
        .list_decisions(
            workflow.id,
            from,
            at.saturating_add(DECISION_MARGIN_MS),
            MAX_DECISIONS_READ,
        )
        .await
        .map_err(store_status)?
        .into_iter()
        .map(decision)
        .collect();

    // The run nearest to the time; on a tie the earlier one.
    let near = store
        .runs_near(workflow.id, at)
        .await
        .map_err(store_status)?;
    let run = near
        .into_iter()
        .min_by_key(|run| (run.logical_time - at).unsigned_abs());
    let mut run_facts = None;
    let mut run_message = None;
    if let Some(run) = run {
        // Its own decisions (queued, throttled, no worker) are dated when they were taken.
        let since = run.logical_time.min(run.created_at);
        decisions.extend(
            store
                .list_decisions(workflow.id, since, now.max(since), MAX_DECISIONS_READ)
                .await
                .map_err(store_status)?
                .into_iter()
                .filter(|d| d.run_id == Some(run.id))
                .map(decision),
        );
        let tasks = if run.workflow_version == workflow.version {
            workflow.spec.tasks.clone()
        } else {
            store
                .get_workflow_version(workflow.id, run.workflow_version)
                .await
                .map_err(store_status)?
                .map(|record| record.spec.tasks)
                .unwrap_or_default()
        };
        let mut instances = Vec::new();
        // The children the run's run_workflow tasks wait on, by (instance, attempt).
        let children = store
            .sub_workflow_waits_of_run(run.id)
            .await
            .map_err(store_status)?;
        for record in store.list_instances(run.id).await.map_err(store_status)? {
            let child_run = children
                .iter()
                .find(|w| w.parent_instance_id == record.id && w.parent_attempt == record.attempt)
                .map(|w| ax_core::why::ChildRunFacts {
                    id: w.child_run_id.0,
                    workflow: w.child_workflow.clone(),
                    state: w.child_state,
                });
            let dispatched_at = if matches!(
                record.state,
                InstanceState::Dispatched | InstanceState::Running
            ) {
                store
                    .list_attempts(record.id)
                    .await
                    .map_err(store_status)?
                    .into_iter()
                    .find(|attempt| attempt.attempt == record.attempt)
                    .and_then(|attempt| attempt.dispatched_at)
            } else {
                None
            };
            instances.push(InstanceFacts {
                id: record.id.0,
                task: record.task,
                state: record.state,
                attempt: record.attempt.0,
                worker_id: record.worker_id,
                not_before: record.not_before,
                created_at: record.created_at,
                dispatched_at,
                started_at: record.started_at,
                finished_at: record.finished_at,
                shard_of: record.shard.as_ref().map(|shard| shard.parent.0),
                child_run,
            });
        }
        let counts = store.run_counts(run.id).await.map_err(store_status)?;
        run_message = Some(convert::run(&run, Some(&counts)));
        run_facts = Some(RunFacts {
            id: run.id.0,
            version: run.workflow_version,
            state: run.state,
            trigger: run.trigger,
            logical_time: run.logical_time,
            created_at: run.created_at,
            finished_at: run.finished_at,
            triggered_by: run.triggered_by,
            tasks,
            instances,
        });
    }

    let input = WhyInput {
        workflow: workflow.name.clone(),
        version: workflow.version,
        spec: workflow.spec.clone(),
        paused: workflow.paused,
        at,
        now,
        decisions,
        run: run_facts,
        workers: worker_facts(node, now).await?,
    };
    let explanation = why::explain(&input);
    let s = &explanation.schedule;
    Ok(pb::Explanation {
        workflow: explanation.workflow,
        version: explanation.version,
        at_ms: explanation.at,
        timezone: explanation.timezone,
        schedule: Some(pb::ExplainedSchedule {
            trigger: convert::trigger(s.trigger) as i32,
            cron: s.cron.clone().unwrap_or_default(),
            timezone: s.timezone.clone(),
            paused: s.paused,
            start_at_ms: s.start_at.unwrap_or(0),
            end_at_ms: s.end_at.unwrap_or(0),
            misfire: s.misfire.clone(),
            overlap: s.overlap.clone(),
            after: s.after.clone(),
            previous_slot_ms: s.previous_slot.unwrap_or(0),
            next_slot_ms: s.next_slot.unwrap_or(0),
        }),
        verdict: explanation.verdict,
        decisions: explanation
            .decisions
            .into_iter()
            .map(|line| pb::DecisionEntry {
                at_ms: line.decision.at,
                slot_at_ms: line.decision.slot_at,
                kind: line.decision.kind.as_str().into(),
                run_id: line.decision.run_id.unwrap_or(0),
                instance_id: line.decision.instance_id.unwrap_or(0),
                task: line.decision.task.unwrap_or_default(),
                detail: line.decision.detail,
                text: line.text,
            })
            .collect(),
        run: run_message,
        tasks: explanation
            .tasks
            .into_iter()
            .map(|task| pb::ExplainedTask {
                reason: task.reason.kind().into(),
                task: task.task,
                state: task.state,
                instance_id: task.instance_id.unwrap_or(0),
                attempt: task.attempt.unwrap_or(0),
                worker_id: task.worker.unwrap_or_default(),
                text: task.text,
            })
            .collect(),
    })
}

pub async fn list_audit(
    node: &Node,
    request: pb::ListAuditRequest,
) -> Result<pb::ListAuditResponse, Status> {
    let set = |text: String| {
        let text = text.trim().to_string();
        (!text.is_empty()).then_some(text)
    };
    let filter = AuditFilter {
        limit: match request.limit {
            0 => 50,
            n => n.min(1_000),
        },
        action: set(request.action),
        target: set(request.target),
        actor: set(request.actor),
        token: set(request.token),
    };
    let rows = node
        .store
        .query_audit(&filter)
        .await
        .map_err(store_status)?;
    Ok(pb::ListAuditResponse {
        entries: rows
            .into_iter()
            .map(|row| pb::AuditEntry {
                at_ms: row.at,
                actor: row.actor,
                action: row.action,
                target: row.target,
                detail: row.detail,
                remote: row.remote,
                token: row.token,
            })
            .collect(),
    })
}
