//! The ax worker: holds a stream to a scheduler node and runs dispatched attempts.
//!
//! Codemap: `session` is one stream (handshake, dispatch, heartbeats, drain); `runner` is one
//! attempt's process (timeout, kill, final report) and its log shipper; `spawn` starts that
//! process without copying the worker's page tables; `logs` reads output into numbered batches,
//! encoded once; `outgoing` sends them as those bytes; `attempts` is what survives a reconnect
//! (running attempts, unacknowledged logs, finished reports); `ends` keeps each end on disk
//! until it is acknowledged, which is what survives a restart; `held` runs the attempts whose
//! process outlives the worker, and takes them back after a restart; `spill` keeps unacknowledged log
//! batches on disk past the memory bound; `fence` kills attempts when no scheduler has been
//! reachable for too long; `endpoints` turns the configured endpoints into the addresses dialed
//! in turn; `backoff` paces reconnects; `credentials` keeps the worker's token out of its tasks'
//! sight; `task_user` is the account tasks run as under `--task-user`.
//!
//! The reconnect loop dials one address at a time. A broken stream moves the worker to the next
//! address after a backoff with full jitter (at once while addresses refuse and some in the
//! pass have not been tried); a node's request to move (`MoveElsewhere`) moves it at once, to
//! the named node when it is one of the worker's own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

mod attempts;
pub mod backoff;
mod command_line;
pub mod credentials;
pub mod endpoints;
mod ends;
mod fence;
mod guardian;
pub mod held;
pub mod logs;
mod outgoing;
mod runner;
mod session;
pub mod spawn;
mod spill;
mod state_lock;
pub mod task_user;
pub mod telemetry;

pub use logs::BatchLimits;
pub use session::SessionError;
pub use spill::LogStats;
pub use state_lock::StateLockError;

use attempts::Attempts;
use backoff::Backoff;
use endpoints::{Endpoint, EndpointError, Resolve, Rotation, SystemResolver};
use fence::Liveness;
use runner::RunnerSettings;
use session::SessionEnd;

