//! `WorkerService.Connect`: one bidirectional stream per worker.
//!
//! The worker's first frame must be `Register`, within a deadline. The Register must fit the
//! stream's credential (the token's worker scope: its id patterns and labels; with mutual TLS
//! the certificate naming the id exactly), and the id must have no other live stream, here or,
//! by the store, on another node (`ax_core::worker_scope::takeover`); else it is refused and
//! audited (`worker_refusals`). The node answers `Registered`, listing the attempts the worker
//! claims to run that are not current or not its own (the worker kills them). Reports then flow
//! to the reporter (transitions) and the log writer (lines); both store only what concerns
//! attempts dispatched to the stream's worker id: a log batch about an attempt this stream is
//! known to hold goes in as it is, any other is checked in the writer's transaction, and the
//! store refuses a report from another worker than the attempt's.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use ax_core::access::Identity;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::state::{InstanceState, Outcome};
use ax_core::worker_scope::{
    HeldStream, RegisterRefusal, SILENT_AFTER_HEARTBEATS, Takeover, takeover,
};
use ax_proto::v1::worker_service_server::WorkerService;
use ax_proto::v1::{
    AttemptFinished, AttemptOutcome, LogBatch, LogStream as ProtoStream, ProtocolVersion, Register,
    Registered, SchedulerMessage, WorkerMessage, scheduler_message, worker_message,
};
use ax_store::{ActiveAttempt, AttemptEnd, LogChunk, LogStream, Report, Store, WorkerRecord};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::clock::now_ms;
use crate::log_writer::Logs;
use crate::membership::Standing;
use crate::metrics::Metrics;
use crate::registry::{Registry, StreamInfo, WorkerProfile};
use crate::reporter::{Envelope, Reports};
use crate::to_worker::{self, ToWorker};
use crate::wake::Wake;
use crate::worker_refusals::{REGISTER_REFUSED, Refusal, WorkerRefusals};
use crate::worker_rows::{PendingAck, WorkerRows};

/// How long a new stream may take to send its Register frame.
const REGISTER_DEADLINE: Duration = Duration::from_secs(10);
/// Frames queued towards one worker before dispatches to it fail over.
const OUTBOUND_QUEUE: usize = 1024;

/// What the worker streams hold: handles to the node's parts, made once in [`crate::start`].
pub struct Streams {
    pub node_id: String,
    pub heartbeat_interval: Duration,
    pub task_heartbeat_interval: Duration,
    /// Mutual TLS: a worker's certificate must name its id.
    pub worker_certificates: bool,
    /// Silence after which a worker is dead, as the worker is told.
    pub worker_dead_after_ms: ax_core::Millis,
    /// Whether the node reaches its store: cut off, it serves no worker.
    pub standing: Arc<Standing>,
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    /// The stream's reports, to the reporter.
    pub reports: Reports,
    /// The stream's lines, to the log writer.
    pub logs: Logs,
    pub refusals: Arc<WorkerRefusals>,
    pub metrics: Arc<Metrics>,
    pub worker_rows: Arc<WorkerRows>,
    /// The dispatcher's wake-up: a worker connected.
    pub dispatch: Wake,
    /// Where each stream's task runs, so that shutdown waits for it.
    pub tasks: TaskTracker,
    /// Cancelled when the node stops serving: the streams end.
    pub stopping: CancellationToken,
}

pub struct WorkerApi {
    streams: Arc<Streams>,
}

impl WorkerApi {
    pub fn new(streams: Arc<Streams>) -> Self {
        WorkerApi { streams }
    }
}

