//! End-to-end tests of the worker against a fake scheduler: a real tonic server on 127.0.0.1 that
//! accepts Register, sends what a test tells it to, and records everything the worker reports.
//! Timeouts here only guard against hangs; nothing asserts on timing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use ax_proto::v1::{
    AttemptFinished, AttemptOutcome, AttemptRef, CancelAttempt, Dispatch, FinishedAck, LogAck,
    LogStream, MoveElsewhere, ProtocolVersion, Register, Registered, ReportRefused,
    SchedulerMessage, WorkerHeartbeat, WorkerMessage, scheduler_message, worker_message::Body,
};
use ax_worker::endpoints::{Resolution, Resolve, first_index};
use ax_worker::{LogStats, WorkerOptions};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

const HANG_GUARD: Duration = Duration::from_secs(20);

type Outbound = mpsc::Sender<Result<SchedulerMessage, Status>>;

#[derive(Default)]
struct FakeState {
    received: Mutex<Vec<WorkerMessage>>,
    connection: Mutex<Option<Outbound>>,
    auto_ack: AtomicBool,
    /// While set, the fake stops reading the worker's stream, as an overloaded node would.
    paused: AtomicBool,
    stale: Mutex<Vec<AttemptRef>>,
    /// Sent as `Registered.worker_dead_after_ms`.
    dead_after_ms: AtomicU32,
    /// While set, the fake refuses new streams, as a node that is down would.
    refuse: AtomicBool,
    /// Streams the worker ended or broke.
    ended: AtomicU32,
}

#[derive(Clone)]
struct FakeService(Arc<FakeState>);

