//! Concurrency limits: which waiting instances fit the capacity the limits leave.
//!
//! An instance counts against the limits of its task (`concurrency`), its workflow
//! (`concurrency.max_running_tasks`) and its pool (the scheduler config's `[pools]`) from its
//! claim (DISPATCHED) until its attempt ends (terminal, back to WAITING, or cancelled). The store
//! enforces the limits race-free across scheduler nodes with one counter row per limited scope,
//! taken in the claim's transaction; the dispatcher uses [`Fitter`] first, on a snapshot of those
//! counters, so that a throttled instance does not take a worker slot a lower-priority instance
//! of another task could use, and to say why it waits.

use std::collections::BTreeMap;

use crate::ids::WorkflowId;
use crate::spec::TaskSpec;

/// One limit an instance counts against.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Limit {
    /// The counter's key: `task:<workflow id>:<task>`, `workflow:<workflow id>` or
    /// `pool:<name>`.
    pub scope: String,
    /// Instances of the scope dispatched or running at once; always at least 1.
    pub max: u32,
}

impl Limit {
    /// The Throttled decision's detail: "task limit 2 reached".
    pub fn reason(&self) -> String {
        let kind = self.scope.split(':').next().unwrap_or("concurrency");
        format!("{kind} limit {} reached", self.max)
    }
}

/// The limits an instance of `task` counts against: only those set (a 0 means none), and a pool
/// only when the scheduler config gives it a limit. Sorted by scope, which is also the order the
/// store locks their counters in.
pub fn limits_for(
    workflow: WorkflowId,
    task: &TaskSpec,
    max_running_tasks: u32,
    pools: &BTreeMap<String, u32>,
) -> Vec<Limit> {
    let mut limits = Vec::new();
    if task.concurrency > 0 {
        limits.push(Limit {
            scope: format!("task:{}:{}", workflow.0, task.name),
            max: task.concurrency,
        });
    }
    if max_running_tasks > 0 {
        limits.push(Limit {
            scope: format!("workflow:{}", workflow.0),
            max: max_running_tasks,
        });
    }
    if let Some(pool) = &task.pool
        && let Some(&max) = pools.get(pool)
        && max > 0
    {
        limits.push(Limit {
            scope: format!("pool:{pool}"),
            max,
        });
    }
    limits.sort();
    limits
}

/// The capacity left under the limits during one dispatcher pass, starting from the counters'
/// values (`used`, by scope; a scope without a counter has none in use).
#[derive(Debug, Clone, Default)]
pub struct Fitter {
    used: BTreeMap<String, u32>,
}

impl Fitter {
    pub fn new(used: BTreeMap<String, u32>) -> Fitter {
        Fitter { used }
    }

