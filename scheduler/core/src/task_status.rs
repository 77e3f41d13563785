//! What each task of a run looks like, including the tasks without an instance yet.
//!
//! The advance gives a task an instance once its trigger rule is judged (`crate::trigger_rule`):
//! to run, or SKIPPED or UPSTREAM_FAILED. A task without one is still waiting for its upstreams,
//! or sits in a run that stopped before its rule was judged (cancelled, or ended before the
//! advance kept the tasks that did not run). This walks the DAG once in topological order
//! (O(tasks + edges)) and judges those tasks' rules on their upstreams' statuses, so a person
//! sees `skipped` or `upstream_failed` where the rule already decides it and `pending` otherwise.
//! The run's handlers (`on_failure`, `on_success`) without an instance are `pending`.

use std::collections::HashMap;
use std::fmt;

use crate::dag::Dag;
use crate::state::InstanceState;
use crate::trigger_rule::{TriggerRule, UpstreamEnd, Upstreams, judge};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// The task has an instance in this state (never PENDING: that shows as `Pending`), or its
    /// rule already decides SKIPPED or UPSTREAM_FAILED.
    Instance(InstanceState),
    /// No instance (or a PENDING one) and its rule not decided yet: it waits for its upstreams.
    Pending,
}

impl TaskStatus {
    /// Lower-case: the instance state's name or `pending`.
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
                InstanceState::Skipped => "skipped",
                InstanceState::UpstreamFailed => "upstream_failed",
            },
            TaskStatus::Pending => "pending",
        }
    }

    /// Upper-case, as graphs and tables show it: the instance state's name or `PENDING`.
    pub fn label(self) -> &'static str {
        match self {
            TaskStatus::Instance(state) => state.as_str(),
            TaskStatus::Pending => "PENDING",
        }
    }

    /// Reads [`TaskStatus::label`] back.
    pub fn parse_label(text: &str) -> Option<TaskStatus> {
        match text {
            "PENDING" => Some(TaskStatus::Pending),
            other => other.parse().ok().map(TaskStatus::Instance),
        }
    }

    /// The state the trigger rules read: `None` while the task may still change.
    fn state(self) -> Option<InstanceState> {
        match self {
            TaskStatus::Instance(state) => Some(state),
            TaskStatus::Pending => None,
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status of a task without an instance (or with a PENDING one), from its rule and its
/// direct upstreams' statuses: SKIPPED or UPSTREAM_FAILED where the rule already decides so,
/// else `Pending`.
pub fn without_instance(
    rule: TriggerRule,
    upstreams: impl IntoIterator<Item = TaskStatus>,
) -> TaskStatus {
    let upstreams = Upstreams::count(
        upstreams
            .into_iter()
            .map(|status| UpstreamEnd::of(status.state())),
    );
    match judge(rule, upstreams).and_then(|verdict| verdict.state()) {
        Some(state) => TaskStatus::Instance(state),
        None => TaskStatus::Pending,
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
            None if dag.handler(task).is_some() => TaskStatus::Pending,
            None => without_instance(
                dag.rule(task),
                dag.upstream(task)
                    .iter()
                    .filter_map(|up| status.get(up.as_str()).copied()),
            ),
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
        let ruled: Vec<(&str, &[&str], TriggerRule)> = spec
            .iter()
            .map(|(name, ups)| (*name, *ups, TriggerRule::AllSuccess))
            .collect();
        check_ruled(&ruled, states, expect);
    }

    fn check_ruled(
        spec: &[(&str, &[&str], TriggerRule)],
        states: &[(&str, InstanceState)],
        expect: &[(&str, &str)],
    ) {
        let tasks: Vec<TaskSpec> = spec
            .iter()
            .map(|(name, ups, rule)| TaskSpec {
                name: name.to_string(),
                upstream: ups.iter().map(|u| u.to_string()).collect(),
                trigger_rule: *rule,
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

    const RULED: &[(&str, &[&str], TriggerRule)] = &[
        ("a", &[], TriggerRule::AllSuccess),
        ("b", &["a"], TriggerRule::AllSuccess),
        ("c", &["b"], TriggerRule::AllSuccess),
        ("d", &["a"], TriggerRule::OneFailed),
        ("e", &["c", "d"], TriggerRule::NoneFailed),
    ];

    #[test]
    fn tasks_without_an_instance_show_what_their_rule_decides() {
        // a failed: b and c are upstream-failed; d (one_failed) is about to run; e
        // (none_failed) already has a failed upstream.
        check_ruled(
            RULED,
            &[("a", Failed)],
            &[
                ("a", "failed"),
                ("b", "upstream_failed"),
                ("c", "upstream_failed"),
                ("d", "pending"),
                ("e", "upstream_failed"),
            ],
        );
        // b skipped: c follows it under all_success; d is skipped (nothing failed); e
        // (none_failed) over two skipped upstreams runs.
        check_ruled(
            RULED,
            &[("a", Success), ("b", Skipped)],
            &[
                ("a", "success"),
                ("b", "skipped"),
                ("c", "skipped"),
                ("d", "skipped"),
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
