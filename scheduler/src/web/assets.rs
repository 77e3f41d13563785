//! The UI's files, embedded in the binary: no build step, nothing to deploy beside it. Each is
//! sent with an ETag (a digest of its bytes) and `no-cache`, so a browser asks again every
//! time, gets `304 Not Modified` while the node runs the same build, and an upgraded node's
//! page the moment it serves one.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset = Asset {
    name: "index.html",
    content_type: "text/html; charset=utf-8",
    body: include_str!("assets/index.html"),
};

const FILES: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
];

/// A digest of the file's bytes. The files are small: hashing one per request costs microseconds.
fn etag(asset: &Asset) -> String {
    let mut hasher = DefaultHasher::new();
    asset.body.hash(&mut hasher);
    format!("\"{:016x}\"", hasher.finish())
}

fn send(asset: &Asset, request: &HeaderMap) -> Response {
    let tag = etag(asset);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(',')
                .any(|candidate| candidate.trim() == tag.as_str())
        });
    let headers = [
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::ETAG,
            HeaderValue::from_str(&tag).unwrap_or(HeaderValue::from_static("\"\"")),
        ),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        // The page loads only its own files and talks only to its own node.
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                 script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
            ),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (headers, asset.body).into_response()
}

/// The page itself, for every path the API and the assets do not claim.
pub(super) fn page(request: &HeaderMap) -> Response {
    send(&INDEX, request)
}

pub(super) async fn asset(Path(file): Path<String>, request: HeaderMap) -> Response {
    match FILES.iter().find(|asset| asset.name == file) {
        Some(asset) => send(asset, &request),
        None => super::error(
            StatusCode::NOT_FOUND,
            tonic::Code::NotFound,
            &format!("no such file: /assets/{file}"),
        ),
    }
}
