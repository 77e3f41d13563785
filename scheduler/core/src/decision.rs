//! Scheduling decisions that are not a plain start: what `axctl why` reads back.
//!
//! The schedule loop, the run queue and the dispatcher record one of these whenever they decide
//! *not* to do the obvious thing (or do it for a reason worth telling): a cron slot fired, was
//! skipped by the misfire policy or the overlap policy, a run was queued behind a concurrency
//! limit, an instance found no live worker with its labels. A person asking "why didn't it run at
//! 02:30?" then reads the answer instead of reconstructing it from logs.

use std::fmt;

/// What was decided. Stored by its `as_str` name; names are only ever added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DecisionKind {
    /// A cron slot (or a dependency, or a backfill slot) created a run.
    Fired,
    /// A slot missed during downtime or a pause was dropped by the misfire policy.
    Misfired,
    /// A slot missed during downtime or a pause was run late by the misfire policy.
    CaughtUp,
    /// A slot was dropped because an earlier run was still active (overlap policy `skip`).
    SkippedOverlap,
    /// An active run was cancelled to make room for a new one (overlap policy `replace`).
    Replaced,
    /// A run waits for a slot under max active runs or a keyed concurrency limit.
    Queued,
    /// A queued run started.
    Dequeued,
    /// A slot came while the workflow was paused.
    Paused,
    /// A slot fell outside the schedule's start/end dates.
    OutsideWindow,
    /// A waiting instance found no live worker carrying its labels.
    NoWorker,
    /// A waiting instance was held back by a concurrency limit (task, workflow or pool).
    Throttled,
    /// A dependency-triggered workflow is waiting for an upstream workflow's run.
    WaitingUpstream,
    /// An attempt was lost with its worker (dead, or back without it): FAILED, retried as its
    /// task allows.
    Lost,
    /// A dispatch its worker never confirmed was taken back: the instance waits as its next
    /// attempt, which does not count against its retries.
    Withdrawn,
    /// An attempt ran past its timeout and grace with no report from its worker: the scheduler
    /// ended it TIMEOUT and told the worker to kill it.
    TimedOut,
    /// A running attempt's task heartbeat stopped while its worker stayed alive: recorded and
    /// alerted once, never killed.
    Stalled,
    /// A waiting instance's task names a secret this node cannot give it (missing, or no key
    /// to open it): it waits until it can.
    SecretUnavailable,
    /// A task's `if:` was false: it is SKIPPED. The detail holds the expression and the
    /// values it read.
    ConditionFalse,
    /// A mapped task's list (`for_each`) was empty: it is SKIPPED.
    EmptyList,
    /// A run had not ended by its deadline (`crate::deadline`): recorded once, alerted, and
    /// with `on_deadline: cancel` the run was cancelled.
    DeadlineMissed,
    /// A run that is never refused (a cron or dependency fire, a child run, a backfill slot)
    /// was created while its app's or the cluster's WAITING instances were at a bound
    /// (`crate::admission`), where an API trigger would have been refused.
    AdmittedOverBound,
}

impl DecisionKind {
    pub const ALL: [DecisionKind; 21] = [
        DecisionKind::Fired,
        DecisionKind::Misfired,
        DecisionKind::CaughtUp,
        DecisionKind::SkippedOverlap,
        DecisionKind::Replaced,
        DecisionKind::Queued,
        DecisionKind::Dequeued,
        DecisionKind::Paused,
        DecisionKind::OutsideWindow,
        DecisionKind::NoWorker,
        DecisionKind::Throttled,
        DecisionKind::WaitingUpstream,
        DecisionKind::Lost,
        DecisionKind::Withdrawn,
        DecisionKind::TimedOut,
        DecisionKind::Stalled,
        DecisionKind::SecretUnavailable,
        DecisionKind::ConditionFalse,
        DecisionKind::EmptyList,
        DecisionKind::DeadlineMissed,
        DecisionKind::AdmittedOverBound,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Fired => "fired",
            DecisionKind::Misfired => "misfired",
            DecisionKind::CaughtUp => "caught_up",
            DecisionKind::SkippedOverlap => "skipped_overlap",
            DecisionKind::Replaced => "replaced",
            DecisionKind::Queued => "queued",
            DecisionKind::Dequeued => "dequeued",
            DecisionKind::Paused => "paused",
            DecisionKind::OutsideWindow => "outside_window",
            DecisionKind::NoWorker => "no_worker",
            DecisionKind::Throttled => "throttled",
            DecisionKind::WaitingUpstream => "waiting_upstream",
            DecisionKind::Lost => "lost",
            DecisionKind::Withdrawn => "withdrawn",
            DecisionKind::TimedOut => "timed_out",
            DecisionKind::Stalled => "stalled",
            DecisionKind::SecretUnavailable => "secret_unavailable",
            DecisionKind::ConditionFalse => "condition_false",
            DecisionKind::EmptyList => "empty_list",
            DecisionKind::DeadlineMissed => "deadline_missed",
            DecisionKind::AdmittedOverBound => "admitted_over_bound",
        }
    }

    pub fn parse(s: &str) -> Option<DecisionKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == s)
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut names = std::collections::BTreeSet::new();
        for kind in DecisionKind::ALL {
            assert_eq!(DecisionKind::parse(kind.as_str()), Some(kind));
            assert!(names.insert(kind.as_str()), "duplicate name {kind}");
        }
        assert_eq!(DecisionKind::parse("started"), None);
    }
}
