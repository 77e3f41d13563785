//! A second worker, written from the contract in `proto/ax/v1/worker.proto` alone, not from
//! `ax-worker`'s code: it registers, sends heartbeats, runs each dispatch with `/bin/sh -c` (or
//! its argv) in a process group of its own, with the dispatch's environment and working
//! directory, streams the output as packed `LogBatch`es, and reports `AttemptStarted` and
//! `AttemptFinished`; it honours `CancelAttempt`, `ReportRefused` and `Registered.stale`.
//!
//! Tests use it to check that the proto is the whole contract (a run of it passes the checks
//! `ax-worker` passes), and as a test double that misbehaves on purpose: it can withhold
//! `AttemptStarted` (a report lost with a dying scheduler), and enforces `Dispatch.timeout_ms`
//! only when asked. [`ProtoWorker::die`] is a crash: the processes die with it and nothing more
//! is reported. Each [`ProtoWorker::start`] is a new worker process (a new incarnation): while
//! the node still holds the previous one's stream, its Register is refused (ALREADY_EXISTS) and
//! it tries again, as the contract says.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use ax_proto::v1 as pb;
use ax_proto::v1::worker_service_client::WorkerServiceClient;
use pb::scheduler_message::Body as FromScheduler;
use pb::worker_message::Body as ToScheduler;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// How a [`ProtoWorker`] behaves.
#[derive(Debug, Clone)]
pub struct ProtoWorkerOptions {
    pub id: String,
    /// `http://host:port` of a scheduler node.
    pub endpoint: String,
    pub capacity: u32,
    pub heartbeat: Duration,
    /// Kill an attempt at its `timeout_ms` and report TIMEOUT, as the contract asks.
    pub enforce_timeouts: bool,
    /// Never send `AttemptStarted` (the process still starts).
    pub withhold_started: bool,
    /// Cut lines longer than this many bytes into several, at a character boundary, each
    /// piece in a batch of its own (the proto lets a worker cut where it likes); no cut when
    /// `None`.
    pub max_line_bytes: Option<usize>,
    /// The bearer token to present (a node with `--auth tokens`).
    pub token: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// `Register.version`; empty sends none (a worker need not say its release).
    pub version: String,
}

impl ProtoWorkerOptions {
    pub fn new(id: &str, endpoint: &str) -> ProtoWorkerOptions {
        ProtoWorkerOptions {
            id: id.into(),
            endpoint: endpoint.into(),
            capacity: 4,
            heartbeat: Duration::from_millis(300),
            enforce_timeouts: true,
            withhold_started: false,
            max_line_bytes: None,
            token: None,
            labels: Default::default(),
            version: "proto-worker".into(),
        }
    }
}

type Outbound = mpsc::Sender<pb::WorkerMessage>;

/// The attempts running here, by (instance, attempt): the process group, and whether the
/// scheduler asked for a cancel.
type Groups = Arc<Mutex<HashMap<(i64, u32), Running>>>;

#[derive(Debug, Clone, Copy)]
struct Running {
    group: i32,
    cancelled: bool,
}

