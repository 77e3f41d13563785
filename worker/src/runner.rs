//! One attempt's process: spawn, log pump, timeout, cancellation, and the final report.
//! A held attempt's process is started and watched through its holder (`held`).

mod held;

use std::io;
use std::num::NonZeroU64;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ax_proto::v1::{
    AttemptFinished, AttemptOutcome, AttemptStarted, Dispatch, LogStream, TaskHeartbeat,
    WorkerMessage, worker_message::Body,
};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep, sleep, sleep_until};
use tracing::Instrument;

use crate::attempts::{AttemptKey, Attempts, Control};
use crate::command_line::plain_words;
use crate::logs::{BatchLimits, Batcher, PackedLines, pump_lines};
use crate::now_ms;
use crate::spawn::TaskCommand;

/// Reads (each up to 16 KiB of lines) buffered between the pipe readers and the batcher of one
/// attempt.
const LINE_CHANNEL: usize = 16;

/// How often a runner whose output is paused (the worker's spill budget is full) looks again.
const LOG_ROOM_POLL: Duration = Duration::from_millis(20);

/// How long the output pipes may stay open after the process group is gone (a daemonised
/// grandchild in another group can hold them forever).
const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(1);

/// The settings a runner needs.
#[derive(Debug, Clone)]
pub struct RunnerSettings {
    /// Kills the process groups of running attempts if this worker dies.
    pub guardian: Option<std::sync::Arc<crate::guardian::Guardian>>,
    pub kill_grace: Duration,
    pub max_line_bytes: usize,
    pub batch: BatchLimits,
    pub task_heartbeat_interval: Duration,
    /// The account tasks run as (`--task-user`); the worker's own when `None`.
    pub task_user: Option<crate::task_user::TaskUser>,
    /// Where each attempt's `$AX_OUTPUT` file is made (the worker's spill directory).
    pub outputs_dir: std::path::PathBuf,
    /// The worker's state directory: held attempts keep their directories under it.
    pub state_dir: std::path::PathBuf,
    /// The program that holds held attempts (this worker's own executable); `None` when it
    /// cannot be found, and held attempts then run as the worker's children.
    pub holder_program: Option<std::path::PathBuf>,
    /// Brings the holders' fence file up to date before a holder starts.
    pub fence_writer: Option<Arc<crate::held::FenceWriter>>,
}

/// Why the worker is killing an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KillReason {
    Timeout,
    Cancel(String),
    Fence(String),
    Forget,
}

/// Runs one admitted attempt to its end and records every report in `attempts`.
pub async fn run_attempt(
    attempts: Arc<Attempts>,
    settings: Arc<RunnerSettings>,
    dispatch: Dispatch,
    control: mpsc::UnboundedReceiver<Control>,
) {
    let span = attempt_span(&dispatch);
    crate::telemetry::join_trace(&span, &dispatch.env);
    let held = dispatch.survive_worker_restart && settings.holder_program.is_some();
    let runner = Runner::new(attempts, settings, dispatch, control);
    if held {
        runner.run_held().instrument(span).await;
    } else {
        runner.run().instrument(span).await;
    }
}

/// Takes back a held attempt an earlier worker process under this id started (see `held`).
pub(crate) async fn adopt_attempt(
    attempts: Arc<Attempts>,
    settings: Arc<RunnerSettings>,
    dir: crate::held::HeldDir,
    attempt: crate::held::HeldAttempt,
    control: mpsc::UnboundedReceiver<Control>,
) {
    let dispatch = Dispatch {
        instance_id: attempt.instance_id,
        attempt: attempt.attempt,
        task: attempt.task.clone(),
        timeout_ms: attempt.timeout_ms,
        keep_when_cut_off: attempt.keep_when_cut_off,
        survive_worker_restart: true,
        ..Dispatch::default()
    };
    let span = attempt_span(&dispatch);
    Runner::new(attempts, settings, dispatch, control)
        .adopt(dir)
        .instrument(span)
        .await;
}

