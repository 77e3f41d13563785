//! Run states and the rule that ends a run.

use std::fmt;
use std::str::FromStr;

use crate::state::UnknownState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    Running,
    /// Waiting for room under max active runs, a keyed concurrency limit or overlap `queue`;
    /// a queued run has no instances yet (`ax_core::firing::start_or_queue`).
    Queued,
    Success,
    Failed,
    Cancelled,
}

impl RunState {
    pub const ALL: [RunState; 5] = [
        RunState::Running,
        RunState::Queued,
        RunState::Success,
        RunState::Failed,
        RunState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "RUNNING",
            RunState::Queued => "QUEUED",
            RunState::Success => "SUCCESS",
            RunState::Failed => "FAILED",
            RunState::Cancelled => "CANCELLED",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Running | RunState::Queued)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// What the store knows about a run's instances when one of them reaches a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunProgress {
    /// Tasks in the run's workflow version.
    pub tasks: u32,
    /// Instances WAITING, DISPATCHED or RUNNING. A PENDING instance (it waits for an upstream
    /// rerun) counts like a task without an instance: neither unfinished nor succeeded.
    pub unfinished: u32,
    pub succeeded: u32,
    pub cancelled: u32,
    /// A person asked to cancel the run.
    pub cancel_requested: bool,
}

/// The run's end state, or `None` while something can still run.
///
/// Instances are created only when all their upstreams succeeded, so once no instance is
/// unfinished nothing more can start: tasks without an instance sit below a failure.
pub fn run_outcome(progress: RunProgress) -> Option<RunState> {
    if progress.unfinished > 0 {
        return None;
    }
    Some(if progress.succeeded >= progress.tasks {
        RunState::Success
    } else if progress.cancel_requested || progress.cancelled > 0 {
        RunState::Cancelled
    } else {
        RunState::Failed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(tasks: u32, unfinished: u32, succeeded: u32) -> RunProgress {
        RunProgress {
            tasks,
            unfinished,
            succeeded,
            ..RunProgress::default()
        }
    }

    #[test]
    fn a_run_goes_on_while_any_instance_is_unfinished() {
        assert_eq!(run_outcome(progress(3, 1, 2)), None);
    }

    #[test]
    fn a_run_succeeds_when_every_task_succeeded() {
        assert_eq!(run_outcome(progress(3, 0, 3)), Some(RunState::Success));
    }

    #[test]
    fn a_run_fails_when_nothing_is_left_and_a_task_did_not_succeed() {
        // One failed leaf of a diamond: two tasks below it were never created.
        assert_eq!(run_outcome(progress(4, 0, 1)), Some(RunState::Failed));
    }

    #[test]
    fn a_cancelled_run_ends_cancelled() {
        let p = RunProgress {
            cancelled: 1,
            ..progress(3, 0, 1)
        };
        assert_eq!(run_outcome(p), Some(RunState::Cancelled));
        let p = RunProgress {
            cancel_requested: true,
            ..progress(3, 0, 1)
        };
        assert_eq!(run_outcome(p), Some(RunState::Cancelled));
    }
}
