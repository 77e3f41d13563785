//! A workflow's grid (`GetGrid`) as JSON, and live as Server-Sent Events.
//!
//! `GET /api/v1/workflows/{name}/grid?limit=&before=` answers the whole matrix in one request.
//! `GET /api/v1/workflows/{name}/grid/events?limit=&also=ID,ID` keeps the newest page live: each
//! `grid` event is a `Grid` whose `runs` are every column of the window, in order, with cells
//! (`hasCells`) only for the columns that changed since the last event (all of them when the
//! rows changed, after a new version). `also` names the runs the page holds as not yet ended,
//! so their last cells are sent when they end.
//!
//! Why this stays cheap at 100 runs × 300 tasks: an ended run's cells never change, so a read
//! of the stream (`GetGrid` with `live`) reads the window's run rows and the cells of the runs
//! still going (and of those that just ended) only, never the whole matrix; the stream sends
//! only the columns whose content changed. It reads at most four times a second while runs
//! change on this node and once a second otherwise (changes made by other nodes of a cluster
//! wake nothing here), less often when a read takes long (a pause of ten times the read after
//! it), and not at all while the page is hidden: the page closes it then.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use ax_proto::v1 as pb;
use ax_proto::v1::control_service_server::ControlService;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;

use super::live::{error_event, json_event};
use super::{Api, BadParam, Peer, answer, number, status_error};

/// The shortest time between two reads while runs change.
const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// The longest wait for a change after the pause: changes made by other nodes of a cluster
/// wake nothing here.
const MAX_INTERVAL: Duration = Duration::from_secs(1);
/// A read's time stretches the pause after it to this many times as long: a stream over a big
/// workflow's many running runs (tens of thousands of cells a read) reads less often, and takes
/// at most about a tenth of a core from the runs it shows.
const PAUSE_PER_READ: u32 = 10;

#[derive(Deserialize)]
pub(super) struct GridQuery {
    limit: Option<String>,
    before: Option<String>,
    also: Option<String>,
}

