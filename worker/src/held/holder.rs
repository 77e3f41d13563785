//! The holder: `ax-worker __hold DIR MAX_LINE KILL_GRACE_MS KEEP [--ids UID:GID:GROUPS] --
//! PROGRAM ARGS...`, started by the worker in a session of its own with the task's
//! environment and working directory.
//!
//! It starts the task, spools its output into `DIR/lines`, ends it when the worker asks
//! (SIGTERM to the holder: SIGTERM to the task's group, SIGKILL after the grace) or when the
//! fence file says no scheduler may have heard from the worker for the fence delay, and records
//! the exit in `DIR/end` before it exits. On its stdout it writes one line for the worker that
//! started it, `started` or `failed MESSAGE`, then nothing more: that worker may be gone.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use ax_proto::v1::LogStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::{FenceState, HeldDir, HeldEnd, HeldStart, HolderId, boot_ms, spool_record};
use crate::logs::{PackedLines, pump_lines};
use crate::runner::signal_group;
use crate::spawn::TaskCommand;

/// How long the output pipes may stay open after the task's group is gone.
const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What the worker passes on the holder's command line.
#[derive(Debug)]
struct HoldArgs {
    dir: PathBuf,
    max_line_bytes: usize,
    kill_grace: Duration,
    keep_when_cut_off: bool,
    ids: Option<(u32, u32, Vec<u32>)>,
    program: OsString,
    args: Vec<OsString>,
}

/// The holder's command line after `__hold`, in the order [`parse`] reads it.
pub(crate) fn arguments(
    dir: &std::path::Path,
    max_line_bytes: usize,
    kill_grace: Duration,
    keep_when_cut_off: bool,
    ids: Option<(u32, u32, &[u32])>,
) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        super::HOLD_COMMAND.into(),
        dir.as_os_str().to_owned(),
        max_line_bytes.to_string().into(),
        kill_grace.as_millis().to_string().into(),
        if keep_when_cut_off { "1" } else { "0" }.into(),
    ];
    if let Some((uid, gid, groups)) = ids {
        let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
        out.push("--ids".into());
        out.push(format!("{uid}:{gid}:{}", groups.join(",")).into());
    }
    out.push("--".into());
    out
}

fn parse(args: &[OsString]) -> Result<HoldArgs, String> {
    let text = |at: usize, what: &str| -> Result<String, String> {
        args.get(at)
            .and_then(|arg| arg.to_str())
            .map(str::to_string)
            .ok_or_else(|| format!("missing or non-UTF-8 {what}"))
    };
    let number = |at: usize, what: &str| -> Result<u64, String> {
        text(at, what)?
            .parse()
            .map_err(|_| format!("{what} is not a number"))
    };
    let dir = PathBuf::from(args.get(1).ok_or("missing the attempt's directory")?);
    let max_line_bytes = usize::try_from(number(2, "line limit")?).unwrap_or(usize::MAX);
    let kill_grace = Duration::from_millis(number(3, "kill grace")?);
    let keep_when_cut_off = text(4, "fence choice")? == "1";
    let mut at = 5;
    let mut ids = None;
    if text(at, "--")? == "--ids" {
        let spec = text(at + 1, "ids")?;
        let mut parts = spec.splitn(3, ':');
        let mut id = |what: &str| -> Result<u32, String> {
            parts
                .next()
                .and_then(|part| part.parse().ok())
                .ok_or_else(|| format!("bad {what} in --ids {spec}"))
        };
        let uid = id("uid")?;
        let gid = id("gid")?;
        let groups = parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|group| !group.is_empty())
            .map(|group| {
                group
                    .parse()
                    .map_err(|_| format!("bad group in --ids {spec}"))
            })
            .collect::<Result<Vec<u32>, String>>()?;
        ids = Some((uid, gid, groups));
        at += 2;
    }
    if text(at, "--")? != "--" {
        return Err("expected -- before the program".into());
    }
    let program = args.get(at + 1).ok_or("missing the program")?.clone();
    Ok(HoldArgs {
        dir,
        max_line_bytes,
        kill_grace,
        keep_when_cut_off,
        ids,
        program,
        args: args[at + 2..].to_vec(),
    })
}

