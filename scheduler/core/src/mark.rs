//! A person's verdict on a task instance: "mark success" or "mark failed" (`MarkInstance`,
//! `axctl mark`), what it may do from which state and what the run does next.
//!
//! A mark sets the instance's state without running anything, as Airflow's "mark success" and
//! "mark failed" do, and keeps ax's invariants:
//!
//! - **An active instance stops.** A WAITING instance is never dispatched; a DISPATCHED or
//!   RUNNING attempt is ended CANCELLED in its own record (its process is killed, as for a
//!   cancel) while the instance takes the marked state. The attempt number does not change, so
//!   the worker's late end of that attempt is refused as for a cancel: it adds its exit code to
//!   the attempt's record and never moves the instance.
//! - **A mark is final for its attempt.** A failed mark takes no automatic retry; a task marked
//!   SUCCESS never runs again unless a person reruns it.
//! - **The run follows as after a real end.** The instance's downstream is judged by its
//!   trigger rules (a success lets it run, a failure makes it UPSTREAM_FAILED under
//!   `all_success`); tasks below it that did not run (SKIPPED, UPSTREAM_FAILED) wait to be judged
//!   again; an ended run is RUNNING again and ends anew (its state recomputed, its handlers run
//!   for the new outcome) once nothing is left, as after a manual retry.
//! - **Mapped and sharded tasks end by their items.** An item is marked like any instance and
//!   its task's end is settled again from its items. A mapped or sharded task's own instance
//!   may be marked only once no item or shard of it is going.
//!
//! Refused: a mark to the state the instance already has, and a PENDING instance (it waits for
//! an upstream rerun; mark the upstream instead).

use crate::state::InstanceState;

/// The state a person marks an instance with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkAs {
    Success,
    Failed,
}

impl MarkAs {
    pub fn state(self) -> InstanceState {
        match self {
            MarkAs::Success => InstanceState::Success,
            MarkAs::Failed => InstanceState::Failed,
        }
    }
}

/// What a legal mark does to the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkPlan {
    /// The instance's new state.
    pub to: InstanceState,
    /// Its current attempt reached a worker (DISPATCHED or RUNNING): that attempt's record ends
    /// CANCELLED and the worker is told to kill its process.
    pub kill: bool,
    /// It was waiting, dispatched or running: it gives back its concurrency slots.
    pub was_active: bool,
    /// It had ended before: its downstream that did not run is judged again and its run
    /// reopened (an ended run runs again until nothing is left).
    pub reopens: bool,
}

/// Why a mark is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MarkRefused {
    #[error("it is {0} already")]
    Already(InstanceState),
    #[error(
        "it is PENDING: it waits for an upstream rerun and is judged when its upstreams end; mark \
         the upstream instance instead"
    )]
    Pending,
}

/// Whether an instance in `from` may be marked `to`, and what that does.
pub fn plan(from: InstanceState, to: MarkAs) -> Result<MarkPlan, MarkRefused> {
    use InstanceState::*;
    let target = to.state();
    match from {
        Pending => Err(MarkRefused::Pending),
        from if from == target => Err(MarkRefused::Already(from)),
        Waiting | Dispatched | Running => Ok(MarkPlan {
            to: target,
            kill: matches!(from, Dispatched | Running),
            was_active: true,
            reopens: false,
        }),
        Success | Failed | Timeout | Cancelled | Skipped | UpstreamFailed => Ok(MarkPlan {
            to: target,
            kill: false,
            was_active: false,
            reopens: true,
        }),
    }
}

/// A mark's reason is required: the audit trail and the attempt's record say why a person
/// overrode what ran. Returns the trimmed reason.
pub fn check_reason(reason: &str) -> Result<&str, String> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err("a mark needs a reason (say why the task's outcome is overridden)".into());
    }
    if reason.chars().count() > 500 {
        return Err(format!(
            "the reason is {} characters long; at most 500",
            reason.chars().count()
        ));
    }
    Ok(reason)
}

#[cfg(test)]
mod tests {
    use super::InstanceState::*;
    use super::*;

    #[test]
    fn an_active_instance_stops_and_only_a_started_one_is_killed() {
        for (from, kill) in [(Waiting, false), (Dispatched, true), (Running, true)] {
            for to in [MarkAs::Success, MarkAs::Failed] {
                let plan = plan(from, to).unwrap();
                assert_eq!(plan.to, to.state());
                assert_eq!(plan.kill, kill, "{from}");
                assert!(plan.was_active);
                assert!(!plan.reopens);
            }
        }
    }

    #[test]
    fn an_ended_instance_is_overridden_and_its_run_reopens() {
        for from in [Failed, Timeout, Cancelled, Skipped, UpstreamFailed] {
            let plan = plan(from, MarkAs::Success).unwrap();
            assert!(plan.reopens && !plan.kill && !plan.was_active, "{from}");
        }
        for from in [Success, Timeout, Cancelled, Skipped, UpstreamFailed] {
            assert_eq!(plan(from, MarkAs::Failed).unwrap().to, Failed, "{from}");
        }
    }

    #[test]
    fn the_same_state_and_pending_are_refused() {
        assert_eq!(
            plan(Success, MarkAs::Success),
            Err(MarkRefused::Already(Success))
        );
        assert_eq!(
            plan(Failed, MarkAs::Failed),
            Err(MarkRefused::Already(Failed))
        );
        assert_eq!(plan(Pending, MarkAs::Success), Err(MarkRefused::Pending));
        assert!(
            MarkRefused::Pending
                .to_string()
                .contains("mark the upstream")
        );
    }

    #[test]
    fn a_reason_is_required_and_bounded() {
        assert!(check_reason("  ").unwrap_err().contains("needs a reason"));
        assert_eq!(check_reason(" fixed by hand ").unwrap(), "fixed by hand");
        assert!(check_reason(&"x".repeat(501)).unwrap_err().contains("501"));
    }
}