type OutboundStream = Pin<Box<dyn Stream<Item = Result<SchedulerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    type ConnectStream = OutboundStream;

    async fn connect(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let remote = request
            .remote_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default();
        let peer_certs = request.peer_certs();
        let identity = request.extensions().get::<Identity>().cloned();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(REGISTER_DEADLINE, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Register frame within 10 s"))??;
        let register = match first.and_then(|message| message.body) {
            Some(worker_message::Body::Register(register)) => register,
            Some(_) => {
                return Err(Status::invalid_argument("the first frame must be Register"));
            }
            None => {
                return Err(Status::invalid_argument(
                    "empty first frame; expected Register",
                ));
            }
        };
        let mut profile = validate_register(&register)?;
        let streams = self.streams.clone();
        let stream = StreamInfo {
            remote: remote.clone(),
            token: identity
                .as_ref()
                .map(|identity| identity.token.clone())
                .unwrap_or_default(),
        };
        let worker_id = profile.id.clone();
        let refuse = |kind: &'static str, detail: String| {
            streams.refusals.record(
                &streams.metrics,
                Refusal {
                    worker: worker_id.clone(),
                    action: REGISTER_REFUSED,
                    kind,
                    detail,
                    remote: stream.remote.clone(),
                    token: stream.token.clone(),
                },
            );
        };
        // The credential bounds who the worker may be: the token's id patterns and labels (the
        // gate let only worker tokens through), then the certificate's names.
        if let Some(identity) = &identity {
            let Some(scope) = &identity.worker else {
                let why = format!("token {:?} is not a worker token", identity.token);
                refuse("id", why.clone());
                return Err(Status::permission_denied(why));
            };
            if let Err(refusal) = scope.check_register(&profile.id, &profile.labels) {
                let kind = match refusal {
                    RegisterRefusal::Id { .. } => "id",
                    RegisterRefusal::Label { .. } => "labels",
                };
                let why = format!("token {:?}: {refusal}", identity.token);
                refuse(kind, why.clone());
                return Err(Status::permission_denied(why));
            }
            profile.apps = scope.app_limit().map(Into::into);
        }
        if streams.worker_certificates
            && let Err(why) = crate::tls::require_worker_certificate(
                peer_certs.as_deref().map(Vec::as_slice),
                &profile.id,
            )
        {
            refuse("certificate", why.clone());
            return Err(Status::unauthenticated(why));
        }
        if streams.standing.is_cut_off() {
            return Err(ax_proto::cut_off::status(&streams.node_id));
        }
        // A member of a multi-primary cluster may not have applied yet what another node wrote
        // of this worker and its attempts (their dispatch, on the worker's previous node):
        // judged on such a read, a running attempt would be called stale and killed, or an end
        // the worker replays refused as not its own, and as those decisions write nothing, no
        // certification would catch them. The reads of this registration, and the reports that
        // follow it, wait for the member first (at once on a single server).
        streams
            .store
            .catch_up_with_the_cluster()
            .await
            .map_err(|err| Status::unavailable(format!("store: {err}")))?;
        let silent_after_ms =
            streams.heartbeat_interval.as_millis() as i64 * SILENT_AFTER_HEARTBEATS;
        if let Err(why) = live_elsewhere(&streams, &profile, silent_after_ms).await? {
            refuse("second_stream", why.clone());
            return Err(Status::already_exists(why));
        }

        // Re-attach: attempts the worker runs that are still current are adopted; the rest are
        // stale and the worker kills them. Attempts it says ended (up to thousands: it lists
        // the ends acknowledged in its last 30 s too) are left to their reports, which follow
        // on this stream, and cost the registration no read: a registration that reads one row
        // per end takes seconds on a loaded store, and a worker moving between nodes must
        // register well within the dead-worker threshold.
        let mut adopted = Vec::new();
        let mut stale = Vec::new();
        for reference in &register.running {
            let instance = InstanceId(reference.instance_id);
            let attempt = Attempt(reference.attempt);
            let current = streams
                .store
                .get_instance(instance)
                .await
                .map_err(|err| Status::unavailable(format!("store: {err}")))?;
            // Only the worker's own attempts are adopted: one dispatched to another id is not
            // this stream's to re-attach (and its process, if any, is killed).
            match current {
                Some(record)
                    if record.attempt == attempt
                        && record.worker_id.as_deref() == Some(profile.id.as_str())
                        && matches!(
                            record.state,
                            InstanceState::Dispatched | InstanceState::Running
                        ) =>
                {
                    adopted.push((instance, attempt));
                }
                _ => stale.push(*reference),
            }
        }
        let (outbox, receiver) = to_worker::outbox(OUTBOUND_QUEUE);
        let now = now_ms();
        let welcome = SchedulerMessage {
            body: Some(scheduler_message::Body::Registered(Registered {
                protocol: ProtocolVersion::ProtocolVersion1 as i32,
                scheduler_node: streams.node_id.clone(),
                heartbeat_interval_ms: streams.heartbeat_interval.as_millis() as u32,
                task_heartbeat_interval_ms: streams.task_heartbeat_interval.as_millis() as u32,
                stale: stale.clone(),
                worker_dead_after_ms: streams.worker_dead_after_ms as u32,
            })),
        };
        // The welcome goes out first, before anything queued once the worker is visible to the
        // dispatcher, so no Dispatch can overtake it.
        let (served, serving_ended) = tokio::sync::oneshot::channel::<()>();
        let frames = futures::stream::once(std::future::ready(Ok(welcome)))
            .chain(to_worker::until_served(receiver, serving_ended).map(convert::worker_frame));
        // The new stream replaces the old one before the store is read for what the worker
        // lacks: a dispatch claimed before this moment either went out on the old stream (and
        // is ended below: another node's after a grace) or is refused by the registry (planned
        // on the old stream), and one claimed after it goes out on this stream.
        let registered_at = now_ms();
        let connected = match streams.registry.connect(
            profile.clone(),
            stream.clone(),
            outbox,
            adopted.clone(),
            registered_at,
            silent_after_ms,
        ) {
            Ok(connected) => connected,
            Err(held) => {
                let why = format!(
                    "worker {:?} already has a live stream on this node, from {}, last heard {} \
                     ago; {}",
                    profile.id,
                    held.remote,
                    ax_core::humane_duration(held.heard_ms_ago),
                    one_stream_hint(silent_after_ms)
                );
                refuse("second_stream", why.clone());
                return Err(Status::already_exists(why));
            }
        };
        if let Some(verdict) = connected.took_over {
            tracing::info!(worker = %profile.id, %remote, ?verdict, "the worker's previous stream is gone; this one takes over");
        }
        let connection = connected.connection;
        let missing = match missing_attempts(&streams, &profile.id, &register, registered_at).await
        {
            Ok(missing) => missing,
            Err(status) => {
                streams.registry.disconnect(&profile.id, connection);
                return Err(status);
            }
        };
        end_missing(&streams, &profile.id, missing).await;
        tracing::info!(worker = %profile.id, %remote, capacity = profile.capacity, adopted = adopted.len(), stale = stale.len(), "worker connected");
        save_worker(&streams, &profile, 0, now, true).await;
        streams.dispatch.notify_one();

        let tasks = streams.tasks.clone();
        tasks.spawn(async move {
            // When this task ends, whatever ended it, so does the stream's sending side.
            let _served = served;
            let attached = Attached {
                worker: &profile.id,
                connection,
                last_heard: connected.last_heard,
            };
            let reason = tokio::select! {
                reason = serve(&streams, &attached, &mut inbound) => reason,
                () = streams.standing.cut_off() => {
                    // Ended with a status, so the worker says why it moves on.
                    if let Some(outbox) = streams.registry.outbox(&profile.id) {
                        outbox.tell(ToWorker::CutOff {
                            node_id: streams.node_id.clone(),
                        });
                    }
                    "this node cannot reach its store".to_string()
                }
                () = streams.stopping.cancelled() => "the node is stopping".to_string(),
            };
            let moving = streams.registry.moving(&profile.id, connection);
            // The row says when the worker was last heard on this stream: a worker that has
            // already registered with another node has a newer row there, which this one does
            // not overwrite (the store keeps the newest).
            let last_heard = streams
                .registry
                .view(&profile.id)
                .map_or_else(now_ms, |view| view.last_heartbeat);
            if streams.registry.disconnect(&profile.id, connection) {
                tracing::info!(worker = %profile.id, reason = %reason, moving, "worker disconnected");
                // A worker that leaves as asked registers with another node, which writes its
                // row: a "disconnected" written here could land after that and hide it.
                if !moving {
                    save_worker(&streams, &profile, 0, last_heard, false).await;
                }
            }
        });
        Ok(Response::new(Box::pin(frames)))
    }
}