/// Runs the holder; `args` start with `__hold`. Returns the process's exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    let args = match parse(&args) {
        Ok(args) => args,
        Err(problem) => {
            eprintln!("ax-worker {}: {problem}", super::HOLD_COMMAND);
            return 2;
        }
    };
    let dir = HeldDir::at(args.dir.clone());
    // Diagnostics go to a file beside the attempt: the worker that reads stderr may be gone.
    if let Ok(log) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.path().join("holder.log"))
    {
        // SAFETY: dup2 onto our own stderr; the file stays open through the new descriptor.
        unsafe { libc::dup2(log.as_raw_fd(), 2) };
    }
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let Some(start_ticks) = super::start_ticks(me) else {
        eprintln!("cannot read /proc/self/stat");
        return 1;
    };
    if let Err(error) = dir.write_holder(HolderId {
        pid: me,
        start_ticks,
    }) {
        eprintln!("cannot record the holder: {error}");
        return 1;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return 1;
        }
    };
    let end = runtime.block_on(hold(&args, &dir));
    match dir.write_end(&end) {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("cannot record the end: {error}");
            1
        }
    }
}

/// Tells the worker that started this holder how the start went, then lets go of stdout.
fn tell_worker(line: &str) {
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto our own stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

async fn hold(args: &HoldArgs, dir: &HeldDir) -> HeldEnd {
    let mut command = TaskCommand::new(&args.program);
    for arg in &args.args {
        command.arg(arg);
    }
    if let Some((uid, gid, groups)) = &args.ids {
        command.run_as_ids(*uid, *gid, groups.clone());
    }
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                let message = format!("spawn failed: the holder cannot handle SIGTERM: {error}");
                tell_worker(&format!("failed {message}"));
                return failed_start(message);
            }
        };
    let mut spool = match std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(dir.lines_path())
    {
        Ok(file) => file,
        Err(error) => {
            let message = format!("spawn failed: cannot make the output spool: {error}");
            tell_worker(&format!("failed {message}"));
            return failed_start(message);
        }
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let message = format!("spawn failed: {error}");
            tell_worker(&format!("failed {message}"));
            return failed_start(message);
        }
    };
    let pgid = i32::try_from(child.id()).unwrap_or(0);
    let started = HeldStart {
        task_pid: child.id(),
        started_at_ms: crate::now_ms(),
        started_boot_ms: boot_ms(),
    };
    if let Err(error) = dir.write_started(started) {
        eprintln!("cannot record the start: {error}");
    }
    tell_worker("started");

    let (line_tx, mut lines) = mpsc::channel::<PackedLines>(16);
    let mut readers = Vec::new();
    for (pipe, stream) in [
        (child.stdout.take(), LogStream::Stdout),
        (child.stderr.take(), LogStream::Stderr),
    ] {
        let Some(pipe) = pipe else { continue };
        let tx = line_tx.clone();
        let max = args.max_line_bytes;
        let fd = pipe.as_raw_fd();
        readers.push(tokio::spawn(async move {
            pump_lines(pipe, stream, max, Some(fd), tx).await
        }));
    }
    drop(line_tx);

    let fence_dir = dir
        .path()
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut fence_tick = tokio::time::interval(super::FENCE_TICK);
    let mut exit: Option<std::io::Result<std::process::ExitStatus>> = None;
    let mut exited_at_ms = 0;
    let mut fenced = String::new();
    let mut sigkill_at: Option<Instant> = None;
    let mut drain_until: Option<Instant> = None;
    let mut readers_done = false;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let kill = |sigkill_at: &mut Option<Instant>| {
        if sigkill_at.is_none() && signal_group(pgid, libc::SIGTERM) {
            *sigkill_at = Some(Instant::now() + args.kill_grace);
        }
    };
    loop {
        if exit.is_some() && (readers_done || drain_until.is_some_and(|t| Instant::now() >= t)) {
            break;
        }
        tokio::select! {
            status = child.wait(), if exit.is_none() => {
                exited_at_ms = crate::now_ms();
                exit = Some(status);
                // What the task left in its group goes too, as the worker's runner does.
                if signal_group(pgid, 0) {
                    kill(&mut sigkill_at);
                }
                drain_until = Some(Instant::now() + args.kill_grace + PIPE_DRAIN_GRACE);
            }
            read = lines.recv(), if !readers_done => match read {
                Some(read) => {
                    if let Err(error) = spool.write_all(&spool_record(&read)) {
                        eprintln!("cannot spool output: {error}");
                    }
                }
                None => readers_done = true,
            },
            _ = terminate.recv() => kill(&mut sigkill_at),
            () = sleep_until(sigkill_at.unwrap_or(far)), if sigkill_at.is_some() => {
                sigkill_at = None;
                if signal_group(pgid, 0) {
                    signal_group(pgid, libc::SIGKILL);
                }
            }
            _ = fence_tick.tick(), if !args.keep_when_cut_off && fenced.is_empty() && exit.is_none() => {
                if let Some(reason) = fence_due(&fence_dir) {
                    eprintln!("{reason}");
                    fenced = reason;
                    kill(&mut sigkill_at);
                }
            }
            () = sleep_until(drain_until.unwrap_or(far)), if drain_until.is_some() && !readers_done => {}
        }
    }
    for reader in &readers {
        reader.abort();
    }
    if signal_group(pgid, 0) {
        signal_group(pgid, libc::SIGKILL);
    }
    while let Ok(read) = lines.try_recv() {
        if let Err(error) = spool.write_all(&spool_record(&read)) {
            eprintln!("cannot spool output: {error}");
        }
    }
    if let Err(error) = spool.sync_data() {
        eprintln!("cannot sync the spool: {error}");
    }
    match exit {
        Some(Ok(status)) => HeldEnd {
            wait_status: Some(status.into_raw()),
            exited_at_ms,
            fenced,
            ..HeldEnd::default()
        },
        Some(Err(error)) => HeldEnd {
            exited_at_ms,
            fenced,
            error: format!("waiting for the process failed: {error}"),
            ..HeldEnd::default()
        },
        None => HeldEnd {
            exited_at_ms: crate::now_ms(),
            fenced,
            error: "the process was not observed to exit".into(),
            ..HeldEnd::default()
        },
    }
}

