//! The HTTP edge: the web UI's page and a JSON API under `/api/v1`, served on the node's gRPC
//! port (HTTP/1.1 and HTTP/2 both reach it).
//!
//! The API calls the `ControlService` handlers themselves, so no rule exists twice: a request is
//! the RPC's request message and a response its response message, both in the protobuf JSON
//! mapping (camelCase fields, enums by name, 64-bit integers as strings). A handler's
//! `tonic::Status` becomes the HTTP status of its code with `{"code", "message"}` as the body.

use std::sync::Arc;

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::grpc::control::ControlApi;

/// The page, embedded in the binary: no build step, no files to deploy.
const INDEX_HTML: &str = include_str!("index.html");

type Api = Arc<ControlApi>;

pub fn router(api: ControlApi) -> Router {
    let api: Api = Arc::new(api);
    Router::new()
        .route("/api/v1/workflows", get(list_workflows))
        .route("/api/v1/workflows/{name}", get(get_workflow))
        .route("/api/v1/runs", get(list_runs))
        .route("/api/v1/runs/{id}", get(get_run))
        .route("/api/v1/{*rest}", get(no_such_api))
        .route("/", get(index))
        .fallback(not_api)
        .with_state(api)
}

/// A handler's answer as JSON, or its status as an HTTP error.
fn answer<T: serde::Serialize>(result: Result<tonic::Response<T>, tonic::Status>) -> Response {
    match result {
        Ok(response) => axum::Json(response.into_inner()).into_response(),
        Err(status) => error(http_status(status.code()), status.code(), status.message()),
    }
}

fn error(http: StatusCode, code: tonic::Code, message: &str) -> Response {
    let body = serde_json::json!({
        "code": format!("{code:?}"),
        "message": message,
    });
    (http, axum::Json(body)).into_response()
}

/// The HTTP status a gRPC code maps to (as gRPC-gateway maps them).
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[derive(Deserialize)]
struct AppQuery {
    #[serde(default)]
    app: String,
}

async fn list_workflows(State(api): State<Api>, Query(query): Query<AppQuery>) -> Response {
    let request = pb::ListWorkflowsRequest { app: query.app };
    answer(api.list_workflows(tonic::Request::new(request)).await)
}

async fn get_workflow(State(api): State<Api>, Path(name): Path<String>) -> Response {
    let request = pb::GetWorkflowRequest { name };
    answer(api.get_workflow(tonic::Request::new(request)).await)
}

#[derive(Deserialize)]
struct RunsQuery {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    state: Option<String>,
}

async fn list_runs(State(api): State<Api>, Query(query): Query<RunsQuery>) -> Response {
    let limit = match query.limit.as_deref().map(str::parse::<u32>) {
        None => 0,
        Some(Ok(limit)) => limit,
        Some(Err(_)) => {
            return bad_request("limit: not a whole number from 0 to 4294967295");
        }
    };
    let state = match query.state.as_deref() {
        None | Some("") => pb::RunState::Unspecified,
        Some(name) => {
            match pb::RunState::from_str_name(&format!("RUN_STATE_{}", name.to_ascii_uppercase())) {
                Some(state) => state,
                None => return bad_request(&format!("state: unknown run state {name:?}")),
            }
        }
    };
    let request = pb::ListRunsRequest {
        workflow: query.workflow,
        limit,
        state: state as i32,
    };
    answer(api.list_runs(tonic::Request::new(request)).await)
}

async fn get_run(State(api): State<Api>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return bad_request(&format!("id: {id:?} is not a run id"));
    };
    answer(
        api.get_run(tonic::Request::new(pb::GetRunRequest { id }))
            .await,
    )
}

fn bad_request(message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        tonic::Code::InvalidArgument,
        message,
    )
}

async fn no_such_api(uri: Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        tonic::Code::NotFound,
        &format!("no such API: {}", uri.path()),
    )
}

async fn index() -> Response {
    page()
}

/// Every other path is the page's (a deep link loads it cold, and the page routes itself); a
/// gRPC call to an unknown method gets gRPC's own answer.
async fn not_api(request: axum::extract::Request) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unimplemented(format!("no such method: {}", request.uri().path()))
            .into_http::<axum::body::Body>()
            .into_response();
    }
    page()
}

fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page names no versioned assets yet: always fetched fresh, so an upgraded
            // node serves its own page.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
        .into_response()
}
