//! The API's reads: each parses its query, calls the `ControlService` handler and answers its
//! message.

use ax_core::render;
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{Api, BadParam, Peer, answer, attachment, flag, id_of, number, status_error};

#[derive(Deserialize)]
pub(super) struct WorkflowsQuery {
    #[serde(default)]
    app: String,
    recent: Option<String>,
    summary: Option<String>,
}

pub(super) async fn list_workflows(
    State(api): State<Api>,
    peer: Peer,
    Query(query): Query<WorkflowsQuery>,
) -> Response {
    let parsed = (|| -> Result<_, BadParam> {
        Ok(pb::ListWorkflowsRequest {
            recent_runs: number("recent", query.recent.as_deref())?,
            summary: flag("summary", query.summary.as_deref())?,
            app: query.app,
        })
    })();
    match parsed {
        Ok(request) => answer(api.list_workflows(peer.request(request)).await),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn get_workflow(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
) -> Response {
    let request = pb::GetWorkflowRequest { name };
    answer(api.get_workflow(peer.request(request)).await)
}

#[derive(Deserialize)]
pub(super) struct RunsQuery {
    #[serde(default)]
    workflow: String,
    limit: Option<String>,
    state: Option<String>,
    before: Option<String>,
    trigger: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

pub(super) async fn list_runs(
    State(api): State<Api>,
    peer: Peer,
    Query(query): Query<RunsQuery>,
) -> Response {
    let parsed = (|| {
        let limit = number::<u32>("limit", query.limit.as_deref())?;
        let before_id = number::<i64>("before", query.before.as_deref())?;
        let state = match query.state.as_deref() {
            None | Some("") => pb::RunState::Unspecified,
            Some(name) => {
                let full = format!("RUN_STATE_{}", name.to_ascii_uppercase());
                pb::RunState::from_str_name(&full)
                    .ok_or_else(|| BadParam(format!("state: unknown run state {name:?}")))?
            }
        };
        let trigger = match query.trigger.as_deref() {
            None | Some("") => pb::TriggerKind::Unspecified,
            Some(name) => {
                let full = format!("TRIGGER_KIND_{}", name.to_ascii_uppercase());
                pb::TriggerKind::from_str_name(&full)
                    .ok_or_else(|| BadParam(format!("trigger: unknown trigger {name:?}")))?
            }
        };
        let from = number::<i64>("from", query.from.as_deref())?;
        let to = number::<i64>("to", query.to.as_deref())?;
        Ok::<_, BadParam>((limit, before_id, state, trigger, from, to))
    })();
    let (limit, before_id, state, trigger, logical_from_ms, logical_to_ms) = match parsed {
        Ok(parsed) => parsed,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::ListRunsRequest {
        workflow: query.workflow,
        limit,
        state: state as i32,
        before_id,
        trigger: trigger as i32,
        logical_from_ms,
        logical_to_ms,
    };
    answer(api.list_runs(peer.request(request)).await)
}

pub(super) async fn get_run(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(api.get_run(peer.request(pb::GetRunRequest { id })).await),
        Err(bad) => bad.into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct InstancesQuery {
    attempts: Option<String>,
    group_items: Option<String>,
    items_of: Option<String>,
    items_from: Option<String>,
    limit: Option<String>,
    state: Option<String>,
}

pub(super) async fn list_instances(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Query(query): Query<InstancesQuery>,
) -> Response {
    let parsed = id_of("id", &id).and_then(|run_id| {
        let state = match query.state.as_deref() {
            None | Some("") => pb::InstanceState::Unspecified,
            Some(name) => {
                let full = format!("INSTANCE_STATE_{}", name.to_ascii_uppercase());
                pb::InstanceState::from_str_name(&full)
                    .ok_or_else(|| BadParam(format!("state: unknown instance state {name:?}")))?
            }
        };
        Ok(pb::ListInstancesRequest {
            run_id,
            attempts: flag("attempts", query.attempts.as_deref())?,
            group_items: flag("group_items", query.group_items.as_deref())?,
            items_of: number("items_of", query.items_of.as_deref())?,
            items_from: number("items_from", query.items_from.as_deref())?,
            limit: number("limit", query.limit.as_deref())?,
            state: state as i32,
        })
    });
    match parsed {
        Ok(request) => answer(api.list_instances(peer.request(request)).await),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn get_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => {
            let request = pb::GetInstanceRequest { id };
            answer(api.get_instance(peer.request(request)).await)
        }
        Err(bad) => bad.into_response(),
    }
}

#[derive(Deserialize)]
pub(super) struct DagQuery {
    version: Option<String>,
    run: Option<String>,
    layout: Option<String>,
    format: Option<String>,
}

impl DagQuery {
    fn request(&self, workflow: String) -> Result<pb::GetDagRequest, BadParam> {
        Ok(pb::GetDagRequest {
            workflow,
            version: number("version", self.version.as_deref())?,
            run_id: number("run", self.run.as_deref())?,
            layout: flag("layout", self.layout.as_deref())?,
        })
    }
}

pub(super) async fn get_dag(
    State(api): State<Api>,
    peer: Peer,
    Path(workflow): Path<String>,
    Query(query): Query<DagQuery>,
) -> Response {
    match query.request(workflow) {
        Ok(request) => answer(api.get_dag(peer.request(request)).await),
        Err(bad) => bad.into_response(),
    }
}

/// The whole graph as a file: `dot`, `mermaid`, `json` or `svg` (laid out as the page draws it).
pub(super) async fn export_dag(
    State(api): State<Api>,
    peer: Peer,
    Path(workflow): Path<String>,
    Query(query): Query<DagQuery>,
) -> Response {
    let format = query.format.clone().unwrap_or_default();
    let (extension, content_type) = match format.as_str() {
        "dot" => ("dot", "text/vnd.graphviz; charset=utf-8"),
        "mermaid" => ("mmd", "text/plain; charset=utf-8"),
        "json" => ("json", "application/json"),
        "svg" => ("svg", "image/svg+xml"),
        other => {
            return BadParam(format!(
                "format: {other:?} is not one of dot, mermaid, json, svg"
            ))
            .into_response();
        }
    };
    let mut request = match query.request(workflow) {
        Ok(request) => request,
        Err(bad) => return bad.into_response(),
    };
    request.layout = format == "svg";
    let (graph, laid) = match api.dag(peer.request(request)).await {
        Ok(found) => found,
        Err(status) => return status_error(&status),
    };
    let body = match format.as_str() {
        "dot" => render::dot(&graph),
        "mermaid" => render::mermaid(&graph),
        "json" => render::json(&graph),
        _ => match laid.as_deref() {
            Some(Ok(layout)) => render::svg(&graph, layout),
            Some(Err(omitted)) => {
                return BadParam(format!("format: svg is not available: {omitted}"))
                    .into_response();
            }
            None => return BadParam("format: svg needs a layout".into()).into_response(),
        },
    };
    let mut file = format!("{}-v{}", graph.workflow, graph.version);
    if let Some(run) = graph.run_id {
        file.push_str(&format!("-run{run}"));
    }
    (
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (
                header::CONTENT_DISPOSITION,
                attachment(&format!("{file}.{extension}")),
            ),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
pub(super) struct WhyQuery {
    at: Option<String>,
}

pub(super) async fn explain_workflow(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    Query(query): Query<WhyQuery>,
) -> Response {
    let at_ms = match number::<i64>("at", query.at.as_deref()) {
        Ok(at) => at,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::ExplainWorkflowRequest { name, at_ms };
    answer(api.explain_workflow(peer.request(request)).await)
}

pub(super) async fn list_workers(State(api): State<Api>, peer: Peer) -> Response {
    answer(
        api.list_workers(peer.request(pb::ListWorkersRequest {}))
            .await,
    )
}

pub(super) async fn list_nodes(State(api): State<Api>, peer: Peer) -> Response {
    answer(api.list_nodes(peer.request(pb::ListNodesRequest {})).await)
}

#[derive(Deserialize)]
pub(super) struct AuditQuery {
    limit: Option<String>,
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    actor: String,
    #[serde(default)]
    token: String,
}

pub(super) async fn list_audit(
    State(api): State<Api>,
    peer: Peer,
    Query(query): Query<AuditQuery>,
) -> Response {
    let limit = match number::<u32>("limit", query.limit.as_deref()) {
        Ok(limit) => limit,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::ListAuditRequest {
        limit,
        action: query.action,
        target: query.target,
        actor: query.actor,
        token: query.token,
    };
    answer(api.list_audit(peer.request(request)).await)
}
