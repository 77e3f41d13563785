//! What each task of a run looks like, including the tasks without an instance: a task below a
//! failure is `upstream_failed`, one whose upstreams are still going is `pending`.
//!
//! An instance is created only when all its upstreams succeeded, so the run's instances alone do
//! not tell a person why a task never ran. This walks the DAG once in topological order
//! (O(tasks + edges)) and derives the missing tasks' status from their upstreams'.

use std::collections::HashMap;
use std::fmt;

use crate::dag::Dag;
use crate::state::InstanceState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// The task has an instance in this state (never PENDING: that shows as `Pending`).
    Instance(InstanceState),
    /// No instance (or a PENDING one) and no upstream failed: it waits for its upstreams.
    Pending,
    /// No instance (or a PENDING one) because an upstream, directly or transitively, failed,
    /// timed out or was cancelled.
    UpstreamFailed,
}

impl TaskStatus {
    /// Lower-case: the instance state's name, `pending` or `upstream_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Instance(state) => match state {
                InstanceState::Waiting => "waiting",
                InstanceState::Dispatched => "dispatched",
                InstanceState::Running => "running",
                InstanceState::Success => "success",
                InstanceState::Failed => "failed",
                InstanceState::Timeout => "timeout",
                InstanceState::Cancelled => "cancelled",
                InstanceState::Pending => "pending",
            },
            TaskStatus::Pending => "pending",
            TaskStatus::UpstreamFailed => "upstream_failed",
        }
    }

    /// Upper-case, as graphs and tables show it: the instance state's name, `PENDING` or
    /// `UPSTREAM_FAILED`.
    pub fn label(self) -> &'static str {
        match self {
            TaskStatus::Instance(state) => state.as_str(),
            TaskStatus::Pending => "PENDING",
            TaskStatus::UpstreamFailed => "UPSTREAM_FAILED",
        }
    }

    /// Reads [`TaskStatus::label`] back.
    pub fn parse_label(text: &str) -> Option<TaskStatus> {
        match text {
            "PENDING" => Some(TaskStatus::Pending),
            "UPSTREAM_FAILED" => Some(TaskStatus::UpstreamFailed),
            other => other.parse().ok().map(TaskStatus::Instance),
        }
    }

    /// Whether the tasks below this one can no longer run in this run (without a person).
    pub fn blocks_downstream(self) -> bool {
        matches!(
            self,
            TaskStatus::UpstreamFailed
                | TaskStatus::Instance(
                    InstanceState::Failed | InstanceState::Timeout | InstanceState::Cancelled
                )
        )
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every task of `dag` in file order with its status, given the run's instances' states by task.
pub fn task_statuses(
    dag: &Dag,
    instances: &HashMap<String, InstanceState>,
) -> Vec<(String, TaskStatus)> {
    let mut status: HashMap<&str, TaskStatus> = HashMap::with_capacity(dag.len());
    for task in dag.topological_order() {
        let own = instances
            .get(task)
            .copied()
            .filter(|state| *state != InstanceState::Pending);
        let value = match own {
            Some(state) => TaskStatus::Instance(state),
            None if dag.upstream(task).iter().any(|up| {
                status
                    .get(up.as_str())
                    .is_some_and(|s| s.blocks_downstream())
            }) =>
            {
                TaskStatus::UpstreamFailed
            }
            None => TaskStatus::Pending,
        };
        status.insert(task, value);
    }
    dag.tasks()
        .iter()
        .map(|task| (task.clone(), status[task.as_str()]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::TaskSpec;
    use InstanceState::*;

    fn check(spec: &[(&str, &[&str])], states: &[(&str, InstanceState)], expect: &[(&str, &str)]) {
        let tasks: Vec<TaskSpec> = spec
            .iter()
            .map(|(name, ups)| TaskSpec {
                name: name.to_string(),
                upstream: ups.iter().map(|u| u.to_string()).collect(),
                ..TaskSpec::default()
            })
            .collect();
        let dag = Dag::new(&tasks).unwrap();
        let instances = states.iter().map(|(t, s)| (t.to_string(), *s)).collect();
        let got: Vec<(String, &str)> = task_statuses(&dag, &instances)
            .into_iter()
            .map(|(task, status)| (task, status.as_str()))
            .collect();
        let want: Vec<(String, &str)> = expect.iter().map(|(t, s)| (t.to_string(), *s)).collect();
        assert_eq!(got, want);
    }

    const DIAMOND: &[(&str, &[&str])] = &[
        ("a", &[]),
        ("b", &["a"]),
        ("c", &["a"]),
        ("d", &["b", "c"]),
        ("e", &["d"]),
    ];

    #[test]
    fn a_failure_makes_everything_below_it_upstream_failed() {
        check(
            DIAMOND,
            &[("a", Success), ("b", Failed), ("c", Success)],
            &[
                ("a", "success"),
                ("b", "failed"),
                ("c", "success"),
                ("d", "upstream_failed"),
                ("e", "upstream_failed"),
            ],
        );
    }

    #[test]
    fn tasks_below_running_upstreams_are_pending() {
        check(
            DIAMOND,
            &[("a", Success), ("b", Running), ("c", Waiting)],
            &[
                ("a", "success"),
                ("b", "running"),
                ("c", "waiting"),
                ("d", "pending"),
                ("e", "pending"),
            ],
        );
    }

    #[test]
    fn a_failure_wins_over_a_branch_still_going() {
        check(
            DIAMOND,
            &[("a", Success), ("b", Timeout), ("c", Running)],
            &[
                ("a", "success"),
                ("b", "timeout"),
                ("c", "running"),
                ("d", "upstream_failed"),
                ("e", "upstream_failed"),
            ],
        );
        check(
            DIAMOND,
            &[("a", Cancelled)],
            &[
                ("a", "cancelled"),
                ("b", "upstream_failed"),
                ("c", "upstream_failed"),
                ("d", "upstream_failed"),
                ("e", "upstream_failed"),
            ],
        );
    }

    #[test]
    fn a_pending_instance_after_a_rerun_counts_as_not_created() {
        // Rerun from b, which failed again: d and e ran before and are PENDING.
        check(
            DIAMOND,
            &[
                ("a", Success),
                ("b", Failed),
                ("c", Success),
                ("d", Pending),
                ("e", Pending),
            ],
            &[
                ("a", "success"),
                ("b", "failed"),
                ("c", "success"),
                ("d", "upstream_failed"),
                ("e", "upstream_failed"),
            ],
        );
        // Still going: the PENDING ones wait.
        check(
            DIAMOND,
            &[
                ("a", Success),
                ("b", Running),
                ("c", Success),
                ("d", Pending),
                ("e", Pending),
            ],
            &[
                ("a", "success"),
                ("b", "running"),
                ("c", "success"),
                ("d", "pending"),
                ("e", "pending"),
            ],
        );
    }

    #[test]
    fn a_fresh_run_shows_roots_waiting_and_the_rest_pending() {
        check(
            DIAMOND,
            &[("a", Waiting)],
            &[
                ("a", "waiting"),
                ("b", "pending"),
                ("c", "pending"),
                ("d", "pending"),
                ("e", "pending"),
            ],
        );
    }
}