fn attempt_span(dispatch: &Dispatch) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        instance = dispatch.instance_id,
        attempt = dispatch.attempt,
        task = %dispatch.task,
        otel.name = tracing::field::Empty,
    )
}

fn key_of(dispatch: &Dispatch) -> AttemptKey {
    AttemptKey {
        instance_id: dispatch.instance_id,
        attempt: dispatch.attempt,
    }
}

struct Runner {
    attempts: Arc<Attempts>,
    settings: Arc<RunnerSettings>,
    key: AttemptKey,
    dispatch: Dispatch,
    watch: Watch,
}

impl Runner {
    fn new(
        attempts: Arc<Attempts>,
        settings: Arc<RunnerSettings>,
        dispatch: Dispatch,
        control: mpsc::UnboundedReceiver<Control>,
    ) -> Runner {
        Runner {
            attempts,
            key: key_of(&dispatch),
            watch: Watch {
                control,
                control_open: true,
                pgid: 0,
                holder: None,
                grace: settings.kill_grace,
                timeout: None,
                // The wire's 0 is no timeout.
                time_limit: NonZeroU64::new(dispatch.timeout_ms)
                    .map(|ms| Duration::from_millis(ms.get())),
                keep_when_cut_off: dispatch.keep_when_cut_off,
                reason: None,
                sigkill_at: None,
                exited: false,
            },
            settings,
            dispatch,
        }
    }
}

/// Everything that can end an attempt from the outside: cancel and kill requests, the timeout,
/// and the SIGKILL that follows a SIGTERM after the grace.
struct Watch {
    control: mpsc::UnboundedReceiver<Control>,
    control_open: bool,
    /// The process group to signal; 0 until the process is started.
    pgid: i32,
    /// A held attempt's holder: the worker asks it to end the task, and keeps the reason in the
    /// attempt's directory for its next process.
    holder: Option<held::HolderHandle>,
    grace: Duration,
    /// Kept across steps: a timer made anew at each step could be dropped before it fires, every
    /// time, while the task's output keeps the loop busy.
    timeout: Option<Pin<Box<Sleep>>>,
    /// How long the attempt may run; `None`: as long as it takes.
    time_limit: Option<Duration>,
    /// The task opted out of self-fencing.
    keep_when_cut_off: bool,
    reason: Option<KillReason>,
    sigkill_at: Option<Pin<Box<Sleep>>>,
    exited: bool,
}

impl Watch {
    /// Waits for the next outside event and acts on it; never completes when nothing is armed.
    /// Cancel safe: every branch is.
    async fn step(&mut self) {
        let timeout_armed = self.timeout.is_some() && self.reason.is_none() && !self.exited;
        tokio::select! {
            request = self.control.recv(), if self.control_open => match request {
                Some(Control::Cancel { reason }) => {
                    tracing::info!(%reason, "cancelling attempt");
                    self.kill(KillReason::Cancel(reason));
                }
                Some(Control::Fence { reason }) if self.keep_when_cut_off => {
                    tracing::warn!(%reason, "not fencing this attempt: its task opted out (self_fence: false)");
                }
                Some(Control::Fence { reason }) => {
                    tracing::warn!(%reason, "self-fencing: killing attempt");
                    self.kill(KillReason::Fence(reason));
                }
                Some(Control::Kill) => {
                    tracing::info!("killing attempt the scheduler no longer considers current");
                    self.kill(KillReason::Forget);
                }
                None => self.control_open = false,
            },
            () = elapsed(&mut self.timeout), if timeout_armed => {
                tracing::info!(timeout = ?self.time_limit, "attempt timed out");
                self.kill(KillReason::Timeout);
            }
            () = elapsed(&mut self.sigkill_at), if self.sigkill_at.is_some() => {
                self.sigkill_at = None;
                if signal_group(self.pgid, 0) {
                    tracing::info!("process group outlived the grace period; sending SIGKILL");
                    signal_group(self.pgid, libc::SIGKILL);
                }
            }
            else => std::future::pending::<()>().await,
        }
    }

