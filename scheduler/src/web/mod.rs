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
        .route("/api/v1/runs/{id}/instances", get(list_instances))
        .route("/api/v1/instances/{id}", get(get_instance))
        .route("/api/v1/workflows/{name}/dag", get(get_dag))
        .route("/api/v1/workflows/{name}/why", get(explain_workflow))
        .route("/api/v1/workers", get(list_workers))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/audit", get(list_audit))
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

/// A request parameter the API cannot read: answered as a 400 that names it.
struct BadParam(String);

impl IntoResponse for BadParam {
    fn into_response(self) -> Response {
        bad_request(&self.0)
    }
}

/// A number parameter, 0 when absent.
fn number<T: std::str::FromStr + Default>(field: &str, value: Option<&str>) -> Result<T, BadParam> {
    match value {
        None | Some("") => Ok(T::default()),
        Some(text) => text
            .parse()
            .map_err(|_| BadParam(format!("{field}: {text:?} is not a whole number in range"))),
    }
}

/// An id from the path.
fn id_of(field: &str, text: &str) -> Result<i64, BadParam> {
    text.parse()
        .map_err(|_| BadParam(format!("{field}: {text:?} is not an id")))
}

async fn list_runs(State(api): State<Api>, Query(query): Query<RunsQuery>) -> Response {
    let limit = match number::<u32>("limit", query.limit.as_deref()) {
        Ok(limit) => limit,
        Err(bad) => return bad.into_response(),
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
    match id_of("id", &id) {
        Ok(id) => answer(
            api.get_run(tonic::Request::new(pb::GetRunRequest { id }))
                .await,
        ),
        Err(bad) => bad.into_response(),
    }
}

async fn list_instances(State(api): State<Api>, Path(id): Path<String>) -> Response {
    match id_of("id", &id) {
        Ok(run_id) => {
            let request = pb::ListInstancesRequest { run_id };
            answer(api.list_instances(tonic::Request::new(request)).await)
        }
        Err(bad) => bad.into_response(),
    }
}

async fn get_instance(State(api): State<Api>, Path(id): Path<String>) -> Response {
    match id_of("id", &id) {
        Ok(id) => {
            let request = pb::GetInstanceRequest { id };
            answer(api.get_instance(tonic::Request::new(request)).await)
        }
        Err(bad) => bad.into_response(),
    }
}

#[derive(Deserialize)]
struct DagQuery {
    version: Option<String>,
    run: Option<String>,
}

async fn get_dag(
    State(api): State<Api>,
    Path(workflow): Path<String>,
    Query(query): Query<DagQuery>,
) -> Response {
    let version = match number::<u32>("version", query.version.as_deref()) {
        Ok(version) => version,
        Err(bad) => return bad.into_response(),
    };
    let run_id = match number::<i64>("run", query.run.as_deref()) {
        Ok(run) => run,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::GetDagRequest {
        workflow,
        version,
        run_id,
    };
    answer(api.get_dag(tonic::Request::new(request)).await)
}

#[derive(Deserialize)]
struct WhyQuery {
    at: Option<String>,
}

async fn explain_workflow(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(query): Query<WhyQuery>,
) -> Response {
    let at_ms = match number::<i64>("at", query.at.as_deref()) {
        Ok(at) => at,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::ExplainWorkflowRequest { name, at_ms };
    answer(api.explain_workflow(tonic::Request::new(request)).await)
}

async fn list_workers(State(api): State<Api>) -> Response {
    answer(
        api.list_workers(tonic::Request::new(pb::ListWorkersRequest {}))
            .await,
    )
}

async fn list_nodes(State(api): State<Api>) -> Response {
    answer(
        api.list_nodes(tonic::Request::new(pb::ListNodesRequest {}))
            .await,
    )
}

#[derive(Deserialize)]
struct AuditQuery {
    limit: Option<String>,
    #[serde(default)]
    action: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    actor: String,
}

async fn list_audit(State(api): State<Api>, Query(query): Query<AuditQuery>) -> Response {
    let limit = match number::<u32>("limit", query.limit.as_deref()) {
        Ok(limit) => limit,
        Err(bad) => return bad.into_response(),
    };
    let request = pb::ListAuditRequest {
        limit,
        action: query.action,
        target: query.target,
        actor: query.actor,
    };
    answer(api.list_audit(tonic::Request::new(request)).await)
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