#[tonic::async_trait]
impl WorkerService for FakeService {
    type ConnectStream = ReceiverStream<Result<SchedulerMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if self.0.refuse.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the fake refuses connections"));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(1024);
        let state = Arc::clone(&self.0);
        tokio::spawn(async move {
            let Ok(Some(first)) = inbound.message().await else {
                return;
            };
            assert!(
                matches!(first.body, Some(Body::Register(_))),
                "first frame must be Register"
            );
            state.received.lock().unwrap().push(first);
            let stale = state.stale.lock().unwrap().clone();
            let registered = Registered {
                protocol: ProtocolVersion::ProtocolVersion1 as i32,
                scheduler_node: "fake".into(),
                heartbeat_interval_ms: 200,
                task_heartbeat_interval_ms: 200,
                stale,
                worker_dead_after_ms: state.dead_after_ms.load(Ordering::SeqCst),
            };
            if tx
                .send(Ok(message(scheduler_message::Body::Registered(registered))))
                .await
                .is_err()
            {
                return;
            }
            *state.connection.lock().unwrap() = Some(tx.clone());
            loop {
                while state.paused.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let Ok(Some(received)) = inbound.message().await else {
                    state.ended.fetch_add(1, Ordering::SeqCst);
                    break;
                };
                if let Some(Body::Logs(batch)) = &received.body
                    && state.auto_ack.load(Ordering::SeqCst)
                {
                    let ack = LogAck {
                        instance_id: batch.instance_id,
                        attempt: batch.attempt,
                        seq: batch.first_seq + batch.line_count() as u64 - 1,
                    };
                    let _ = tx
                        .send(Ok(message(scheduler_message::Body::LogAck(ack))))
                        .await;
                }
                if let Some(Body::Finished(finished)) = &received.body
                    && state.auto_ack.load(Ordering::SeqCst)
                {
                    let ack = FinishedAck {
                        instance_id: finished.instance_id,
                        attempt: finished.attempt,
                    };
                    let _ = tx
                        .send(Ok(message(scheduler_message::Body::FinishedAck(ack))))
                        .await;
                }
                state.received.lock().unwrap().push(received);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn message(body: scheduler_message::Body) -> SchedulerMessage {
    SchedulerMessage { body: Some(body) }
}

struct FakeScheduler {
    url: String,
    state: Arc<FakeState>,
    server: JoinHandle<()>,
}

impl FakeScheduler {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(FakeState::default());
        state.auto_ack.store(true, Ordering::SeqCst);
        let service = WorkerServiceServer::new(FakeService(Arc::clone(&state)));
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        FakeScheduler { url, state, server }
    }

    fn received(&self) -> Vec<WorkerMessage> {
        self.state.received.lock().unwrap().clone()
    }

    fn address(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("http://")
            .parse()
            .expect("the fake's address")
    }

    /// Asks the worker on the current stream to move.
    async fn ask_to_move(&self, to_address: &str) {
        self.send(scheduler_message::Body::MoveElsewhere(MoveElsewhere {
            reason: "the test asks".into(),
            to_address: to_address.into(),
        }))
        .await;
    }

    /// Polls the recorded messages until `probe` finds what it looks for.
    async fn wait_for<T>(&self, what: &str, probe: impl Fn(&[WorkerMessage]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if let Some(found) = probe(&self.received()) {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; got {:#?}",
                self.received()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn send(&self, body: scheduler_message::Body) {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        let tx = loop {
            if let Some(tx) = self.state.connection.lock().unwrap().clone() {
                break tx;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no worker connected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tx.send(Ok(message(body)))
            .await
            .expect("worker stream open");
    }

    async fn dispatch(&self, dispatch: Dispatch) {
        self.send(scheduler_message::Body::Dispatch(dispatch)).await;
    }

    /// Ends the current stream with an error status, as a dying scheduler node would.
    async fn drop_connection(&self) {
        let tx = self
            .state
            .connection
            .lock()
            .unwrap()
            .take()
            .expect("a connection");
        let _ = tx
            .send(Err(Status::unavailable("scheduler node going away")))
            .await;
    }

    async fn finished(&self, instance_id: i64, attempt: u32) -> AttemptFinished {
        self.wait_for("AttemptFinished", |messages| {
            messages.iter().find_map(|m| match &m.body {
                Some(Body::Finished(f)) if f.instance_id == instance_id && f.attempt == attempt => {
                    Some(f.clone())
                }
                _ => None,
            })
        })
        .await
    }

    async fn started_pid(&self, instance_id: i64) -> u32 {
        self.wait_for("AttemptStarted", |messages| {
            messages.iter().find_map(|m| match &m.body {
                Some(Body::Started(s)) if s.instance_id == instance_id => Some(s.pid),
                _ => None,
            })
        })
        .await
    }

    /// Log lines of one attempt as (seq, stream, text), ordered by seq, duplicates removed.
    fn lines(&self, instance_id: i64) -> Vec<(u64, LogStream, String)> {
        let mut lines = BTreeMap::new();
        for m in self.received() {
            if let Some(Body::Logs(batch)) = m.body
                && batch.instance_id == instance_id
            {
                let texts = batch.texts().expect("a consistent log batch");
                for (offset, (stream, text)) in texts.into_iter().enumerate() {
                    lines.insert(batch.first_seq + offset as u64, (stream, text.to_string()));
                }
            }
        }
        lines
            .into_iter()
            .map(|(seq, (stream, text))| (seq, stream, text))
            .collect()
    }

    fn rejections(&self, instance_id: i64) -> Vec<(String, bool)> {
        self.received()
            .into_iter()
            .filter_map(|m| match m.body {
                Some(Body::Rejected(r)) if r.instance_id == instance_id => {
                    Some((r.reason, r.duplicate))
                }
                _ => None,
            })
            .collect()
    }

    fn heartbeats(&self) -> Vec<WorkerHeartbeat> {
        self.received()
            .into_iter()
            .filter_map(|m| match m.body {
                Some(Body::Heartbeat(h)) => Some(h),
                _ => None,
            })
            .collect()
    }

    fn registers(&self) -> Vec<Register> {
        self.received()
            .into_iter()
            .filter_map(|m| match m.body {
                Some(Body::Register(r)) => Some(r),
                _ => None,
            })
            .collect()
    }
}

impl Drop for FakeScheduler {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Worker {
    handle: JoinHandle<anyhow::Result<()>>,
    shutdown: CancellationToken,
    /// The worker's own state directory, unless the test gave one: tests run side by side with
    /// the same worker ids, and the default under the shared temp dir would mix their ends.
    _state: Option<tempfile::TempDir>,
}

impl Worker {
    fn start(endpoints: &[&FakeScheduler], tweak: impl FnOnce(&mut WorkerOptions)) -> Self {
        Self::start_with_stats(endpoints, Arc::new(LogStats::default()), tweak)
    }

    fn start_with_stats(
        endpoints: &[&FakeScheduler],
        stats: Arc<LogStats>,
        tweak: impl FnOnce(&mut WorkerOptions),
    ) -> Self {
        let mut options = WorkerOptions {
            endpoints: endpoints.iter().map(|fake| fake.url.clone()).collect(),
            worker_id: id_starting_at(0, endpoints.len()),
            capacity: 4,
            heartbeat_interval: Duration::from_millis(200),
            task_heartbeat_interval: Duration::from_millis(200),
            kill_grace: Duration::from_secs(1),
            reconnect_initial: Duration::from_millis(20),
            reconnect_max: Duration::from_millis(200),
            ..WorkerOptions::default()
        };
        options.labels.insert("pool".into(), "test".into());
        tweak(&mut options);
        let state = match options.state_dir {
            Some(_) => None,
            None => {
                let state = tempfile::tempdir().expect("a state directory");
                options.state_dir = Some(state.path().to_path_buf());
                Some(state)
            }
        };
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run_with_stats(options, shutdown.clone(), stats));
        Worker {
            handle,
            shutdown,
            _state: state,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(HANG_GUARD, self.handle)
            .await
            .expect("worker stops")
            .expect("worker task")
            .expect("worker result");
    }
}

/// A worker id whose first choice among `len` addresses is the one at `index`. The tests'
/// workers start at the first endpoint unless a test says otherwise.
fn id_starting_at(index: usize, len: usize) -> String {
    (0..)
        .map(|n| format!("test-worker-{n}"))
        .find(|id| first_index(id, len) == index)
        .expect("some id starts there")
}

/// Resolves host names from a table the test changes; a name not in it does not resolve.
#[derive(Debug, Default)]
struct TableResolver(Mutex<BTreeMap<String, Vec<std::net::SocketAddr>>>);

impl TableResolver {
    fn set(&self, host: &str, fakes: &[&FakeScheduler]) {
        let addresses = fakes.iter().map(|fake| fake.address()).collect();
        self.0.lock().unwrap().insert(host.to_string(), addresses);
    }
}

impl Resolve for TableResolver {
    fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolution<'a> {
        let found = self.0.lock().unwrap().get(host).cloned();
        Box::pin(async move {
            found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such host"))
        })
    }
}

/// Waits until one of `fakes` has a Register; returns its index.
async fn registered_at(fakes: &[&FakeScheduler]) -> usize {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        if let Some(index) = fakes.iter().position(|fake| !fake.registers().is_empty()) {
            return index;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fake got a Register"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A dispatch as a scheduler sends it: the attempt's context in its environment.
fn dispatch(instance_id: i64, command: impl Into<String>) -> Dispatch {
    let task = format!("task{instance_id}");
    let env = [
        ("AX_INSTANCE_ID", instance_id.to_string()),
        ("AX_ATTEMPT", "1".to_string()),
        ("AX_RUN_ID", "42".to_string()),
        ("AX_WORKFLOW", "wf".to_string()),
        ("AX_TASK", task.clone()),
        ("AX_LOGICAL_TIME", "2024-05-01T02:00:00Z".to_string()),
    ];
    Dispatch {
        instance_id,
        attempt: 1,
        run_id: 42,
        workflow: "wf".into(),
        task,
        command: command.into(),
        logical_time_ms: 1_714_528_800_000,
        env: env.map(|(k, v)| (k.to_string(), v)).into_iter().collect(),
        ..Dispatch::default()
    }
}

fn outcome(finished: &AttemptFinished) -> AttemptOutcome {
    AttemptOutcome::try_from(finished.outcome).unwrap()
}

/// True while `pid` is a live process (a zombie waiting for its reaper counts as gone).
/// Bytes of the files in `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.metadata().ok())
                .map(|metadata| metadata.len())
                .sum()
        })
        .unwrap_or(0)
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only probes.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn wait_for_file(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn stdout_and_stderr_lines_arrive_numbered_with_their_streams() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    let mut task = dispatch(
        1,
        "echo out1; echo err1 >&2; echo \"$AX_INSTANCE_ID $AX_ATTEMPT $AX_RUN_ID $AX_WORKFLOW $AX_TASK \
         $AX_LOGICAL_TIME $AX_PARAM_CITY\"; echo err2 >&2",
    );
    task.env.insert("AX_PARAM_CITY".into(), "Lyon".into());
    fake.dispatch(task).await;
    let finished = fake.finished(1, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(finished.exit_code, Some(0));
    assert_eq!(finished.log_lines, 4);

    let lines = fake.lines(1);
    assert_eq!(
        lines.iter().map(|(seq, ..)| *seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let of = |stream| {
        lines
            .iter()
            .filter(|(_, s, _)| *s == stream)
            .map(|(_, _, t)| t.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of(LogStream::Stdout),
        ["out1", "1 1 42 wf task1 2024-05-01T02:00:00Z Lyon"]
    );
    assert_eq!(of(LogStream::Stderr), ["err1", "err2"]);

    // Accepted, then Started, then every log batch, then Finished.
    let order: Vec<&str> = fake
        .received()
        .iter()
        .filter_map(|m| match &m.body {
            Some(Body::Accepted(_)) => Some("accepted"),
            Some(Body::Started(_)) => Some("started"),
            Some(Body::Logs(_)) => Some("logs"),
            Some(Body::Finished(_)) => Some("finished"),
            _ => None,
        })
        .collect();
    assert_eq!(order.first(), Some(&"accepted"));
    assert_eq!(order.get(1), Some(&"started"));
    assert_eq!(order.last(), Some(&"finished"));

    let register = &fake.registers()[0];
    assert_eq!(register.protocol, ProtocolVersion::ProtocolVersion1 as i32);
    assert_eq!(register.worker_id, id_starting_at(0, 1));
    assert_eq!(register.capacity, 4);
    assert_eq!(
        register.labels.get("pool").map(String::as_str),
        Some("test")
    );
    assert!(register.running.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn non_zero_exit_is_failed_with_its_code() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(2, "exit 3")).await;
    let finished = fake.finished(2, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Failed);
    assert_eq!(finished.exit_code, Some(3));
    assert_eq!(finished.signal, None);
    assert_eq!(finished.log_lines, 0);
    worker.stop().await;
}

#[tokio::test]
async fn argv_runs_without_a_shell_and_a_bad_working_dir_is_a_spawn_failure() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    let mut task = dispatch(3, "");
    task.argv = vec!["/bin/echo".into(), "a b".into(), "$HOME".into()];
    fake.dispatch(task).await;
    assert_eq!(outcome(&fake.finished(3, 1).await), AttemptOutcome::Success);
    assert_eq!(
        fake.lines(3),
        [(1, LogStream::Stdout, "a b $HOME".to_string())]
    );

    let mut task = dispatch(4, "true");
    task.working_dir = "/nonexistent/ax-worker-test".into();
    fake.dispatch(task).await;
    let finished = fake.finished(4, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::SpawnFailed);
    assert!(!finished.message.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn a_duplicate_dispatch_starts_one_process_and_is_rejected_as_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("runs");
    let go = dir.path().join("go");
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    let command = format!(
        "echo run >> {}; while [ ! -e {} ]; do sleep 0.02; done",
        marker.display(),
        go.display()
    );
    fake.dispatch(dispatch(5, command.clone())).await;
    fake.dispatch(dispatch(5, command.clone())).await;
    fake.wait_for("a rejection", |_| {
        (!fake.rejections(5).is_empty()).then_some(())
    })
    .await;
    std::fs::write(&go, "").unwrap();
    assert_eq!(outcome(&fake.finished(5, 1).await), AttemptOutcome::Success);
    // Once finished, the attempt is still known here.
    fake.dispatch(dispatch(5, command)).await;
    fake.wait_for("a second rejection", |_| {
        (fake.rejections(5).len() == 2).then_some(())
    })
    .await;

    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "run\n");
    assert!(fake.rejections(5).iter().all(|(_, duplicate)| *duplicate));
    let starts = fake
        .received()
        .iter()
        .filter(|m| matches!(m.body, Some(Body::Started(_))))
        .count();
    assert_eq!(starts, 1);
    worker.stop().await;
}

#[tokio::test]
async fn capacity_is_respected() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |options| options.capacity = 2);
    for instance in 10..13 {
        fake.dispatch(dispatch(instance, "sleep 100")).await;
    }
    fake.wait_for("a rejection", |_| {
        (!fake.rejections(12).is_empty()).then_some(())
    })
    .await;
    let (reason, duplicate) = fake.rejections(12).remove(0);
    assert!(!duplicate);
    assert!(reason.contains("capacity"), "{reason}");
    for instance in [10, 11] {
        fake.started_pid(instance).await;
        let cancel = CancelAttempt {
            instance_id: instance,
            attempt: 1,
            reason: "test over".into(),
        };
        fake.send(scheduler_message::Body::Cancel(cancel)).await;
        assert_eq!(
            outcome(&fake.finished(instance, 1).await),
            AttemptOutcome::Cancelled
        );
    }
    assert!(
        fake.heartbeats()
            .iter()
            .any(|h| h.running == 2 && h.capacity == 2)
    );
    worker.stop().await;
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    let mut task = dispatch(
        20,
        format!("sleep 100 & echo $! > {}; wait", pid_file.display()),
    );
    task.timeout_ms = 300;
    fake.dispatch(task).await;
    let grandchild: i32 = wait_for_file(&pid_file).await.trim().parse().unwrap();
    let finished = fake.finished(20, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Timeout);
    assert_eq!(finished.signal, Some(libc::SIGTERM));
    fake.wait_for("the grandchild to die", |_| {
        (!alive(grandchild)).then_some(())
    })
    .await;
    worker.stop().await;
}

#[tokio::test]
async fn a_task_ignoring_sigterm_is_killed_after_the_grace() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |options| {
        options.kill_grace = Duration::from_millis(300)
    });
    let mut task = dispatch(
        21,
        "trap '' TERM; echo ready; while true; do sleep 0.05; done",
    );
    task.timeout_ms = 200;
    fake.dispatch(task).await;
    let finished = fake.finished(21, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Timeout);
    assert_eq!(finished.signal, Some(libc::SIGKILL));
    worker.stop().await;
}

#[tokio::test]
async fn cancel_kills_and_reports_cancelled() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(30, "echo started; sleep 100")).await;
    let pid = fake.started_pid(30).await;
    fake.wait_for("the first line", |_| {
        (!fake.lines(30).is_empty()).then_some(())
    })
    .await;
    let cancel = CancelAttempt {
        instance_id: 30,
        attempt: 1,
        reason: "stopped by alice".into(),
    };
    fake.send(scheduler_message::Body::Cancel(cancel)).await;
    let finished = fake.finished(30, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Cancelled);
    assert_eq!(finished.message, "stopped by alice");
    assert_eq!(finished.log_lines, 1);
    assert!(!alive(pid as i32));
    worker.stop().await;
}

#[tokio::test]
async fn a_refused_report_with_kill_kills_and_reports_nothing_more() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(31, "sleep 100")).await;
    let pid = fake.started_pid(31).await as i32;
    let refused = ReportRefused {
        instance_id: 31,
        attempt: 1,
        reason: "attempt 2 is current".into(),
        kill: true,
        code: tonic::Code::FailedPrecondition as i32,
    };
    fake.send(scheduler_message::Body::Refused(refused)).await;
    fake.wait_for("the process to die", |_| (!alive(pid)).then_some(()))
        .await;
    // The worker reports its load without the forgotten attempt, and never reports it finished.
    fake.wait_for("an idle heartbeat", |_| {
        fake.heartbeats()
            .last()
            .is_some_and(|h| h.running == 0)
            .then_some(())
    })
    .await;
    worker.stop().await;
    assert!(
        !fake
            .received()
            .iter()
            .any(|m| matches!(m.body, Some(Body::Finished(_))))
    );
}

/// A line up to the default limit (1 MiB) is kept whole; a longer one is cut into lines of
/// 1 MiB.
#[tokio::test]
async fn a_long_line_is_kept_whole_up_to_the_limit_and_cut_past_it() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(
        40,
        "head -c 204800 /dev/zero | tr '\\0' a; echo; \
         head -c 2500000 /dev/zero | tr '\\0' a; echo; echo tail",
    ))
    .await;
    let finished = fake.finished(40, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    let lines = fake.lines(40);
    let lengths: Vec<usize> = lines.iter().map(|(_, _, text)| text.len()).collect();
    assert_eq!(
        lengths,
        [204_800, 1 << 20, 1 << 20, 2_500_000 - (2 << 20), 4]
    );
    assert!(
        lines[..4]
            .iter()
            .all(|(_, _, text)| text.bytes().all(|b| b == b'a'))
    );
    assert_eq!(finished.log_lines, 5);
    worker.stop().await;
}

#[tokio::test]
async fn invalid_utf8_is_replaced() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(41, "printf 'a\\377b\\n'; printf 'no newline'"))
        .await;
    assert_eq!(
        outcome(&fake.finished(41, 1).await),
        AttemptOutcome::Success
    );
    let texts: Vec<String> = fake
        .lines(41)
        .into_iter()
        .map(|(_, _, text)| text)
        .collect();
    assert_eq!(texts, ["a\u{FFFD}b", "no newline"]);
    worker.stop().await;
}

#[tokio::test]
async fn a_running_attempt_survives_a_reconnect_to_another_node() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let first = FakeScheduler::start().await;
    let second = FakeScheduler::start().await;
    // The first node never acknowledges logs, so its lines must be replayed to the second.
    first.state.auto_ack.store(false, Ordering::SeqCst);
    let worker = Worker::start(&[&first, &second], |_| {});
    let command = format!(
        "echo before; while [ ! -e {} ]; do sleep 0.02; done; echo after",
        go.display()
    );
    first.dispatch(dispatch(50, command)).await;
    let pid = first.started_pid(50).await;
    first
        .wait_for("the first line", |_| {
            (!first.lines(50).is_empty()).then_some(())
        })
        .await;