    /// Sends SIGTERM to the group and arms the SIGKILL. The first reason is the one reported,
    /// except that a refused attempt is never reported, and a process that already exited on its
    /// own is reported as it ended.
    fn kill(&mut self, reason: KillReason) {
        match (&self.reason, &reason) {
            (_, KillReason::Forget) => self.reason = Some(reason),
            (None, _) if !self.exited => self.reason = Some(reason),
            _ => {}
        }
        if let Some(holder) = &mut self.holder {
            if let Some(reason) = &self.reason {
                holder.end_task(reason);
            }
            return;
        }
        if self.sigkill_at.is_none() && signal_group(self.pgid, libc::SIGTERM) {
            self.sigkill_at = Some(Box::pin(sleep(self.grace)));
        }
    }

    /// The attempt owns its process group: when its main process ends, whatever it left behind
    /// in the group is ended too (SIGTERM, then SIGKILL after the grace), so nothing outlives an
    /// attempt and holds its output pipes open.
    fn exited(&mut self, status: &io::Result<ExitStatus>) {
        self.exited = true;
        if let Err(error) = status {
            tracing::warn!(%error, "waiting for the attempt's process failed");
        }
        if signal_group(self.pgid, 0) {
            tracing::info!("attempt left processes behind in its group; terminating them");
            if signal_group(self.pgid, libc::SIGTERM) && self.sigkill_at.is_none() {
                self.sigkill_at = Some(Box::pin(sleep(self.grace)));
            }
        }
    }
}

impl Runner {
    async fn run(mut self) {
        let mut command = task_command(&self.dispatch);
        let output_file = match self.output_file() {
            Ok(path) => path,
            Err(error) => {
                tracing::warn!(%error, "cannot make the attempt's $AX_OUTPUT file");
                let report = AttemptFinished {
                    instance_id: self.key.instance_id,
                    attempt: self.key.attempt,
                    outcome: AttemptOutcome::SpawnFailed as i32,
                    finished_at_ms: now_ms(),
                    message: format!("spawn failed: cannot make the $AX_OUTPUT file: {error}"),
                    ..AttemptFinished::default()
                };
                self.send_finished(report).await;
                return;
            }
        };
        command.env("AX_OUTPUT", &output_file);
        if let Some(user) = &self.settings.task_user {
            command.run_as(user);
            // The dispatch's own values win, as they do over the worker's environment.
            for key in ["HOME", "USER", "LOGNAME"] {
                if let Some(value) = self.dispatch.env.get(key) {
                    command.env(key, value);
                }
            }
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                tracing::warn!(%error, "attempt could not be started");
                let report = AttemptFinished {
                    instance_id: self.key.instance_id,
                    attempt: self.key.attempt,
                    outcome: AttemptOutcome::SpawnFailed as i32,
                    finished_at_ms: now_ms(),
                    message: format!("spawn failed: {error}"),
                    ..AttemptFinished::default()
                };
                self.send_finished(report).await;
                return;
            }
        };
        let start = Instant::now();
        let pid = child.id();
        // The child leads its own process group, so its pid is the group id.
        self.watch.pgid = i32::try_from(pid).unwrap_or(0);
        if let Some(guardian) = &self.settings.guardian {
            guardian.watch(self.watch.pgid);
        }
        self.watch.timeout = self
            .watch
            .time_limit
            .map(|limit| Box::pin(sleep_until(start + limit)));
        tracing::info!(pid, "attempt started");
        let started = AttemptStarted {
            instance_id: self.key.instance_id,
            attempt: self.key.attempt,
            pid,
            started_at_ms: now_ms(),
        };
        if let Some((link, message)) = self.attempts.started(self.key, started) {
            link.send(message).await;
        }

