//! A run as it changes, pushed as Server-Sent Events: a `run` event carries the run and its
//! instances (`{run, instances}`, the `GetRun` and `ListInstances` answers) whenever they
//! differ from what the browser last saw; `end` follows the run's end.
//!
//! An event's id is a digest of what it carries. A browser that reconnects sends it back as
//! `Last-Event-ID` and hears nothing until the run changes from that. A stream reads the run
//! (`GetRun` and `ListInstances`) at most four times a second while it changes, once a second
//! while it does not, and not at all once the run has ended or the page is closed; the page
//! closes it while hidden.

use std::collections::hash_map::DefaultHasher;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;

use super::{Api, Peer, id_of, status_error};

/// The shortest time between two reads of a busy run.
const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// The longest: changes made by other nodes of a cluster wake nothing here.
const MAX_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Serialize)]
struct RunSnapshot {
    run: pb::Run,
    instances: pb::ListInstancesResponse,
}

pub(super) fn json_event<T: Serialize>(name: &str, value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().event(name).data(json),
        Err(err) => Event::default()
            .event("error")
            .data(serde_json::json!({"code": "Internal", "message": err.to_string()}).to_string()),
    }
}

pub(super) fn error_event(status: &tonic::Status) -> Event {
    let body = serde_json::json!({
        "code": format!("{:?}", status.code()),
        "message": status.message(),
    });
    Event::default().event("error").data(body.to_string())
}

pub(super) async fn run_events(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let id = match id_of("id", &id) {
        Ok(id) => id,
        Err(bad) => return bad.into_response(),
    };
    // An unknown run is a plain 404, not a stream that fails.
    if let Err(status) = api.get_run(peer.request(pb::GetRunRequest { id })).await {
        return status_error(&status);
    }
    let seen = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    Sse::new(snapshots(api, peer, id, seen))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn snapshot(api: &Api, peer: &Peer, id: i64) -> Result<RunSnapshot, tonic::Status> {
    let run = api
        .get_run(peer.request(pb::GetRunRequest { id }))
        .await?
        .into_inner();
    let instances = api
        .list_instances(peer.request(pb::ListInstancesRequest {
            run_id: id,
            attempts: true,
            // The run page counts a mapped task's items and pages them on the task's page.
            group_items: true,
            ..Default::default()
        }))
        .await?
        .into_inner();
    Ok(RunSnapshot { run, instances })
}

fn digest(json: &str) -> String {
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

fn snapshots(
    api: Arc<crate::grpc::control::ControlApi>,
    peer: Peer,
    id: i64,
    seen: Option<String>,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let progress = api.watch_progress();
    // The state: the progress watch, the digest the browser has, whether the stream is over,
    // and whether to wait before reading (right after an event, nothing has changed yet).
    futures::stream::unfold(
        (progress, seen, false, false),
        move |(mut progress, mut seen, done, mut wait)| {
            let (api, peer) = (api.clone(), peer.clone());
            async move {
                if done {
                    return None;
                }
                loop {
                    if wait {
                        tokio::time::sleep(MIN_INTERVAL).await;
                        let _ = tokio::time::timeout(MAX_INTERVAL, progress.changed()).await;
                    }
                    wait = true;
                    let snapshot = match snapshot(&api, &peer, id).await {
                        Ok(snapshot) => snapshot,
                        Err(status) => {
                            return Some((Ok(error_event(&status)), (progress, seen, true, true)));
                        }
                    };
                    let ended = pb::RunState::try_from(snapshot.run.state).is_ok_and(is_terminal);
                    let json = match serde_json::to_string(&snapshot) {
                        Ok(json) => json,
                        Err(err) => {
                            let status = tonic::Status::internal(err.to_string());
                            return Some((Ok(error_event(&status)), (progress, seen, true, true)));
                        }
                    };
                    let id = digest(&json);
                    if seen.as_deref() != Some(id.as_str()) {
                        let event = Event::default().event("run").id(id.clone()).data(json);
                        seen = Some(id);
                        return Some((Ok(event), (progress, seen, false, true)));
                    }
                    if ended {
                        let end = Event::default().event("end").data("{}");
                        return Some((Ok(end), (progress, seen, true, true)));
                    }
                }
            }
        },
    )
}

fn is_terminal(state: pb::RunState) -> bool {
    matches!(
        state,
        pb::RunState::Success | pb::RunState::Failed | pb::RunState::Cancelled
    )
}
