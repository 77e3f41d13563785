//! The instance state machine: the one place that says which transitions are legal.
//!
//! ```text
//! WAITING → DISPATCHED → RUNNING → SUCCESS
//!                     ↘          ↘ FAILED | TIMEOUT → (retries left) WAITING as attempt+1
//!                      ↘ (the worker refused it) WAITING, same attempt
//!                      ↘ (withdrawn: may have reached a worker, never confirmed) WAITING as attempt+1
//! any non-terminal → CANCELLED
//! FAILED | TIMEOUT | CANCELLED | SUCCESS → (rerun from this task) WAITING as attempt+1
//! FAILED | TIMEOUT | CANCELLED | SUCCESS → (rerun from an upstream task) PENDING
//! PENDING → (its trigger rule says run) WAITING as attempt+1
//! PENDING → (its trigger rule says not) SKIPPED | UPSTREAM_FAILED
//! SKIPPED | UPSTREAM_FAILED → (an upstream retried or rerun) PENDING
//! ```
//! SKIPPED and UPSTREAM_FAILED are the ends of a task that did not run: the advance creates its
//! instance in that state when the task's trigger rule (`crate::trigger_rule`) or its condition
//! says so, with no attempt of its own.
//! PENDING is an instance that ran before and must wait for its upstreams again because a person
//! reran a task above it (`axctl rerun RUN --from TASK`). It keeps its attempt number (the last
//! attempt's record stays as it ended) until the advance, which looks only at a finished task's
//! direct downstream as for a new instance, moves it to WAITING as attempt + 1. For the end of a
//! run and for display a PENDING instance counts like a task without an instance: it is neither
//! unfinished (nothing of it runs) nor succeeded, so a rerun task that fails again ends the run
//! FAILED with its downstream shown as upstream-failed.
//! The store carries a transition out as a conditional update keyed by (instance, attempt, from
//! state), so two nodes racing on one instance cannot both win.

use std::fmt;
use std::str::FromStr;

use crate::trigger_rule::Verdict;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Waiting,
    Dispatched,
    Running,
    Success,
    Failed,
    Timeout,
    Cancelled,
    /// Ran before; waits for its upstreams again after a rerun from a task above it.
    Pending,
    /// Did not run: its trigger rule cannot be met without a failure, or its condition is false.
    Skipped,
    /// Did not run: an upstream failed and its trigger rule does not allow that.
    UpstreamFailed,
}

impl InstanceState {
    pub const ALL: [InstanceState; 10] = [
        InstanceState::Waiting,
        InstanceState::Dispatched,
        InstanceState::Running,
        InstanceState::Success,
        InstanceState::Failed,
        InstanceState::Timeout,
        InstanceState::Cancelled,
        InstanceState::Pending,
        InstanceState::Skipped,
        InstanceState::UpstreamFailed,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Success
                | Self::Failed
                | Self::Timeout
                | Self::Cancelled
                | Self::Skipped
                | Self::UpstreamFailed
        )
    }

    /// Waiting for a worker, on one, or running: something of the instance is still going.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Waiting | Self::Dispatched | Self::Running)
    }

    /// The spelling stored in the database and shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "WAITING",
            Self::Dispatched => "DISPATCHED",
            Self::Running => "RUNNING",
            Self::Success => "SUCCESS",
            Self::Failed => "FAILED",
            Self::Timeout => "TIMEOUT",
            Self::Cancelled => "CANCELLED",
            Self::Pending => "PENDING",
            Self::Skipped => "SKIPPED",
            Self::UpstreamFailed => "UPSTREAM_FAILED",
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown instance state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for InstanceState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_string()))
    }
}

/// How an attempt ended, as reported by the worker (or decided by the scheduler's backstop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Success,
    Failed,
    Timeout,
}

impl Outcome {
    pub fn state(self) -> InstanceState {
        match self {
            Outcome::Success => InstanceState::Success,
            Outcome::Failed => InstanceState::Failed,
            Outcome::Timeout => InstanceState::Timeout,
        }
    }
}

