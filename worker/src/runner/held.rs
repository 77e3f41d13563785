//! A held attempt, from the worker's side: starting its holder (or taking back one an earlier
//! worker process started), cutting its spooled output into batches, asking the holder to end
//! it, and reporting the end the holder recorded. The files are described in `crate::held`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use ax_proto::v1::{AttemptFinished, AttemptOutcome, AttemptStarted};
use tokio::io::AsyncBufReadExt;
use tokio::io::unix::AsyncFd;
use tokio::time::{Instant, sleep, sleep_until};

use super::{KillReason, Runner, Shipper, task_command};
use crate::held::{
    Boundary, HeldAttempt, HeldDir, HeldEnd, HeldStart, SpoolReader, boot_ms, holder_alive,
};
use crate::logs::Batcher;
use crate::now_ms;
use crate::spawn::TaskProcess;

/// A batcher set to go on where the recorded batches end, and the spool offset there.
struct Spooled {
    batcher: Batcher,
    offset: u64,
}

/// How often the worker reads what the holder spooled.
const TAIL_TICK: Duration = Duration::from_millis(20);

/// How long a holder may take to say whether the task started.
const HOLDER_START_LIMIT: Duration = Duration::from_secs(30);

/// How long a restarted worker waits for a holder that has not yet recorded itself or the task.
const HOLDER_RECORD_LIMIT: Duration = Duration::from_secs(10);

/// The holder of a running held attempt, as the runner's watch sees it: where to record why
/// the attempt ends, and how to reach the holder.
#[derive(Debug)]
pub(crate) struct HolderHandle {
    dir: HeldDir,
    target: SignalTarget,
    asked: bool,
}

#[derive(Debug)]
enum SignalTarget {
    /// This worker's child, not reaped while the runner may signal it.
    Pid(i32),
    /// An earlier worker's holder, reached through a pidfd so that a reused pid is never hit.
    PidFd(OwnedFd),
    /// A holder that had already ended.
    Gone,
}

impl HolderHandle {
    /// Records why the attempt ends, then asks the holder to end the task (once).
    pub(crate) fn end_task(&mut self, reason: &KillReason) {
        if let Err(error) = self.dir.note_kill(reason) {
            tracing::warn!(%error, "cannot record why the held attempt ends");
        }
        if self.asked {
            return;
        }
        self.asked = true;
        self.signal(libc::SIGTERM);
    }

    fn signal(&self, signal: i32) {
        match &self.target {
            SignalTarget::Pid(pid) => {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(*pid, signal) };
            }
            SignalTarget::PidFd(pidfd) => {
                // SAFETY: pidfd_send_signal on a pidfd we own; no siginfo.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        pidfd.as_raw_fd(),
                        signal,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
            }
            SignalTarget::Gone => {}
        }
    }
}

/// The holder's exit, awaited.
#[derive(Debug)]
enum HolderProcess {
    /// Started by this worker process: its child, reaped here.
    Child(TaskProcess),
    /// Started by an earlier worker process: watched through a pidfd.
    Adopted(AsyncFd<OwnedFd>),
    /// Found ended by a restarted worker.
    Gone,
}

impl HolderProcess {
    /// Waits until the holder has exited. Cancel safe.
    async fn exited(&mut self) {
        match self {
            HolderProcess::Child(child) => {
                let _ = child.wait().await;
            }
            HolderProcess::Adopted(pidfd) => {
                let _ = pidfd.readable().await;
            }
            HolderProcess::Gone => {}
        }
    }

    fn handle(&self, dir: &HeldDir) -> io::Result<HolderHandle> {
        let target = match self {
            HolderProcess::Child(child) => SignalTarget::Pid(child.id().cast_signed()),
            HolderProcess::Adopted(pidfd) => SignalTarget::PidFd(pidfd.get_ref().try_clone()?),
            HolderProcess::Gone => SignalTarget::Gone,
        };
        Ok(HolderHandle {
            dir: dir.clone(),
            target,
            asked: false,
        })
    }
}

