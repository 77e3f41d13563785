//! The API's actions: POST with a JSON body (the RPC's request message; the path names the
//! workflow, run or instance). Only `application/json` bodies are read, so a page of another
//! site cannot post a form here: a cross-origin JSON request needs the browser's preflight,
//! which this API never grants.

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::{Api, BadParam, Peer, answer, id_of};

/// Who acts when the body names no one.
const WEB_ACTOR: &str = "web";

/// The body as the request message: empty is `{}`; anything but JSON is refused.
fn body<T: DeserializeOwned + Default>(headers: &HeaderMap, bytes: &Bytes) -> Result<T, BadParam> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        return Err(BadParam(format!(
            "Content-Type: {content_type:?} is not application/json (actions take a JSON body)"
        )));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|err| BadParam(format!("request body: {err}")))
}

fn actor(actor: &mut String) {
    if actor.trim().is_empty() {
        *actor = WEB_ACTOR.into();
    }
}

macro_rules! parse {
    ($parsed:expr) => {
        match $parsed {
            Ok(value) => value,
            Err(bad) => return bad.into_response(),
        }
    };
}

pub(super) async fn trigger(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let mut request: pb::TriggerWorkflowRequest = parse!(body(&headers, &bytes));
    request.name = name;
    actor(&mut request.actor);
    answer(api.trigger_workflow(peer.request(request)).await)
}

pub(super) async fn pause(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let mut request: pb::PauseWorkflowRequest = parse!(body(&headers, &bytes));
    request.name = name;
    actor(&mut request.actor);
    answer(api.pause_workflow(peer.request(request)).await)
}

pub(super) async fn resume(
    State(api): State<Api>,
    peer: Peer,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let mut request: pb::ResumeWorkflowRequest = parse!(body(&headers, &bytes));
    request.name = name;
    actor(&mut request.actor);
    answer(api.resume_workflow(peer.request(request)).await)
}

pub(super) async fn cancel_run(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let id = parse!(id_of("id", &id));
    let mut request: pb::CancelRunRequest = parse!(body(&headers, &bytes));
    request.id = id;
    actor(&mut request.actor);
    answer(api.cancel_run(peer.request(request)).await)
}

pub(super) async fn rerun_run(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let id = parse!(id_of("id", &id));
    let mut request: pb::RerunRunRequest = parse!(body(&headers, &bytes));
    request.id = id;
    actor(&mut request.actor);
    answer(api.rerun_run(peer.request(request)).await)
}

pub(super) async fn retry_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let id = parse!(id_of("id", &id));
    let mut request: pb::RetryInstanceRequest = parse!(body(&headers, &bytes));
    request.id = id;
    actor(&mut request.actor);
    answer(api.retry_instance(peer.request(request)).await)
}

pub(super) async fn cancel_instance(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let id = parse!(id_of("id", &id));
    let mut request: pb::CancelInstanceRequest = parse!(body(&headers, &bytes));
    request.id = id;
    actor(&mut request.actor);
    answer(api.cancel_instance(peer.request(request)).await)
}
