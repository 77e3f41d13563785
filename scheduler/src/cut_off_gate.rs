//! Answers at once, with UNAVAILABLE and the reason, every call that needs the store while the
//! node is cut off from it (`membership::Standing`): the control API (gRPC and the JSON API) and
//! worker registrations. Without it such a call waited for a database connection until the
//! pool gave up (30 s), and a worker's registration outlived the worker's patience, when
//! another node could have answered at once. A call in flight when the node is cut off is
//! answered the same way then (its store work is dropped, as a lost connection would drop it).
//!
//! The health service, the web UI's files and the metrics stay open: they say how the node is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response};

use crate::membership::Standing;

/// Whether a request to `path` needs the store.
fn needs_store(path: &str) -> bool {
    path.starts_with("/ax.v1.ControlService/")
        || path.starts_with("/ax.v1.WorkerService/")
        || path.starts_with("/api/")
}

#[derive(Clone)]
pub struct CutOffLayer {
    standing: Arc<Standing>,
    node_id: Arc<str>,
}

impl CutOffLayer {
    pub fn new(standing: Arc<Standing>, node_id: &str) -> Self {
        CutOffLayer {
            standing,
            node_id: node_id.into(),
        }
    }
}

impl<S> tower::Layer<S> for CutOffLayer {
    type Service = CutOffGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CutOffGate {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct CutOffGate<S> {
    inner: S,
    layer: CutOffLayer,
}

impl<S, B> tower::Service<Request<B>> for CutOffGate<S>
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

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !needs_store(request.uri().path()) {
            return Box::pin(inner.call(request));
        }
        let grpc = crate::auth::layer::is_grpc_request(&request);
        let standing = self.layer.standing.clone();
        let node_id = self.layer.node_id.clone();
        let refused = move || {
            let status = ax_proto::cut_off::status(&node_id);
            if grpc {
                status.into_http::<tonic::body::Body>()
            } else {
                crate::json_errors::status_error(&status).map(tonic::body::Body::new)
            }
        };
        if standing.is_cut_off() {
            return Box::pin(async move { Ok(refused()) });
        }
        Box::pin(async move {
            tokio::select! {
                answer = inner.call(request) => answer,
                () = standing.cut_off() => Ok(refused()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::needs_store;

    #[test]
    fn the_api_and_worker_streams_need_the_store_and_health_and_pages_do_not() {
        assert!(needs_store("/ax.v1.ControlService/TriggerRun"));
        assert!(needs_store("/ax.v1.WorkerService/Connect"));
        assert!(needs_store("/api/v1/runs"));
        assert!(!needs_store("/grpc.health.v1.Health/Check"));
        assert!(!needs_store(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!needs_store("/"));
        assert!(!needs_store("/assets/app.js"));
        assert!(!needs_store("/metrics"));
    }
}
