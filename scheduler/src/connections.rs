//! The node's listeners and the connections they accept: each connection is served by hyper
//! (HTTP/1.1 and HTTP/2 on one port, after a TLS handshake when the node has TLS) and held to
//! the node's connection limits, so that connections that hold a file and send nothing cannot
//! lock anyone out:
//! - a **first-request deadline**: from accept, the TLS handshake included, to a complete
//!   HTTP/1 request head or an HTTP/2 stream's headers;
//! - an **idle timeout** for a connection with no request open (an HTTP/2 stream, a worker's
//!   stream or an event stream included, is an open request until its response ends);
//! - a **cap** on open connections over every listener, within the process's open-file limit:
//!   a new connection past it closes the connection quiet the longest (never one with a
//!   request open), or is itself refused when every connection is busy;
//! - **accept back-off**: when accept fails (out of file descriptors), the loop waits, 10 ms
//!   doubling to 200 ms, instead of spinning on a connection the kernel keeps queued;
//! - **HTTP/2 keepalive** pings, which close a connection whose peer stopped answering, and
//!   which live worker streams answer, so they are never the ones cut.
//!
//! What to close and when is decided by `ax_core::connections`; this module does the I/O. Every
//! task it spawns (accept loops, connections, HTTP/2 streams) is tracked and ends after the
//! stop token: connections are asked to close gracefully and are dropped after a grace.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use ax_core::connections::{CloseReason, ConnectionView, Timeouts, Verdict};
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::Connected;
use tower::ServiceExt;

use crate::tls::ServerTls;

/// What a listener serves: the node's routes (web UI, JSON API, gRPC) behind its layers.
pub type HttpService = tower::util::BoxCloneSyncService<
    Request<tonic::body::Body>,
    Response<tonic::body::Body>,
    Infallible,
>;

/// The limits connections are held to (flags `--max-connections`, `--first-request-timeout`,
/// `--idle-connection-timeout`, `--keepalive-interval`, `--keepalive-timeout`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The most connections open at once over every listener; lowered to what the open-file
    /// limit leaves (`ax_core::connections::connection_cap`).
    pub max_connections: u32,
    /// From accept (the TLS handshake included) to the first request.
    pub first_request_timeout: Duration,
    /// How long a connection with no request open stays open.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged.
    pub keepalive_interval: Duration,
    /// A ping not answered within this closes the connection.
    pub keepalive_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: ax_core::connections::DEFAULT_MAX_CONNECTIONS,
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// Connections the kernel completes and queues for accept: enough for a burst (every worker
/// of a cluster reconnecting after a restart) to wait for the accept loop instead of having
/// its handshakes dropped and retried a second later.
const LISTEN_BACKLOG: u32 = 1024;
/// How long a graceful close (idle, first-request deadline) may take with nothing open.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long connections get to finish after the stop token before they are dropped. Less than
/// what `RunningScheduler::shutdown` waits for the server.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The first wait after a failed accept; it doubles up to the most.
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MOST: Duration = Duration::from_millis(200);
/// A warning about the cap or failed accepts is logged at most this often.
const WARN_EVERY_MS: u64 = 60_000;
/// A worker stream carries its tasks' log lines: with HTTP/2's default windows a worker waits
/// for a window update every few batches (BENCHMARKS.md, W4). What these windows let in is
/// bounded, and the log writer's byte budget bounds the rest.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 8 << 20;

/// What happened to the node's connections, for its metrics.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    open: AtomicUsize,
    cap: AtomicUsize,
    accepted: AtomicU64,
    first_request_timeouts: AtomicU64,
    idle_closes: AtomicU64,
    /// Closed to make room for a new connection at the cap.
    evicted: AtomicU64,
    /// New connections closed at once because every open one was busy.
    refused: AtomicU64,
    accept_errors: AtomicU64,
}