/// Everything a worker needs to start.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Scheduler endpoints (`http://host:port`); a host name counts as each address it resolves
    /// to. The worker connects to one address at a time, the first chosen by a hash of its id,
    /// and moves to the next when a stream breaks (see `endpoints`).
    pub endpoints: Vec<String>,
    /// Resolves the endpoints' host names; the system's resolver by default.
    pub resolver: Arc<dyn Resolve>,
    pub worker_id: String,
    pub labels: BTreeMap<String, String>,
    /// Attempts run at once.
    pub capacity: u32,
    pub heartbeat_interval: Duration,
    pub task_heartbeat_interval: Duration,
    /// Between SIGTERM and SIGKILL when the worker kills an attempt's process group.
    pub kill_grace: Duration,
    /// How long the handshake (connect, Register → Registered) may take.
    pub register_timeout: Duration,
    /// First and largest reconnect delay (exponential, full jitter).
    pub reconnect_initial: Duration,
    pub reconnect_max: Duration,
    /// The longest output line kept whole (bytes of UTF-8, without its newline); a longer one is
    /// cut into lines of this many bytes, at a character boundary. 1 MiB by default: a line a
    /// task prints (a JSON document, a minified file) stays one line in the viewer and in the
    /// download, and a batch that carries one stays far below the node's 4 MiB message limit.
    pub max_line_bytes: usize,
    /// Bytes of unacknowledged log lines kept in memory across all attempts. A batch that does
    /// not fit goes to its attempt's spill file in `state_dir` instead, and so does every later
    /// batch of that attempt until the file is fully acknowledged and deleted.
    pub max_retained_log_bytes: usize,
    /// Bytes of unacknowledged log lines kept in spill files across all attempts. Past it, an
    /// attempt whose lines would go to disk stops being read until the scheduler acknowledges
    /// some: its task blocks on its full pipe (back-pressure), so a runaway task cannot fill the
    /// worker's disk.
    pub max_spilled_log_bytes: u64,
    /// What the worker keeps on disk, and what a restart under the same id takes back: the
    /// journal of ends not yet acknowledged (`ends/`), spill files, and the attempts'
    /// `$AX_OUTPUT` files (`outputs/`). `<temp dir>/ax-worker-<worker id>` when `None`; it must
    /// outlive the worker process (not a per-start private temp dir). Spill files left there by
    /// an earlier process that no kept end points at are deleted at start: their attempts died
    /// with that process.
    pub state_dir: Option<PathBuf>,
    pub log_batch: BatchLimits,
    /// How long a sent finished report the scheduler has not acknowledged is kept and replayed
    /// on every new stream (an acknowledged one is dropped at once).
    pub finished_retention: Duration,
    /// On shutdown, after the last report, how long to wait for log acknowledgements (or for a
    /// stream to deliver reports on when disconnected).
    pub drain_flush_timeout: Duration,
    /// Self-fencing: when no scheduler has been reachable for this long, running attempts are
    /// killed and reported FAILED, before a scheduler could declare them lost and run them
    /// elsewhere. A scheduler that sends its dead-worker threshold shortens this to 3/4 of that
    /// threshold (see the `fence` module for the margin). `None` disables it.
    pub self_fence_after: Option<Duration>,
    /// Reported in Register; the machine's host name when `None`.
    pub hostname: Option<String>,
    /// The worker's token, CA and client certificate.
    pub auth: ax_proto::client::ClientAuth,
    /// A file holding the token, read again at every connection (so a rotated token is
    /// picked up without a restart); it wins over `auth.token`.
    pub token_file: Option<PathBuf>,
    /// The account tasks run as (`--task-user`); the worker's own when `None`. Needs the worker
    /// to run as root.
    pub task_user: Option<task_user::TaskUser>,
    /// The program that holds held attempts: `ax-worker` itself (`ax-worker __hold ...`).
    /// `None`: this process's own executable. Held attempts run as the worker's children when
    /// it cannot be found.
    pub holder_program: Option<PathBuf>,
    /// Cancelled, with the shutdown, to stop without waiting for running held attempts: the
    /// worker's next process under its id takes them back (an upgrade or a restart).
    pub hand_over: CancellationToken,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            endpoints: vec!["http://127.0.0.1:7070".into()],
            resolver: Arc::new(SystemResolver),
            worker_id: "worker".into(),
            labels: BTreeMap::new(),
            capacity: 20,
            heartbeat_interval: Duration::from_secs(5),
            task_heartbeat_interval: Duration::from_secs(30),
            kill_grace: Duration::from_secs(5),
            register_timeout: Duration::from_secs(10),
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            max_line_bytes: logs::MAX_LINE_BYTES,
            max_retained_log_bytes: 32 << 20,
            max_spilled_log_bytes: 1 << 30,
            state_dir: None,
            log_batch: BatchLimits::default(),
            finished_retention: Duration::from_secs(3600),
            drain_flush_timeout: Duration::from_secs(5),
            self_fence_after: Some(Duration::from_secs(10)),
            hostname: None,
            auth: ax_proto::client::ClientAuth::default(),
            token_file: None,
            task_user: None,
            holder_program: None,
            hand_over: CancellationToken::new(),
        }
    }
}

