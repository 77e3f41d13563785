//! Run states and the rule that ends a run.

use std::fmt;
use std::str::FromStr;

use crate::spec::Handler;
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

/// What the store knows about a run's graph (its tasks, not its handlers) when one of its
/// instances reaches a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunProgress {
    /// Tasks in the graph of the run's workflow version.
    pub tasks: u32,
    /// Instances WAITING, DISPATCHED or RUNNING. A PENDING instance (it waits for an upstream
    /// rerun) counts like a task without an instance.
    pub unfinished: u32,
    pub succeeded: u32,
    pub skipped: u32,
    /// FAILED, TIMEOUT or UPSTREAM_FAILED.
    pub failed: u32,
    pub cancelled: u32,
    /// A person asked to cancel the run.
    pub cancel_requested: bool,
}

/// The graph's outcome, or `None` while something of it can still run.
///
/// SUCCESS when every task succeeded or was skipped; otherwise CANCELLED when the run or an
/// instance was cancelled, else FAILED. The advance gives every task whose rule was judged an
/// instance, so once none is unfinished nothing more starts; a task still without one sits in a
/// run that stopped (or below a failure, in runs from before the advance kept SKIPPED and
/// UPSTREAM_FAILED), and the run does not succeed.
pub fn run_outcome(progress: RunProgress) -> Option<RunState> {
    if progress.unfinished > 0 {
        return None;
    }
    let clean = progress.failed == 0 && progress.cancelled == 0;
    Some(
        if clean && progress.succeeded + progress.skipped >= progress.tasks {
            RunState::Success
        } else if progress.cancel_requested || progress.cancelled > 0 {
            RunState::Cancelled
        } else {
            RunState::Failed
        },
    )
}

/// A run's handlers (`on_failure`, `on_success`), as the end of the run needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Handlers {
    /// The workflow version has an `on_failure` list.
    pub on_failure: bool,
    /// The workflow version has an `on_success` list.
    pub on_success: bool,
    /// The outcome the handlers were started for; `None` while none was.
    pub started_for: Option<RunState>,
    /// Handler instances WAITING, DISPATCHED or RUNNING.
    pub unfinished: u32,
}

/// What a run does once one of its instances ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStep {
    /// Something of it still runs (or can).
    Continue,
    /// The graph ended with this outcome and the handler list for it starts; the run ends
    /// with that outcome once they ended, whatever theirs.
    StartHandlers { outcome: RunState, handler: Handler },
    /// The run ends in this state.
    End(RunState),
}

/// The run's next step from its graph's progress and its handlers. A handler's own failure
/// never changes the run's outcome; a cancelled run starts no handler.
pub fn run_step(graph: RunProgress, handlers: Handlers) -> RunStep {
    let Some(outcome) = run_outcome(graph) else {
        return RunStep::Continue;
    };
    if handlers.unfinished > 0 {
        return RunStep::Continue;
    }
    if handlers.started_for.is_some() {
        return RunStep::End(outcome);
    }
    let handler = match outcome {
        RunState::Failed if handlers.on_failure => Some(Handler::OnFailure),
        RunState::Success if handlers.on_success => Some(Handler::OnSuccess),
        _ => None,
    };
    match handler {
        Some(handler) => RunStep::StartHandlers { outcome, handler },
        None => RunStep::End(outcome),
    }
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
    fn skipped_tasks_do_not_fail_a_run_and_an_upstream_failed_one_does() {
        let skipped = RunProgress {
            skipped: 2,
            ..progress(4, 0, 2)
        };
        assert_eq!(run_outcome(skipped), Some(RunState::Success));
        let upstream_failed = RunProgress {
            skipped: 1,
            failed: 1,
            ..progress(4, 0, 2)
        };
        assert_eq!(run_outcome(upstream_failed), Some(RunState::Failed));
    }

    #[test]
    fn a_run_steps_through_its_handlers_once() {
        let failed = RunProgress {
            failed: 1,
            ..progress(3, 0, 2)
        };
        let both = Handlers {
            on_failure: true,
            on_success: true,
            ..Handlers::default()
        };
        // (graph, handlers, step)
        let cases = [
            (progress(3, 1, 2), both, RunStep::Continue),
            (
                failed,
                both,
                RunStep::StartHandlers {
                    outcome: RunState::Failed,
                    handler: Handler::OnFailure,
                },
            ),
            (
                progress(3, 0, 3),
                both,
                RunStep::StartHandlers {
                    outcome: RunState::Success,
                    handler: Handler::OnSuccess,
                },
            ),
            (
                failed,
                Handlers {
                    started_for: Some(RunState::Failed),
                    unfinished: 1,
                    ..both
                },
                RunStep::Continue,
            ),
            // The handlers ended, whatever their own states: the run keeps its outcome.
            (
                failed,
                Handlers {
                    started_for: Some(RunState::Failed),
                    ..both
                },
                RunStep::End(RunState::Failed),
            ),
            (
                progress(3, 0, 3),
                Handlers {
                    on_success: false,
                    ..both
                },
                RunStep::End(RunState::Success),
            ),
            (
                RunProgress {
                    cancel_requested: true,
                    ..progress(3, 0, 1)
                },
                both,
                RunStep::End(RunState::Cancelled),
            ),
        ];
        for (graph, handlers, want) in cases {
            assert_eq!(run_step(graph, handlers), want, "{graph:?} {handlers:?}");
        }
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
