//! `WatchRun`: a run's changes as a stream, so a client waiting for a run holds no polling loop.
//!
//! The node sends the run, then the run again whenever its state or counts differ from what it
//! last sent, looking each time this node makes progress and at least every
//! [`LOOK_EVERY`] (a change made on another node is seen by then). Once the run has ended the
//! stream stays open until no attempt's process may still run: a cancel or a timeout ends the
//! attempt in the store first, and its worker reports the process's end (exit code or signal)
//! after the kill. A process whose end never comes (its worker is gone) holds the stream until
//! the request's settle time has passed since the run ended, at most. Reads are at least
//! [`MIN_INTERVAL`] apart.

use std::time::Duration;

use ax_core::ids::RunId;
use ax_core::state::InstanceState;
use ax_proto::v1 as pb;
use ax_store::AttemptRecord;
use tokio::sync::mpsc;
use tonic::Status;

use super::ControlApi;
use crate::grpc::convert::store_status;

/// How often the run is read when nothing on this node made progress.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// The least time between two reads of the run, however busy the node: a node makes progress
/// many times a second, and each watcher reads the store each time.
const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// How long the stream waits for processes after the run ended, unless the request says.
const DEFAULT_SETTLE: Duration = Duration::from_secs(30);

/// The longest settle time a request may ask for.
const MAX_SETTLE: Duration = Duration::from_secs(600);

/// Whether an attempt's process may still be running: the scheduler ended the attempt
/// (cancelled, timed out) after its process started, and no end of the process came since.
pub(crate) fn process_may_run(attempt: &AttemptRecord) -> bool {
    matches!(
        attempt.state,
        InstanceState::Cancelled | InstanceState::Timeout
    ) && (attempt.started_at.is_some() || attempt.pid.is_some())
        && attempt.exit_code.is_none()
        && attempt.signal.is_none()
}

/// The settle time a request asks for.
pub(crate) fn settle_time(settle_ms: u32) -> Result<Duration, Status> {
    let asked = Duration::from_millis(u64::from(settle_ms));
    if settle_ms == 0 {
        Ok(DEFAULT_SETTLE)
    } else if asked > MAX_SETTLE {
        Err(Status::invalid_argument(format!(
            "settle_ms {settle_ms} is more than {} ms",
            MAX_SETTLE.as_millis()
        )))
    } else {
        Ok(asked)
    }
}

impl ControlApi {
    /// Sends the run's changes until it has ended and settled; the caller checked that the
    /// run is visible to it.
    pub(super) async fn stream_run_changes(
        &self,
        id: RunId,
        settle: Duration,
        sender: &mpsc::Sender<Result<pb::Run, Status>>,
    ) -> Result<(), Status> {
        let mut progress = self.node.watch_progress();
        let mut last: Option<pb::Run> = None;
        loop {
            let read_at = tokio::time::Instant::now();
            let run = self.run_message(id).await?;
            let ended = run_ended(&run);
            let finished_at_ms = run.finished_at_ms;
            if last.as_ref() != Some(&run) {
                last = Some(run.clone());
                if sender.send(Ok(run)).await.is_err() {
                    return Ok(());
                }
            }
            // The settle time counts from the run's end, not from this watch: a wait on a run
            // that ended long ago, with a process whose end never came, does not wait again.
            if ended
                && (settled(
                    finished_at_ms,
                    chrono::Utc::now().timestamp_millis(),
                    settle,
                ) || !self.processes_may_run(id).await?)
            {
                return Ok(());
            }
            tokio::select! {
                _ = progress.changed() => {}
                _ = tokio::time::sleep(LOOK_EVERY) => {}
                _ = sender.closed() => return Ok(()),
            }
            tokio::select! {
                () = tokio::time::sleep_until(read_at + MIN_INTERVAL) => {}
                _ = sender.closed() => return Ok(()),
            }
        }
    }

    async fn processes_may_run(&self, id: RunId) -> Result<bool, Status> {
        let instances = self
            .node
            .store
            .list_instances(id)
            .await
            .map_err(store_status)?;
        for instance in instances.iter().filter(|i| {
            matches!(i.state, InstanceState::Cancelled | InstanceState::Timeout)
                && i.started_at.is_some()
        }) {
            let attempts = self
                .node
                .store
                .list_attempts(instance.id)
                .await
                .map_err(store_status)?;
            if attempts.iter().any(process_may_run) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Whether the settle time since the run's end (`finished_at_ms`, 0 when unknown) is over.
fn settled(finished_at_ms: i64, now_ms: i64, settle: Duration) -> bool {
    finished_at_ms > 0 && now_ms.saturating_sub(finished_at_ms) >= settle.as_millis() as i64
}

fn run_ended(run: &pb::Run) -> bool {
    matches!(
        pb::RunState::try_from(run.state),
        Ok(pb::RunState::Success | pb::RunState::Failed | pb::RunState::Cancelled)
    )
}

#[cfg(test)]
mod tests {
    use ax_core::ids::{Attempt, InstanceId};

    use super::*;

    fn attempt(state: InstanceState) -> AttemptRecord {
        AttemptRecord {
            instance_id: InstanceId(1),
            attempt: Attempt(1),
            state,
            worker_id: Some("w1".into()),
            node_id: None,
            dispatched_at: Some(1),
            started_at: Some(2),
            finished_at: Some(3),
            exit_code: None,
            signal: None,
            pid: Some(42),
            log_lines: 0,
            message: String::new(),
            outputs: Default::default(),
        }
    }

    #[test]
    fn a_cancelled_or_timed_out_process_may_run_until_its_end_is_reported() {
        assert!(process_may_run(&attempt(InstanceState::Cancelled)));
        assert!(process_may_run(&attempt(InstanceState::Timeout)));
        let killed = AttemptRecord {
            signal: Some(15),
            ..attempt(InstanceState::Cancelled)
        };
        assert!(!process_may_run(&killed));
        let exited = AttemptRecord {
            exit_code: Some(0),
            ..attempt(InstanceState::Timeout)
        };
        assert!(!process_may_run(&exited));
        // An attempt that ended by its process's own report has nothing left.
        assert!(!process_may_run(&attempt(InstanceState::Failed)));
        // Cancelled before its process started: there is none.
        let never_started = AttemptRecord {
            started_at: None,
            pid: None,
            ..attempt(InstanceState::Cancelled)
        };
        assert!(!process_may_run(&never_started));
    }

    #[test]
    fn the_settle_time_counts_from_the_runs_end() {
        let settle = Duration::from_secs(30);
        assert!(!settled(1_000_000, 1_000_000 + 29_999, settle));
        assert!(settled(1_000_000, 1_000_000 + 30_000, settle));
        // An end not recorded yet waits for the processes.
        assert!(!settled(0, 1_000_000, settle));
    }

    #[test]
    fn settle_times_default_and_are_bounded() {
        assert_eq!(settle_time(0).expect("default"), DEFAULT_SETTLE);
        assert_eq!(
            settle_time(1500).expect("asked"),
            Duration::from_millis(1500)
        );
        let refused = settle_time(600_001).expect_err("too long");
        assert!(refused.message().contains("settle_ms 600001"), "{refused}");
    }
}