/// What the refusal of a second stream tells the worker to do about it.
fn one_stream_hint(silent_after_ms: i64) -> String {
    format!(
        "a worker id has one live stream: stop the other worker or give this one another id (a \
         stream silent for {} is taken over)",
        ax_core::humane_duration(silent_after_ms)
    )
}

/// `Err(why)` when the store shows the worker's id live on another node, as a stream that is
/// not gone (`takeover`: its row is its last heartbeat there, its process's incarnation).
async fn live_elsewhere(
    streams: &Streams,
    profile: &WorkerProfile,
    silent_after_ms: i64,
) -> Result<Result<(), String>, Status> {
    let row = streams
        .store
        .worker(&profile.id)
        .await
        .map_err(|err| Status::unavailable(format!("store: {err}")))?;
    let Some(row) = row.filter(|row| row.connected && row.node_id != streams.node_id) else {
        return Ok(Ok(()));
    };
    let verdict = takeover(
        &HeldStream {
            incarnation: &row.incarnation,
            last_heard: row.last_heartbeat,
            closed: false,
        },
        &profile.incarnation,
        now_ms(),
        silent_after_ms,
    );
    Ok(match verdict {
        Takeover::Refused { heard_ms_ago } => Err(format!(
            "worker {:?} already has a live stream on node {}, last heard {} ago; {}",
            profile.id,
            row.node_id,
            ax_core::humane_duration(heard_ms_ago),
            one_stream_hint(silent_after_ms)
        )),
        _ => Ok(()),
    })
}

