//! One stream to one scheduler node: handshake, replay, dispatches, heartbeats, draining, and
//! the end a node asks for (`MoveElsewhere`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ax_proto::v1::{
    Dispatch, DispatchAccepted, DispatchRejected, MoveElsewhere, ProtocolVersion, Register,
    Registered, SchedulerMessage, WorkerHeartbeat, WorkerMessage, scheduler_message,
    worker_message::Body,
};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior, timeout};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::attempts::{Admission, AttemptKey, END_RESEND_AFTER, Link, Replay};
use crate::runner::run_attempt;
use crate::{Context, now_ms};
use crate::{fence, outgoing};

/// Messages queued towards the scheduler. Every sender (connection, runners, log pumps) shares
/// this one bounded channel, so a slow scheduler back-pressures the log pumps.
const OUTBOUND_CAPACITY: usize = 256;

/// How often a draining connection checks whether everything has been reported.
const DRAIN_POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("scheduler endpoint: {0}")]
    Endpoint(#[from] ax_proto::client::ClientError),
    #[error("connecting failed")]
    Connect(#[source] tonic::transport::Error),
    #[error("stream failed: {0}")]
    Status(#[from] tonic::Status),
    #[error("no Registered within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("the scheduler closed the stream")]
    Closed,
    #[error("the outgoing stream closed")]
    OutgoingClosed,
}

impl SessionError {
    /// The endpoint's host actively refused the connection: nothing listens there.
    pub fn is_refused(&self) -> bool {
        let SessionError::Connect(error) = self else {
            return false;
        };
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return true;
            }
            source = cause.source();
        }
        false
    }

    /// The node cannot reach its store: another node may, at once.
    pub fn is_node_cut_off(&self) -> bool {
        matches!(self, SessionError::Status(status) if ax_proto::cut_off::is_cut_off(status))
    }
}

/// How a connection ended well.
#[derive(Debug)]
pub enum SessionEnd {
    /// After shutdown, the worker drained and reported everything.
    Drained,
    /// The node asked the worker to go to another node.
    MoveAsked(MoveElsewhere),
}

/// How a connection ended.
#[derive(Debug)]
pub struct SessionOutcome {
    /// Whether the scheduler answered Register: the connection was healthy at some point.
    pub registered: bool,
    pub result: Result<SessionEnd, SessionError>,
}

/// Runs one connection until it breaks, until the node asks the worker to move or, after
/// `shutdown`, until the worker has drained. `handshake` bounds the connect and the wait for
/// Registered.
pub async fn run_session(
    context: &Arc<Context>,
    target: &crate::endpoints::Target,
    epoch: u64,
    handshake: Duration,
    shutdown: &CancellationToken,
) -> SessionOutcome {
    let closed = CancellationToken::new();
    let mut session = Session {
        context: Arc::clone(context),
        epoch,
        closed: closed.clone(),
        registered: false,
        heartbeats_acked: Arc::new(AtomicBool::new(false)),
    };
    let result = session.run(target, handshake, shutdown).await;
    // Runners blocked on this stream's full channel give up; what they held is replayed later.
    context.attempts.detach(epoch);
    closed.cancel();
    SessionOutcome {
        registered: session.registered,
        result,
    }
}

struct Session {
    context: Arc<Context>,
    epoch: u64,
    closed: CancellationToken,
    registered: bool,
    /// The scheduler on this stream acknowledges heartbeats.
    heartbeats_acked: Arc<AtomicBool>,
}

