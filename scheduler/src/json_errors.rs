//! Errors as the JSON API and the gate answer them over HTTP: a gRPC status's code as its
//! HTTP status (as gRPC-gateway maps them), with `{"code", "message"}` as the body. A refusal
//! for load (`ax_proto::overloaded`) is a 429 with `Retry-After` and the bound it met in the
//! body's `overloaded`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A handler's status as the JSON API answers it.
pub fn status_error(status: &tonic::Status) -> Response {
    let Some(overloaded) = ax_proto::overloaded::of(status) else {
        return error(http_status(status.code()), status.code(), status.message());
    };
    let body = serde_json::json!({
        "code": format!("{:?}", status.code()),
        "message": status.message(),
        "overloaded": overloaded,
    });
    let retry_after = ax_proto::overloaded::retry_after_secs(&overloaded);
    (
        http_status(status.code()),
        [(axum::http::header::RETRY_AFTER, retry_after.to_string())],
        axum::Json(body),
    )
        .into_response()
}

/// An error answer: the HTTP status, and `{"code", "message"}` as the body.
pub fn error(http: StatusCode, code: tonic::Code, message: &str) -> Response {
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
