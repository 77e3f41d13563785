//! The gate as a tower layer around everything the node's port serves: first the cross-site
//! rules (`ax_core::cross_site`, with tokens on or off), then the token check. A refused gRPC
//! call gets its status as gRPC trailers; a refused HTTP request gets the JSON error the API
//! uses (`{"code", "message"}`) with the matching HTTP status.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response, header};
use axum::response::IntoResponse;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use ax_core::cross_site::{self, NodeNames, RequestFacts, Verdict};

use super::{AuthMode, Gate, Refusal, bearer_token, session_cookie};

/// How long a request that needs no token may take, its body included.
const ANONYMOUS_REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone)]
pub struct AuthLayer {
    gate: Arc<Gate>,
    names: Arc<NodeNames>,
}

impl AuthLayer {
    /// `names`: what the node answers to (`Host`) besides IP literals and `localhost`.
    pub fn new(gate: Arc<Gate>, names: NodeNames) -> Self {
        AuthLayer {
            gate,
            names: Arc::new(names),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticated {
            inner,
            gate: self.gate.clone(),
            names: self.names.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    gate: Arc<Gate>,
    names: Arc<NodeNames>,
}

/// The caller's address from what the server put in the request (plain TCP or TLS).
pub fn remote_of(extensions: &axum::http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
}

impl<S, B> tower::Service<Request<B>> for Authenticated<S>
where
    S: tower::Service<Request<B>, Response = Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // The clone that was made ready is the one that serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        let tokens = gate.mode() == AuthMode::Tokens;
        let cookie_allowed = match cross_site::judge(&facts(&request), &self.names, tokens) {
            Verdict::Allow { cookie } => cookie,
            Verdict::Refuse(refusal) => {
                let response = cross_site_refused(&request, &refusal);
                // Debug, not info: a page or a scanner can send these as fast as it likes.
                tracing::debug!(
                    method = %request.method(),
                    path = request.uri().path(),
                    remote = ?remote_of(request.extensions()),
                    "refused: {refusal}"
                );
                return Box::pin(async move { Ok(response) });
            }
        };
        if !tokens {
            return Box::pin(inner.call(request));
        }
        Box::pin(async move {
            let method = request.method().as_str().to_string();
            let path = request.uri().path().to_string();
            let token = bearer_token(request.headers()).or_else(|| {
                cookie_allowed
                    .then(|| session_cookie(request.headers()))
                    .flatten()
            });
            let remote = remote_of(request.extensions());
            match gate.check(&method, &path, token.as_deref(), remote).await {
                Ok(Some(identity)) => {
                    request.extensions_mut().insert(identity);
                    inner.call(request).await
                }
                // An open path (health check, sign-in, the page's files) answers within a
                // deadline: a caller without a token must not hold a request, and with it a
                // connection, open by sending its body slowly or never.
                Ok(None) => {
                    let grpc = is_grpc_request(&request);
                    match tokio::time::timeout(ANONYMOUS_REQUEST_DEADLINE, inner.call(request))
                        .await
                    {
                        Ok(answer) => answer,
                        Err(_) => Ok(deadline_passed(grpc)),
                    }
                }
                Err(refusal) => Ok(refused(&request, refusal)),
            }
        })
    }
}

pub(crate) fn is_grpc_request<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(cross_site::is_grpc)
}

/// The answer to an open-path request that outlived [`ANONYMOUS_REQUEST_DEADLINE`].
fn deadline_passed(grpc: bool) -> Response<tonic::body::Body> {
    let status = tonic::Status::deadline_exceeded(format!(
        "a request without a token must be sent and answered within {} s",
        ANONYMOUS_REQUEST_DEADLINE.as_secs()
    ));
    answer(grpc, &status, Some(axum::http::StatusCode::REQUEST_TIMEOUT))
}

/// A refusal as its caller reads it: gRPC's status to a gRPC client; to anything else the
/// API's JSON error, with `http` as its status (else the code's own).
fn answer(
    grpc: bool,
    status: &tonic::Status,
    http: Option<axum::http::StatusCode>,
) -> Response<tonic::body::Body> {
    if grpc {
        return status.clone().into_http::<tonic::body::Body>();
    }
    let mut response = crate::json_errors::status_error(status);
    if let Some(http) = http {
        *response.status_mut() = http;
    }
    response.map(tonic::body::Body::new)
}

/// What the cross-site rules look at in a request.
fn facts<B>(request: &Request<B>) -> RequestFacts<'_> {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    RequestFacts {
        method: request.method().as_str(),
        path: request.uri().path(),
        // HTTP/2 names the node in `:authority`, HTTP/1.1 in `Host`.
        host: request
            .uri()
            .authority()
            .map(|authority| authority.as_str())
            .or_else(|| text(header::HOST.as_str())),
        content_type: text(header::CONTENT_TYPE.as_str()),
        origin: text(header::ORIGIN.as_str()),
        fetch_site: text("sec-fetch-site"),
        request_header: headers.contains_key(cross_site::REQUEST_HEADER),
        authorization: headers.contains_key(header::AUTHORIZATION),
        tls: request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .is_some(),
    }
}

/// A cross-site refusal: gRPC's status to a gRPC client, the API's JSON error to anything
/// else (a browser).
fn cross_site_refused<B>(
    request: &Request<B>,
    refusal: &cross_site::Refusal,
) -> Response<tonic::body::Body> {
    let status = tonic::Status::permission_denied(refusal.to_string());
    let http = axum::http::StatusCode::from_u16(refusal.http_status()).ok();
    answer(is_grpc_request(request), &status, http)
}

fn refused<B>(request: &Request<B>, refusal: Refusal) -> Response<tonic::body::Body> {
    let status = tonic::Status::new(refusal.code, refusal.message);
    answer(is_grpc_request(request), &status, None)
}

impl IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        crate::json_errors::status_error(&tonic::Status::new(self.code, self.message))
    }
}