/// The attempts the store has DISPATCHED or RUNNING on `worker` (claimed before `registered_at`:
/// a dispatch claimed later may still be on its way to this very stream) that the worker's
/// Register names neither as running nor as finished.
async fn missing_attempts(
    streams: &Streams,
    worker: &str,
    register: &Register,
    registered_at: i64,
) -> Result<Vec<ActiveAttempt>, Status> {
    let listed: HashSet<(i64, u32)> = register
        .running
        .iter()
        .chain(&register.finished)
        .map(|r| (r.instance_id, r.attempt))
        .collect();
    let active = streams
        .store
        .active_attempts(Some(worker), 100_000)
        .await
        .map_err(|err| Status::unavailable(format!("store: {err}")))?;
    Ok(active
        .into_iter()
        .filter(|a| !listed.contains(&(a.instance_id.0, a.attempt.0)))
        .filter(|a| a.dispatched_at.is_some_and(|at| at < registered_at))
        .collect())
}

/// How long a dispatch another node claimed for the worker before it registered here, and that
/// the worker did not list, is left to that node. Usually that node never sent it (it found the
/// worker moving) and puts it back WAITING itself as the same attempt, once its report batch
/// lands; withdrawing it here at once would spend an attempt number on that common case. If it
/// is still the attempt's dispatch after this, it went to the stream the worker left, or its
/// node died: withdrawn then.
const OTHER_NODES_DISPATCH_GRACE: Duration = Duration::from_secs(5);

/// Ends what a registering worker no longer has, each with a decision: a dispatch that may have
/// reached it is withdrawn (WAITING as the next attempt), a running attempt is lost (FAILED,
/// retried as its task allows). Its process is gone: a worker that restarted killed it on the
/// way down (parent-death signal, guardian), and the same worker process lists what it runs or
/// ran. Dispatches of other nodes are ended after [`OTHER_NODES_DISPATCH_GRACE`], if still the
/// same dispatch then.
async fn end_missing(streams: &Arc<Streams>, worker: &str, missing: Vec<ActiveAttempt>) {
    let (theirs, ours): (Vec<ActiveAttempt>, Vec<ActiveAttempt>) =
        missing.into_iter().partition(|attempt| {
            attempt.state == InstanceState::Dispatched
                && attempt
                    .dispatched_by
                    .as_deref()
                    .is_some_and(|by| by != streams.node_id)
        });
    end_now(streams, worker, ours).await;
    if theirs.is_empty() {
        return;
    }
    let streams = Arc::clone(streams);
    let worker = worker.to_string();
    streams.tasks.clone().spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(OTHER_NODES_DISPATCH_GRACE) => {}
            // Left to the other node: this one no longer reports anything.
            () = streams.stopping.cancelled() => return,
        }
        // Those still the attempt's dispatch, as they are now: one that went RUNNING meanwhile
        // was started by a process the worker no longer has (it did not list it), and is lost.
        // Unread, they go as they were read: the store refuses a withdrawal of a changed
        // dispatch, and one that finds its attempt RUNNING loses it.
        let still: Vec<ActiveAttempt> = match streams
            .store
            .active_attempts(Some(&worker), 100_000)
            .await
        {
            Ok(active) => theirs
                .iter()
                .filter_map(|read| {
                    active
                        .iter()
                        .find(|now| {
                            (now.instance_id, now.attempt, now.dispatched_at)
                                == (read.instance_id, read.attempt, read.dispatched_at)
                        })
                        .cloned()
                })
                .collect(),
            Err(err) => {
                tracing::warn!(error = %err, worker, "reading the dispatches left to another node failed; withdrawing them as read");
                theirs
            }
        };
        end_now(&streams, &worker, still).await;
    });
}