impl GridQuery {
    fn request(&self, workflow: String) -> Result<pb::GetGridRequest, BadParam> {
        let also = match self.also.as_deref() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|id| {
                    id.trim()
                        .parse::<i64>()
                        .map_err(|_| BadParam(format!("also: {id:?} is not a run id")))
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(pb::GetGridRequest {
            workflow,
            limit: number("limit", self.limit.as_deref())?,
            before_id: number("before", self.before.as_deref())?,
            live: false,
            also,
        })
    }
}

pub(super) async fn get_grid(
    State(api): State<Api>,
    peer: Peer,
    Path(workflow): Path<String>,
    Query(query): Query<GridQuery>,
) -> Response {
    match query.request(workflow) {
        Ok(request) => answer(api.get_grid(peer.request(request)).await),
        Err(bad) => bad.into_response(),
    }
}

pub(super) async fn grid_events(
    State(api): State<Api>,
    peer: Peer,
    Path(workflow): Path<String>,
    Query(query): Query<GridQuery>,
) -> Response {
    let mut request = match query.request(workflow) {
        Ok(request) => request,
        Err(bad) => return bad.into_response(),
    };
    if request.before_id != 0 {
        return BadParam("before: only the newest page is live".into()).into_response();
    }
    request.live = true;
    // An unknown workflow or a bad limit is a plain error, not a stream that fails.
    if let Err(status) = api.get_grid(peer.request(request.clone())).await {
        return status_error(&status);
    }
    Sse::new(changes(api, peer, request))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// What a stream knows of what it sent.
struct Sent {
    /// The rows' digest; `None` before the first event.
    tasks: Option<u64>,
    /// Each column's digest (header and cells), by run id.
    columns: HashMap<i64, u64>,
    /// Each column's run state as last read, by run id.
    states: HashMap<i64, i32>,
    /// The window's run ids in order.
    window: Vec<i64>,
}

fn digest<T: serde::Serialize>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// The next event, if anything changed: reads the window's running columns (and those in
/// `also`), then the cells of any column that changed without them (a run that appeared or
/// ended between two reads), or every column when the rows changed.
async fn next_event(
    api: &Api,
    peer: &Peer,
    request: &mut pb::GetGridRequest,
    sent: &mut Sent,
) -> Result<Option<Event>, tonic::Status> {
    let mut grid = api
        .get_grid(peer.request(request.clone()))
        .await?
        .into_inner();
    let tasks = digest(&grid.tasks);
    let rows_changed = sent.tasks.is_some_and(|before| before != tasks);
    let stale: Vec<i64> = grid
        .runs
        .iter()
        .filter(|run| !run.has_cells)
        .filter(|run| match sent.states.get(&run.id) {
            // On the first read, the page has the ended runs it asked for.
            None => sent.tasks.is_some(),
            Some(state) => *state != run.state,
        })
        .map(|run| run.id)
        .collect();
    if rows_changed || !stale.is_empty() {
        let mut again = request.clone();
        again.live = !rows_changed;
        again.also.extend(stale);
        grid = api.get_grid(peer.request(again)).await?.into_inner();
    }
    let window: Vec<i64> = grid.runs.iter().map(|run| run.id).collect();
    let mut changed = rows_changed || sent.tasks.is_none() || window != sent.window;
    for run in &mut grid.runs {
        sent.states.insert(run.id, run.state);
        if !run.has_cells {
            continue;
        }
        let now = digest(run);
        if sent.columns.insert(run.id, now) == Some(now) && !rows_changed {
            // Unchanged: its header alone.
            run.has_cells = false;
            run.states.clear();
            run.instance_base = 0;
            run.instance_offsets.clear();
            run.details.clear();
        } else {
            changed = true;
        }
    }
    let in_window: HashSet<i64> = window.iter().copied().collect();
    sent.columns.retain(|id, _| in_window.contains(id));
    sent.states.retain(|id, _| in_window.contains(id));
    sent.tasks = Some(tasks);
    sent.window = window;
    // The next read asks again for the runs still going.
    request.also = grid
        .runs
        .iter()
        .filter(|run| !is_ended(run.state))
        .map(|run| run.id)
        .collect();
    Ok(changed.then(|| json_event("grid", &grid)))
}

fn is_ended(state: i32) -> bool {
    matches!(
        pb::RunState::try_from(state),
        Ok(pb::RunState::Success | pb::RunState::Failed | pb::RunState::Cancelled)
    )
}

fn changes(
    api: Api,
    peer: Peer,
    request: pb::GetGridRequest,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let progress = api.watch_progress();
    let sent = Sent {
        tasks: None,
        columns: HashMap::new(),
        states: HashMap::new(),
        window: Vec::new(),
    };
    // The state: the progress watch, the request, what was sent, whether the stream is over,
    // and the pause before the next read (none before the first).
    futures::stream::unfold(
        (progress, request, sent, false, Duration::ZERO),
        move |(mut progress, mut request, mut sent, done, mut pause)| {
            let (api, peer) = (api.clone(), peer.clone());
            async move {
                if done {
                    return None;
                }
                loop {
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                        let _ = tokio::time::timeout(MAX_INTERVAL, progress.changed()).await;
                    }
                    let started = Instant::now();
                    let read = next_event(&api, &peer, &mut request, &mut sent).await;
                    pause = MIN_INTERVAL.max(started.elapsed() * PAUSE_PER_READ);
                    match read {
                        Ok(Some(event)) => {
                            return Some((Ok(event), (progress, request, sent, false, pause)));
                        }
                        Ok(None) => {}
                        Err(status) => {
                            let event = error_event(&status);
                            return Some((Ok(event), (progress, request, sent, true, pause)));
                        }
                    }
                }
            }
        },
    )
}
