//! The UI's files, embedded in the binary: no build step, nothing to deploy beside it. Each is
//! sent with an ETag (a digest of its bytes) and `no-cache`, so a browser asks again every
//! time, gets `304 Not Modified` while the node runs the same build, and an upgraded node's
//! page the moment it serves one.

use std::borrow::Cow;
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

/// A script module of the page.
macro_rules! module {
    ($name:literal) => {
        Asset {
            name: $name,
            content_type: "text/javascript; charset=utf-8",
            body: include_str!(concat!("assets/", $name)),
        }
    };
}

const FILES: &[Asset] = &[
    module!("app.js"),
    module!("actions.js"),
    module!("ansi.js"),
    module!("api.js"),
    module!("audit.js"),
    module!("backfill.js"),
    module!("dag.js"),
    module!("dom.js"),
    module!("format.js"),
    module!("grid.js"),
    module!("instance.js"),
    module!("logs.js"),
    module!("marks.js"),
    module!("router.js"),
    module!("run.js"),
    module!("runs.js"),
    module!("session.js"),
    module!("trigger.js"),
    module!("why.js"),
    module!("workers.js"),
    module!("workflows.js"),
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
];

/// A digest of the file's bytes. The files are small: hashing one per request costs microseconds.
fn etag(body: &str) -> String {
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}\"", hasher.finish())
}

/// The file's text. A debug build reads it from `AX_UI_DIR` when that is set, so the page can
/// be changed and reloaded without a rebuild; only the files named here are ever read.
fn body_of(asset: &Asset) -> Cow<'static, str> {
    #[cfg(debug_assertions)]
    if let Some(dir) = std::env::var_os("AX_UI_DIR")
        && let Ok(text) = std::fs::read_to_string(std::path::Path::new(&dir).join(asset.name))
    {
        return Cow::Owned(text);
    }
    Cow::Borrowed(asset.body)
}

fn send(asset: &Asset, request: &HeaderMap) -> Response {
    let body = body_of(asset);
    let tag = etag(&body);
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
    (headers, body.into_owned()).into_response()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file in `assets/` is served: a module left out of `FILES` would fail to load in
    /// the browser, and with it the page.
    #[test]
    fn every_file_in_the_assets_folder_is_served() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/web/assets");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("assets folder")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name != INDEX.name)
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = FILES.iter().map(|asset| asset.name.to_owned()).collect();
        served.sort();
        assert_eq!(on_disk, served);
    }

    /// The page asks for every module at once (`modulepreload`) rather than level by level as
    /// imports are parsed: a module missing from its list would load a round trip later.
    #[test]
    fn the_page_preloads_every_module_it_imports() {
        let mut preloaded: Vec<&str> = INDEX
            .body
            .lines()
            .filter_map(|line| line.strip_prefix("<link rel=\"modulepreload\" href=\"/assets/"))
            .filter_map(|rest| rest.strip_suffix("\">"))
            .collect();
        preloaded.sort();
        let mut modules: Vec<&str> = FILES
            .iter()
            .filter(|asset| asset.name.ends_with(".js") && asset.name != "app.js")
            .map(|asset| asset.name)
            .collect();
        modules.sort();
        assert_eq!(preloaded, modules);
    }
}