/// Something that happens to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The scheduler sent the current attempt to a worker.
    Dispatch,
    /// The worker refused the dispatch, or it never left the scheduler: the same attempt may be
    /// dispatched again.
    Reject,
    /// The scheduler takes back a dispatch that may have reached a worker which never confirmed
    /// a start (the worker died, or came back without it): the next try is a new attempt,
    /// because an attempt number is never dispatched twice.
    Withdraw,
    /// The worker started the process.
    Start,
    /// The process ended. `retries_left` says whether the retry policy allows another attempt.
    Finish {
        outcome: Outcome,
        retries_left: bool,
    },
    /// The process could not be started at all (counts as a failed attempt).
    SpawnFailed { retries_left: bool },
    /// A person (or a replacing run) stopped the instance.
    Cancel,
    /// A person asked for another attempt of a finished, unsuccessful instance.
    ManualRetry,
    /// A person reran the run from this instance's task (`rerun --from`): it runs again even if
    /// it succeeded.
    RerunFrom,
    /// A person reran the run from a task upstream of this one: it waits for its upstreams again.
    UpstreamRerun,
    /// The trigger rule of a PENDING instance's task was judged on its upstreams' ends (again).
    Judged(Verdict),
    /// A sharded task's instance fanned out into its shards: it runs (on no worker of its own)
    /// until its shards decide its end (`crate::shard`), which comes as a `Finish` or `Cancel`.
    FanOut,
    /// The worker a waiting shard is pinned to is gone for good: the shard cannot run anywhere.
    PinnedWorkerGone,
}

/// The effect of a legal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub to: InstanceState,
    /// The instance moves on to its next attempt (a retry); the old attempt's record is kept.
    pub next_attempt: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition: {event:?} in state {from}")]
pub struct IllegalTransition {
    pub from: InstanceState,
    pub event: Event,
}

/// The transition table. Everything not listed is illegal.
pub fn transition(from: InstanceState, event: Event) -> Result<Transition, IllegalTransition> {
    use InstanceState::*;
    let stay = |to| {
        Ok(Transition {
            to,
            next_attempt: false,
        })
    };
    let retry = Ok(Transition {
        to: Waiting,
        next_attempt: true,
    });
    match (from, event) {
        (Waiting, Event::Dispatch) => stay(Dispatched),
        (Dispatched, Event::Reject) => stay(Waiting),
        (Dispatched, Event::Withdraw) => retry,
        (Dispatched, Event::Start) => stay(Running),
        (Dispatched, Event::SpawnFailed { retries_left: true }) => retry,
        (
            Dispatched,
            Event::SpawnFailed {
                retries_left: false,
            },
        ) => stay(Failed),
        (
            Running,
            Event::Finish {
                outcome: Outcome::Success,
                ..
            },
        ) => stay(Success),
        (
            Running,
            Event::Finish {
                retries_left: true, ..
            },
        ) => retry,
        (
            Running,
            Event::Finish {
                outcome,
                retries_left: false,
            },
        ) => stay(outcome.state()),
        (Waiting | Dispatched | Running, Event::Cancel) => stay(Cancelled),
        (Failed | Timeout | Cancelled, Event::ManualRetry) => retry,
        (Success | Failed | Timeout | Cancelled | Skipped | UpstreamFailed, Event::RerunFrom) => {
            retry
        }
        (
            Success | Failed | Timeout | Cancelled | Skipped | UpstreamFailed,
            Event::UpstreamRerun,
        ) => stay(Pending),
        (Pending, Event::Judged(Verdict::Run)) => retry,
        (Pending, Event::Judged(Verdict::Skip)) => stay(Skipped),
        (Pending, Event::Judged(Verdict::UpstreamFailed)) => stay(UpstreamFailed),
        (Waiting, Event::FanOut) => stay(Running),
        (Waiting, Event::PinnedWorkerGone) => stay(Failed),
        _ => Err(IllegalTransition { from, event }),
    }
}

#[cfg(test)]
mod tests {
    use super::InstanceState::*;
    use super::*;

    fn events() -> Vec<Event> {
        let mut all = vec![
            Event::Dispatch,
            Event::Reject,
            Event::Withdraw,
            Event::Start,
            Event::Cancel,
            Event::ManualRetry,
            Event::RerunFrom,
            Event::UpstreamRerun,
            Event::Judged(Verdict::Run),
            Event::Judged(Verdict::Skip),
            Event::Judged(Verdict::UpstreamFailed),
            Event::FanOut,
            Event::PinnedWorkerGone,
        ];
        for retries_left in [false, true] {
            all.push(Event::SpawnFailed { retries_left });
            for outcome in [Outcome::Success, Outcome::Failed, Outcome::Timeout] {
                all.push(Event::Finish {
                    outcome,
                    retries_left,
                });
            }
        }
        all
    }

