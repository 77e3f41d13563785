//! Verdicts on attempts the scheduler believes are on a worker: healthy, timed out, lost, or
//! never started.
//!
//! The rules of design.md, in one place:
//! - A worker is dead when it has been silent (no heartbeat, or its stream closed and did not
//!   come back) for `dead_after_missed` worker heartbeat intervals (20 s by default). A stream
//!   that is reconnecting is not a dead worker: heartbeats on the new stream count.
//! - Timeout is measured from the attempt's start, never from a heartbeat. The worker enforces
//!   it; the scheduler's backstop declares TIMEOUT only when
//!   `now − started_at > timeout + 1.5 × the longest heartbeat interval`.
//! - An attempt is lost when its task heartbeat is older than 1.5 × its interval *and* its
//!   worker is dead. A late or batched heartbeat alone never condemns a healthy task.
//! - A dispatched attempt whose worker died before starting it goes back to WAITING.

use crate::Millis;
use crate::state::InstanceState;

/// The heartbeat settings the verdicts depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intervals {
    pub worker_heartbeat_ms: Millis,
    pub task_heartbeat_ms: Millis,
    pub dead_after_missed: u32,
}

impl Intervals {
    /// Silence after which a worker is dead.
    pub fn worker_dead_after_ms(&self) -> Millis {
        self.worker_heartbeat_ms * Millis::from(self.dead_after_missed)
    }

    /// Age of the last task heartbeat after which a running attempt may be lost.
    pub fn task_silent_after_ms(&self) -> Millis {
        self.task_heartbeat_ms * 3 / 2
    }

    /// What the backstop adds to a task's timeout before declaring TIMEOUT.
    pub fn timeout_grace_ms(&self) -> Millis {
        self.worker_heartbeat_ms.max(self.task_heartbeat_ms) * 3 / 2
    }
}

/// What the scheduler knows about one attempt that is DISPATCHED or RUNNING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFacts {
    pub state: InstanceState,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub last_task_heartbeat: Option<Millis>,
    /// 0 means no timeout.
    pub timeout_ms: u64,
    /// The last sign of life of the attempt's worker on any node (a heartbeat, a registration,
    /// or the moment its stream closed). `None` when no node has ever seen it.
    pub worker_last_seen: Option<Millis>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Past timeout + grace: the attempt ends TIMEOUT (and its process is killed if reachable).
    TimedOut,
    /// Its worker is dead and it has been silent: it ends FAILED as lost.
    Lost,
    /// Dispatched to a worker that died before starting it: back to WAITING, same attempt.
    NeverStarted,
}

pub fn worker_is_dead(last_seen: Option<Millis>, intervals: &Intervals, now: Millis) -> bool {
    match last_seen {
        Some(seen) => now - seen > intervals.worker_dead_after_ms(),
        None => true,
    }
}