    /// Takes one unit of every limit in `limits` if each has room; otherwise takes nothing and
    /// returns the first full limit. Called in priority order, so the highest-priority instances
    /// get the room and a throttled instance never blocks another task's.
    pub fn take<'a>(&mut self, limits: &'a [Limit]) -> Result<(), &'a Limit> {
        if let Some(full) = self.first_full(limits) {
            return Err(full);
        }
        for limit in limits {
            *self.used.entry(limit.scope.clone()).or_insert(0) += 1;
        }
        Ok(())
    }

    /// The first of `limits` with no room left, if any; takes nothing.
    pub fn first_full<'a>(&self, limits: &'a [Limit]) -> Option<&'a Limit> {
        limits
            .iter()
            .find(|limit| self.used(&limit.scope) >= limit.max)
    }

    /// Gives back what [`Fitter::take`] took (the instance found no worker after all).
    pub fn give_back(&mut self, limits: &[Limit]) {
        for limit in limits {
            if let Some(used) = self.used.get_mut(&limit.scope) {
                *used = used.saturating_sub(1);
            }
        }
    }

    pub fn used(&self, scope: &str) -> u32 {
        self.used.get(scope).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str, concurrency: u32, pool: Option<&str>) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            concurrency,
            pool: pool.map(String::from),
            ..TaskSpec::default()
        }
    }

    #[test]
    fn only_set_limits_count_and_they_are_sorted() {
        let pools = BTreeMap::from([("etl".to_string(), 4)]);
        let wf = WorkflowId(7);
        assert_eq!(limits_for(wf, &task("a", 0, None), 0, &pools), vec![]);
        // An unconfigured pool has no limit.
        assert_eq!(
            limits_for(wf, &task("a", 0, Some("gpu")), 0, &pools),
            vec![]
        );
        let all = limits_for(wf, &task("a", 2, Some("etl")), 10, &pools);
        let scopes: Vec<_> = all.iter().map(|l| (l.scope.as_str(), l.max)).collect();
        assert_eq!(
            scopes,
            [("pool:etl", 4), ("task:7:a", 2), ("workflow:7", 10)]
        );
        assert_eq!(all[1].reason(), "task limit 2 reached");
        assert_eq!(all[0].reason(), "pool limit 4 reached");
        assert_eq!(all[2].reason(), "workflow limit 10 reached");
    }

    #[test]
    fn fitting_in_priority_order_throttles_the_full_task_but_not_others() {
        let pools = BTreeMap::new();
        let wf = WorkflowId(1);
        let limited = limits_for(wf, &task("limited", 2, None), 0, &pools);
        let free = limits_for(wf, &task("free", 0, None), 0, &pools);
        // One instance of "limited" already runs (from the store's counters).
        let mut fitter = Fitter::new(BTreeMap::from([("task:1:limited".to_string(), 1)]));
        // Priority order: three of "limited" first, then "free".
        assert_eq!(fitter.take(&limited), Ok(()));
        assert_eq!(
            fitter.take(&limited).unwrap_err().reason(),
            "task limit 2 reached"
        );
        assert!(fitter.take(&limited).is_err());
        assert_eq!(fitter.take(&free), Ok(()));
        assert_eq!(fitter.used("task:1:limited"), 2);
        // No worker for the one that fit: its unit is free again.
        fitter.give_back(&limited);
        assert_eq!(fitter.take(&limited), Ok(()));
    }

    #[test]
    fn a_full_limit_takes_nothing_from_the_others() {
        let pools = BTreeMap::from([("etl".to_string(), 1)]);
        let wf = WorkflowId(1);
        let a = limits_for(wf, &task("a", 5, Some("etl")), 3, &pools);
        let b = limits_for(wf, &task("b", 5, Some("etl")), 3, &pools);
        let mut fitter = Fitter::default();
        assert_eq!(fitter.take(&a), Ok(()));
        assert_eq!(fitter.take(&b).unwrap_err().scope, "pool:etl");
        assert_eq!(fitter.used("task:1:b"), 0);
        assert_eq!(fitter.used("workflow:1"), 1);
    }

    #[test]
    fn random_sequences_never_exceed_any_limit() {
        let mut state = 99u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let pools = BTreeMap::from([("p".to_string(), 3)]);
        let tasks: Vec<TaskSpec> = (0..4)
            .map(|i| {
                task(
                    &format!("t{i}"),
                    (i % 3) as u32,
                    (i % 2 == 0).then_some("p"),
                )
            })
            .collect();
        for _ in 0..200 {
            let mut fitter = Fitter::default();
            let mut taken: Vec<Vec<Limit>> = Vec::new();
            for _ in 0..30 {
                let t = &tasks[(next() % 4) as usize];
                let limits = limits_for(WorkflowId(1), t, 5, &pools);
                if next() % 4 == 0 && !taken.is_empty() {
                    let back = taken.remove((next() as usize) % taken.len());
                    fitter.give_back(&back);
                }
                if fitter.take(&limits).is_ok() {
                    taken.push(limits);
                }
                let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
                for limits in &taken {
                    for l in limits {
                        *counts.entry(&l.scope).or_default() += 1;
                        assert!(counts[l.scope.as_str()] <= l.max);
                    }
                }
            }
        }
    }
}