    /// The whole table, as data: (from, event, expected to-state and attempt bump). Every pair not
    /// listed here must be illegal.
    fn legal() -> Vec<(InstanceState, Event, InstanceState, bool)> {
        let fin = |outcome, retries_left| Event::Finish {
            outcome,
            retries_left,
        };
        vec![
            (Waiting, Event::Dispatch, Dispatched, false),
            (Dispatched, Event::Reject, Waiting, false),
            (Dispatched, Event::Withdraw, Waiting, true),
            (Dispatched, Event::Start, Running, false),
            (
                Dispatched,
                Event::SpawnFailed { retries_left: true },
                Waiting,
                true,
            ),
            (
                Dispatched,
                Event::SpawnFailed {
                    retries_left: false,
                },
                Failed,
                false,
            ),
            (Running, fin(Outcome::Success, false), Success, false),
            (Running, fin(Outcome::Success, true), Success, false),
            (Running, fin(Outcome::Failed, false), Failed, false),
            (Running, fin(Outcome::Failed, true), Waiting, true),
            (Running, fin(Outcome::Timeout, false), Timeout, false),
            (Running, fin(Outcome::Timeout, true), Waiting, true),
            (Waiting, Event::Cancel, Cancelled, false),
            (Dispatched, Event::Cancel, Cancelled, false),
            (Running, Event::Cancel, Cancelled, false),
            (Failed, Event::ManualRetry, Waiting, true),
            (Timeout, Event::ManualRetry, Waiting, true),
            (Cancelled, Event::ManualRetry, Waiting, true),
            (Success, Event::RerunFrom, Waiting, true),
            (Failed, Event::RerunFrom, Waiting, true),
            (Timeout, Event::RerunFrom, Waiting, true),
            (Cancelled, Event::RerunFrom, Waiting, true),
            (Skipped, Event::RerunFrom, Waiting, true),
            (UpstreamFailed, Event::RerunFrom, Waiting, true),
            (Skipped, Event::UpstreamRerun, Pending, false),
            (UpstreamFailed, Event::UpstreamRerun, Pending, false),
            (Success, Event::UpstreamRerun, Pending, false),
            (Failed, Event::UpstreamRerun, Pending, false),
            (Timeout, Event::UpstreamRerun, Pending, false),
            (Cancelled, Event::UpstreamRerun, Pending, false),
            (Pending, Event::Judged(Verdict::Run), Waiting, true),
            (Pending, Event::Judged(Verdict::Skip), Skipped, false),
            (
                Pending,
                Event::Judged(Verdict::UpstreamFailed),
                UpstreamFailed,
                false,
            ),
            (Waiting, Event::FanOut, Running, false),
            (Waiting, Event::PinnedWorkerGone, Failed, false),
        ]
    }

    #[test]
    fn every_pair_of_state_and_event_follows_the_table() {
        let table = legal();
        let mut checked = 0;
        for from in InstanceState::ALL {
            for event in events() {
                let expected = table
                    .iter()
                    .find(|(f, e, _, _)| *f == from && *e == event)
                    .map(|&(_, _, to, next_attempt)| Transition { to, next_attempt });
                match (transition(from, event), expected) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "{from} on {event:?}"),
                    (Err(err), None) => {
                        assert_eq!(err, IllegalTransition { from, event });
                    }
                    (got, want) => panic!("{from} on {event:?}: got {got:?}, want {want:?}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 10 * 21);
    }

    #[test]
    fn terminal_states_accept_only_a_retry_or_a_rerun() {
        for from in InstanceState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for event in events() {
                let ok = transition(from, event).is_ok();
                // Only what ran can be retried; SKIPPED and UPSTREAM_FAILED follow their upstreams.
                let expected = (event == Event::ManualRetry
                    && matches!(from, Failed | Timeout | Cancelled))
                    || matches!(event, Event::RerunFrom | Event::UpstreamRerun);
                assert_eq!(ok, expected, "{from} on {event:?}");
            }
        }
    }

    #[test]
    fn a_pending_instance_only_waits_for_its_upstreams() {
        for event in events() {
            let ok = transition(Pending, event).is_ok();
            assert_eq!(
                ok,
                matches!(event, Event::Judged(_)),
                "PENDING on {event:?}"
            );
        }
        assert!(!Pending.is_terminal());
    }

    #[test]
    fn state_names_round_trip() {
        for state in InstanceState::ALL {
            assert_eq!(state.as_str().parse::<InstanceState>(), Ok(state));
        }
        assert_eq!(
            "RUNNING ".parse::<InstanceState>(),
            Err(UnknownState("RUNNING ".into()))
        );
    }
}