    first.drop_connection().await;
    let register = second
        .wait_for("a Register", |messages| {
            messages.iter().find_map(|m| match &m.body {
                Some(Body::Register(r)) => Some(r.clone()),
                _ => None,
            })
        })
        .await;
    assert_eq!(
        register.running,
        [AttemptRef {
            instance_id: 50,
            attempt: 1
        }]
    );
    assert!(
        alive(pid as i32),
        "the child keeps running across a reconnect"
    );

    std::fs::write(&go, "").unwrap();
    let finished = second.finished(50, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(finished.log_lines, 2);
    let texts: Vec<(u64, String)> = second
        .lines(50)
        .into_iter()
        .map(|(seq, _, text)| (seq, text))
        .collect();
    assert_eq!(texts, [(1, "before".to_string()), (2, "after".to_string())]);
    worker.stop().await;
}

#[tokio::test]
async fn a_report_finished_during_an_outage_is_delivered_after_reconnecting() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let first = FakeScheduler::start().await;
    let worker = Worker::start(&[&first], |_| {});
    first
        .dispatch(dispatch(
            51,
            format!(
                "while [ ! -e {} ]; do sleep 0.02; done; echo done",
                go.display()
            ),
        ))
        .await;
    first.started_pid(51).await;
    // Stop the only node, let the attempt finish while nobody listens, then bring a node back on
    // the same address.
    let address = first.url.trim_start_matches("http://").to_string();
    first.drop_connection().await;
    drop(first);
    std::fs::write(&go, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listener = loop {
        // The old server may still hold the port for a moment.
        match tokio::net::TcpListener::bind(&address).await {
            Ok(listener) => break listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let state = Arc::new(FakeState::default());
    state.auto_ack.store(true, Ordering::SeqCst);
    let service = WorkerServiceServer::new(FakeService(Arc::clone(&state)));
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let revived = FakeScheduler {
        url: format!("http://{address}"),
        state,
        server,
    };
    let finished = revived.finished(51, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(finished.log_lines, 1);
    assert_eq!(
        revived.lines(51),
        [(1, LogStream::Stdout, "done".to_string())]
    );
    assert!(revived.registers()[0].running.is_empty());
    worker.stop().await;
}

#[tokio::test]
async fn stale_attempts_are_killed_after_a_reconnect() {
    let first = FakeScheduler::start().await;
    let second = FakeScheduler::start().await;
    second.state.stale.lock().unwrap().push(AttemptRef {
        instance_id: 52,
        attempt: 1,
    });
    let worker = Worker::start(&[&first, &second], |_| {});
    first.dispatch(dispatch(52, "sleep 100")).await;
    let pid = first.started_pid(52).await as i32;
    first.drop_connection().await;
    second
        .wait_for("a Register", |_| {
            (!second.registers().is_empty()).then_some(())
        })
        .await;
    second
        .wait_for("the stale process to die", |_| (!alive(pid)).then_some(()))
        .await;
    worker.stop().await;
    assert!(
        !second
            .received()
            .iter()
            .any(|m| matches!(m.body, Some(Body::Finished(_))))
    );
}

#[tokio::test]
async fn graceful_shutdown_waits_for_a_running_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |_| {});
    fake.dispatch(dispatch(
        60,
        format!(
            "while [ ! -e {} ]; do sleep 0.02; done; echo finished",
            go.display()
        ),
    ))
    .await;
    fake.started_pid(60).await;
    worker.shutdown.cancel();
    fake.wait_for("a draining heartbeat", |_| {
        fake.heartbeats().iter().any(|h| h.draining).then_some(())
    })
    .await;
    fake.dispatch(dispatch(61, "true")).await;
    fake.wait_for("a rejection", |_| {
        (!fake.rejections(61).is_empty()).then_some(())
    })
    .await;
    assert!(fake.rejections(61)[0].0.contains("draining"));
    // The attempt is blocked on the go file, so the worker cannot have stopped yet.
    assert!(!worker.handle.is_finished());

    std::fs::write(&go, "").unwrap();
    tokio::time::timeout(HANG_GUARD, worker.handle)
        .await
        .expect("worker stops")
        .unwrap()
        .unwrap();
    let finished = fake.finished(60, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(
        fake.lines(60),
        [(1, LogStream::Stdout, "finished".to_string())]
    );
}

#[tokio::test]
async fn shutdown_with_nothing_running_returns_promptly_even_without_a_scheduler() {
    // Nothing listens on this port; the worker keeps retrying until told to stop.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let shutdown = CancellationToken::new();
    let state = tempfile::tempdir().expect("a state directory");
    let options = WorkerOptions {
        endpoints: vec![url],
        state_dir: Some(state.path().to_path_buf()),
        ..WorkerOptions::default()
    };
    let handle = tokio::spawn(ax_worker::run(options, shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.cancel();
    tokio::time::timeout(HANG_GUARD, handle)
        .await
        .expect("worker stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn attempts_are_self_fenced_when_no_scheduler_is_reachable() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |options| {
        options.self_fence_after = Some(Duration::from_millis(300));
        options.drain_flush_timeout = Duration::from_millis(200);
    });
    fake.dispatch(dispatch(70, "sleep 100")).await;
    let pid = fake.started_pid(70).await as i32;
    // The only scheduler is up (it takes connections) but will not take this worker's stream:
    // it may be judging the worker meanwhile.
    fake.state.refuse.store(true, Ordering::SeqCst);
    fake.drop_connection().await;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the attempt was not fenced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await;
}

/// A task with `self_fence: false` keeps running when its worker is cut off; the others on the
/// same worker are fenced.
#[tokio::test]
async fn an_attempt_whose_task_opted_out_is_not_fenced() {
    let fake = FakeScheduler::start().await;
    let worker = Worker::start(&[&fake], |options| {
        options.self_fence_after = Some(Duration::from_millis(300));
        options.drain_flush_timeout = Duration::from_millis(200);
    });
    let mut kept = dispatch(73, "sleep 100");
    kept.keep_when_cut_off = true;
    fake.dispatch(kept).await;
    fake.dispatch(dispatch(74, "sleep 100")).await;
    let kept_pid = fake.started_pid(73).await as i32;
    let fenced_pid = fake.started_pid(74).await as i32;
    fake.state.refuse.store(true, Ordering::SeqCst);
    fake.drop_connection().await;
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while alive(fenced_pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other attempt was not fenced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Well past the fence delay, the opted-out attempt still runs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(alive(kept_pid), "the opted-out attempt was fenced");
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(kept_pid, libc::SIGKILL) };
    worker.stop().await;
}

/// A node that is down refuses connections, and no node that is down judges anyone: however
/// long the outage, the attempt keeps running. (A node that starts gives workers the
/// dead-worker threshold from its own start to come back.)
#[tokio::test]
async fn attempts_outlive_an_outage_of_every_scheduler() {
    let fake = FakeScheduler::start().await;
    fake.state.dead_after_ms.store(400, Ordering::SeqCst);
    let worker = Worker::start(&[&fake], |options| {
        options.self_fence_after = Some(Duration::from_millis(300));
        options.drain_flush_timeout = Duration::from_millis(200);
    });
    fake.dispatch(dispatch(72, "sleep 100")).await;
    let pid = fake.started_pid(72).await as i32;
    fake.drop_connection().await;
    drop(fake);
    // Ten times the fence delay (300 ms) with the port closed.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            alive(pid),
            "the attempt was fenced while every node was down"
        );
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    worker.stop().await;
}

#[tokio::test]
async fn self_fencing_comes_before_the_schedulers_dead_worker_threshold() {
    let fake = FakeScheduler::start().await;
    // The scheduler counts the worker dead after 2 s of silence; the worker's own setting would
    // wait a minute, so only the scheduler's threshold can explain a fence within the hang guard.
    fake.state.dead_after_ms.store(2000, Ordering::SeqCst);
    let worker = Worker::start(&[&fake], |options| {
        options.self_fence_after = Some(Duration::from_secs(60));
        options.drain_flush_timeout = Duration::from_millis(200);
    });
    fake.dispatch(dispatch(71, "sleep 100")).await;
    let pid = fake.started_pid(71).await as i32;
    // A healthy stream is never fenced, however long it lasts compared with the fence delay.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(alive(pid), "fenced while the stream was healthy");

    fake.state.refuse.store(true, Ordering::SeqCst);
    fake.drop_connection().await;
    let dropped = tokio::time::Instant::now();
    let guard = Duration::from_secs(10);
    while alive(pid) {
        assert!(
            dropped.elapsed() < guard,
            "the attempt was not fenced within {guard:?} of losing the scheduler"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The fence waits 3/4 of the threshold after the last contact (the last heartbeat, at most
    // 200 ms before the drop), never less.
    let fenced_after = dropped.elapsed();
    assert!(
        fenced_after >= Duration::from_millis(1200),
        "fenced after only {fenced_after:?}"
    );
    worker.stop().await;
}

#[tokio::test]
async fn log_lines_past_the_memory_bound_are_spilled_and_all_delivered_once_in_order() {
    const LINES: u64 = 20_000;
    const BOUND: usize = 64 * 1024;
    let spill_dir = tempfile::tempdir().unwrap();
    let first = FakeScheduler::start().await;
    let second = FakeScheduler::start().await;
    // The first node stores nothing, so every line stays unacknowledged.
    first.state.auto_ack.store(false, Ordering::SeqCst);
    let stats = Arc::new(LogStats::default());
    let worker = Worker::start_with_stats(&[&first, &second], Arc::clone(&stats), |options| {
        options.max_retained_log_bytes = BOUND;
        options.state_dir = Some(spill_dir.path().to_path_buf());
        options.self_fence_after = None;
    });
    first.dispatch(dispatch(90, format!("seq 1 {LINES}"))).await;
    let finished = first.finished(90, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(finished.log_lines, LINES);
    // The directory also holds `outputs/`, where attempts' $AX_OUTPUT files are made.
    let spill_files = || {
        std::fs::read_dir(spill_dir.path())
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "spill"))
            })
            .count()
    };
    assert_eq!(spill_files(), 1, "the attempt's lines were spilled");
    assert!(stats.spilled_batches() > 0);

    first.state.refuse.store(true, Ordering::SeqCst);
    first.drop_connection().await;
    let finished = second.finished(90, 1).await;
    assert_eq!(finished.log_lines, LINES);
    second
        .wait_for("the spill file to be deleted", |_| {
            (spill_files() == 0).then_some(())
        })
        .await;

    // Every line exactly once and in order, across batches in arrival order, all before the
    // finished report.
    let received = second.received();
    let mut seqs = Vec::new();
    let mut texts_match = true;
    for m in &received {
        if let Some(Body::Logs(batch)) = &m.body
            && batch.instance_id == 90
        {
            for (offset, (_, text)) in batch.texts().expect("consistent").iter().enumerate() {
                let seq = batch.first_seq + offset as u64;
                texts_match &= *text == seq.to_string();
                seqs.push(seq);
            }
        }
    }
    assert_eq!(seqs.len() as u64, LINES);
    assert!(
        seqs.iter().copied().eq(1..=LINES),
        "lines out of order or duplicated"
    );
    assert!(texts_match, "a line's text does not match its seq");
    let last_logs = received
        .iter()
        .rposition(|m| matches!(m.body, Some(Body::Logs(_))));
    let finished_at = received
        .iter()
        .position(|m| matches!(m.body, Some(Body::Finished(_))));
    assert!(
        last_logs < finished_at,
        "the finished report overtook its lines"
    );

    assert!(
        stats.peak_retained_bytes() <= BOUND,
        "{} bytes held in memory, bound {BOUND}",
        stats.peak_retained_bytes()
    );
    assert!(stats.peak_retained_bytes() > 0);
    assert_eq!(stats.dropped_batches(), 0);
    assert_eq!(stats.spill_errors(), 0);
    worker.stop().await;
    assert_eq!(stats.retained_bytes(), 0);
}

#[tokio::test]
async fn a_chatty_task_is_back_pressured_and_still_timed_out() {
    let fake = FakeScheduler::start().await;
    let spill_dir = tempfile::tempdir().unwrap();
    const SPILL_BUDGET: u64 = 1 << 20;
    let worker = Worker::start(&[&fake], |options| {
        options.kill_grace = Duration::from_millis(300);
        options.self_fence_after = None;
        options.max_retained_log_bytes = 256 * 1024;
        options.max_spilled_log_bytes = SPILL_BUDGET;
        options.state_dir = Some(spill_dir.path().to_path_buf());
    });
    fake.wait_for("a heartbeat", |_| {
        (!fake.heartbeats().is_empty()).then_some(())
    })
    .await;
    fake.state.paused.store(true, Ordering::SeqCst);
    // `yes` writes as fast as it can; with the scheduler not reading, the worker's stream, its
    // outgoing channel, its memory bound and then its spill budget fill up, the worker stops
    // reading, and `yes` blocks on its pipe.
    let mut task = dispatch(80, "yes");
    task.timeout_ms = 500;
    fake.dispatch(task).await;
    // Started is queued behind nothing yet, but the fake does not read: find the pid by group.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let pid = loop {
        let found = std::fs::read_dir("/proc").unwrap().filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (cmdline.starts_with(b"yes\0") || cmdline.starts_with(b"/bin/sh\0-c\0yes\0"))
                .then_some(pid)
                .filter(|_| stat.contains("(sh)") || stat.contains("(yes)"))
        });
        if let Some(pid) = found.into_iter().next() {
            break pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The timeout fires although every send towards the scheduler is blocked.
    let mut spilled = 0;
    while alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timeout did not kill a back-pressured task"
        );
        spilled = spilled.max(dir_bytes(spill_dir.path()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One batch (at most 256 KiB of text, framed) may overshoot the budget.
    assert!(
        spilled <= SPILL_BUDGET + 512 * 1024,
        "{spilled} bytes spilled, budget {SPILL_BUDGET}"
    );
    fake.state.paused.store(false, Ordering::SeqCst);
    let finished = fake.finished(80, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Timeout);
    let lines = fake.lines(80);
    assert_eq!(lines.len() as u64, finished.log_lines);
    assert!(lines.iter().all(|(_, _, text)| text == "y"));
    worker.stop().await;
}

/// A command that prints `before`, waits for `go` to exist, then prints `after`.
fn waiting_command(go: &Path) -> String {
    format!(
        "echo before; while [ ! -e {} ]; do sleep 0.02; done; echo after",
        go.display()
    )
}

fn running(instance_id: i64) -> Vec<AttemptRef> {
    vec![AttemptRef {
        instance_id,
        attempt: 1,
    }]
}

/// Workers given the same list start at different places in it: where the hash of their id
/// says.
#[tokio::test]
async fn workers_given_the_same_list_start_where_their_ids_hash() {
    let fakes = [
        FakeScheduler::start().await,
        FakeScheduler::start().await,
        FakeScheduler::start().await,
    ];
    let list: Vec<&FakeScheduler> = fakes.iter().collect();
    let ids: Vec<String> = (0..6).map(|n| format!("spread-{n}")).collect();
    let mut workers = Vec::new();
    for id in &ids {
        let id = id.clone();
        workers.push(Worker::start(&list, move |options| options.worker_id = id));
    }
    let mut homes = Vec::new();
    for id in &ids {
        let home = first_index(id, 3);
        fakes[home]
            .wait_for("the worker's Register", |_| {
                fakes[home]
                    .registers()
                    .iter()
                    .any(|r| &r.worker_id == id)
                    .then_some(())
            })
            .await;
        homes.push(home);
    }
    for (index, fake) in fakes.iter().enumerate() {
        let here: Vec<String> = fake.registers().into_iter().map(|r| r.worker_id).collect();
        let expected: Vec<&String> = ids
            .iter()
            .zip(&homes)
            .filter(|(_, home)| **home == index)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(here.len(), expected.len(), "fake {index} got {here:?}");
    }
    homes.sort();
    homes.dedup();
    assert_eq!(
        homes,
        [0, 1, 2],
        "six ids all started on some of three nodes"
    );
    for worker in workers {
        worker.stop().await;
    }
}

/// A host name counts as each address it resolves to, and is resolved again at every pass, so
/// a changed record is followed; the running attempt and its lines go along.
#[tokio::test]
async fn a_name_with_several_addresses_is_each_of_them_and_a_changed_record_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let (a, b, c) = (
        FakeScheduler::start().await,
        FakeScheduler::start().await,
        FakeScheduler::start().await,
    );
    // Only the last node stores lines: every line must reach it.
    a.state.auto_ack.store(false, Ordering::SeqCst);
    b.state.auto_ack.store(false, Ordering::SeqCst);
    let resolver = Arc::new(TableResolver::default());
    resolver.set("nodes.test", &[&a, &b]);
    let worker = Worker::start(&[], |options| {
        options.endpoints = vec!["http://nodes.test:7070".into()];
        options.resolver = resolver.clone();
    });
    let pair = [&a, &b];
    let first = registered_at(&pair).await;
    let (first, second) = (pair[first], pair[1 - first]);
    first.dispatch(dispatch(100, waiting_command(&go))).await;
    first.started_pid(100).await;
    first
        .wait_for("the first line", |_| {
            (!first.lines(100).is_empty()).then_some(())
        })
        .await;

    first.drop_connection().await;
    second
        .wait_for("a Register", |_| {
            (!second.registers().is_empty()).then_some(())
        })
        .await;
    assert_eq!(second.registers()[0].running, running(100));

    // The name now points at the third node only: after the pass over the first two, the
    // worker goes there.
    resolver.set("nodes.test", &[&c]);
    second.drop_connection().await;
    c.wait_for("a Register", |_| (!c.registers().is_empty()).then_some(()))
        .await;
    assert_eq!(c.registers()[0].running, running(100));

    std::fs::write(&go, "").unwrap();
    let finished = c.finished(100, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    let texts: Vec<(u64, String)> = c
        .lines(100)
        .into_iter()
        .map(|(seq, _, text)| (seq, text))
        .collect();
    assert_eq!(texts, [(1, "before".to_string()), (2, "after".to_string())]);
    worker.stop().await;
}

/// A node's MoveElsewhere ends the stream; the worker registers next with the node named when
/// it is one of its endpoints, else with another than the one it left, with its running
/// attempt listed and its unacknowledged lines sent again. The move trips no fencing.
#[tokio::test]
async fn a_move_asked_by_the_node_goes_to_the_named_endpoint_with_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let (a, b, c) = (
        FakeScheduler::start().await,
        FakeScheduler::start().await,
        FakeScheduler::start().await,
    );
    a.state.auto_ack.store(false, Ordering::SeqCst);
    a.state.dead_after_ms.store(2_000, Ordering::SeqCst);
    let worker = Worker::start(&[&a, &b, &c], |options| {
        options.self_fence_after = Some(Duration::from_secs(1));
    });
    a.dispatch(dispatch(101, waiting_command(&go))).await;
    let pid = a.started_pid(101).await as i32;
    a.wait_for("the first line", |_| {
        (!a.lines(101).is_empty()).then_some(())
    })
    .await;

    a.ask_to_move(&c.url).await;
    c.wait_for("a Register", |_| (!c.registers().is_empty()).then_some(()))
        .await;
    assert_eq!(c.registers()[0].running, running(101));
    a.wait_for("the old stream to end", |_| {
        (a.state.ended.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    // The line the first node never acknowledged is sent again to the new one.
    c.wait_for("the replayed line", |_| {
        (c.lines(101) == [(1, LogStream::Stdout, "before".to_string())]).then_some(())
    })
    .await;
    assert!(
        b.registers().is_empty(),
        "the worker went to the node named"
    );

    // Named an address that is none of the worker's: it goes to another endpoint, not there.
    c.ask_to_move("http://192.0.2.1:7070").await;
    a.wait_for("a second Register", |_| {
        (a.registers().len() == 2).then_some(())
    })
    .await;
    assert_eq!(a.registers()[1].running, running(101));
    assert!(b.registers().is_empty());

    // Well past the fence delay across the moves, the task still runs and ends well.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(alive(pid), "a move fenced the attempt");
    std::fs::write(&go, "").unwrap();
    let finished = a.finished(101, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(finished.log_lines, 2);
    assert_eq!(
        a.lines(101),
        [
            (1, LogStream::Stdout, "before".to_string()),
            (2, LogStream::Stdout, "after".to_string())
        ]
    );
    worker.stop().await;
}

/// An endpoint that refuses connections and one that accepts them and never answers, listed
/// before a good one: the worker gets to the good one and runs tasks there.
#[tokio::test]
async fn a_worker_given_unreachable_endpoints_first_uses_the_good_one() {
    let refusing = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        url
    };
    // Accepts connections (the kernel's backlog does) and never speaks.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let good = FakeScheduler::start().await;
    let worker = Worker::start(&[], |options| {
        options.endpoints = vec![refusing.clone(), silent_url.clone(), good.url.clone()];
        options.worker_id = id_starting_at(0, 3);
        options.register_timeout = Duration::from_millis(300);
    });
    good.dispatch(dispatch(102, "echo ran")).await;
    let finished = good.finished(102, 1).await;
    assert_eq!(outcome(&finished), AttemptOutcome::Success);
    assert_eq!(good.lines(102), [(1, LogStream::Stdout, "ran".to_string())]);
    worker.stop().await;
    drop(silent);
}