/// A reading of [`ConnectionCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionStats {
    pub open: usize,
    pub cap: usize,
    pub accepted: u64,
    pub first_request_timeouts: u64,
    pub idle_closes: u64,
    pub evicted: u64,
    pub refused: u64,
    pub accept_errors: u64,
}

impl ConnectionCounters {
    pub fn read(&self) -> ConnectionStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConnectionStats {
            open: self.open.load(Ordering::Relaxed),
            cap: self.cap.load(Ordering::Relaxed),
            accepted: get(&self.accepted),
            first_request_timeouts: get(&self.first_request_timeouts),
            idle_closes: get(&self.idle_closes),
            evicted: get(&self.evicted),
            refused: get(&self.refused),
            accept_errors: get(&self.accept_errors),
        }
    }

    fn closed(&self, reason: CloseReason) {
        let counter = match reason {
            CloseReason::FirstRequestTimeout => &self.first_request_timeouts,
            CloseReason::Idle => &self.idle_closes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The node's connection handling: listeners added with [`Connections::serve`] share its cap.
/// Cloning gives another handle to the same connections.
#[derive(Clone)]
pub struct Connections {
    shared: Arc<Shared>,
}

struct Shared {
    cap: usize,
    timeouts: Timeouts,
    clock: Clock,
    builder: hyper_util::server::conn::auto::Builder<TrackedExecutor>,
    open: Mutex<HashMap<u64, Arc<ConnectionState>>>,
    next_id: AtomicU64,
    /// Woken whenever a connection ends.
    room: Notify,
    stop: CancellationToken,
    tasks: TaskTracker,
    counters: Arc<ConnectionCounters>,
    last_cap_warning_ms: AtomicU64,
    last_accept_warning_ms: AtomicU64,
}

impl Connections {
    /// Connection handling under `limits`, counted in `counters`, until `stop`. The cap is
    /// fixed here, from the process's open-file limit (raised first toward what the cap
    /// needs, when the hard limit allows).
    pub fn new(
        limits: &ConnectionLimits,
        counters: Arc<ConnectionCounters>,
        stop: CancellationToken,
    ) -> Connections {
        let open_files = open_file_limit(ax_core::connections::open_files_wanted(
            limits.max_connections,
        ));
        let cap = ax_core::connections::connection_cap(limits.max_connections, open_files);
        if cap < limits.max_connections as usize {
            tracing::warn!(
                max_connections = limits.max_connections,
                open_file_limit = open_files,
                cap,
                "the open-file limit holds fewer connections than --max-connections: at most \
                 {cap} are served at once (raise the limit, e.g. LimitNOFILE= or ulimit -n, to \
                 serve more)"
            );
        }
        counters.cap.store(cap, Ordering::Relaxed);
        let tasks = TaskTracker::new();
        let mut builder =
            hyper_util::server::conn::auto::Builder::new(TrackedExecutor(tasks.clone()));
        builder
            .http1()
            .timer(TokioTimer::new())
            // A request head, once the connection waits for one, comes whole within the idle
            // timeout (the first one within the first-request deadline, enforced here).
            .header_read_timeout(limits.idle_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            // As tonic's server: no limit of its own on a client's concurrent streams.
            .max_concurrent_streams(None)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout);
        let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Connections {
            shared: Arc::new(Shared {
                cap,
                timeouts: Timeouts {
                    first_request_ms: millis(limits.first_request_timeout),
                    idle_ms: millis(limits.idle_timeout),
                    close_grace_ms: millis(CLOSE_GRACE),
                },
                clock: Clock::new(),
                builder,
                open: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                room: Notify::new(),
                stop,
                tasks,
                counters,
                last_cap_warning_ms: AtomicU64::new(0),
                last_accept_warning_ms: AtomicU64::new(0),
            }),
        }
    }

    /// The most connections open at once.
    pub fn cap(&self) -> usize {
        self.shared.cap
    }

    /// Serves `service` on `listener`'s connections (after a TLS handshake with `tls`'s
    /// current configuration, when given) until the stop token.
    pub fn serve(&self, listener: TcpListener, service: HttpService, tls: Option<Arc<ServerTls>>) {
        self.shared
            .tasks
            .spawn(accept_loop(self.shared.clone(), listener, service, tls));
    }

    /// Waits until, after the stop token, every listener and connection has ended.
    pub async fn closed(&self) {
        self.shared.stop.cancelled().await;
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
}

/// A listener on `address` with the node's accept queue ([`LISTEN_BACKLOG`]).
pub fn bind(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's and tokio's listeners: a restarted node binds its port while the old
    // connections linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Milliseconds on a monotonic clock since the connections were set up.
#[derive(Clone, Copy)]
struct Clock {
    epoch: tokio::time::Instant,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn instant(&self, ms: u64) -> tokio::time::Instant {
        // Far enough for "never" without overflowing the runtime's clock.
        let ms = ms.min(1 << 40);
        self.epoch + Duration::from_millis(ms)
    }
}

/// Spawns HTTP/2 streams' tasks on the connections' tracker.
#[derive(Clone)]
struct TrackedExecutor(TaskTracker);

impl<F> hyper::rt::Executor<F> for TrackedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        self.0.spawn(future);
    }
}

/// No close has begun.
const NOT_CLOSING: u64 = u64::MAX;

/// One connection's state, shared by its task, its requests and the cap's choice.
struct ConnectionState {
    opened_ms: u64,
    served: AtomicBool,
    open_requests: AtomicUsize,
    quiet_since_ms: AtomicU64,
    closing_since_ms: AtomicU64,
    /// Told to close at once to make room.
    evicted: Notify,
}

impl ConnectionState {
    fn new(now_ms: u64) -> ConnectionState {
        ConnectionState {
            opened_ms: now_ms,
            served: AtomicBool::new(false),
            open_requests: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(now_ms),
            closing_since_ms: AtomicU64::new(NOT_CLOSING),
            evicted: Notify::new(),
        }
    }

    fn view(&self) -> ConnectionView {
        let closing = self.closing_since_ms.load(Ordering::Acquire);
        ConnectionView {
            opened_ms: self.opened_ms,
            served: self.served.load(Ordering::Acquire),
            open_requests: self.open_requests.load(Ordering::Acquire),
            quiet_since_ms: self.quiet_since_ms.load(Ordering::Acquire),
            closing_since_ms: (closing != NOT_CLOSING).then_some(closing),
        }
    }

    /// Marks the start of a close; false when one had begun already.
    fn begin_close(&self, now_ms: u64) -> bool {
        self.closing_since_ms
            .compare_exchange(NOT_CLOSING, now_ms, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A request from its call until its response body is dropped (sent, or the stream reset).
struct OpenRequest {
    state: Arc<ConnectionState>,
    clock: Clock,
}

impl OpenRequest {
    fn begin(state: Arc<ConnectionState>, clock: Clock) -> OpenRequest {
        state.served.store(true, Ordering::Release);
        state.open_requests.fetch_add(1, Ordering::AcqRel);
        OpenRequest { state, clock }
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        if self.state.open_requests.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.state
                .quiet_since_ms
                .store(self.clock.now_ms(), Ordering::Release);
        }
    }
}

/// A response body that keeps its request open until it is dropped.
struct TrackedBody {
    body: tonic::body::Body,
    _open: OpenRequest,
}

impl http_body::Body for TrackedBody {
    type Data = <tonic::body::Body as http_body::Body>::Data;
    type Error = <tonic::body::Body as http_body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The service of one connection: the listener's, with the connection's address (and TLS
/// certificates) in each request's extensions, as tonic's server puts them
/// (`TcpConnectInfo`, `TlsConnectInfo<TcpConnectInfo>`), and each request counted open.
struct ConnectionService<I> {
    service: HttpService,
    info: I,
    state: Arc<ConnectionState>,
    clock: Clock,
}

impl<I> hyper::service::Service<Request<Incoming>> for ConnectionService<I>
where
    I: Clone + Send + Sync + 'static,
{
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let open = OpenRequest::begin(self.state.clone(), self.clock);
        let mut request = request.map(tonic::body::Body::new);
        request.extensions_mut().insert(self.info.clone());
        let service = self.service.clone();
        Box::pin(async move {
            let response = service.oneshot(request).await?;
            Ok(response.map(|body| TrackedBody { body, _open: open }))
        })
    }
}

/// A connection's place among the open ones, given up when its task ends.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self
            .shared
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.remove(&self.id);
        self.shared
            .counters
            .open
            .store(open.len(), Ordering::Relaxed);
        drop(open);
        self.shared.room.notify_waiters();
    }
}

impl Shared {
    fn open_count(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn register(self: &Arc<Self>) -> (Registered, Arc<ConnectionState>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnectionState::new(self.clock.now_ms()));
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.insert(id, state.clone());
        self.counters.open.store(open.len(), Ordering::Relaxed);
        let registered = Registered {
            shared: self.clone(),
            id,
        };
        (registered, state)
    }

    /// Past the cap (or out of files): closes the connection quiet the longest, which is
    /// `newest` itself when every other one is busy.
    fn make_room(&self, newest: Option<&Arc<ConnectionState>>) {
        let now_ms = self.clock.now_ms();
        let victim = {
            let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            ax_core::connections::quietest(open.iter().map(|(id, state)| (*id, state.view())))
                .and_then(|id| open.get(&id).cloned())
        };
        let Some(victim) = victim else {
            // Every connection, the new one included, has a request open or is closing.
            return;
        };
        if !victim.begin_close(now_ms) {
            return;
        }
        victim.evicted.notify_one();
        if newest.is_some_and(|newest| Arc::ptr_eq(&victim, newest)) {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
        if newest.is_some() && self.due(&self.last_cap_warning_ms, now_ms) {
            tracing::warn!(
                cap = self.cap,
                "the node holds the most connections it may (--max-connections, within the \
                 open-file limit): the connection quiet the longest is closed to make room for \
                 each new one, or the new one is refused when all are busy"
            );
        }
    }

    /// Whether a rate-limited warning is due now (at most once a minute).
    fn due(&self, last_ms: &AtomicU64, now_ms: u64) -> bool {
        let last = last_ms.load(Ordering::Relaxed);
        (last == 0 || now_ms.saturating_sub(last) >= WARN_EVERY_MS)
            && last_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Waits until a new connection may be accepted: until fewer than the cap are open (the
    /// one accepted then may take the last place, or close the quietest). False on stop.
    async fn wait_for_room(&self) -> bool {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.open_count() <= self.cap {
                return true;
            }
            tokio::select! {
                _ = room => {}
                _ = self.stop.cancelled() => return false,
            }
        }
    }
}

/// Whether accept failed for want of file descriptors (or memory for one): the connection
/// stays queued in the kernel, so an immediate retry fails again.
fn out_of_files(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    service: HttpService,
    tls: Option<Arc<ServerTls>>,
) {
    let mut backoff = ACCEPT_BACKOFF_FIRST;
    loop {
        if !shared.wait_for_room().await {
            return;
        }
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_FIRST;
                stream
            }
            Err(error) => {
                shared
                    .counters
                    .accept_errors
                    .fetch_add(1, Ordering::Relaxed);
                let now_ms = shared.clock.now_ms();
                if out_of_files(&error) {
                    // Something besides the connections holds the files the cap left: a quiet
                    // connection gives one back for the connection waiting in the queue.
                    shared.make_room(None);
                    if shared.due(&shared.last_accept_warning_ms, now_ms) {
                        tracing::warn!(
                            %error,
                            open = shared.open_count(),
                            "cannot accept a connection: out of file descriptors; closing the \
                             quietest connection and retrying with back-off (lower \
                             --max-connections or raise the open-file limit)"
                        );
                    }
                } else {
                    tracing::debug!(%error, "accepting a connection failed");
                }
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MOST);
                continue;
            }
        };
        shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = stream.set_nodelay(true) {
            // Nagle's algorithm would hold a small frame written right after another (a
            // FinishedAck, then the next Dispatch) for the peer's delayed ACK, about 40 ms.
            tracing::warn!(%error, "cannot turn off Nagle's algorithm on a connection");
        }
        let (registered, state) = shared.register();
        if shared.open_count() > shared.cap {
            shared.make_room(Some(&state));
        }
        shared.tasks.spawn(serve_connection(
            shared.clone(),
            registered,
            state,
            stream,
            service.clone(),
            tls.clone(),
        ));
    }
}

/// One connection from accept to close: its TLS handshake, then its requests.
async fn serve_connection(
    shared: Arc<Shared>,
    _registered: Registered,
    state: Arc<ConnectionState>,
    stream: TcpStream,
    service: HttpService,
    tls: Option<Arc<ServerTls>>,
) {
    let Some(tls) = tls else {
        return serve_http(&shared, &state, stream, service).await;
    };
    let deadline = shared.clock.instant(
        state
            .opened_ms
            .saturating_add(shared.timeouts.first_request_ms),
    );
    let peer = stream.peer_addr().ok();
    let handshake = tokio_rustls::TlsAcceptor::from(tls.config()).accept(stream);
    let stream = tokio::select! {
        done = tokio::time::timeout_at(deadline, handshake) => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(?peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                shared.counters.closed(CloseReason::FirstRequestTimeout);
                tracing::debug!(?peer, "TLS handshake not finished within the first-request deadline");
                return;
            }
        },
        _ = state.evicted.notified() => return,
        _ = shared.stop.cancelled() => return,
    };
    serve_http(&shared, &state, stream, service).await
}

/// Serves HTTP on `io` until the peer closes, a limit closes it, or the node stops.
async fn serve_http<IO>(shared: &Shared, state: &Arc<ConnectionState>, io: IO, service: HttpService)
where
    IO: Connected + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = ConnectionService {
        service,
        info: io.connect_info(),
        state: state.clone(),
        clock: shared.clock,
    };
    let connection = shared.builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut closing = false;
    let mut dropped_at: Option<tokio::time::Instant> = None;
    loop {
        let now_ms = shared.clock.now_ms();
        let wake = match ax_core::connections::judge(&state.view(), now_ms, &shared.timeouts) {
            Verdict::Keep { until_ms } => shared.clock.instant(until_ms),
            Verdict::Close(reason) => {
                shared.counters.closed(reason);
                state.begin_close(now_ms);
                if !closing {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                continue;
            }
            Verdict::Drop => return,
        };
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(error) = served {
                    tracing::debug!(error = %error, "connection ended with an error");
                }
                return;
            }
            _ = state.evicted.notified() => return,
            _ = shared.stop.cancelled(), if dropped_at.is_none() => {
                state.begin_close(shared.clock.now_ms());
                if !closing {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                dropped_at = Some(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            _ = sleep_until_some(dropped_at) => return,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The process's soft open-file limit, raised toward `wanted` when the hard limit allows;
/// `None` when unlimited or unknown.
// `rlim_t` is u64 here but narrower on some targets.
#[allow(clippy::unnecessary_cast)]
fn open_file_limit(wanted: u64) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < wanted as libc::rlim_t && limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: (wanted as libc::rlim_t).min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = limit.rlim_cur as u64,
                to = raised.rlim_cur as u64,
                "raised the open-file limit toward what --max-connections needs"
            );
            limit = raised;
        }
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(limit.rlim_cur as u64)
}