/// Why the worker could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("no scheduler endpoint configured")]
    NoEndpoints,
    #[error(transparent)]
    InvalidEndpoint(#[from] EndpointError),
    #[error("capacity must be at least 1")]
    ZeroCapacity,
    #[error(transparent)]
    TaskUser(#[from] task_user::TaskUserError),
    #[error(transparent)]
    StateDir(#[from] state_lock::StateLockError),
}

/// What the connection and the runners share.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) options: WorkerOptions,
    pub(crate) attempts: Arc<Attempts>,
    pub(crate) liveness: Arc<Liveness>,
    pub(crate) runner: Arc<RunnerSettings>,
    pub(crate) tracker: TaskTracker,
    pub(crate) started_at_ms: i64,
    pub(crate) hostname: String,
    /// Drawn once per run: every Register of this process carries it, so a node tells this
    /// process reconnecting (its old stream may linger there) from a second worker with its id.
    pub(crate) incarnation: String,
}

/// Runs the worker until `shutdown` is cancelled, then stops taking work, lets running attempts
/// finish and reports them, and returns.
pub async fn run(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    run_with_stats(options, shutdown, Arc::new(LogStats::default())).await
}

/// [`run`], counting the fate of unacknowledged log lines in `stats` (memory use, spills, drops).
pub async fn run_with_stats(
    options: WorkerOptions,
    shutdown: CancellationToken,
    stats: Arc<LogStats>,
) -> anyhow::Result<()> {
    if options.endpoints.is_empty() {
        return Err(WorkerError::NoEndpoints.into());
    }
    if options.capacity == 0 {
        return Err(WorkerError::ZeroCapacity.into());
    }
    if options.task_user.is_some() {
        task_user::TaskUser::check_worker_can_switch().map_err(WorkerError::from)?;
    }
    let endpoints = options
        .endpoints
        .iter()
        .map(|text| Endpoint::parse(text))
        .collect::<Result<Vec<_>, _>>()
        .map_err(WorkerError::from)?;
    let state_dir = options.state_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ax-worker-{}", sanitize(&options.worker_id)))
    });
    // Held for the whole run: nothing below may touch the directory without it.
    let _state_lock = {
        let dir = state_dir.clone();
        tokio::task::spawn_blocking(move || {
            state_lock::StateLock::take(&dir, state_lock::WAIT_FOR_PREDECESSOR)
        })
        .await
        .map_err(|error| anyhow::anyhow!("taking the state directory's lock: {error}"))?
        .map_err(WorkerError::from)?
    };
    let (journal, kept_ends) = ends::EndJournal::open(&state_dir.join("ends"))
        .map_err(|error| anyhow::anyhow!("{error} (the worker's state directory, --state-dir)"))?;
    let kept_spills = kept_ends
        .iter()
        .filter(|end| !end.spill_path.is_empty())
        .map(|end| PathBuf::from(&end.spill_path))
        .collect();
    spill::remove_stale(&state_dir, &kept_spills);
    let held_dirs = held::held_dirs(&state_dir);
    let outputs_dir = state_dir.join("outputs");
    let liveness = Arc::new(seeded_liveness(&state_dir, !held_dirs.is_empty()));
    let held_root = state_dir.join(held::HELD_DIR);
    let fence_writer = match std::fs::create_dir_all(&held_root) {
        Ok(()) => Some(Arc::new(held::FenceWriter::new(
            Arc::clone(&liveness),
            options.self_fence_after,
            held_root,
        ))),
        Err(error) => {
            tracing::warn!(dir = %held_root.display(), %error, "cannot make the held attempts' directory; attempts that ask to survive a worker restart run as any other");
            None
        }
    };
    if let Err(error) = runner::prepare_outputs_dir(&outputs_dir, options.task_user.is_some()) {
        // Tried again before each attempt; an attempt that cannot have it fails saying why.
        tracing::warn!(dir = %outputs_dir.display(), %error, "cannot make the $AX_OUTPUT directory");
    }
    let context = Arc::new(Context {
        attempts: {
            let attempts = Attempts::new(
                options.max_retained_log_bytes,
                options.max_spilled_log_bytes,
                state_dir.clone(),
                stats,
            )
            .with_journal(journal);
            attempts.restore(kept_ends);
            Arc::new(attempts)
        },
        liveness,
        runner: Arc::new(RunnerSettings {
            guardian: match guardian::Guardian::start() {
                Ok(guardian) => Some(Arc::new(guardian)),
                Err(error) => {
                    tracing::warn!(%error, "cannot start the process-group guardian (awk); a task's grandchildren may outlive a crash of this worker");
                    None
                }
            },
            kill_grace: options.kill_grace,
            max_line_bytes: options.max_line_bytes,
            batch: options.log_batch,
            task_heartbeat_interval: options.task_heartbeat_interval,
            task_user: options.task_user.clone(),
            outputs_dir,
            state_dir: state_dir.clone(),
            holder_program: fence_writer.as_ref().and_then(|_| {
                options.holder_program.clone().or_else(|| {
                    std::env::current_exe()
                        .inspect_err(|error| tracing::warn!(%error, "cannot find this program's file; attempts that ask to survive a worker restart run as any other"))
                        .ok()
                })
            }),
            fence_writer,
        }),
        tracker: TaskTracker::new(),
        started_at_ms: now_ms(),
        incarnation: incarnation(),
        hostname: options
            .hostname
            .clone()
            .unwrap_or_else(|| ax_proto::hostname().unwrap_or_default()),
        options,
    });
    let fencing = CancellationToken::new();
    if let Some(after) = context.options.self_fence_after {
        tokio::spawn(fence::self_fence(
            Arc::clone(&context.attempts),
            Arc::clone(&context.liveness),
            after,
            fencing.clone(),
        ));
    }
    let fence_file_stop = fencing.child_token();
    let _stop_fencing = fencing.drop_guard();
    if let Some(writer) = &context.runner.fence_writer {
        tokio::spawn(keep_fence_file(Arc::clone(writer), fence_file_stop));
    }
    adopt_held(&context, held_dirs);
    let mut rotation = Rotation::new(
        endpoints,
        Arc::clone(&context.options.resolver),
        &context.options.worker_id,
    );
    let mut judged_generation = 0;
    let mut backoff = Backoff::new(
        context.options.reconnect_initial,
        context.options.reconnect_max,
    );
    let mut epoch = 0u64;
    // Addresses in a row that refused a connection or answered that their node cannot reach
    // its store: until every one in the pass has, the next is tried at once (only refusals
    // count for the fence: all nodes down is what lets it wait; see `fence`).
    let mut turned_away_in_a_row = 0usize;
    // The last stream ended because its node asked this worker to move.
    let mut moving = false;
    // Set once shutdown was requested and nothing runs any more: reports not yet delivered get
    // until then to find a stream.
    let mut give_up_at: Option<Instant> = None;
    tracing::info!(worker_id = %context.options.worker_id, endpoints = ?context.options.endpoints, "worker starting");
    loop {
        if shutdown.is_cancelled() {
            if context.options.hand_over.is_cancelled() {
                context.attempts.set_handing_over();
            } else {
                context.attempts.set_draining();
            }
            if context.attempts.awaited_count() == 0 {
                if context.attempts.all_reported() && context.attempts.all_acked() {
                    break;
                }
                let deadline = *give_up_at
                    .get_or_insert_with(|| Instant::now() + context.options.drain_flush_timeout);
                if Instant::now() >= deadline {
                    tracing::warn!("shutting down with reports no scheduler acknowledged");
                    break;
                }
            }
        }
        let target = rotation.next().await;
        if rotation.generation() != judged_generation {
            judged_generation = rotation.generation();
            let resolved = rotation.resolved();
            context.liveness.judge(
                resolved.targets.iter().map(|target| target.address),
                !resolved.unresolved.is_empty(),
            );
        }
        let Some(target) = target else {
            tracing::warn!(endpoints = ?context.options.endpoints, "no scheduler endpoint resolves; trying again");
            moving = false;
            pause(&context, &mut backoff, &shutdown).await;
            continue;
        };
        epoch += 1;
        // Right after a move the worker's stream was healthy: a node that does not answer soon
        // must not keep it from the others until the fence's count runs out.
        let handshake = if moving {
            move_handshake(&context)
        } else {
            context.options.register_timeout
        };
        let span = tracing::info_span!("connection", endpoint = %target.url, epoch);
        let outcome = session::run_session(&context, &target, epoch, handshake, &shutdown)
            .instrument(span.clone())
            .await;
        let after_move = std::mem::take(&mut moving);
        match outcome.result {
            Ok(SessionEnd::Drained) => break,
            Ok(SessionEnd::MoveAsked(request)) => {
                let found = rotation.after_move(&request.to_address).await;
                span.in_scope(|| {
                    tracing::info!(
                        reason = %request.reason,
                        to_address = %request.to_address,
                        to_one_of_ours = found,
                        "the node asked this worker to move; reconnecting at once"
                    );
                });
                backoff.reset();
                turned_away_in_a_row = 0;
                moving = true;
                continue;
            }
            Err(error) => {
                let refused = error.is_refused();
                if refused {
                    context.liveness.refused(target.address);
                }
                // A node that cannot reach its store sends the worker on as a refusal does,
                // though it proves nothing about liveness: another node may take it.
                if refused || error.is_node_cut_off() {
                    turned_away_in_a_row += 1;
                } else {
                    turned_away_in_a_row = 0;
                }
                let error = error_chain(&error);
                span.in_scope(|| {
                    tracing::warn!(%error, registered = outcome.registered, refused, "connection ended");
                });
            }
        }
        if outcome.registered {
            backoff.reset();
        }
        // A move costs no backoff, even when the node moved to does not take the worker.
        if after_move {
            continue;
        }
        // Nor does a node that refused or cannot reach its store while another may take the
        // worker (a cut-off node's silence in the store has used part of the dead-worker
        // threshold in which its workers must register elsewhere).
        if turned_away_in_a_row > 0 && turned_away_in_a_row < rotation.len() {
            continue;
        }
        turned_away_in_a_row = 0;
        pause(&context, &mut backoff, &shutdown).await;
    }
    context.tracker.close();
    if context.options.hand_over.is_cancelled() {
        let held = context.attempts.running_count();
        tracing::info!(
            held,
            "worker stopped; its next process takes back the held attempts still running"
        );
        return Ok(());
    }
    context.tracker.wait().await;
    tracing::info!("worker stopped");
    Ok(())
}

