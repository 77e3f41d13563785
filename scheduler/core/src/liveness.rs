//! Verdicts on attempts the scheduler believes are on a worker: healthy, timed out, lost, or
//! withdrawn.
//!
//! The rules, in one place:
//! - A worker is dead when it has been silent (no heartbeat, or its stream closed and did not
//!   come back) for `dead_after_missed` worker heartbeat intervals (20 s by default). A stream
//!   that is reconnecting is not a dead worker: heartbeats on the new stream count.
//! - **A node's own blindness never counts against a worker.** Silence is measured from the
//!   worker's last sign of life or from the moment the judging node began to watch (its start,
//!   or the moment it got its store back after losing it), whichever is later: a "last seen"
//!   older than that is not evidence, because the worker may have tried to reach a node that
//!   was not there. Until a worker has had the dead threshold from that moment to reconnect and
//!   replay its reports, no verdict is given at all (not even a timeout: the report saying the
//!   attempt ended in time may be on its way).
//! - Timeout is measured from the attempt's start, never from a heartbeat. The worker enforces
//!   it; the scheduler enforces it too, whatever the worker does, at
//!   `now − started_at > timeout + timeout_grace` (the grace covers the worker's own kill,
//!   SIGTERM then SIGKILL, and its report's way back).
//! - An attempt is lost when its worker is dead. By then a worker that is alive but cut off has
//!   fenced itself (it does at ¾ of the dead threshold), so a retry never runs beside it.
//! - A running attempt whose task heartbeat is older than 1.5 × its interval while its worker
//!   is alive has stalled: the node records it and alerts, and never kills it. A late or
//!   batched heartbeat alone never condemns a healthy task.
//! - A dispatched attempt whose worker died without confirming a start is withdrawn: it goes
//!   back to WAITING as attempt + 1, because the dispatch may have reached the worker and an
//!   attempt number is never dispatched twice.

use std::num::NonZeroU64;

use crate::Millis;
use crate::state::InstanceState;

/// The heartbeat settings the verdicts depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intervals {
    pub worker_heartbeat_ms: Millis,
    pub task_heartbeat_ms: Millis,
    pub dead_after_missed: u32,
    /// How long past a task's timeout the scheduler waits for the worker's own report.
    pub timeout_grace_ms: Millis,
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
}

/// What the scheduler knows about one attempt that is DISPATCHED or RUNNING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFacts {
    pub state: InstanceState,
    pub dispatched_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub last_task_heartbeat: Option<Millis>,
    /// `None`: the attempt may run as long as it takes.
    pub timeout_ms: Option<NonZeroU64>,
    /// The last sign of life of the attempt's worker on any node (a heartbeat, a registration,
    /// or the moment its stream closed). `None` when no node has ever seen it.
    pub worker_last_seen: Option<Millis>,
}

/// The judging node: its settings, and since when it has been able to see workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judge {
    pub intervals: Intervals,
    /// When this node started, or last got its store back after losing it.
    pub watching_since: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Past timeout + grace: the attempt ends TIMEOUT, its worker is told to kill it, and a
    /// retry waits until the worker says the process ended (or the start lock expires).
    TimedOut,
    /// Its worker is dead: it ends FAILED as lost.
    Lost,
    /// Its worker is alive but its task heartbeat stopped: told, never killed.
    Stalled,
    /// Dispatched to a worker that died without confirming a start: back to WAITING as
    /// attempt + 1, which does not count against the task's retries.
    Withdrawn,
}

impl Judge {
    /// True while workers may still be reconnecting to this node: no verdict is given.
    pub fn in_grace(&self, now: Millis) -> bool {
        now - self.watching_since <= self.intervals.worker_dead_after_ms()
    }

    pub fn worker_is_dead(&self, last_seen: Option<Millis>, now: Millis) -> bool {
        let seen = last_seen.map_or(self.watching_since, |seen| seen.max(self.watching_since));
        now - seen > self.intervals.worker_dead_after_ms()
    }

