//! A worker's report about one attempt (or the scheduler's own verdict on it), and what
//! applying it did.

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::{InstanceState, Outcome};

/// How an attempt ended, as far as the store is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Finished(Outcome),
    /// The process never started.
    SpawnFailed,
}

/// A worker's report about one attempt. Applied only if (instance, attempt) is current, the
/// instance is in the state the report expects, and the report comes from the worker the
/// attempt was dispatched to; otherwise the result is `Stale`. `worker_id` is `None` for the
/// scheduler's own verdicts on a running attempt (the liveness backstop). A `Rejected` the
/// scheduler decides (a withdrawal, an undeliverable dispatch) names the worker the dispatch
/// went to: a dispatch refused by its worker goes out again under the same attempt number,
/// possibly to another worker, and a withdrawal decided on an older read must not end that one.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// DISPATCHED → WAITING. With `withdrawn` false (the worker refused the dispatch, or it
    /// never left the scheduler) the same attempt may go out again. With `withdrawn` true the
    /// dispatch may have reached a worker that never confirmed a start (it died, or came back
    /// without it): the attempt ends FAILED with `reason` and the instance waits as attempt + 1,
    /// which does not count against its retries (a withdrawn attempt's number never goes out
    /// again). A withdrawal that finds its attempt RUNNING (the Started report landed first)
    /// ends it as lost instead.
    Rejected {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        reason: String,
        withdrawn: bool,
        /// The dispatch a scheduler's verdict is about (the attempt's `dispatched_at` as read):
        /// applied only while that dispatch is the attempt's, not a later one of the same
        /// attempt number to the same worker. `None` applies to whichever dispatch it is.
        dispatched_at: Option<Millis>,
    },
    /// DISPATCHED → RUNNING.
    Started {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: String,
        pid: u32,
        at: Millis,
    },
    /// Last-active time of a RUNNING attempt.
    TaskHeartbeat {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        at: Millis,
    },
    /// RUNNING (or DISPATCHED for a spawn failure) → terminal, or → WAITING as the next attempt
    /// when the task's retries allow. A success advances the run's DAG in the same transaction.
    /// From the worker, about an attempt the scheduler already ended CANCELLED or TIMEOUT, it
    /// is applied as that attempt's late ending: the attempt keeps its state and records the
    /// exit code, signal and line count.
    Finished {
        instance_id: InstanceId,
        attempt: Attempt,
        worker_id: Option<String>,
        end: AttemptEnd,
        exit_code: Option<i32>,
        signal: Option<i32>,
        at: Millis,
        log_lines: u64,
        message: String,
        /// What a successful attempt passes on (`ax_core::outputs`); empty otherwise.
        outputs: ax_core::outputs::Outputs,
    },
}

impl Report {
    /// The attempt the report is about: (instance, attempt).
    pub fn key(&self) -> (InstanceId, Attempt) {
        match self {
            Report::Rejected {
                instance_id,
                attempt,
                ..
            }
            | Report::Started {
                instance_id,
                attempt,
                ..
            }
            | Report::TaskHeartbeat {
                instance_id,
                attempt,
                ..
            }
            | Report::Finished {
                instance_id,
                attempt,
                ..
            } => (*instance_id, *attempt),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportResult {
    Applied(Applied),
    /// The attempt is not current, or the instance is not in the state the report expects.
    Stale {
        current_attempt: Attempt,
        state: InstanceState,
    },
    NotFound,
    /// A worker's report about an attempt that was not dispatched to it: another worker's, or
    /// one that does not exist (yet). Nothing is written.
    NotYours,
}

/// What an applied report changed, so the engine knows whom to wake.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    /// Instances that became WAITING (downstream created, or a retry scheduled).
    pub new_waiting: u32,
    /// The instance's attempt ended (its start lock can be released).
    pub attempt_ended: bool,
    /// How it ended (SUCCESS, FAILED or TIMEOUT), for a Finished report.
    pub attempt_state: Option<InstanceState>,
    /// The instance goes on to its next attempt (a retry after its backoff).
    pub retry_scheduled: bool,
    /// The run reached a terminal state.
    pub run_finished: Option<(RunId, RunState)>,
}