async fn end_now(streams: &Streams, worker: &str, missing: Vec<ActiveAttempt>) {
    if missing.is_empty() {
        return;
    }
    let now = now_ms();
    let cause = format!("worker {worker} registered without it");
    let mut decisions = Vec::with_capacity(missing.len());
    for attempt in missing {
        let (kind, report) = match attempt.state {
            InstanceState::Running => (
                DecisionKind::Lost,
                Report::Finished {
                    instance_id: attempt.instance_id,
                    attempt: attempt.attempt,
                    worker_id: None,
                    end: AttemptEnd::Finished(Outcome::Failed),
                    exit_code: None,
                    signal: None,
                    at: now,
                    log_lines: 0,
                    message: format!("lost: {cause}"),
                    outputs: Default::default(),
                },
            ),
            _ => (
                DecisionKind::Withdrawn,
                Report::Rejected {
                    instance_id: attempt.instance_id,
                    attempt: attempt.attempt,
                    worker_id: Some(worker.to_string()),
                    reason: cause.clone(),
                    withdrawn: true,
                    dispatched_at: attempt.dispatched_at,
                },
            ),
        };
        tracing::warn!(instance = %attempt.instance_id, attempt = %attempt.attempt, worker = %worker, ?kind, "the worker registered without an attempt the store has on it; ending it now");
        decisions.push((attempt, kind, cause.clone()));
        let envelope = Envelope::decided(worker, report);
        if streams.reports.send(envelope).await.is_err() {
            return;
        }
    }
    crate::backstop::record_endings(&streams.store, &streams.node_id, decisions, now).await;
}

/// The stored form of a worker's log batch: packed lines as they came, or separate lines
/// (`LogBatch.lines`, the proto's other form) packed here.
fn log_chunk(batch: LogBatch) -> Result<LogChunk, String> {
    let instance_id = InstanceId(batch.instance_id);
    let attempt = Attempt(batch.attempt);
    let stored = |stream: ProtoStream| match stream {
        ProtoStream::Stderr => LogStream::Stderr,
        _ => LogStream::Stdout,
    };
    if !batch.lines.is_empty() {
        if !batch.streams.is_empty() || !batch.body.is_empty() {
            return Err("the batch has both separate and packed lines".into());
        }
        let lines = batch
            .lines
            .iter()
            .map(|line| (stored(line.stream()), line.text.as_str()));
        return Ok(LogChunk::from_lines(
            instance_id,
            attempt,
            batch.first_seq,
            lines,
            batch.sent_at_ms,
        ));
    }
    let streams = batch
        .streams
        .iter()
        .map(|&byte| ax_proto::packed_stream(byte).map(stored))
        .collect::<Result<Vec<_>, _>>()?;
    LogChunk::packed(
        instance_id,
        attempt,
        batch.first_seq,
        streams,
        batch.body,
        batch.sent_at_ms,
    )
    .map_err(|error| error.to_string())
}

fn validate_register(register: &Register) -> Result<WorkerProfile, Status> {
    if register.protocol != ProtocolVersion::ProtocolVersion1 as i32 {
        return Err(Status::failed_precondition(format!(
            "unsupported protocol version {}; this scheduler speaks 1",
            register.protocol
        )));
    }
    let id = register.worker_id.trim();
    if id.is_empty() || id.len() > 128 {
        return Err(Status::invalid_argument(
            "Register.worker_id must be 1 to 128 characters",
        ));
    }
    Ok(WorkerProfile {
        id: id.to_string(),
        version: register.version.clone(),
        hostname: register.hostname.clone(),
        labels: register.labels.clone().into_iter().collect(),
        capacity: if register.capacity == 0 {
            20
        } else {
            register.capacity
        },
        started_at: register.started_at_ms,
        apps: None,
        incarnation: register.incarnation.chars().take(64).collect(),
    })
}