pub fn judge(facts: &AttemptFacts, intervals: &Intervals, now: Millis) -> Verdict {
    let dead = worker_is_dead(facts.worker_last_seen, intervals, now);
    match facts.state {
        InstanceState::Dispatched if dead => {
            // Give a fresh dispatch the same grace as a worker: the worker may not have been
            // seen by this node yet.
            let since = facts.dispatched_at.unwrap_or(Millis::MIN);
            if now - since > intervals.worker_dead_after_ms() {
                Verdict::NeverStarted
            } else {
                Verdict::Healthy
            }
        }
        InstanceState::Running => {
            let started = facts.started_at.or(facts.dispatched_at).unwrap_or(now);
            if facts.timeout_ms > 0
                && now - started > facts.timeout_ms as Millis + intervals.timeout_grace_ms()
            {
                return Verdict::TimedOut;
            }
            let last_active = facts.last_task_heartbeat.unwrap_or(started).max(started);
            if dead && now - last_active > intervals.task_silent_after_ms() {
                Verdict::Lost
            } else {
                Verdict::Healthy
            }
        }
        _ => Verdict::Healthy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Millis = 1_000;
    const DEFAULTS: Intervals = Intervals {
        worker_heartbeat_ms: 5 * SEC,
        task_heartbeat_ms: 30 * SEC,
        dead_after_missed: 4,
    };

    fn running(
        started: Millis,
        heartbeat: Millis,
        timeout_ms: u64,
        worker_seen: Millis,
    ) -> AttemptFacts {
        AttemptFacts {
            state: InstanceState::Running,
            dispatched_at: Some(started - 10),
            started_at: Some(started),
            last_task_heartbeat: Some(heartbeat),
            timeout_ms,
            worker_last_seen: Some(worker_seen),
        }
    }

    #[test]
    fn thresholds_are_generous_multiples_of_the_intervals() {
        assert_eq!(DEFAULTS.worker_dead_after_ms(), 20 * SEC);
        assert_eq!(DEFAULTS.task_silent_after_ms(), 45 * SEC);
        assert_eq!(DEFAULTS.timeout_grace_ms(), 45 * SEC);
    }

    /// The seed's incident: a 30-minute task on a loaded worker whose heartbeats were batched
    /// into a 15-minute window. Its worker is alive, so it is healthy at 50% of its timeout and
    /// at 100%, and only the backstop past timeout + grace ends it.
    #[test]
    fn a_late_heartbeat_alone_never_condemns_a_healthy_task() {
        let timeout = 30 * 60 * SEC;
        let start = 0;
        let at_half = 15 * 60 * SEC;
        let facts = running(start, start, timeout as u64, at_half - SEC);
        assert_eq!(judge(&facts, &DEFAULTS, at_half), Verdict::Healthy);
        let at_timeout = timeout;
        let facts = running(start, start, timeout as u64, at_timeout + 40 * SEC);
        assert_eq!(
            judge(&facts, &DEFAULTS, at_timeout + 44 * SEC),
            Verdict::Healthy
        );
        assert_eq!(
            judge(&facts, &DEFAULTS, at_timeout + 46 * SEC),
            Verdict::TimedOut
        );
    }

    #[test]
    fn timeout_is_measured_from_the_start_not_the_heartbeat() {
        // Fresh heartbeats do not extend the timeout.
        let facts = running(0, 100 * SEC, 60_000, 100 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 106 * SEC), Verdict::TimedOut);
        // No timeout: never timed out while its worker lives.
        let facts = running(0, 100 * SEC, 0, 9_999 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 10_000 * SEC), Verdict::Healthy);
    }

    #[test]
    fn lost_needs_both_a_silent_task_and_a_dead_worker() {
        // Silent task, live worker (the worker is just busy): healthy.
        let facts = running(0, 0, 0, 99 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 100 * SEC), Verdict::Healthy);
        // Dead worker, but the task heartbeat is recent: not yet.
        let facts = running(0, 70 * SEC, 0, 70 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 100 * SEC), Verdict::Healthy);
        // Dead worker and a silent task: lost.
        let facts = running(0, 50 * SEC, 0, 50 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 100 * SEC), Verdict::Lost);
        // The boundary is strict: exactly at the threshold is still alive.
        let facts = running(0, 55 * SEC, 0, 80 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 100 * SEC), Verdict::Healthy);
    }

    #[test]
    fn a_reconnected_worker_is_alive() {
        // The stream broke at 10 s and came back; heartbeats on the new stream arrived until
        // 50 s. The task itself has been silent for a minute, but its worker lives.
        let facts = running(0, 0, 0, 50 * SEC);
        assert_eq!(judge(&facts, &DEFAULTS, 60 * SEC), Verdict::Healthy);
    }

    #[test]
    fn a_dispatch_to_a_dead_worker_goes_back_after_the_grace() {
        let facts = AttemptFacts {
            state: InstanceState::Dispatched,
            dispatched_at: Some(0),
            started_at: None,
            last_task_heartbeat: None,
            timeout_ms: 0,
            worker_last_seen: None,
        };
        assert_eq!(judge(&facts, &DEFAULTS, 10 * SEC), Verdict::Healthy);
        assert_eq!(judge(&facts, &DEFAULTS, 21 * SEC), Verdict::NeverStarted);
        let alive = AttemptFacts {
            worker_last_seen: Some(20 * SEC),
            ..facts
        };
        assert_eq!(judge(&alive, &DEFAULTS, 21 * SEC), Verdict::Healthy);
    }

    #[test]
    fn other_states_are_not_judged() {
        for state in [
            InstanceState::Waiting,
            InstanceState::Success,
            InstanceState::Failed,
        ] {
            let facts = AttemptFacts {
                state,
                ..running(0, 0, 1, 0)
            };
            assert_eq!(judge(&facts, &DEFAULTS, 1_000 * SEC), Verdict::Healthy);
        }
    }
}
