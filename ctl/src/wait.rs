//! Waiting for a run to end, with live progress on stderr.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use ax_proto::v1::{GetRunRequest, InstanceCounts, Run, RunState, WatchRunRequest};
use tonic::Code;

use crate::client::{Client, Ctx};
use crate::error::Exit;
use crate::view::run_state;

/// How often the run is polled (a node without `WatchRun`), and how soon a node that went
/// away is tried again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How long a server that went away mid-wait (a restart, a failover to another node) is waited
/// for before giving up; the run itself goes on without us.
const UNAVAILABLE_GRACE: Duration = Duration::from_secs(10);

/// True once the run can no longer change.
pub fn is_final(state: i32) -> bool {
    matches!(
        RunState::try_from(state),
        Ok(RunState::Success | RunState::Failed | RunState::Cancelled)
    )
}

/// The exit code a waited run ends the process with.
pub fn exit_for(state: i32) -> Exit {
    match RunState::try_from(state) {
        Ok(RunState::Success) => Exit::Ok,
        Ok(RunState::Failed) => Exit::RunFailed,
        Ok(RunState::Cancelled) => Exit::RunCancelled,
        _ => Exit::Other,
    }
}

/// `run 42 RUNNING: 2 success, 1 running, 1 waiting, 0 failed, 1 pending`. Dispatched counts as
/// running and timeout as failed, because that is what a person watching cares about; tasks
/// without an instance yet (upstream not done, or upstream failed) are "pending".
pub fn progress_line(run: &Run) -> String {
    let c = run.counts.unwrap_or_default();
    let InstanceCounts {
        waiting,
        dispatched,
        running,
        success,
        failed,
        timeout,
        cancelled,
        not_created,
        skipped,
        upstream_failed,
    } = c;
    let mut line = format!(
        "run {} {}: {success} success, {} running, {waiting} waiting, {} failed",
        run.id,
        run_state(run.state),
        dispatched + running,
        failed + timeout,
    );
    if cancelled > 0 {
        line.push_str(&format!(", {cancelled} cancelled"));
    }
    if skipped > 0 {
        line.push_str(&format!(", {skipped} skipped"));
    }
    if upstream_failed > 0 {
        line.push_str(&format!(", {upstream_failed} upstream failed"));
    }
    if not_created > 0 {
        line.push_str(&format!(", {not_created} pending"));
    }
    line
}

/// Follows the run until it ends (and its processes have: `WatchRun`) and returns its last
/// state. On a terminal, progress is one line rewritten in place; otherwise (CI logs, files) a
/// line is written each time it changes. A node without `WatchRun` (0.1) is polled instead; a
/// node that goes away mid-wait (a restart, a failover) is tried again for a while, since the
/// run goes on without us.
pub async fn wait_for_run(ctx: &Ctx, client: &mut Client, run_id: i64) -> anyhow::Result<Run> {
    let mut progress = Progress::new();
    let mut unavailable_since: Option<Instant> = None;
    loop {
        let status = match follow(client, run_id, &mut progress).await {
            Ok(Some(run)) => return Ok(progress.done(run)),
            // The stream ended before the run did: follow it again, a moment later.
            Ok(None) => {
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            Err(status) => status,
        };
        match status.code() {
            Code::Unimplemented => return poll(ctx, client, run_id, progress).await,
            Code::Unavailable | Code::Cancelled => {
                let since = *unavailable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > UNAVAILABLE_GRACE {
                    progress.abandon();
                    return Err(ctx.status(status));
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            _ => {
                progress.abandon();
                return Err(ctx.status(status));
            }
        }
    }
}

/// One `WatchRun` stream: the ended run, `None` when the stream closed first.
async fn follow(
    client: &mut Client,
    run_id: i64,
    progress: &mut Progress,
) -> Result<Option<Run>, tonic::Status> {
    let mut stream = client
        .watch_run(WatchRunRequest {
            id: run_id,
            settle_ms: 0,
        })
        .await?
        .into_inner();
    let mut last: Option<Run> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            message = stream.message() => match message? {
                Some(run) => {
                    progress.show(&run);
                    last = Some(run);
                }
                None => return Ok(last.filter(|run| is_final(run.state))),
            },
            // The elapsed time on a terminal keeps counting between changes.
            _ = tick.tick() => {
                if let Some(run) = &last {
                    progress.show(run);
                }
            }
        }
    }
}

/// Polls the run until it ends: for a node without `WatchRun`.
async fn poll(
    ctx: &Ctx,
    client: &mut Client,
    run_id: i64,
    mut progress: Progress,
) -> anyhow::Result<Run> {
    let mut unavailable_since: Option<Instant> = None;
    loop {
        let run = match client.get_run(GetRunRequest { id: run_id }).await {
            Ok(response) => {
                unavailable_since = None;
                response.into_inner()
            }
            Err(status) if status.code() == Code::Unavailable => {
                let since = *unavailable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > UNAVAILABLE_GRACE {
                    progress.abandon();
                    return Err(ctx.status(status));
                }
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            Err(status) => {
                progress.abandon();
                return Err(ctx.status(status));
            }
        };
        progress.show(&run);
        if is_final(run.state) {
            return Ok(progress.done(run));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The progress line on stderr.
struct Progress {
    tty: bool,
    started: Instant,
    last_line: String,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last_line: String::new(),
        }
    }

    fn show(&mut self, run: &Run) {
        let line = progress_line(run);
        if self.tty {
            let elapsed = ax_core::humane_duration(self.started.elapsed().as_millis() as i64);
            // Carriage return plus "erase line" redraws the same line.
            eprint!("\r\x1b[2K{line} ({elapsed})");
            let _ = std::io::stderr().flush();
        } else if line != self.last_line {
            eprintln!("{line}");
        }
        self.last_line = line;
    }

    /// The run ended: the line is left as it is.
    fn done(self, run: Run) -> Run {
        if self.tty {
            eprintln!();
        }
        run
    }

    /// An error follows: it starts on a line of its own.
    fn abandon(&self) {
        if self.tty && !self.last_line.is_empty() {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_groups_states() {
        let run = Run {
            id: 7,
            state: RunState::Running as i32,
            counts: Some(InstanceCounts {
                waiting: 1,
                dispatched: 1,
                running: 1,
                success: 2,
                failed: 1,
                timeout: 1,
                cancelled: 0,
                not_created: 3,
                skipped: 2,
                upstream_failed: 1,
            }),
            ..Default::default()
        };
        assert_eq!(
            progress_line(&run),
            "run 7 RUNNING: 2 success, 2 running, 1 waiting, 2 failed, 2 skipped, 1 upstream failed, 3 pending"
        );
    }

    #[test]
    fn exit_codes_follow_the_final_state() {
        assert_eq!(exit_for(RunState::Success as i32), Exit::Ok);
        assert_eq!(exit_for(RunState::Failed as i32), Exit::RunFailed);
        assert_eq!(exit_for(RunState::Cancelled as i32), Exit::RunCancelled);
        assert!(!is_final(RunState::Running as i32));
    }
}
