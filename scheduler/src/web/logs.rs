//! An attempt's log over HTTP: a page of lines (the viewer never loads a big log whole), the
//! whole log as a file streamed from the store, and a live tail as Server-Sent Events that
//! resumes after the last line the browser saw (`Last-Event-ID` is a line number).

use std::convert::Infallible;
use std::time::Duration;

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;

use super::{Api, BadParam, Peer, attachment, id_of, number, status_error};

/// Lines per page when the request names no limit, and the most a page may ask for.
const DEFAULT_PAGE: u32 = 1_000;
const MAX_PAGE: u32 = 10_000;

#[derive(Deserialize)]
pub(super) struct LogQuery {
    attempt: Option<String>,
    after: Option<String>,
    limit: Option<String>,
    #[serde(default)]
    contains: String,
}

impl LogQuery {
    fn request(&self, id: &str) -> Result<pb::GetLogsRequest, BadParam> {
        let limit = match number::<u32>("limit", self.limit.as_deref())? {
            0 => DEFAULT_PAGE,
            n if n > MAX_PAGE => {
                return Err(BadParam(format!(
                    "limit: {n} is more than {MAX_PAGE} lines"
                )));
            }
            n => n,
        };
        Ok(pb::GetLogsRequest {
            instance_id: id_of("id", id)?,
            attempt: number("attempt", self.attempt.as_deref())?,
            follow: false,
            after_seq: number("after", self.after.as_deref())?,
            limit,
            contains: self.contains.clone(),
        })
    }
}

/// `{attempt, lines}`: up to `limit` lines after line `after`, optionally only those containing
/// `contains` (a search: the next page of matches starts after the last match).
pub(super) async fn page(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> Response {
    let request = match query.request(&id) {
        Ok(request) => request,
        Err(bad) => return bad.into_response(),
    };
    let mut page = pb::LogChunk {
        attempt: request.attempt,
        lines: Vec::new(),
    };
    let mut chunks = match api.get_logs(peer.request(request)).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status_error(&status),
    };
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(chunk) => {
                page.attempt = chunk.attempt;
                page.lines.extend(chunk.lines);
            }
            Err(status) => return status_error(&status),
        }
    }
    axum::Json(page).into_response()
}

/// The instance a request names, and a `GetLogs` request for the attempt it names (0 = the
/// current one) from its first line.
async fn attempt_logs(
    api: &Api,
    peer: &Peer,
    id: &str,
    attempt: Option<&str>,
) -> Result<(pb::Instance, pb::GetLogsRequest), Response> {
    let (id, attempt) = match (id_of("id", id), number::<u32>("attempt", attempt)) {
        (Ok(id), Ok(attempt)) => (id, attempt),
        (Err(bad), _) | (_, Err(bad)) => return Err(bad.into_response()),
    };
    let instance = api
        .get_instance(peer.request(pb::GetInstanceRequest { id }))
        .await
        .map_err(|status| status_error(&status))?
        .into_inner();
    let request = pb::GetLogsRequest {
        instance_id: instance.id,
        attempt: if attempt == 0 {
            instance.attempt
        } else {
            attempt
        },
        ..Default::default()
    };
    Ok((instance, request))
}

#[derive(Deserialize)]
pub(super) struct DownloadQuery {
    attempt: Option<String>,
}

/// The attempt's whole log as text, one stored line per line, streamed page by page: a
/// million-line log never sits whole in the scheduler's memory. A store error mid-way ends the
/// body early, so the browser reports a failed download rather than keeping a short file.
pub(super) async fn download(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Query(query): Query<DownloadQuery>,
) -> Response {
    let (instance, request) = match attempt_logs(&api, &peer, &id, query.attempt.as_deref()).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let attempt = request.attempt;
    let chunks = match api.get_logs(peer.request(request)).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status_error(&status),
    };
    let body = chunks.map(|chunk| {
        chunk
            .map(|chunk| {
                let size = chunk.lines.iter().map(|line| line.text.len() + 1).sum();
                let mut text = String::with_capacity(size);
                for line in &chunk.lines {
                    text.push_str(&line.text);
                    text.push('\n');
                }
                Bytes::from(text)
            })
            .map_err(|status| std::io::Error::other(status.message().to_string()))
    });
    let file = format!(
        "{}-{}-run{}-attempt{attempt}.log",
        instance.workflow, instance.task, instance.run_id
    );
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_string(),
            ),
            (header::CONTENT_DISPOSITION, attachment(&file)),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

#[derive(Deserialize)]
pub(super) struct TailQuery {
    attempt: Option<String>,
    after: Option<String>,
}

/// New lines as they are stored: `lines` events (a `LogChunk`, id = its last line number),
/// then `end` once the attempt has ended and every line it produced was sent, or `error`.
/// A reconnecting browser sends `Last-Event-ID` and gets only the lines after it.
pub(super) async fn tail(
    State(api): State<Api>,
    peer: Peer,
    Path(id): Path<String>,
    Query(query): Query<TailQuery>,
    headers: HeaderMap,
) -> Response {
    let resume = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    let after = match number::<u64>("Last-Event-ID", resume.as_deref()) {
        Ok(n) if resume.is_some() => Ok(n),
        _ => number::<u64>("after", query.after.as_deref()),
    };
    let after = match after {
        Ok(after) => after,
        Err(bad) => return bad.into_response(),
    };
    let (_, mut request) = match attempt_logs(&api, &peer, &id, query.attempt.as_deref()).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    request.follow = true;
    request.after_seq = after;
    let chunks = match api.get_logs(peer.request(request)).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return status_error(&status),
    };
    Sse::new(tail_events(chunks))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

fn tail_events(
    chunks: impl Stream<Item = Result<pb::LogChunk, tonic::Status>> + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let lines = chunks.map(|chunk| {
        Ok(match chunk {
            Ok(chunk) => {
                let last = chunk.lines.last().map_or(0, |line| line.seq);
                super::live::json_event("lines", &chunk).id(last.to_string())
            }
            Err(status) => super::live::error_event(&status),
        })
    });
    lines.chain(futures::stream::once(async {
        Ok(Event::default().event("end").data("{}"))
    }))
}