        let (line_tx, mut lines) = mpsc::channel::<PackedLines>(LINE_CHANNEL);
        let mut readers = Vec::new();
        let heartbeat_every = self
            .settings
            .task_heartbeat_interval
            .max(Duration::from_millis(10));
        let shipper = Shipper::start(Arc::clone(&self.attempts), self.key, heartbeat_every);
        for (pipe, stream) in [
            (child.stdout.take(), LogStream::Stdout),
            (child.stderr.take(), LogStream::Stderr),
        ] {
            let Some(pipe) = pipe else { continue };
            let tx = line_tx.clone();
            let max = self.settings.max_line_bytes;
            let fd = pipe.as_raw_fd();
            readers.push(tokio::spawn(
                async move { pump_lines(pipe, stream, max, Some(fd), tx).await }.in_current_span(),
            ));
        }
        drop(line_tx);

        let mut batcher = Batcher::new(self.settings.batch);
        let mut exit: Option<io::Result<ExitStatus>> = None;
        let mut exited_at_ms = None;
        let mut drain_until: Option<Instant> = None;
        let mut readers_done = false;
        let mut paused = false;

        loop {
            if exit.is_some() && (readers_done || drain_until.is_some_and(|t| Instant::now() >= t))
            {
                break;
            }
            let room = self.attempts.has_log_room(self.key);
            if room == paused {
                paused = !room;
                if paused {
                    tracing::warn!(
                        "the worker's spill files hold their budget of unacknowledged log lines; \
                         not reading this attempt's output until the scheduler acknowledges some"
                    );
                } else {
                    tracing::info!("reading the attempt's output again");
                }
            }
            tokio::select! {
                () = self.watch.step() => {}
                status = child.wait(), if exit.is_none() => {
                    self.watch.exited(&status);
                    exit = Some(status);
                    exited_at_ms = Some(now_ms());
                    drain_until = Some(Instant::now() + self.settings.kill_grace + PIPE_DRAIN_GRACE);
                }
                () = sleep(LOG_ROOM_POLL), if paused => {}
                read = lines.recv(), if !readers_done && !paused => match read {
                    Some(read) => {
                        if batcher.push(read) {
                            self.flush(&mut batcher, Some(&shipper));
                        }
                    }
                    None => readers_done = true,
                },
                () = sleep_until(batcher.deadline().unwrap_or(start)), if batcher.deadline().is_some() => {
                    self.flush(&mut batcher, Some(&shipper));
                }
                () = sleep_until(drain_until.unwrap_or(start)), if drain_until.is_some() && !readers_done => {
                    tracing::warn!("output pipes still open after the process group ended; closing them");
                }
            }
        }
        for reader in &readers {
            reader.abort();
        }
        // The attempt is over: whatever is left of its group was told to stop when the main
        // process ended, and goes now; only then is the group struck off the guardian's list.
        if self.watch.pgid > 0 {
            if signal_group(self.watch.pgid, 0) {
                signal_group(self.watch.pgid, libc::SIGKILL);
            }
            if let Some(guardian) = &self.settings.guardian {
                guardian.unwatch(self.watch.pgid);
            }
        }
        // Lines already queued by the readers still belong to the attempt.
        while let Ok(read) = lines.try_recv() {
            if batcher.push(read) {
                self.flush(&mut batcher, Some(&shipper));
            }
        }
        self.flush(&mut batcher, Some(&shipper));
        // Every batch is handed to the stream before the end is reported, so a scheduler sees
        // an attempt's lines before its end on one stream.
        shipper.finish().await;
        let kill = self.watch.reason.take();
        if matches!(kill, Some(KillReason::Forget)) {
            // Finished removes the forgotten entry and sends nothing.
            self.attempts.finished(self.key, AttemptFinished::default());
            return;
        }
        let mut report = self.report(exit, kill, batcher.lines_taken());
        report.finished_at_ms = exited_at_ms.unwrap_or(report.finished_at_ms);
        read_outputs(&mut report, &output_file);
        tracing::info!(
            outcome = ?AttemptOutcome::try_from(report.outcome).unwrap_or_default(),
            exit_code = ?report.exit_code,
            signal = ?report.signal,
            log_lines = report.log_lines,
            "attempt finished"
        );
        self.send_finished(report).await;
    }

    fn report(
        &self,
        exit: Option<io::Result<ExitStatus>>,
        kill: Option<KillReason>,
        log_lines: u64,
    ) -> AttemptFinished {
        let mut report = AttemptFinished {
            instance_id: self.key.instance_id,
            attempt: self.key.attempt,
            finished_at_ms: now_ms(),
            log_lines,
            ..AttemptFinished::default()
        };
        let status = match exit {
            Some(Ok(status)) => status,
            Some(Err(error)) => {
                report.outcome = AttemptOutcome::Failed as i32;
                report.message = format!("waiting for the process failed: {error}");
                return report;
            }
            None => {
                report.outcome = AttemptOutcome::Failed as i32;
                report.message = "the process was not observed to exit".into();
                return report;
            }
        };
        report.exit_code = status.code();
        report.signal = status.signal();
        let (outcome, message) = match kill {
            Some(KillReason::Timeout) => (
                AttemptOutcome::Timeout,
                format!(
                    "killed after the timeout of {} ms",
                    self.dispatch.timeout_ms
                ),
            ),
            Some(KillReason::Cancel(reason)) => (AttemptOutcome::Cancelled, reason),
            Some(KillReason::Fence(reason)) => (AttemptOutcome::Failed, reason),
            Some(KillReason::Forget) | None => match (status.code(), status.signal()) {
                (Some(0), _) => (AttemptOutcome::Success, String::new()),
                (Some(code), _) => (AttemptOutcome::Failed, format!("exited with code {code}")),
                (None, Some(signal)) => {
                    (AttemptOutcome::Failed, format!("killed by signal {signal}"))
                }
                (None, None) => (
                    AttemptOutcome::Failed,
                    "ended without exit code or signal".into(),
                ),
            },
        };
        report.outcome = outcome as i32;
        report.message = message;
        report
    }

    /// The attempt's `$AX_OUTPUT` path, in a directory only the worker's account can enter.
    /// The task makes the file when it writes one (most write none, and making and removing a
    /// file per attempt is a measurable part of a short task's cost); under `--task-user` the
    /// task's account cannot make files there, so the worker makes it, empty, for that account
    /// alone.
    fn output_file(&self) -> io::Result<std::path::PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = &self.settings.outputs_dir;
        let task_user = self.settings.task_user.as_ref();
        if !dir.is_dir() {
            prepare_outputs_dir(dir, task_user.is_some())?;
        }
        let path = dir.join(format!(
            "output-{}-{}",
            self.key.instance_id, self.key.attempt
        ));
        // A file left by an earlier worker process under this id is not this attempt's.
        let _ = std::fs::remove_file(&path);
        if let Some(user) = task_user {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid))?;
        }
        Ok(path)
    }

    /// Cuts the pending lines into a batch and hands it to the shipper.
    fn flush(&self, batcher: &mut Batcher, shipper: Option<&Shipper>) {
        let Some(frame) = batcher.take(self.key.instance_id, self.key.attempt, now_ms()) else {
            return;
        };
        if self.attempts.logs(self.key, frame)
            && let Some(shipper) = shipper
        {
            shipper.wake();
        }
    }

    /// Keeps the end on disk and sends it, and returns once it is on disk: a worker killed after
    /// that still reports it when it starts again under the same id. The report does not wait
    /// for the sync: a scheduler that has the end needs nothing from the disk, and one that does
    /// not is no worse off for having been sent it early (a kill before the sync loses the end
    /// either way), while each end would otherwise wait a sync before its slot frees.
    async fn send_finished(&self, report: AttemptFinished) {
        let kept = self.attempts.keep_end(self.key, &report);
        if let Some((link, message)) = self.attempts.finished(self.key, report) {
            link.send(message).await;
        }
        if let Some(kept) = kept {
            match kept.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, "the end could not be kept on disk");
                }
                Err(_) => tracing::warn!("the ends journal stopped; the end is not kept on disk"),
            }
        }
    }
}