/// The fence count, taken over from the worker's previous process when it left held attempts:
/// their holders count from the moment no scheduler may have heard from that process, and a
/// restart must not start the count again.
fn seeded_liveness(state_dir: &std::path::Path, held: bool) -> Liveness {
    let previous = held
        .then(|| held::FenceState::read(&state_dir.join(held::HELD_DIR)))
        .flatten();
    match previous {
        Some(previous) => {
            let unheard = held::boot_ms().saturating_sub(previous.unheard_since_ms);
            let liveness = Liveness::unheard_since_start(Duration::from_millis(unheard));
            liveness.learn_dead_after(u32::try_from(previous.dead_after_ms).unwrap_or(u32::MAX));
            liveness
        }
        None => Liveness::new(),
    }
}

/// Keeps the fence file of the held attempts' holders current (see `held`).
async fn keep_fence_file(writer: Arc<held::FenceWriter>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(held::FENCE_TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Err(error) = writer.write_now() {
            tracing::warn!(%error, "cannot write the held attempts' fence file");
        }
    }
}

/// Takes back the held attempts an earlier process under this id left running (or ended):
/// each is admitted before the first Register, which lists it as running.
fn adopt_held(context: &Arc<Context>, dirs: Vec<held::HeldDir>) {
    for dir in dirs {
        let attempt = match dir.attempt() {
            Ok(attempt) => attempt,
            Err(error) => {
                tracing::warn!(dir = %dir.path().display(), %error, "a held attempt's directory without its attempt; removing it");
                dir.remove();
                continue;
            }
        };
        let key = attempt.key();
        let control = match context.attempts.admit(key, u32::MAX) {
            attempts::Admission::Accepted(control) => control,
            // Its end is already in the journal: the directory is left over.
            attempts::Admission::Duplicate | attempts::Admission::Rejected(_) => {
                dir.remove();
                continue;
            }
        };
        context.tracker.spawn(runner::adopt_attempt(
            Arc::clone(&context.attempts),
            Arc::clone(&context.runner),
            dir,
            attempt,
            control,
        ));
    }
}

