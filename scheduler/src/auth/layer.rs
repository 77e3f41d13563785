//! The gate as a tower layer around everything the node's port serves. A refused gRPC call
//! gets its status as gRPC trailers; a refused HTTP request gets the JSON error the API uses
//! (`{"code", "message"}`) with the matching HTTP status.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response, header};
use axum::response::IntoResponse;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{Gate, Refusal, presented_token};

#[derive(Clone)]
pub struct AuthLayer {
    gate: Arc<Gate>,
}

impl AuthLayer {
    pub fn new(gate: Arc<Gate>) -> Self {
        AuthLayer { gate }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticated {
            inner,
            gate: self.gate.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    gate: Arc<Gate>,
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
        if gate.mode() == super::AuthMode::Off {
            return Box::pin(inner.call(request));
        }
        Box::pin(async move {
            let method = request.method().as_str().to_string();
            let path = request.uri().path().to_string();
            let token = presented_token(request.headers());
            let remote = remote_of(request.extensions());
            match gate.check(&method, &path, token.as_deref(), remote).await {
                Ok(identity) => {
                    if let Some(identity) = identity {
                        request.extensions_mut().insert(identity);
                    }
                    inner.call(request).await
                }
                Err(refusal) => Ok(refused(&request, refusal)),
            }
        })
    }
}

fn refused<B>(request: &Request<B>, refusal: Refusal) -> Response<tonic::body::Body> {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"));
    let status = tonic::Status::new(refusal.code, refusal.message);
    if grpc {
        return status.into_http::<tonic::body::Body>();
    }
    crate::web::status_error(&status).map(tonic::body::Body::new)
}

impl IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        crate::web::status_error(&tonic::Status::new(self.code, self.message))
    }
}