/// Makes the directory of the attempts' `$AX_OUTPUT` files (and sets the mode of one left by
/// an earlier worker): 0700, so that no other account reads a task's outputs whatever mode the
/// task made its file with; 0711 when tasks run as another account, which may then open the file
/// made for it but list nothing. That account must also pass through the spill directory
/// above it, which gets the same search bits (its own files stay 0600).
pub(crate) fn prepare_outputs_dir(dir: &std::path::Path, task_user: bool) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if task_user && let Some(parent) = dir.parent() {
        let mode = std::fs::metadata(parent)?.permissions().mode() & 0o7777;
        if mode & 0o011 != 0o011 {
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode | 0o011))?;
        }
    }
    let mode = if task_user { 0o711 } else { 0o700 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Puts what a successful attempt wrote to `$AX_OUTPUT` in its report, and removes the file. A
/// file that is not outputs (too large, malformed) fails the attempt, saying why: a downstream
/// task must not run on a truncated or misread value.
pub(crate) fn read_outputs(report: &mut AttemptFinished, path: &std::path::Path) {
    let read = read_capped(path);
    if !matches!(&read, Err(error) if error.kind() == io::ErrorKind::NotFound) {
        let _ = std::fs::remove_file(path);
    }
    if report.outcome != AttemptOutcome::Success as i32 {
        return;
    }
    let parsed = match read {
        Ok(Ok(bytes)) => ax_core::outputs::parse(&bytes).map_err(|e| e.to_string()),
        Ok(Err(size)) => Err(ax_core::outputs::OutputsError::TooLarge { size }.to_string()),
        // The task made no file (or removed its own): it wrote nothing.
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Default::default()),
        Err(error) => Err(format!("cannot read $AX_OUTPUT: {error}")),
    };
    match parsed {
        Ok(outputs) => report.outputs = outputs.into_iter().collect(),
        Err(problem) => {
            report.outcome = AttemptOutcome::Failed as i32;
            report.message = format!("outputs refused: {problem}");
        }
    }
}

