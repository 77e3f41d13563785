//! The API's actions: POST with a JSON body (the RPC's request message; the path names the
//! workflow, run or instance). Only `application/json` bodies are read, so a page of another
//! site cannot post a form here: a cross-origin JSON request needs the browser's preflight,
//! which this API never grants.

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::body::Bytes;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Api, BadParam, Peer, answer, id_of};

/// Who acts when the body names no one.
const WEB_ACTOR: &str = "web";

/// An action's request message, read from a JSON body (empty is `{}`), its `actor` `web` when
/// the body names none.
pub(super) struct Action<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Action<T> {
    type Rejection = BadParam;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_string();
        if !content_type.starts_with("application/json") {
            return Err(BadParam(format!(
                "Content-Type: {content_type:?} is not application/json (actions take a JSON body)"
            )));
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|err| BadParam(format!("request body: {err}")))?;
        let mut body = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Object(Default::default())
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|err| BadParam(format!("request body: {err}")))?
        };
        let Value::Object(fields) = &mut body else {
            return Err(BadParam("request body: expected a JSON object".into()));
        };
        if fields
            .get("actor")
            .is_none_or(|actor| actor.as_str().is_some_and(|a| a.trim().is_empty()))
        {
            fields.insert("actor".into(), WEB_ACTOR.into());
        }
        serde_json::from_value(body)
            .map(Action)
            .map_err(|err| BadParam(format!("request body: {err}")))
    }
}

pub(super) async fn trigger(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    Action(request): Action<pb::TriggerWorkflowRequest>,
) -> Response {
    let request = pb::TriggerWorkflowRequest { name, ..request };
    answer(api.trigger_workflow(peer.request(request)).await)
}

/// A backfill of the workflow's cron slots in a range, or with `dryRun` the slots alone.
pub(super) async fn backfill(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    Action(request): Action<pb::BackfillWorkflowRequest>,
) -> Response {
    let request = pb::BackfillWorkflowRequest { name, ..request };
    answer(api.backfill_workflow(peer.request(request)).await)
}

pub(super) async fn pause(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    Action(request): Action<pb::PauseWorkflowRequest>,
) -> Response {
    let request = pb::PauseWorkflowRequest { name, ..request };
    answer(api.pause_workflow(peer.request(request)).await)
}

pub(super) async fn resume(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    Action(request): Action<pb::ResumeWorkflowRequest>,
) -> Response {
    let request = pb::ResumeWorkflowRequest { name, ..request };
    answer(api.resume_workflow(peer.request(request)).await)
}

pub(super) async fn cancel_run(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Action(request): Action<pb::CancelRunRequest>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(
            api.cancel_run(peer.request(pb::CancelRunRequest { id, ..request }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn rerun_run(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Action(request): Action<pb::RerunRunRequest>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(
            api.rerun_run(peer.request(pb::RerunRunRequest { id, ..request }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn retry_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Action(request): Action<pb::RetryInstanceRequest>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(
            api.retry_instance(peer.request(pb::RetryInstanceRequest { id, ..request }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn cancel_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Action(request): Action<pb::CancelInstanceRequest>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(
            api.cancel_instance(peer.request(pb::CancelInstanceRequest { id, ..request }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn mark_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Action(request): Action<pb::MarkInstanceRequest>,
) -> Response {
    match id_of("id", &id) {
        Ok(id) => answer(
            api.mark_instance(peer.request(pb::MarkInstanceRequest { id, ..request }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}