/// 128 random bits as hex: this process's incarnation.
fn incarnation() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits out the next reconnect delay, or less when shutdown comes while nothing runs.
async fn pause(context: &Context, backoff: &mut Backoff, shutdown: &CancellationToken) {
    let delay = reconnect_delay(context, backoff);
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        // A shutdown while idle must not wait out a long backoff.
        () = shutdown.cancelled(), if context.attempts.awaited_count() == 0 && !shutdown.is_cancelled() => {}
    }
}

/// The self-fence delay in force: the configured one, shortened by the scheduler's threshold.
fn fence_delay(context: &Context) -> Option<Duration> {
    let dead_after = context.liveness.dead_after();
    match context.options.self_fence_after {
        Some(configured) => Some(fence::effective_delay(configured, dead_after)),
        None => dead_after.map(|threshold| threshold * 3 / 4),
    }
}

/// The handshake bound right after a move: the register timeout, but at most a quarter of the
/// fence delay, so a node that is moved to and does not answer leaves time for another.
fn move_handshake(context: &Context) -> Duration {
    let timeout = context.options.register_timeout;
    match fence_delay(context) {
        Some(fence) => timeout.min(fence / 4).max(Duration::from_millis(100)),
        None => timeout,
    }
}

/// The wait before the next round of connection attempts: the backoff's, but while attempts
/// run or their ends are not acknowledged at most a quarter of the self-fence delay (3/16 of
/// the scheduler's dead-worker threshold), so every address's refusal stays fresh enough to
/// show that no node is up to judge this worker, and a node that comes back hears from it well
/// within the threshold it gives workers from its start.
fn reconnect_delay(context: &Context, backoff: &mut Backoff) -> Duration {
    let delay = backoff.next_delay();
    let attempts = &context.attempts;
    if attempts.running_count() == 0 && attempts.unacknowledged().is_empty() {
        return delay;
    }
    match fence_delay(context) {
        Some(fence) => delay.min(fence / 4),
        None => delay,
    }
}

/// An error with its sources, because tonic's transport errors say little on their own.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A worker id as a file name: anything but ASCII letters, digits, `-`, `_` and `.` becomes `_`.
fn sanitize(worker_id: &str) -> String {
    worker_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