/// The bytes of an `$AX_OUTPUT` file, or its size when that is past what an attempt may pass
/// on: the task's code is not trusted to keep the file small, and the worker never holds more
/// of it than the limit (and one byte, which a file still growing may add).
fn read_capped(path: &std::path::Path) -> io::Result<Result<Vec<u8>, usize>> {
    use std::io::Read;
    let limit = ax_core::outputs::MAX_ATTEMPT_BYTES;
    let file = std::fs::File::open(path)?;
    let size = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    if size > limit {
        return Ok(Err(size));
    }
    let mut bytes = Vec::with_capacity(size);
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    Ok(Ok(bytes))
}

/// Sends one attempt's recorded log batches on the current stream, in order, and its task
/// heartbeats, apart from the runner: the runner reads the task's pipes as fast as the task
/// writes, and records what it reads (`Attempts::logs`: memory up to the worker's bound, then the
/// attempt's spill file), so a slow stream or scheduler costs disk, not the task's speed, and
/// never delays a cancel or a timeout. A batch a dead stream may have lost is replayed by the next
/// one; heartbeats are not replayed (a stale one says nothing), but they queue with the batches,
/// so a busy stream delays them without starving them.
struct Shipper {
    wake: Arc<Notify>,
    finishing: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Shipper {
    fn start(attempts: Arc<Attempts>, key: AttemptKey, heartbeat_every: Duration) -> Shipper {
        let wake = Arc::new(Notify::new());
        let finishing = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(
            Shipper::ship(
                attempts,
                key,
                Arc::clone(&wake),
                Arc::clone(&finishing),
                heartbeat_every,
            )
            .in_current_span(),
        );
        Shipper {
            wake,
            finishing,
            task,
        }
    }

    fn wake(&self) {
        self.wake.notify_one();
    }

    /// Sends what is recorded and not yet sent on the current stream, then ends.
    async fn finish(self) {
        self.finishing.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "the log shipper failed");
        }
    }

    async fn ship(
        attempts: Arc<Attempts>,
        key: AttemptKey,
        wake: Arc<Notify>,
        finishing: Arc<AtomicBool>,
        heartbeat_every: Duration,
    ) {
        let mut next_heartbeat = Instant::now() + heartbeat_every;
        let heartbeat_due = |next: &mut Instant| {
            let now = Instant::now();
            let due = now >= *next;
            if due {
                *next = now + heartbeat_every;
            }
            due
        };
        loop {
            // Read before sending, so the wake-up of `finish` is never mistaken for an older one.
            let last_round = finishing.load(Ordering::Acquire);
            let mut heartbeat = heartbeat_due(&mut next_heartbeat) && !last_round;
            if let Some(link) = attempts.link() {
                loop {
                    if heartbeat && !link.send(task_heartbeat(key)).await {
                        break;
                    }
                    let Some(frame) = attempts.take_unsent(key, link.epoch) else {
                        break;
                    };
                    if !link.send(frame).await {
                        break;
                    }
                    heartbeat = heartbeat_due(&mut next_heartbeat);
                }
            }
            if last_round {
                return;
            }
            tokio::select! {
                () = wake.notified() => {}
                () = sleep_until(next_heartbeat) => {}
            }
        }
    }
}