/// The worker's row as this node sees it now.
fn worker_row(
    streams: &Streams,
    profile: &WorkerProfile,
    running: u32,
    at: i64,
    connected: bool,
) -> WorkerRecord {
    WorkerRecord {
        id: profile.id.clone(),
        version: profile.version.clone(),
        hostname: profile.hostname.clone(),
        labels: profile.labels.clone(),
        capacity: profile.capacity,
        running,
        started_at: profile.started_at,
        last_heartbeat: at,
        node_id: streams.node_id.clone(),
        draining: false,
        connected,
        apps: profile.apps.as_deref().map(<[String]>::to_vec),
        incarnation: profile.incarnation.clone(),
    }
}

/// Writes the worker's row now (a connect or a disconnect), with any heartbeat refreshes kept.
async fn save_worker(
    streams: &Streams,
    profile: &WorkerProfile,
    running: u32,
    at: i64,
    connected: bool,
) {
    let record = worker_row(streams, profile, running, at, connected);
    if let Err(err) = streams.worker_rows.save(record).await {
        tracing::warn!(worker = %profile.id, error = %err, "saving the worker record failed");
    }
}

/// A registered stream, as its loop knows it.
struct Attached<'a> {
    worker: &'a str,
    connection: u64,
    /// When a frame was last received (the registry reads it to judge a second stream).
    last_heard: Arc<AtomicI64>,
}

/// Attempts this stream's log batches went in for without a check, remembered so that the
/// registry is asked once per attempt, not once per batch; cleared past this many.
const KNOWN_ATTEMPTS: usize = 4096;