fn failed_start(message: String) -> HeldEnd {
    HeldEnd {
        exited_at_ms: crate::now_ms(),
        error: message,
        spawn_failed: true,
        ..HeldEnd::default()
    }
}

/// The reason to fence now, if the fence file says the delay has passed. A missing or
/// unreadable file fences nothing: the worker writes it before it starts any holder, and a
/// state directory someone removed is no proof that the worker is cut off.
fn fence_due(held_dir: &std::path::Path) -> Option<String> {
    let state = FenceState::read(held_dir)?;
    let deadline = state.deadline_ms()?;
    let now = boot_ms();
    (now >= deadline).then(|| {
        format!(
            "self-fenced by the attempt's holder: no scheduler may have heard from the worker for {} ms (fence delay {} ms)",
            now.saturating_sub(state.unheard_since_ms),
            state.delay_ms.unwrap_or(0)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_round_trips() {
        let dir = std::path::Path::new("/state/held/1-1");
        let mut line = arguments(
            dir,
            4096,
            Duration::from_millis(1500),
            true,
            Some((1000, 100, &[100, 27][..])),
        );
        line.extend(["sh".into(), "-c".into(), "echo hi".into()]);
        let parsed = parse(&line).unwrap();
        assert_eq!(parsed.dir, dir);
        assert_eq!(parsed.max_line_bytes, 4096);
        assert_eq!(parsed.kill_grace, Duration::from_millis(1500));
        assert!(parsed.keep_when_cut_off);
        assert_eq!(parsed.ids, Some((1000, 100, vec![100, 27])));
        assert_eq!(parsed.program, "sh");
        assert_eq!(parsed.args, ["-c", "echo hi"]);

        let mut plain = arguments(dir, 10, Duration::ZERO, false, None);
        plain.push("true".into());
        let parsed = parse(&plain).unwrap();
        assert_eq!(parsed.ids, None);
        assert!(parsed.args.is_empty());
        let err = parse(&plain[..plain.len() - 2]).unwrap_err();
        assert!(err.contains("--"), "{err}");
    }
}
