//! Retention: which ended runs are history old enough to purge.
//!
//! A workflow's own `retention` wins over the cluster's default (`retention` in the scheduler
//! config); `forever`, or no retention anywhere, keeps every run. A run goes once it ended
//! (SUCCESS, FAILED or CANCELLED) longer ago than its workflow keeps runs; a queued or running
//! run never goes, however old.

use crate::Millis;
use crate::run::RunState;
use crate::spec::Retention;

/// How long ended runs of a workflow are kept, in milliseconds; `None` keeps them forever.
pub fn kept_for(own: Option<Retention>, cluster_default_ms: Option<u64>) -> Option<u64> {
    match own {
        Some(Retention::Forever) => None,
        Some(Retention::Keep { ms }) => Some(ms),
        None => cluster_default_ms,
    }
    .filter(|ms| *ms > 0)
}

/// Runs of the workflow that ended before this instant are purged at `now`; `None` when the
/// workflow keeps its runs forever.
pub fn cutoff(
    own: Option<Retention>,
    cluster_default_ms: Option<u64>,
    now: Millis,
) -> Option<Millis> {
    kept_for(own, cluster_default_ms).map(|ms| older_than(ms, now))
}

/// The instant `ms` before `now` (the distant past when `ms` reaches beyond the epoch's range).
pub fn older_than(ms: u64, now: Millis) -> Millis {
    now.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Whether a run in `state` that ended at `finished_at` is past `cutoff`.
pub fn purgeable(state: RunState, finished_at: Option<Millis>, cutoff: Millis) -> bool {
    state.is_terminal() && finished_at.is_some_and(|at| at < cutoff)
}

/// Whether the node `me` is the one that purges, of the nodes whose leases are live: the one
/// with the lowest id, so that a cluster purges on one node at a time (a second purger would
/// only repeat the same deletes: each step locks its runs and skips those already gone).
pub fn is_purger<'a>(live: impl IntoIterator<Item = &'a str>, me: &str) -> bool {
    live.into_iter().all(|other| me <= other)
}

/// The refusal of an on-demand purge's age (`axctl purge --older-than`): it must keep
/// something, or a purge would take runs that ended a moment ago.
pub fn check_older_than(ms: i64) -> Result<u64, String> {
    if ms <= 0 {
        return Err(format!(
            "older_than must be more than zero (got {ms} ms), e.g. 90d"
        ));
    }
    Ok(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;
    const NOW: Millis = 1_800_000_000_000;

    #[test]
    fn a_workflow_s_own_retention_wins_over_the_default() {
        let own = Some(Retention::Keep { ms: 7 * DAY });
        assert_eq!(kept_for(own, Some(90 * DAY)), Some(7 * DAY));
        assert_eq!(kept_for(None, Some(90 * DAY)), Some(90 * DAY));
        assert_eq!(kept_for(Some(Retention::Forever), Some(90 * DAY)), None);
        assert_eq!(kept_for(None, None), None);
        assert_eq!(kept_for(own, None), Some(7 * DAY));
        assert_eq!(
            cutoff(None, Some(DAY), NOW),
            Some(NOW - DAY as i64),
            "a day before now"
        );
        assert_eq!(cutoff(Some(Retention::Forever), Some(DAY), NOW), None);
        assert_eq!(older_than(u64::MAX, NOW), NOW - i64::MAX);
    }

    #[test]
    fn only_ended_runs_past_the_cutoff_go() {
        let cutoff = NOW - DAY as i64;
        for state in [RunState::Success, RunState::Failed, RunState::Cancelled] {
            assert!(purgeable(state, Some(cutoff - 1), cutoff), "{state}");
            assert!(
                !purgeable(state, Some(cutoff), cutoff),
                "{state} at the cutoff"
            );
            assert!(!purgeable(state, None, cutoff), "{state} without an end");
        }
        for state in [RunState::Running, RunState::Queued] {
            assert!(!purgeable(state, Some(0), cutoff), "{state}");
        }
    }

    #[test]
    fn the_live_node_with_the_lowest_id_purges() {
        assert!(is_purger(["n1", "n2", "n3"], "n1"));
        assert!(!is_purger(["n1", "n2"], "n2"));
        // A node that does not see its own lease (the store is slow to show it) still judges
        // by the others; alone, it purges.
        assert!(is_purger(["n2"], "n1"));
        assert!(is_purger([], "n1"));
    }

    #[test]
    fn an_on_demand_purge_keeps_something() {
        assert_eq!(check_older_than(90 * DAY as i64), Ok(90 * DAY));
        assert!(check_older_than(0).unwrap_err().contains("more than zero"));
        assert!(check_older_than(-5).is_err());
    }
}