    pub fn judge(&self, facts: &AttemptFacts, now: Millis) -> Verdict {
        if self.in_grace(now) {
            return Verdict::Healthy;
        }
        let intervals = &self.intervals;
        let dead = self.worker_is_dead(facts.worker_last_seen, now);
        match facts.state {
            InstanceState::Dispatched if dead => {
                // Give a fresh dispatch the same grace as a worker: the worker may not have
                // been seen by this node yet.
                let since = facts.dispatched_at.unwrap_or(Millis::MIN);
                if now - since > intervals.worker_dead_after_ms() {
                    Verdict::Withdrawn
                } else {
                    Verdict::Healthy
                }
            }
            InstanceState::Running => {
                let started = facts.started_at.or(facts.dispatched_at).unwrap_or(now);
                if let Some(timeout) = facts.timeout_ms
                    && now - started > timeout.get() as Millis + intervals.timeout_grace_ms
                {
                    return Verdict::TimedOut;
                }
                let last_active = facts.last_task_heartbeat.unwrap_or(started).max(started);
                if dead {
                    Verdict::Lost
                } else if now - last_active > intervals.task_silent_after_ms() {
                    Verdict::Stalled
                } else {
                    Verdict::Healthy
                }
            }
            _ => Verdict::Healthy,
        }
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
        timeout_grace_ms: 15 * SEC,
    };

    /// A node that has been watching for ages.
    fn judge(facts: &AttemptFacts, now: Millis) -> Verdict {
        watching_since(-1_000_000 * SEC).judge(facts, now)
    }

    fn watching_since(at: Millis) -> Judge {
        Judge {
            intervals: DEFAULTS,
            watching_since: at,
        }
    }