/// Handles the worker's frames until the stream ends; returns why it ended.
async fn serve(
    streams: &Streams,
    attached: &Attached<'_>,
    inbound: &mut Streaming<WorkerMessage>,
) -> String {
    let worker = attached.worker;
    let connection = attached.connection;
    let mut known: HashSet<(InstanceId, Attempt)> = HashSet::new();
    loop {
        let message = match inbound.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return "stream closed".into(),
            Err(status) => return format!("stream error: {}", status.message()),
        };
        attached.last_heard.store(now_ms(), Ordering::Relaxed);
        let Some(body) = message.body else { continue };
        let report = match body {
            worker_message::Body::Register(_) => {
                tracing::warn!(worker, "second Register on one stream ignored");
                continue;
            }
            worker_message::Body::Accepted(_) => continue,
            worker_message::Body::Heartbeat(heartbeat) => {
                let now = now_ms();
                streams
                    .registry
                    .heartbeat(worker, connection, heartbeat.draining, now);
                // Other nodes see this worker through the store: every heartbeat refreshes its
                // row, and is acknowledged once the row is written (`worker_rows`).
                if let Some(view) = streams.registry.view(worker) {
                    let row = worker_row(streams, &view.profile, view.running, now, true);
                    let ack = streams.registry.outbox(worker).map(|outbox| PendingAck {
                        outbox,
                        sent_at_ms: heartbeat.sent_at_ms,
                    });
                    streams.worker_rows.refresh(row, ack);
                }
                continue;
            }
            worker_message::Body::Logs(batch) => {
                if batch.line_count() == 0 || batch.first_seq == 0 {
                    continue;
                }
                let chunk = match log_chunk(batch) {
                    Ok(chunk) => chunk,
                    Err(error) => {
                        tracing::warn!(worker, %error, "dropping a malformed log batch");
                        continue;
                    }
                };
                // An attempt dispatched to (or re-attached by) this stream and in flight: its
                // lines go in as they are. Any other is checked against the store in the log
                // writer's transaction (a worker that moved nodes resends what another node
                // dispatched; a stranger's are refused there).
                let key = (chunk.instance_id, chunk.attempt);
                let own = known.contains(&key)
                    || streams
                        .registry
                        .in_flight_on(worker, connection, key.0, key.1);
                if own && known.len() < KNOWN_ATTEMPTS {
                    known.insert(key);
                } else if own {
                    known.clear();
                }
                if !streams.logs.append(worker.to_string(), chunk, own).await {
                    return "log writer stopped".into();
                }
                continue;
            }
            // The worker has this attempt already: its own reports tell how it goes.
            worker_message::Body::Rejected(rejected) if rejected.duplicate => {
                tracing::info!(
                    worker,
                    instance = rejected.instance_id,
                    attempt = rejected.attempt,
                    "a repeated dispatch was rejected as a duplicate; waiting for the attempt's own reports"
                );
                continue;
            }
            worker_message::Body::Rejected(rejected) => Report::Rejected {
                instance_id: InstanceId(rejected.instance_id),
                attempt: Attempt(rejected.attempt),
                worker_id: Some(worker.to_string()),
                reason: rejected.reason,
                withdrawn: false,
                dispatched_at: None,
            },
            worker_message::Body::Started(started) => Report::Started {
                instance_id: InstanceId(started.instance_id),
                attempt: Attempt(started.attempt),
                worker_id: worker.to_string(),
                pid: started.pid,
                at: started.started_at_ms,
            },
            worker_message::Body::TaskHeartbeat(heartbeat) => Report::TaskHeartbeat {
                instance_id: InstanceId(heartbeat.instance_id),
                attempt: Attempt(heartbeat.attempt),
                worker_id: Some(worker.to_string()),
                at: heartbeat.sent_at_ms,
            },
            worker_message::Body::Finished(finished) => finished_report(finished, worker),
        };
        time_start(streams, worker, &report);
        if let Report::Finished {
            instance_id,
            attempt,
            ..
        }
        | Report::Rejected {
            instance_id,
            attempt,
            ..
        } = &report
        {
            // The worker freed the slot before it said so: dispatch into it now, while the
            // report waits for its batch, not after (the reporter frees it again, harmlessly).
            streams.registry.end_attempt(worker, *instance_id, *attempt);
            // A refused dispatch may go to another worker as the same attempt: this stream's
            // lines about it are checked from now on.
            known.remove(&(*instance_id, *attempt));
        }
        if streams
            .reports
            .send(Envelope {
                worker: worker.to_string(),
                report,
                from_worker: true,
            })
            .await
            .is_err()
        {
            return "reporter stopped".into();
        }
    }
}

/// Times a start as its stream receives it, before the report's batch: the attempt may end
/// and leave the registry before that batch is applied.
/// A worker's `AttemptFinished` as a report. The worker is not trusted with its outputs: outputs
/// with a bad name or past an attempt's limit fail the attempt, and only a success keeps any.
fn finished_report(mut finished: AttemptFinished, worker: &str) -> Report {
    let outputs: ax_core::outputs::Outputs = finished.outputs.drain().collect();
    let refused = ax_core::outputs::check(&outputs).err();
    if let Some(problem) = &refused {
        finished.outcome = AttemptOutcome::Failed as i32;
        finished.message = format!("outputs refused: {problem}");
    }
    let end = match AttemptOutcome::try_from(finished.outcome) {
        Ok(AttemptOutcome::Success) => AttemptEnd::Finished(Outcome::Success),
        Ok(AttemptOutcome::Timeout) => AttemptEnd::Finished(Outcome::Timeout),
        Ok(AttemptOutcome::SpawnFailed) => AttemptEnd::SpawnFailed,
        // A cancelled attempt's instance is already CANCELLED; recording the attempt as failed
        // is refused as stale, which is what we want.
        _ => AttemptEnd::Finished(Outcome::Failed),
    };
    let outputs = if end == AttemptEnd::Finished(Outcome::Success) {
        outputs
    } else {
        Default::default()
    };
    Report::Finished {
        instance_id: InstanceId(finished.instance_id),
        attempt: Attempt(finished.attempt),
        worker_id: Some(worker.to_string()),
        end,
        exit_code: finished.exit_code,
        signal: finished.signal,
        at: finished.finished_at_ms,
        log_lines: finished.log_lines,
        message: finished.message,
        outputs,
    }
}

