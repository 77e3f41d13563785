//! The HTTP edge: the web UI and a JSON API under `/api/v1`, served on the node's gRPC port
//! (HTTP/1.1 and HTTP/2 both reach it).
//!
//! The API calls the `ControlService` handlers themselves, so no rule exists twice: a request is
//! the RPC's request message and a response its response message, both in the protobuf JSON
//! mapping (camelCase fields, enums by name, 64-bit integers as strings). A handler's
//! `tonic::Status` becomes the HTTP status of its code with `{"code", "message"}` as the body.
//! Live views are Server-Sent Events (`live`, `logs`); everything else is a plain request.

mod actions;
mod assets;
mod grid;
mod live;
mod logs;
mod reads;
mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::grpc::control::ControlApi;
pub(crate) use crate::json_errors::{error, status_error};

type Api = Arc<ControlApi>;

pub fn router(api: ControlApi) -> Router {
    let api: Api = Arc::new(api);
    Router::new()
        .route("/api/v1/workflows", get(reads::list_workflows))
        .route("/api/v1/workflows/{name}", get(reads::get_workflow))
        .route("/api/v1/workflows/{name}/dag", get(reads::get_dag))
        .route(
            "/api/v1/workflows/{name}/dag/export",
            get(reads::export_dag),
        )
        .route("/api/v1/workflows/{name}/why", get(reads::explain_workflow))
        .route("/api/v1/workflows/{name}/grid", get(grid::get_grid))
        .route(
            "/api/v1/workflows/{name}/grid/events",
            get(grid::grid_events),
        )
        .route("/api/v1/workflows/{name}/trigger", post(actions::trigger))
        .route("/api/v1/workflows/{name}/backfill", post(actions::backfill))
        .route("/api/v1/workflows/{name}/pause", post(actions::pause))
        .route("/api/v1/workflows/{name}/resume", post(actions::resume))
        .route("/api/v1/runs", get(reads::list_runs))
        .route("/api/v1/runs/{id}", get(reads::get_run))
        .route("/api/v1/runs/{id}/instances", get(reads::list_instances))
        .route("/api/v1/runs/{id}/events", get(live::run_events))
        .route("/api/v1/runs/{id}/cancel", post(actions::cancel_run))
        .route("/api/v1/runs/{id}/rerun", post(actions::rerun_run))
        .route("/api/v1/instances/{id}", get(reads::get_instance))
        .route("/api/v1/instances/{id}/logs", get(logs::page))
        .route("/api/v1/instances/{id}/logs/download", get(logs::download))
        .route("/api/v1/instances/{id}/logs/tail", get(logs::tail))
        .route(
            "/api/v1/instances/{id}/retry",
            post(actions::retry_instance),
        )
        .route(
            "/api/v1/instances/{id}/cancel",
            post(actions::cancel_instance),
        )
        .route("/api/v1/instances/{id}/mark", post(actions::mark_instance))
        .route("/api/v1/workers", get(reads::list_workers))
        .route("/api/v1/nodes", get(reads::list_nodes))
        .route("/api/v1/audit", get(reads::list_audit))
        .route(
            "/api/v1/session",
            post(session::sign_in).delete(session::sign_out),
        )
        .route("/api/v1/whoami", get(session::who_am_i))
        .route("/api/v1/{*rest}", get(no_such_api).post(no_such_api))
        .route("/assets/{file}", get(assets::asset))
        .route("/metrics", get(metrics))
        .fallback(not_api)
        .with_state(api)
}

/// A handler's answer as JSON, or its status as an HTTP error.
fn answer<T: serde::Serialize>(result: Result<tonic::Response<T>, tonic::Status>) -> Response {
    match result {
        Ok(response) => axum::Json(response.into_inner()).into_response(),
        Err(status) => status_error(&status),
    }
}

/// A request the API cannot read: answered as a 400 that names what was wrong.
struct BadParam(String);

impl IntoResponse for BadParam {
    fn into_response(self) -> Response {
        error(
            StatusCode::BAD_REQUEST,
            tonic::Code::InvalidArgument,
            &self.0,
        )
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

/// A yes-or-no parameter, false when absent.
fn flag(field: &str, value: Option<&str>) -> Result<bool, BadParam> {
    match value {
        None | Some("") | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(other) => Err(BadParam(format!("{field}: {other:?} is not true or false"))),
    }
}

/// An id from the path.
fn id_of(field: &str, text: &str) -> Result<i64, BadParam> {
    text.parse()
        .map_err(|_| BadParam(format!("{field}: {text:?} is not an id")))
}

/// A `Content-Disposition` that saves the answer as `file`, with every character a file system
/// or a header could misread replaced by `_`.
fn attachment(file: &str) -> String {
    let file: String = file
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("attachment; filename=\"{file}\"")
}

/// Who a request came from (the TCP peer, and the caller's identity when the node asks for
/// one), carried into the handler's request so app scopes and the audit trail treat it as they
/// treat a gRPC call.
#[derive(Clone, Default)]
struct Peer {
    connection: Option<TcpConnectInfo>,
    /// The connection is TLS (a cookie may then say `Secure`).
    over_tls: bool,
    identity: Option<ax_core::access::Identity>,
}

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let tls = parts.extensions.get::<TlsConnectInfo<TcpConnectInfo>>();
        let connection = parts
            .extensions
            .get::<TcpConnectInfo>()
            .cloned()
            .or_else(|| tls.map(|info| info.get_ref().clone()));
        Ok(Peer {
            connection,
            over_tls: tls.is_some(),
            identity: parts.extensions.get::<ax_core::access::Identity>().cloned(),
        })
    }
}

impl Peer {
    /// The caller's address.
    fn remote(&self) -> Option<std::net::SocketAddr> {
        self.connection
            .as_ref()
            .and_then(TcpConnectInfo::remote_addr)
    }

    /// `message` as a handler's request, from this peer.
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(info) = &self.connection {
            request.extensions_mut().insert(info.clone());
        }
        if let Some(identity) = &self.identity {
            request.extensions_mut().insert(identity.clone());
        }
        request
    }
}

/// `GET /metrics`: the node's Prometheus metrics (`crate::metrics`).
async fn metrics(axum::extract::State(api): axum::extract::State<Api>) -> Response {
    api.node().scraped.response().await
}

async fn no_such_api(uri: Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        tonic::Code::NotFound,
        &format!("no such API: {}", uri.path()),
    )
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
    assets::page(request.headers())
}