impl Session {
    async fn run(
        &mut self,
        target: &crate::endpoints::Target,
        handshake: Duration,
        shutdown: &CancellationToken,
    ) -> Result<SessionEnd, SessionError> {
        let context = Arc::clone(&self.context);
        let options = &context.options;
        let mut auth = options.auth.clone();
        if let Some(path) = &options.token_file {
            auth.token = Some(ax_proto::client::read_token_file(path)?);
        }
        let bearer = auth.bearer()?;
        // A node's certificate names its host, not the address the name resolved to.
        let channel = auth
            .endpoint(&target.url, Some(&target.host))?
            .connect_timeout(handshake)
            // A silent network partition would otherwise keep a dead stream "up" until the
            // outgoing channel fills, and the worker would neither reconnect nor self-fence.
            .http2_keep_alive_interval(options.heartbeat_interval.max(Duration::from_millis(100)))
            .keep_alive_timeout(options.heartbeat_interval.max(Duration::from_secs(1)))
            .keep_alive_while_idle(true)
            .connect()
            .await
            .map_err(SessionError::Connect)?;
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let link = Link {
            epoch: self.epoch,
            tx,
            closed: self.closed.clone(),
        };

        // Register is queued before the stream opens, so it is the first frame.
        let register = Register {
            protocol: ProtocolVersion::ProtocolVersion1 as i32,
            worker_id: options.worker_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            labels: options.labels.clone().into_iter().collect(),
            capacity: options.capacity,
            started_at_ms: self.context.started_at_ms,
            hostname: self.context.hostname.clone(),
            running: self.context.attempts.running(),
            finished: self.context.attempts.unacknowledged(),
            incarnation: self.context.incarnation.clone(),
        };
        let running = register.running.len();
        if !link.send(wrap(Body::Register(register))).await {
            return Err(SessionError::OutgoingClosed);
        }
        // A frame the transport takes counts as contact for self-fencing, but only once the
        // scheduler answered: a Register pushed into a connection that is then refused proves
        // nothing.
        let answered = Arc::new(AtomicBool::new(false));
        // Once the scheduler acknowledges heartbeats, only frames received count as contact:
        // a frame handed to the transport may be lost in a silent partition.
        let acked = Arc::clone(&self.heartbeats_acked);
        acked.store(false, Ordering::Relaxed);
        let outgoing = {
            let answered = Arc::clone(&answered);
            let liveness = Arc::clone(&self.context.liveness);
            ReceiverStream::new(rx).map(move |message| {
                if answered.load(Ordering::Relaxed) && !acked.load(Ordering::Relaxed) {
                    liveness.touch();
                }
                message
            })
        };
        let deadline = handshake;
        let response = timeout(deadline, outgoing::connect(channel, outgoing, &bearer))
            .await
            .map_err(|_| SessionError::HandshakeTimeout(deadline))??;
        let mut inbound = response.into_inner();
        let first = timeout(deadline, inbound.next())
            .await
            .map_err(|_| SessionError::HandshakeTimeout(deadline))?;
        let registered = match first {
            Some(Ok(SchedulerMessage {
                body: Some(scheduler_message::Body::Registered(registered)),
            })) => registered,
            Some(Ok(other)) => {
                return Err(SessionError::Protocol(format!(
                    "expected Registered first, got {other:?}"
                )));
            }
            Some(Err(status)) => return Err(status.into()),
            None => return Err(SessionError::Closed),
        };
        self.on_registered(&registered, running)?;
        self.context.liveness.touch();
        answered.store(true, Ordering::Relaxed);

        // Replay what earlier streams may have lost, then let runners send directly.
        let attempts = &self.context.attempts;
        loop {
            let replay = attempts.replay_or_install(&link);
            if replay.is_empty() {
                break;
            }
            tracing::info!(
                items = replay.len(),
                "replaying reports not acknowledged on an earlier stream"
            );
            for item in replay {
                match item {
                    Replay::Message(message) => {
                        if !link.send(message).await {
                            return Err(SessionError::OutgoingClosed);
                        }
                    }
                    // Spilled batches are read one at a time, so a large spill file never sits
                    // in memory whole.
                    Replay::Spilled(key) => {
                        while let Some(message) = attempts.take_unsent(key, link.epoch) {
                            if !link.send(message).await {
                                return Err(SessionError::OutgoingClosed);
                            }
                        }
                    }
                }
            }
        }

        let mut heartbeat =
            tokio::time::interval(options.heartbeat_interval.max(Duration::from_millis(10)));
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut drain_poll = tokio::time::interval(DRAIN_POLL);
        let mut draining = false;
        let mut flush_deadline: Option<Instant> = None;
        loop {
            if shutdown.is_cancelled() && !draining {
                draining = true;
                if options.hand_over.is_cancelled() {
                    self.context.attempts.set_handing_over();
                } else {
                    self.context.attempts.set_draining();
                }
                tracing::info!(
                    running = self.context.attempts.running_count(),
                    "draining: no new attempts"
                );
                self.heartbeat(&link).await?;
            }
            if draining && self.context.attempts.all_reported() {
                let deadline = *flush_deadline
                    .get_or_insert_with(|| Instant::now() + options.drain_flush_timeout);
                if self.context.attempts.all_acked() {
                    tracing::info!("drained: every attempt finished and was reported");
                    return Ok(SessionEnd::Drained);
                }
                if Instant::now() >= deadline {
                    tracing::warn!("drained, but some log lines were not acknowledged in time");
                    return Ok(SessionEnd::Drained);
                }
            }
            tokio::select! {
                message = inbound.next() => match message {
                    Some(Ok(message)) => {
                        self.context.liveness.touch();
                        if let Some(request) = self.handle(message, &link).await? {
                            // Nothing more is read from this stream: a Dispatch behind the
                            // request is withdrawn by the next node, which this worker does not
                            // list it to. What the runners hold stays with the attempts and is
                            // sent again on the next stream.
                            return Ok(SessionEnd::MoveAsked(request));
                        }
                    }
                    Some(Err(status)) => return Err(status.into()),
                    None => return Err(SessionError::Closed),
                },
                _ = heartbeat.tick() => {
                    self.context.attempts.prune(options.finished_retention);
                    self.heartbeat(&link).await?;
                    self.resend_unanswered_ends(&link).await?;
                }
                _ = drain_poll.tick(), if draining => {}
                () = shutdown.cancelled(), if !draining => {}
            }
        }
    }