fn time_start(streams: &Streams, worker: &str, report: &Report) {
    if let Report::Started {
        instance_id,
        attempt,
        ..
    } = report
        && let Some(ready_at) = streams
            .registry
            .take_ready_at(worker, *instance_id, *attempt)
    {
        Metrics::observe_ms(&streams.metrics.start_latency, ready_at, now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_proto::v1::LogLine;

    fn packed(streams: &[u8], body: &str) -> LogBatch {
        LogBatch {
            instance_id: 9,
            attempt: 2,
            first_seq: 5,
            streams: streams.to_vec(),
            body: body.into(),
            sent_at_ms: 77,
            ..LogBatch::default()
        }
    }

    #[test]
    fn packed_and_separate_lines_become_the_same_chunk() {
        let from_packed = log_chunk(packed(&[1, 2, 1], "out\n\nlast")).expect("consistent");
        let separate = LogBatch {
            lines: [
                (ProtoStream::Stdout, "out"),
                (ProtoStream::Stderr, ""),
                (ProtoStream::Stdout, "last"),
            ]
            .into_iter()
            .map(|(stream, text)| LogLine {
                stream: stream as i32,
                text: text.into(),
            })
            .collect(),
            ..packed(&[], "")
        };
        let from_separate = log_chunk(separate).expect("separate lines");
        assert_eq!(from_packed, from_separate);
        assert_eq!(
            (
                from_packed.instance_id,
                from_packed.attempt,
                from_packed.first_seq,
                from_packed.at
            ),
            (InstanceId(9), Attempt(2), 5, 77)
        );
        assert_eq!(from_packed.last_seq(), 7);
        assert_eq!(
            from_packed.lines().collect::<Vec<_>>(),
            [
                (LogStream::Stdout, "out"),
                (LogStream::Stderr, ""),
                (LogStream::Stdout, "last")
            ]
        );
    }

    #[test]
    fn a_mispacked_batch_is_refused_with_what_is_wrong() {
        let error = log_chunk(packed(&[1, 1], "one line")).expect_err("two streams, one line");
        assert!(
            error.contains("2 stream entries for 0 line breaks"),
            "{error}"
        );
        let error = log_chunk(packed(&[1, 3], "a\nb")).expect_err("stream 3");
        assert!(error.contains("byte 3"), "{error}");
        let both = LogBatch {
            lines: vec![LogLine {
                stream: 1,
                text: "x".into(),
            }],
            ..packed(&[1], "y")
        };
        let error = log_chunk(both).expect_err("both forms");
        assert!(error.contains("both"), "{error}");
    }
}

#[cfg(test)]
mod finished_tests {
    use super::*;

    fn finished(outcome: AttemptOutcome, outputs: &[(&str, String)]) -> AttemptFinished {
        AttemptFinished {
            instance_id: 7,
            attempt: 1,
            outcome: outcome as i32,
            outputs: outputs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        }
    }

    /// A worker is not trusted with outputs: a bad name or too many bytes fail the attempt and
    /// keep nothing; a failed attempt keeps none.
    #[test]
    fn outputs_from_a_worker_are_checked() {
        let ok = finished_report(
            finished(AttemptOutcome::Success, &[("rows", "3".into())]),
            "w1",
        );
        let Report::Finished { end, outputs, .. } = ok else {
            panic!()
        };
        assert_eq!(end, AttemptEnd::Finished(Outcome::Success));
        assert_eq!(outputs["rows"], "3");
        for bad in [
            vec![("1bad", "x".to_string())],
            vec![("blob", "x".repeat(ax_core::outputs::MAX_ATTEMPT_BYTES))],
        ] {
            let report = finished_report(finished(AttemptOutcome::Success, &bad), "w1");
            let Report::Finished {
                end,
                outputs,
                message,
                ..
            } = report
            else {
                panic!()
            };
            assert_eq!(end, AttemptEnd::Finished(Outcome::Failed));
            assert!(outputs.is_empty());
            assert!(message.starts_with("outputs refused: "), "{message}");
        }
        let failed = finished_report(
            finished(AttemptOutcome::Failed, &[("rows", "3".into())]),
            "w1",
        );
        let Report::Finished { outputs, .. } = failed else {
            panic!()
        };
        assert!(outputs.is_empty());
    }
}
