//! Sharded broadcast: one shard per eligible live worker, and when the task is over.
//!
//! A task with `routing: sharded_broadcast` gets its one instance per run like any task (the
//! *parent*). The parent is never dispatched: when the dispatcher first sees it WAITING it fans
//! it out into one shard instance per live worker carrying the task's labels (in worker id
//! order, shard index 0..n), pinned to that worker, and the parent becomes RUNNING with no
//! worker. Each shard is dispatched (and retried) only on its worker. The parent ends with
//! [`parent_outcome`], and only the parent counts for the run's end and for the task's
//! downstream.

use crate::state::InstanceState;

/// How the shards of one fan-out stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShardProgress {
    pub total: u32,
    pub succeeded: u32,
    /// FAILED or TIMEOUT with no retry left.
    pub failed: u32,
    pub cancelled: u32,
}

/// The parent's end, once decided: FAILED as soon as a shard failed with no retries left (the
/// other shards run on, and the run waits for them before it ends), CANCELLED when a shard was
/// cancelled and none failed, SUCCESS when every shard succeeded; `None` while shards are
/// unfinished and none failed.
pub fn parent_outcome(progress: ShardProgress) -> Option<InstanceState> {
    if progress.failed > 0 {
        return Some(InstanceState::Failed);
    }
    if progress.cancelled > 0 {
        return Some(InstanceState::Cancelled);
    }
    if progress.total > 0 && progress.succeeded >= progress.total {
        return Some(InstanceState::Success);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(total: u32, succeeded: u32, failed: u32, cancelled: u32) -> ShardProgress {
        ShardProgress {
            total,
            succeeded,
            failed,
            cancelled,
        }
    }

    #[test]
    fn the_parent_waits_for_all_and_fails_on_the_first_failure() {
        assert_eq!(parent_outcome(p(3, 0, 0, 0)), None);
        assert_eq!(parent_outcome(p(3, 2, 0, 0)), None);
        assert_eq!(parent_outcome(p(3, 3, 0, 0)), Some(InstanceState::Success));
        assert_eq!(parent_outcome(p(3, 0, 1, 0)), Some(InstanceState::Failed));
        assert_eq!(parent_outcome(p(3, 2, 1, 0)), Some(InstanceState::Failed));
        assert_eq!(parent_outcome(p(3, 1, 1, 1)), Some(InstanceState::Failed));
        assert_eq!(
            parent_outcome(p(3, 1, 0, 1)),
            Some(InstanceState::Cancelled)
        );
        assert_eq!(parent_outcome(p(0, 0, 0, 0)), None);
    }
}