    fn on_registered(
        &mut self,
        registered: &Registered,
        running: usize,
    ) -> Result<(), SessionError> {
        if registered.protocol != ProtocolVersion::ProtocolVersion1 as i32 {
            return Err(SessionError::Protocol(format!(
                "scheduler answered with protocol version {}, this worker speaks 1",
                registered.protocol
            )));
        }
        self.registered = true;
        tracing::info!(
            scheduler_node = %registered.scheduler_node,
            running,
            worker_dead_after_ms = registered.worker_dead_after_ms,
            "registered"
        );
        let options = &self.context.options;
        let expected = [
            (
                "heartbeat_interval",
                registered.heartbeat_interval_ms,
                options.heartbeat_interval,
            ),
            (
                "task_heartbeat_interval",
                registered.task_heartbeat_interval_ms,
                options.task_heartbeat_interval,
            ),
        ];
        for (name, scheduler_ms, ours) in expected {
            if scheduler_ms != 0 && u128::from(scheduler_ms) != ours.as_millis() {
                tracing::warn!(
                    interval = name,
                    scheduler_ms,
                    worker_ms = ours.as_millis() as u64,
                    "the scheduler expects a different interval; keeping the worker's configuration"
                );
            }
        }
        self.context
            .liveness
            .learn_dead_after(registered.worker_dead_after_ms);
        if let (Some(configured), Some(dead_after)) =
            (options.self_fence_after, self.context.liveness.dead_after())
        {
            fence::check_margin(configured, dead_after, options.kill_grace);
        }
        for stale in &registered.stale {
            let key = AttemptKey::from(stale);
            tracing::warn!(
                instance = key.instance_id,
                attempt = key.attempt,
                "scheduler does not know this attempt; killing it"
            );
            self.context.attempts.forget(key, true);
        }
        Ok(())
    }