    fn running(
        started: Millis,
        heartbeat: Millis,
        timeout_ms: Option<NonZeroU64>,
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

    fn dispatched(at: Millis, worker_seen: Option<Millis>) -> AttemptFacts {
        AttemptFacts {
            state: InstanceState::Dispatched,
            dispatched_at: Some(at),
            started_at: None,
            last_task_heartbeat: None,
            timeout_ms: None,
            worker_last_seen: worker_seen,
        }
    }

    #[test]
    fn thresholds_are_generous_multiples_of_the_intervals() {
        assert_eq!(DEFAULTS.worker_dead_after_ms(), 20 * SEC);
        assert_eq!(DEFAULTS.task_silent_after_ms(), 45 * SEC);
    }

    /// A busy worker with late heartbeats: a 30-minute task on a loaded worker whose heartbeats
    /// come batched into a 15-minute window. Its worker is alive, so at 50% of its timeout and
    /// at 100% it is at most stalled (told, never killed), and only the backstop past timeout +
    /// grace ends it.
    #[test]
    fn a_late_heartbeat_alone_never_condemns_a_healthy_task() {
        let timeout = 30 * 60 * SEC;
        let start = 0;
        let at_half = 15 * 60 * SEC;
        let facts = running(start, start, NonZeroU64::new(timeout as u64), at_half - SEC);
        assert_eq!(judge(&facts, at_half), Verdict::Stalled);
        let at_timeout = timeout;
        let facts = running(
            start,
            start,
            NonZeroU64::new(timeout as u64),
            at_timeout + 10 * SEC,
        );
        assert_eq!(judge(&facts, at_timeout + 14 * SEC), Verdict::Stalled);
        assert_eq!(judge(&facts, at_timeout + 16 * SEC), Verdict::TimedOut);
    }

    #[test]
    fn timeout_is_measured_from_the_start_not_the_heartbeat() {
        // Fresh heartbeats do not extend the timeout.
        let facts = running(0, 100 * SEC, NonZeroU64::new(60_000), 100 * SEC);
        assert_eq!(judge(&facts, 76 * SEC), Verdict::TimedOut);
        // No timeout: never timed out while its worker lives.
        let facts = running(0, 9_999 * SEC, None, 9_999 * SEC);
        assert_eq!(judge(&facts, 10_000 * SEC), Verdict::Healthy);
    }

    #[test]
    fn a_connected_worker_does_not_save_an_attempt_past_its_timeout() {
        // The worker heartbeats right now but never reported the timeout it should have
        // enforced: the scheduler enforces it.
        let facts = running(0, 29 * SEC, NonZeroU64::new(2_000), 30 * SEC);
        assert_eq!(judge(&facts, 17 * SEC + 1), Verdict::TimedOut);
        assert_eq!(judge(&facts, 17 * SEC), Verdict::Healthy);
    }

    #[test]
    fn lost_needs_a_dead_worker_and_a_silent_task_on_a_live_one_has_stalled() {
        // Silent task, live worker (the worker is just busy): stalled, not lost.
        let facts = running(0, 0, None, 99 * SEC);
        assert_eq!(judge(&facts, 100 * SEC), Verdict::Stalled);
        // Dead worker, even with a recent task heartbeat: lost (a cut-off worker fenced the
        // attempt at 3/4 of the dead threshold).
        let facts = running(0, 70 * SEC, None, 70 * SEC);
        assert_eq!(judge(&facts, 100 * SEC), Verdict::Lost);
        // Dead worker and a silent task: lost.
        let facts = running(0, 50 * SEC, None, 50 * SEC);
        assert_eq!(judge(&facts, 100 * SEC), Verdict::Lost);
        // The boundaries are strict: exactly at either threshold is still healthy.
        let facts = running(0, 55 * SEC, None, 80 * SEC);
        assert_eq!(judge(&facts, 100 * SEC), Verdict::Healthy);
    }

    /// A worker killed with -9 while its task heartbeated a moment before: the attempt is lost
    /// once the worker has been silent for the dead threshold, whatever the task heartbeat.
    #[test]
    fn a_dead_workers_attempt_is_lost_at_the_dead_threshold() {
        let facts = running(0, 10 * SEC, None, 10 * SEC);
        assert_eq!(judge(&facts, 30 * SEC), Verdict::Healthy);
        assert_eq!(judge(&facts, 30 * SEC + 1), Verdict::Lost);
    }

    #[test]
    fn a_reconnected_worker_is_alive() {
        // The stream broke at 10 s and came back; heartbeats on the new stream arrived until
        // 50 s. The task itself has been silent for a minute, but its worker lives: the
        // attempt has stalled, and is not lost.
        let facts = running(0, 0, None, 50 * SEC);
        assert_eq!(judge(&facts, 60 * SEC), Verdict::Stalled);
    }

    #[test]
    fn a_dispatch_to_a_dead_worker_is_withdrawn_after_the_grace() {
        let facts = dispatched(0, None);
        assert_eq!(judge(&facts, 10 * SEC), Verdict::Healthy);
        assert_eq!(judge(&facts, 21 * SEC), Verdict::Withdrawn);
        let alive = dispatched(0, Some(20 * SEC));
        assert_eq!(judge(&alive, 21 * SEC), Verdict::Healthy);
    }

    /// A node that was down from 10 s to 100 s: the workers were seen last before it went down,
    /// so by the store they look long dead. Until 120 s (its start + the dead threshold) nothing
    /// is judged, not even the timeout of an attempt whose report may be on its way; after that
    /// silence counts from 100 s, not from the last sighting.
    #[test]
    fn a_restarted_node_counts_no_silence_from_before_its_start() {
        let node = watching_since(100 * SEC);
        let silent = running(0, 5 * SEC, None, 10 * SEC);
        let over_time = running(0, 5 * SEC, NonZeroU64::new(1_000), 10 * SEC);
        let sent = dispatched(9 * SEC, Some(10 * SEC));
        let never_seen = dispatched(9 * SEC, None);
        for facts in [silent, over_time, sent, never_seen] {
            assert_eq!(node.judge(&facts, 101 * SEC), Verdict::Healthy, "{facts:?}");
            assert_eq!(node.judge(&facts, 120 * SEC), Verdict::Healthy, "{facts:?}");
        }
        assert!(!node.worker_is_dead(Some(10 * SEC), 120 * SEC));
        assert!(node.worker_is_dead(Some(10 * SEC), 121 * SEC));
        assert_eq!(node.judge(&silent, 121 * SEC), Verdict::Lost);
        assert_eq!(node.judge(&over_time, 121 * SEC), Verdict::TimedOut);
        assert_eq!(node.judge(&sent, 121 * SEC), Verdict::Withdrawn);
        assert_eq!(node.judge(&never_seen, 121 * SEC), Verdict::Withdrawn);
        // A worker that reconnected after the restart is judged by its new heartbeats.
        assert!(!node.worker_is_dead(Some(115 * SEC), 121 * SEC));
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
                ..running(0, 0, NonZeroU64::new(1), 0)
            };
            assert_eq!(judge(&facts, 1_000 * SEC), Verdict::Healthy);
        }
    }
}