fn task_heartbeat(key: AttemptKey) -> WorkerMessage {
    WorkerMessage {
        body: Some(Body::TaskHeartbeat(TaskHeartbeat {
            instance_id: key.instance_id,
            attempt: key.attempt,
            sent_at_ms: now_ms(),
        })),
    }
}

/// Waits for `timer`, if there is one.
async fn elapsed(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Sends `signal` to the whole process group `pgid` (0 only probes). Returns whether the group
/// still has members. Signalling the group, not the pid, is what takes grandchildren such as
/// `sh -c 'sleep 100 & wait'` down with the attempt.
pub(crate) fn signal_group(pgid: i32, signal: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid addresses a group.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// The command of a dispatch: `argv` when it is given, else the command line, started
/// directly when no shell is needed for it (`command_line.rs`) and through `/bin/sh -c`
/// otherwise; with the worker's environment and the dispatch's.
fn task_command(dispatch: &Dispatch) -> TaskCommand {
    if dispatch.argv.is_empty()
        && let Some(words) = plain_words(&dispatch.command)
    {
        let mut command = with_task_context(program_command(&words), dispatch);
        if command.executes_directly() {
            // What the shell would have exported: the directory it runs in.
            if let Ok(mut dir) = std::env::current_dir() {
                if !dispatch.working_dir.is_empty() {
                    dir.push(&dispatch.working_dir);
                }
                command.env("PWD", dir);
            }
            return command;
        }
    }
    let command = match dispatch.argv.split_first() {
        Some(_) => program_command(&dispatch.argv),
        None => program_command(&["/bin/sh", "-c", &dispatch.command]),
    };
    with_task_context(command, dispatch)
}

/// `words[0]` with the rest as its arguments.
fn program_command<S: AsRef<std::ffi::OsStr>>(words: &[S]) -> TaskCommand {
    let mut command = TaskCommand::new(words.first().map_or("".as_ref(), AsRef::as_ref));
    for word in words.iter().skip(1) {
        command.arg(word.as_ref());
    }
    command
}

/// The task's environment (the scheduler sends the attempt's `AX_*` variables in it) and its
/// working directory.
fn with_task_context(mut command: TaskCommand, dispatch: &Dispatch) -> TaskCommand {
    for (key, value) in &dispatch.env {
        command.env(key, value);
    }
    if !dispatch.working_dir.is_empty() {
        command.current_dir(&dispatch.working_dir);
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dispatch with the environment a scheduler sends.
    fn dispatch(command: &str, working_dir: &std::path::Path) -> Dispatch {
        Dispatch {
            command: command.into(),
            working_dir: working_dir.display().to_string(),
            task: "nap".into(),
            env: [("AX_TASK".to_string(), "nap".to_string())].into(),
            ..Dispatch::default()
        }
    }

    async fn run(command: &TaskCommand) -> (String, i32) {
        // A script just written may still be open in a process another test is starting,
        // between its clone and its exec (Text file busy); that passes.
        let mut busy = 0;
        let mut process = loop {
            match command.spawn() {
                Err(error) if error.kind() == io::ErrorKind::ExecutableFileBusy && busy < 100 => {
                    busy += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                spawned => break spawned.expect("spawn"),
            }
        };
        let (stdout, _, status) = process.output().await.expect("output");
        (
            String::from_utf8(stdout).expect("UTF-8"),
            status.code().unwrap_or(-1),
        )
    }

    #[tokio::test]
    async fn a_plain_command_line_starts_without_a_shell_and_sees_what_the_shell_would_give() {
        let dir = tempfile::tempdir().expect("tempdir");
        let command = task_command(&dispatch("env", dir.path()));
        assert_eq!(command.get_program(), "env", "no shell in between");
        let (out, code) = run(&command).await;
        assert_eq!(code, 0);
        assert!(
            out.lines()
                .any(|l| l == format!("PWD={}", dir.path().display())),
            "{out}"
        );
        assert!(out.lines().any(|l| l == "AX_TASK=nap"), "{out}");

        // The exit status is the program's own, as through `sh -c`.
        let command = task_command(&dispatch("sleep notanumber", dir.path()));
        assert_eq!(command.get_program(), "sleep");
        let (_, code) = run(&command).await;
        assert_eq!(code, 1);
    }

    /// An executable file `name` in `dir` holding `text`.
    fn write_script(dir: &std::path::Path, name: &str, text: &str) {
        let script = dir.join(name);
        std::fs::write(&script, text).expect("write");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }

    #[tokio::test]
    async fn what_only_a_shell_can_run_keeps_the_shell() {
        let dir = tempfile::tempdir().expect("tempdir");
        for line in [
            "echo $AX_TASK",
            "exit 3",
            "missing-program-xyz",
            "FOO=1 env",
        ] {
            let command = task_command(&dispatch(line, dir.path()));
            assert_eq!(command.get_program(), "/bin/sh", "{line}");
        }
        let (out, _) = run(&task_command(&dispatch("echo $AX_TASK", dir.path()))).await;
        assert_eq!(out, "nap\n");
        let (_, code) = run(&task_command(&dispatch("missing-program-xyz", dir.path()))).await;
        assert_eq!(code, 127, "the shell's 'not found'");

        // A script without a `#!` line is run by the shell, as `sh -c` would.
        write_script(dir.path(), "plain-script", "echo from-script\n");
        let command = task_command(&dispatch("./plain-script", dir.path()));
        assert_eq!(command.get_program(), "/bin/sh");
        let (out, code) = run(&command).await;
        assert_eq!((out.as_str(), code), ("from-script\n", 0));

        // With a `#!` line it starts directly, from the working directory.
        write_script(
            dir.path(),
            "hashbang-script",
            "#!/bin/sh\necho from-hashbang\n",
        );
        let command = task_command(&dispatch("./hashbang-script", dir.path()));
        assert_eq!(command.get_program(), "./hashbang-script");
        let (out, code) = run(&command).await;
        assert_eq!((out.as_str(), code), ("from-hashbang\n", 0));
    }
}