impl Runner {
    /// Starts a held attempt: its directory, its holder, and then as [`Runner::follow`].
    pub(super) async fn run_held(self) {
        let dir = HeldDir::of(&self.settings.state_dir, self.key);
        let attempt = HeldAttempt {
            instance_id: self.key.instance_id,
            attempt: self.key.attempt,
            timeout_ms: self.dispatch.timeout_ms,
            keep_when_cut_off: self.dispatch.keep_when_cut_off,
            task: self.dispatch.task.clone(),
        };
        let output_file = match self.output_file() {
            Ok(path) => path,
            Err(error) => {
                return self
                    .spawn_failed(format!("cannot make the $AX_OUTPUT file: {error}"))
                    .await;
            }
        };
        if let Err(error) = dir.create(&attempt) {
            return self
                .spawn_failed(format!("cannot make the held attempt's directory: {error}"))
                .await;
        }
        self.attempts.hold(self.key);
        let mut task = task_command(&self.dispatch);
        task.env("AX_OUTPUT", &output_file);
        if let Some(user) = &self.settings.task_user {
            task.env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
            for key in ["HOME", "USER", "LOGNAME"] {
                if let Some(value) = self.dispatch.env.get(key) {
                    task.env(key, value);
                }
            }
        }
        let Some(program) = self.settings.holder_program.clone() else {
            return self.spawn_failed("no holder program".into()).await;
        };
        // The holder fences on this file from its first moment: it must not be older than the
        // contact that brought this dispatch.
        if let Some(writer) = &self.settings.fence_writer
            && let Err(error) = writer.write_now()
        {
            dir.remove();
            return self
                .spawn_failed(format!("cannot write the holders' fence file: {error}"))
                .await;
        }
        let ids = self
            .settings
            .task_user
            .as_ref()
            .map(|user| (user.uid, user.gid, user.groups.as_slice()));
        let arguments = crate::held::holder::arguments(
            dir.path(),
            self.settings.max_line_bytes,
            self.settings.kill_grace,
            self.dispatch.keep_when_cut_off,
            ids,
        );
        let mut holder = task.held_by(program, arguments);
        holder.detach();
        let mut child = match holder.spawn() {
            Ok(child) => child,
            Err(error) => {
                dir.remove();
                return self
                    .spawn_failed(format!("cannot start the attempt's holder: {error}"))
                    .await;
            }
        };
        let answer = match child.stdout.take() {
            Some(stdout) => {
                let mut line = String::new();
                let mut reader = tokio::io::BufReader::new(stdout);
                match tokio::time::timeout(HOLDER_START_LIMIT, reader.read_line(&mut line)).await {
                    Ok(Ok(_)) => line.trim_end().to_string(),
                    Ok(Err(error)) => format!("failed reading the holder's answer: {error}"),
                    Err(_) => "failed the holder did not answer".into(),
                }
            }
            None => "failed the holder has no stdout".into(),
        };
        drop(child.stderr.take());
        let mut process = HolderProcess::Child(child);
        if answer != "started" {
            // The holder recorded the failure as its end and exits at once (or is made to).
            if let HolderProcess::Child(child) = &process {
                // SAFETY: our child, not yet reaped.
                unsafe { libc::kill(child.id().cast_signed(), libc::SIGKILL) };
            }
            process.exited().await;
            dir.remove();
            let message = answer.strip_prefix("failed ").unwrap_or(&answer);
            tracing::warn!(%message, "held attempt could not be started");
            return self.spawn_failed(message.to_string()).await;
        }
        let started = match dir.started() {
            Ok(started) => Some(started),
            Err(error) => {
                tracing::warn!(%error, "the holder recorded no start; ending the attempt");
                if let HolderProcess::Child(child) = &process {
                    // SAFETY: our child, not yet reaped.
                    unsafe { libc::kill(child.id().cast_signed(), libc::SIGKILL) };
                }
                None
            }
        };
        self.follow(dir, process, started, output_file).await;
    }