/// One incarnation of the worker: a stream and the processes it started.
pub struct ProtoWorker {
    received: Arc<Mutex<Vec<pb::SchedulerMessage>>>,
    groups: Groups,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ProtoWorker {
    /// Connects, registers (with nothing running: a fresh process) and serves dispatches until
    /// [`ProtoWorker::die`].
    pub async fn start(options: ProtoWorkerOptions) -> anyhow::Result<ProtoWorker> {
        let incarnation = format!("{:032x}", rand::random::<u128>());
        let started_at_ms = now_ms();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let (tx, mut inbound, registered) = loop {
            let channel = Channel::from_shared(options.endpoint.clone())?
                .connect()
                .await
                .with_context(|| format!("connecting to {}", options.endpoint))?;
            let (tx, rx) = mpsc::channel::<pb::WorkerMessage>(1024);
            let register = pb::Register {
                protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
                worker_id: options.id.clone(),
                version: options.version.clone(),
                labels: options.labels.clone().into_iter().collect(),
                capacity: options.capacity,
                started_at_ms,
                hostname: "proto-worker".into(),
                running: Vec::new(),
                finished: Vec::new(),
                incarnation: incarnation.clone(),
            };
            tx.send(wrap(ToScheduler::Register(register))).await?;
            let token = options.token.clone();
            let mut client = WorkerServiceClient::with_interceptor(
                channel,
                move |mut request: tonic::Request<()>| {
                    if let Some(token) = &token {
                        let value = format!("Bearer {token}")
                            .parse()
                            .map_err(|_| tonic::Status::invalid_argument("token"))?;
                        request.metadata_mut().insert("authorization", value);
                    }
                    Ok(request)
                },
            );
            let answer = match client.connect(ReceiverStream::new(rx)).await {
                Ok(response) => {
                    let mut inbound = response.into_inner();
                    match inbound.message().await {
                        Ok(Some(first)) => Ok((inbound, first)),
                        Ok(None) => Err(tonic::Status::unavailable("stream closed at once")),
                        Err(status) => Err(status),
                    }
                }
                Err(status) => Err(status),
            };
            match answer {
                Ok((inbound, first)) => break (tx, inbound, first),
                // The node still holds the previous process's stream: try again shortly.
                Err(status)
                    if status.code() == tonic::Code::AlreadyExists
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(status) => return Err(anyhow::anyhow!("Connect: {status}")),
            }
        };
        let received = Arc::new(Mutex::new(vec![registered]));
        let groups: Groups = Arc::default();
        let heartbeats = {
            let tx = tx.clone();
            let every = options.heartbeat;
            let groups = Arc::clone(&groups);
            let capacity = options.capacity;
            tokio::spawn(async move {
                loop {
                    let running = lock(&groups).len() as u32;
                    let beat = pb::WorkerHeartbeat {
                        sent_at_ms: now_ms(),
                        running,
                        capacity,
                        draining: false,
                    };
                    if tx.send(wrap(ToScheduler::Heartbeat(beat))).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            })
        };
        let serving = {
            let received = Arc::clone(&received);
            let groups = Arc::clone(&groups);
            tokio::spawn(async move {
                while let Ok(Some(message)) = inbound.message().await {
                    lock(&received).push(message.clone());
                    match message.body {
                        Some(FromScheduler::Dispatch(dispatch)) => {
                            accept(&options, &tx, &groups, dispatch).await;
                        }
                        Some(FromScheduler::Cancel(cancel)) => {
                            let key = (cancel.instance_id, cancel.attempt);
                            if let Some(running) = lock(&groups).get_mut(&key) {
                                running.cancelled = true;
                                signal(running.group, libc::SIGTERM);
                            }
                        }
                        Some(FromScheduler::Refused(refused)) if refused.kill => {
                            let key = (refused.instance_id, refused.attempt);
                            if let Some(running) = lock(&groups).get(&key) {
                                signal(running.group, libc::SIGKILL);
                            }
                        }
                        Some(FromScheduler::Registered(registered)) => {
                            for stale in registered.stale {
                                if let Some(running) =
                                    lock(&groups).get(&(stale.instance_id, stale.attempt))
                                {
                                    signal(running.group, libc::SIGKILL);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            })
        };
        Ok(ProtoWorker {
            received,
            groups,
            tasks: vec![heartbeats, serving],
        })
    }

    /// Every frame the scheduler sent so far.
    pub fn received(&self) -> Vec<pb::SchedulerMessage> {
        lock(&self.received).clone()
    }

    /// Crashes: every process group it started is killed, the stream ends, nothing more is
    /// reported (as when it is dropped).
    pub fn die(self) {}
}

impl Drop for ProtoWorker {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for running in lock(&self.groups).values() {
            signal(running.group, libc::SIGKILL);
        }
    }
}

async fn accept(
    options: &ProtoWorkerOptions,
    tx: &Outbound,
    groups: &Groups,
    dispatch: pb::Dispatch,
) {
    let key = (dispatch.instance_id, dispatch.attempt);
    let refuse = |reason: &str, duplicate: bool| {
        wrap(ToScheduler::Rejected(pb::DispatchRejected {
            instance_id: key.0,
            attempt: key.1,
            reason: reason.into(),
            duplicate,
        }))
    };
    if lock(groups).contains_key(&key) {
        let _ = tx.send(refuse("already running here", true)).await;
        return;
    }
    if lock(groups).len() >= options.capacity as usize {
        let _ = tx.send(refuse("full", false)).await;
        return;
    }
    let mut command = match dispatch.argv.split_first() {
        Some((program, args)) => {
            let mut command = tokio::process::Command::new(program);
            command.args(args);
            command
        }
        None => {
            let mut command = tokio::process::Command::new("/bin/sh");
            command.arg("-c").arg(&dispatch.command);
            command
        }
    };
    command
        .envs(&dispatch.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if !dispatch.working_dir.is_empty() {
        command.current_dir(&dispatch.working_dir);
    }
    let accepted = pb::DispatchAccepted {
        instance_id: key.0,
        attempt: key.1,
    };
    let _ = tx.send(wrap(ToScheduler::Accepted(accepted))).await;
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let finished = pb::AttemptFinished {
                instance_id: key.0,
                attempt: key.1,
                outcome: pb::AttemptOutcome::SpawnFailed as i32,
                finished_at_ms: now_ms(),
                message: format!("spawn failed: {error}"),
                ..pb::AttemptFinished::default()
            };
            let _ = tx.send(wrap(ToScheduler::Finished(finished))).await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    let group = i32::try_from(pid).unwrap_or(0);
    lock(groups).insert(
        key,
        Running {
            group,
            cancelled: false,
        },
    );
    if !options.withhold_started {
        let started = pb::AttemptStarted {
            instance_id: key.0,
            attempt: key.1,
            pid,
            started_at_ms: now_ms(),
        };
        let _ = tx.send(wrap(ToScheduler::Started(started))).await;
    }
    let tx = tx.clone();
    let groups = Arc::clone(groups);
    let timeout = (options.enforce_timeouts && dispatch.timeout_ms > 0)
        .then(|| Duration::from_millis(dispatch.timeout_ms));
    let max_line_bytes = options.max_line_bytes;
    tokio::spawn(async move {
        // Lines are numbered and sent under one lock, so batches go out in line order.
        let seq = Arc::new(tokio::sync::Mutex::new(0u64));
        let mut pipes = Vec::new();
        let outputs = [
            (child.stdout.take().map(Pipe::Out), 1u8),
            (child.stderr.take().map(Pipe::Err), 2u8),
        ];
        for (pipe, stream) in outputs {
            let Some(pipe) = pipe else { continue };
            let tx = tx.clone();
            let seq = Arc::clone(&seq);
            pipes.push(tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut seq = seq.lock().await;
                    for piece in cut(&line, max_line_bytes) {
                        *seq += 1;
                        let batch = pb::LogBatch {
                            instance_id: key.0,
                            attempt: key.1,
                            first_seq: *seq,
                            sent_at_ms: now_ms(),
                            streams: vec![stream],
                            body: piece.to_string(),
                            ..pb::LogBatch::default()
                        };
                        if tx.send(wrap(ToScheduler::Logs(batch))).await.is_err() {
                            return;
                        }
                    }
                }
            }));
        }
        let mut timed_out = false;
        let status = match timeout {
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    timed_out = true;
                    signal(group, libc::SIGKILL);
                    child.wait().await
                }
            },
            None => child.wait().await,
        };
        for pipe in pipes {
            let _ = pipe.await;
        }
        let cancelled = lock(&groups)
            .remove(&key)
            .is_some_and(|running| running.cancelled);
        let (exit_code, signal_num) = match &status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        let outcome = if timed_out {
            pb::AttemptOutcome::Timeout
        } else if exit_code == Some(0) {
            pb::AttemptOutcome::Success
        } else if cancelled {
            pb::AttemptOutcome::Cancelled
        } else {
            pb::AttemptOutcome::Failed
        };
        let finished = pb::AttemptFinished {
            instance_id: key.0,
            attempt: key.1,
            outcome: outcome as i32,
            exit_code,
            signal: signal_num,
            finished_at_ms: now_ms(),
            log_lines: *seq.lock().await,
            message: String::new(),
            outputs: Default::default(),
        };
        let _ = tx.send(wrap(ToScheduler::Finished(finished))).await;
    });
}

/// `line` in pieces of at most `max` bytes, cut at character boundaries (a piece holds at least
/// one character); the whole line without a limit.
fn cut(line: &str, max: Option<usize>) -> Vec<&str> {
    let Some(max) = max else {
        return vec![line];
    };
    let mut pieces = Vec::new();
    let mut rest = line;
    while rest.len() > max {
        let mut at = max;
        while at > 0 && !rest.is_char_boundary(at) {
            at -= 1;
        }
        if at == 0 {
            at = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(at);
        pieces.push(piece);
        rest = tail;
    }
    pieces.push(rest);
    pieces
}

/// Either output pipe, so one reader loop serves both.
enum Pipe {
    Out(tokio::process::ChildStdout),
    Err(tokio::process::ChildStderr),
}

impl tokio::io::AsyncRead for Pipe {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Pipe::Out(out) => std::pin::Pin::new(out).poll_read(cx, buf),
            Pipe::Err(err) => std::pin::Pin::new(err).poll_read(cx, buf),
        }
    }
}

fn signal(group: i32, signal: i32) {
    if group > 1 {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses a group.
        unsafe {
            libc::kill(-group, signal);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wrap(body: ToScheduler) -> pb::WorkerMessage {
    pb::WorkerMessage { body: Some(body) }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}