    /// Handles one frame; a move request is handed back, to end the stream.
    async fn handle(
        &mut self,
        message: SchedulerMessage,
        link: &Link,
    ) -> Result<Option<MoveElsewhere>, SessionError> {
        let attempts = &self.context.attempts;
        match message.body {
            Some(scheduler_message::Body::Dispatch(dispatch)) => {
                self.dispatch(dispatch, link).await?
            }
            Some(scheduler_message::Body::Cancel(cancel)) => {
                let key = AttemptKey {
                    instance_id: cancel.instance_id,
                    attempt: cancel.attempt,
                };
                if !attempts.cancel(key, cancel.reason) {
                    tracing::info!(
                        instance = key.instance_id,
                        attempt = key.attempt,
                        "cancel for an attempt not running here"
                    );
                }
            }
            Some(scheduler_message::Body::Refused(refused)) => {
                let key = AttemptKey {
                    instance_id: refused.instance_id,
                    attempt: refused.attempt,
                };
                tracing::warn!(
                    instance = key.instance_id,
                    attempt = key.attempt,
                    reason = %refused.reason,
                    kill = refused.kill,
                    "scheduler refused a report"
                );
                attempts.forget(key, refused.kill);
            }
            Some(scheduler_message::Body::LogAck(ack)) => {
                attempts.ack(
                    AttemptKey {
                        instance_id: ack.instance_id,
                        attempt: ack.attempt,
                    },
                    ack.seq,
                );
            }
            Some(scheduler_message::Body::FinishedAck(ack)) => {
                tracing::debug!(
                    instance = ack.instance_id,
                    attempt = ack.attempt,
                    "end acknowledged"
                );
                attempts.finished_acked(AttemptKey {
                    instance_id: ack.instance_id,
                    attempt: ack.attempt,
                });
            }
            // Receiving it is the point: every frame received counts as contact for self-fencing.
            Some(scheduler_message::Body::HeartbeatAck(_)) => {
                self.heartbeats_acked.store(true, Ordering::Relaxed);
            }
            Some(scheduler_message::Body::Registered(_)) => {
                tracing::warn!("ignoring a second Registered on one stream");
            }
            Some(scheduler_message::Body::MoveElsewhere(request)) => return Ok(Some(request)),
            None => tracing::warn!("ignoring an empty message from the scheduler"),
        }
        Ok(None)
    }

    async fn dispatch(&mut self, dispatch: Dispatch, link: &Link) -> Result<(), SessionError> {
        let key = AttemptKey {
            instance_id: dispatch.instance_id,
            attempt: dispatch.attempt,
        };
        let context = &self.context;
        let reply = match context.attempts.admit(key, context.options.capacity) {
            Admission::Accepted(control) => {
                let accepted = DispatchAccepted {
                    instance_id: key.instance_id,
                    attempt: key.attempt,
                };
                if !link.send(wrap(Body::Accepted(accepted))).await {
                    context.attempts.unadmit(key);
                    return Err(SessionError::OutgoingClosed);
                }
                tracing::info!(instance = key.instance_id, attempt = key.attempt, task = %dispatch.task, "dispatch accepted");
                context.tracker.spawn(run_attempt(
                    Arc::clone(&context.attempts),
                    Arc::clone(&context.runner),
                    dispatch,
                    control,
                ));
                return Ok(());
            }
            Admission::Duplicate => DispatchRejected {
                instance_id: key.instance_id,
                attempt: key.attempt,
                reason: "this attempt already runs or ran on this worker".into(),
                duplicate: true,
            },
            Admission::Rejected(reason) => DispatchRejected {
                instance_id: key.instance_id,
                attempt: key.attempt,
                reason,
                duplicate: false,
            },
        };
        tracing::info!(
            instance = key.instance_id,
            attempt = key.attempt,
            reason = %reply.reason,
            duplicate = reply.duplicate,
            "dispatch rejected"
        );
        if link.send(wrap(Body::Rejected(reply))).await {
            Ok(())
        } else {
            Err(SessionError::OutgoingClosed)
        }
    }

    /// Sends again the ends this stream has left unanswered for [`END_RESEND_AFTER`]: the node
    /// acknowledges a repeated end as the one it stored, so this is safe, and it is what gets an
    /// end lost inside a node stored while the stream stays up.
    async fn resend_unanswered_ends(&self, link: &Link) -> Result<(), SessionError> {
        let attempts = &self.context.attempts;
        let due = attempts.ends_to_resend(link.epoch, Instant::now(), END_RESEND_AFTER);
        if due.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            ends = due.len(),
            after_s = END_RESEND_AFTER.as_secs(),
            "ends not acknowledged on this stream in time; sending them again"
        );
        for message in due {
            if !link.send(message).await {
                return Err(SessionError::OutgoingClosed);
            }
        }
        Ok(())
    }

    async fn heartbeat(&self, link: &Link) -> Result<(), SessionError> {
        let attempts = &self.context.attempts;
        let heartbeat = WorkerHeartbeat {
            sent_at_ms: now_ms(),
            running: u32::try_from(attempts.running_count()).unwrap_or(u32::MAX),
            capacity: self.context.options.capacity,
            draining: attempts.draining(),
        };
        if link.send(wrap(Body::Heartbeat(heartbeat))).await {
            Ok(())
        } else {
            Err(SessionError::OutgoingClosed)
        }
    }
}

fn wrap(body: Body) -> WorkerMessage {
    WorkerMessage { body: Some(body) }
}