    /// Takes back a held attempt an earlier worker process under this id started.
    pub(super) async fn adopt(self, dir: HeldDir) {
        self.attempts.hold(self.key);
        let output_file = self.settings.outputs_dir.join(format!(
            "output-{}-{}",
            self.key.instance_id, self.key.attempt
        ));
        // The holder records itself, then the task; an earlier worker may have died between.
        let give_up = Instant::now() + HOLDER_RECORD_LIMIT;
        let (holder, started) = loop {
            let holder = dir.holder().ok();
            let started = dir.started().ok();
            let ended = matches!(dir.end(), Ok(Some(_)));
            let alive = holder.is_some_and(holder_alive);
            if ended || !alive || started.is_some() || Instant::now() >= give_up {
                break (holder.filter(|_| alive), started);
            }
            sleep(Duration::from_millis(50)).await;
        };
        let pidfd = holder.and_then(|holder| {
            crate::spawn::pidfd_open(holder.pid)
                .ok()
                // The pid was the holder's when the pidfd was opened: check again.
                .filter(|_| holder_alive(holder))
                // SAFETY: the AsyncFd owns the pidfd, which stays open and the same until
                // it is dropped.
                .and_then(|fd| {
                    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .ok()
                })
        });
        let process = match pidfd {
            Some(pidfd) => HolderProcess::Adopted(pidfd),
            None => HolderProcess::Gone,
        };
        match (&process, started) {
            (HolderProcess::Gone, _) => {
                tracing::info!("taking back a held attempt whose holder has ended");
            }
            (_, None) => {
                // A holder that never recorded its task in time: it is ended.
                tracing::warn!("the held attempt's holder recorded no task; ending it");
                if let Ok(handle) = process.handle(&dir) {
                    handle.signal(libc::SIGKILL);
                }
            }
            (_, Some(started)) => tracing::info!(
                pid = started.task_pid,
                "taking back a held attempt an earlier worker process started"
            ),
        }
        self.follow(dir, process, started, output_file).await;
    }

    /// Reports the start, then cuts the spooled output into batches until the holder exits,
    /// enforcing the timeout and passing cancels, fences and refusals on to the holder.
    async fn follow(
        mut self,
        dir: HeldDir,
        mut process: HolderProcess,
        started: Option<HeldStart>,
        output_file: std::path::PathBuf,
    ) {
        let mut handle = match process.handle(&dir) {
            Ok(handle) => handle,
            Err(error) => {
                tracing::warn!(%error, "cannot keep a handle on the holder; ending the attempt");
                if let HolderProcess::Child(child) = &process {
                    // SAFETY: our child, not yet reaped.
                    unsafe { libc::kill(child.id().cast_signed(), libc::SIGKILL) };
                }
                process.exited().await;
                let batcher = self.recut_or_new(&dir).batcher;
                return self.finish_held(dir, output_file, batcher).await;
            }
        };
        // An earlier worker process (or a cancel queued while the holder started) was ending
        // it: ask again, the holder may not have been asked yet.
        if let Some(reason) = dir.kill_note().or_else(|| self.watch.reason.clone()) {
            handle.end_task(&reason);
            self.watch.reason = Some(reason);
        }
        self.watch.holder = Some(handle);
        if let (Some(limit), Some(started)) = (self.watch.time_limit, started) {
            let ran = Duration::from_millis(boot_ms().saturating_sub(started.started_boot_ms));
            let left = limit.saturating_sub(ran);
            self.watch.timeout = Some(Box::pin(sleep_until(Instant::now() + left)));
        }
        if let Some(started) = started {
            self.report_started(started).await;
        }
        let batcher = self.recut_or_new(&dir);
        self.tail(dir, process, output_file, batcher).await;
    }

    async fn report_started(&self, started: HeldStart) {
        let message = AttemptStarted {
            instance_id: self.key.instance_id,
            attempt: self.key.attempt,
            pid: started.task_pid,
            started_at_ms: started.started_at_ms,
        };
        if let Some((link, message)) = self.attempts.started(self.key, message) {
            link.send(message).await;
        }
    }

    fn recut_or_new(&self, dir: &HeldDir) -> Spooled {
        self.recut(dir).unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read the held attempt's spooled output");
            Spooled {
                batcher: Batcher::new(self.settings.batch),
                offset: 0,
            }
        })
    }

    /// Cuts again, as they were, the batches an earlier worker process recorded and a
    /// scheduler has not acknowledged, and returns the batcher to go on with.
    fn recut(&self, dir: &HeldDir) -> io::Result<Spooled> {
        let boundaries = dir.boundaries()?;
        let acked = dir.acked();
        let mut batcher = Batcher::new(self.settings.batch);
        let mut reader = SpoolReader::new(dir.lines_path(), 0);
        let mut offset = 0;
        for boundary in &boundaries {
            if boundary.last_seq <= acked {
                offset = boundary.end_offset;
                continue;
            }
            if reader.offset() != offset {
                reader = SpoolReader::new(dir.lines_path(), offset);
            }
            batcher.resume_at(boundary.first_seq);
            for record in reader.read(Some(boundary.end_offset))? {
                batcher.push(record.lines);
            }
            self.flush(&mut batcher, None);
            offset = boundary.end_offset;
        }
        if let Some(last) = boundaries.last() {
            batcher.resume_at(last.last_seq + 1);
        }
        if !boundaries.is_empty() {
            tracing::info!(
                batches = boundaries.iter().filter(|b| b.last_seq > acked).count(),
                acked,
                "resending the held attempt's unacknowledged lines as they were cut"
            );
        }
        Ok(Spooled { batcher, offset })
    }

    async fn tail(
        mut self,
        dir: HeldDir,
        mut process: HolderProcess,
        output_file: std::path::PathBuf,
        spooled: Spooled,
    ) {
        let Spooled {
            mut batcher,
            offset,
        } = spooled;
        let heartbeat_every = self
            .settings
            .task_heartbeat_interval
            .max(Duration::from_millis(10));
        let shipper = Shipper::start(Arc::clone(&self.attempts), self.key, heartbeat_every);
        let mut reader = SpoolReader::new(dir.lines_path(), offset);
        let mut tick = tokio::time::interval(TAIL_TICK);
        let mut acked = dir.acked();
        let start = Instant::now();
        loop {
            tokio::select! {
                () = self.watch.step() => {}
                () = process.exited() => break,
                _ = tick.tick() => {
                    if self.attempts.has_log_room(self.key) {
                        self.take_spooled(&mut reader, &mut batcher, &dir, Some(&shipper));
                    }
                    let now_acked = self.attempts.acked_seq(self.key);
                    if now_acked > acked {
                        acked = now_acked;
                        if let Err(error) = dir.write_acked(acked) {
                            tracing::debug!(%error, "cannot record the acknowledged lines");
                        }
                    }
                }
                () = sleep_until(batcher.deadline().unwrap_or(start)), if batcher.deadline().is_some() => {
                    self.cut(&mut batcher, &dir, reader.offset(), Some(&shipper));
                }
            }
        }
        self.take_spooled(&mut reader, &mut batcher, &dir, Some(&shipper));
        self.cut(&mut batcher, &dir, reader.offset(), Some(&shipper));
        shipper.finish().await;
        self.finish_held(dir, output_file, batcher).await;
    }

    /// Reads what the holder spooled since the last call into the batcher, cutting full
    /// batches as they come.
    fn take_spooled(
        &self,
        reader: &mut SpoolReader,
        batcher: &mut Batcher,
        dir: &HeldDir,
        shipper: Option<&Shipper>,
    ) {
        let records = match reader.read(None) {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, "cannot read the held attempt's spooled output");
                return;
            }
        };
        for record in records {
            if batcher.push(record.lines) {
                self.cut(batcher, dir, record.end_offset, shipper);
            }
        }
    }

    /// Records the pending batch's boundary, then hands it over to be sent.
    fn cut(
        &self,
        batcher: &mut Batcher,
        dir: &HeldDir,
        end_offset: u64,
        shipper: Option<&Shipper>,
    ) {
        let pending = batcher.pending_lines();
        if pending == 0 {
            return;
        }
        let first_seq = batcher.lines_taken() + 1;
        let boundary = Boundary {
            first_seq,
            last_seq: first_seq + pending - 1,
            end_offset,
        };
        if let Err(error) = dir.append_boundary(boundary) {
            tracing::warn!(%error, "cannot record a batch's boundary; a restart may send its lines again cut otherwise");
        }
        self.flush(batcher, shipper);
    }

    /// Reports the end the holder recorded (or that it recorded none), keeps it in the ends
    /// journal, and only then removes the attempt's directory.
    async fn finish_held(
        mut self,
        dir: HeldDir,
        output_file: std::path::PathBuf,
        batcher: Batcher,
    ) {
        let kill = self.watch.reason.take().or_else(|| dir.kill_note());
        if matches!(kill, Some(KillReason::Forget)) {
            self.attempts.finished(self.key, AttemptFinished::default());
            let _ = std::fs::remove_file(&output_file);
            dir.remove();
            return;
        }
        let end = match dir.end() {
            Ok(end) => end,
            Err(error) => {
                tracing::warn!(%error, "cannot read the held attempt's end");
                None
            }
        };
        let mut report = match end {
            None => AttemptFinished {
                instance_id: self.key.instance_id,
                attempt: self.key.attempt,
                outcome: AttemptOutcome::Failed as i32,
                finished_at_ms: now_ms(),
                log_lines: batcher.lines_taken(),
                message: "the attempt's holder ended without recording how the task ended".into(),
                ..AttemptFinished::default()
            },
            Some(HeldEnd {
                spawn_failed: true,
                error,
                exited_at_ms,
                ..
            }) => AttemptFinished {
                instance_id: self.key.instance_id,
                attempt: self.key.attempt,
                outcome: AttemptOutcome::SpawnFailed as i32,
                finished_at_ms: exited_at_ms,
                message: error,
                ..AttemptFinished::default()
            },
            Some(end) => {
                let exit = match (end.wait_status, end.error.is_empty()) {
                    (Some(status), _) => Some(Ok(std::process::ExitStatus::from_raw(status))),
                    (None, false) => Some(Err(io::Error::other(end.error.clone()))),
                    (None, true) => None,
                };
                let kill = kill.or_else(|| {
                    (!end.fenced.is_empty()).then(|| KillReason::Fence(end.fenced.clone()))
                });
                let mut report = self.report(exit, kill, batcher.lines_taken());
                report.finished_at_ms = end.exited_at_ms;
                report
            }
        };
        super::read_outputs(&mut report, &output_file);
        tracing::info!(
            outcome = ?AttemptOutcome::try_from(report.outcome).unwrap_or_default(),
            exit_code = ?report.exit_code,
            signal = ?report.signal,
            log_lines = report.log_lines,
            "held attempt finished"
        );
        self.send_finished(report).await;
        dir.remove();
    }

    async fn spawn_failed(&self, message: String) {
        let report = AttemptFinished {
            instance_id: self.key.instance_id,
            attempt: self.key.attempt,
            outcome: AttemptOutcome::SpawnFailed as i32,
            finished_at_ms: now_ms(),
            message: format!("spawn failed: {message}"),
            ..AttemptFinished::default()
        };
        self.send_finished(report).await;
    }
}
