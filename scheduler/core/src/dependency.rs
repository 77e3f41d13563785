//! Cross-workflow dependencies: a workflow with `schedule.after: [a, b]` gets one run for a
//! logical time L once each of `a` and `b` has a successful run for L.
//!
//! The store asks [`decide`] in the transaction that ends an upstream run SUCCESS, with what it
//! found for each upstream workflow; the run it then creates carries the dedup key
//! [`dedup_key`], so a second upstream completion for the same L (a duplicate, a rerun) finds the
//! run there and creates nothing. At apply, [`find_cycle`] refuses a workflow whose `after` would
//! close a loop through workflows already stored.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::Millis;
use crate::decision::DecisionKind;
use crate::ids::RunId;

/// What the store found for one upstream workflow of a dependent, for one logical time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamFact {
    pub workflow: String,
    /// A SUCCESS run of it for the logical time, if there is one.
    pub success_run: Option<RunId>,
}

/// What a dependent workflow does when one of its upstreams succeeded for a logical time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyDecision {
    /// The dependent is paused: nothing is created.
    Paused,
    /// Every upstream succeeded for the logical time: one run, naming these upstream runs.
    Fire { upstream_runs: Vec<(String, RunId)> },
    /// Some upstreams have no successful run for the logical time yet.
    Wait { missing: Vec<String> },
}

impl DependencyDecision {
    pub fn kind(&self) -> DecisionKind {
        match self {
            DependencyDecision::Paused => DecisionKind::Paused,
            DependencyDecision::Fire { .. } => DecisionKind::Fired,
            DependencyDecision::Wait { .. } => DecisionKind::WaitingUpstream,
        }
    }

    /// One line for a person (the decision log's detail).
    pub fn detail(&self, logical_time: Millis) -> String {
        let logical_time = crate::rfc3339(logical_time);
        match self {
            DependencyDecision::Paused => {
                format!("upstreams succeeded for logical time {logical_time} while paused")
            }
            DependencyDecision::Fire { upstream_runs } => format!(
                "upstream runs succeeded for logical time {logical_time}: {}",
                upstream_runs_text(upstream_runs)
            ),
            DependencyDecision::Wait { missing } => format!(
                "waiting for {} to succeed for logical time {logical_time}",
                missing.join(", ")
            ),
        }
    }
}

/// `ingest run 4, dims run 7`: who a dependency run was triggered by.
pub fn upstream_runs_text(upstream_runs: &[(String, RunId)]) -> String {
    upstream_runs
        .iter()
        .map(|(workflow, run)| format!("{workflow} run {run}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The run's dedup key: one dependency run per (workflow, logical time).
pub fn dedup_key(logical_time: Millis) -> String {
    format!("dep:{logical_time}")
}

/// The decision for a dependent with these upstream facts (in its `after` order).
pub fn decide(paused: bool, upstreams: &[UpstreamFact]) -> DependencyDecision {
    if paused {
        return DependencyDecision::Paused;
    }
    let missing: Vec<String> = upstreams
        .iter()
        .filter(|u| u.success_run.is_none())
        .map(|u| u.workflow.clone())
        .collect();
    if !missing.is_empty() || upstreams.is_empty() {
        return DependencyDecision::Wait { missing };
    }
    DependencyDecision::Fire {
        upstream_runs: upstreams
            .iter()
            .filter_map(|u| u.success_run.map(|run| (u.workflow.clone(), run)))
            .collect(),
    }
}

/// A workflow's `after` would close a loop of workflows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule.after: cycle across workflows: {}", path.join(" → "))]
pub struct WorkflowCycle {
    /// In run order, starting and ending with the applied workflow: `[report, ingest, report]`
    /// says ingest runs after report and report after ingest.
    pub path: Vec<String>,
}

/// Whether applying `workflow` with `after` closes a cycle through the stored dependencies
/// (`stored`: each other workflow's `after` list; `workflow`'s own stored entry is replaced).
/// The shortest cycle is spelled, ties broken by name, so the message is deterministic.
pub fn find_cycle(
    workflow: &str,
    after: &[String],
    stored: &BTreeMap<String, Vec<String>>,
) -> Result<(), WorkflowCycle> {
    if after.iter().any(|a| a == workflow) {
        return Err(WorkflowCycle {
            path: vec![workflow.to_string(), workflow.to_string()],
        });
    }
    // Downstream edges (upstream → the workflows that run after it), without the applied
    // workflow's stored edges.
    let mut downstream: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (down, ups) in stored {
        if down == workflow {
            continue;
        }
        for up in ups {
            downstream
                .entry(up.as_str())
                .or_default()
                .insert(down.as_str());
        }
    }
    let closes: BTreeSet<&str> = after.iter().map(String::as_str).collect();
    // Breadth-first from the applied workflow along downstream edges; reaching one of its own
    // upstreams closes the loop.
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut queue = VecDeque::from([workflow]);
    let mut seen = BTreeSet::from([workflow]);
    while let Some(current) = queue.pop_front() {
        if current != workflow && closes.contains(current) {
            let mut path = vec![workflow.to_string(), current.to_string()];
            let mut cursor = current;
            while let Some(&p) = parent.get(cursor) {
                path.insert(1, p.to_string());
                cursor = p;
            }
            // `parent` chains end at the applied workflow, which is already first.
            path.remove(1);
            path.push(workflow.to_string());
            return Err(WorkflowCycle { path });
        }
        for &next in downstream.get(current).into_iter().flatten() {
            if seen.insert(next) {
                parent.insert(next, current);
                queue.push_back(next);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(workflow: &str, run: Option<i64>) -> UpstreamFact {
        UpstreamFact {
            workflow: workflow.into(),
            success_run: run.map(RunId),
        }
    }

    fn stored(edges: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        edges
            .iter()
            .map(|(down, ups)| {
                (
                    down.to_string(),
                    ups.iter().map(|u| u.to_string()).collect(),
                )
            })
            .collect()
    }

    fn after(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn fires_once_every_upstream_succeeded_for_the_logical_time() {
        let d = decide(false, &[fact("ingest", Some(4)), fact("dims", Some(7))]);
        assert_eq!(
            d,
            DependencyDecision::Fire {
                upstream_runs: vec![("ingest".into(), RunId(4)), ("dims".into(), RunId(7))]
            }
        );
        assert_eq!(d.kind(), DecisionKind::Fired);
        assert_eq!(
            d.detail(1_767_225_600_000),
            "upstream runs succeeded for logical time 2026-01-01T00:00:00Z: ingest run 4, dims run 7"
        );
    }

    #[test]
    fn waits_naming_the_upstreams_without_a_success() {
        let d = decide(false, &[fact("ingest", Some(4)), fact("dims", None)]);
        assert_eq!(
            d,
            DependencyDecision::Wait {
                missing: vec!["dims".into()]
            }
        );
        assert_eq!(d.kind(), DecisionKind::WaitingUpstream);
        assert_eq!(
            d.detail(1_767_225_600_000),
            "waiting for dims to succeed for logical time 2026-01-01T00:00:00Z"
        );
    }

    #[test]
    fn a_paused_dependent_creates_nothing() {
        let d = decide(true, &[fact("ingest", Some(4))]);
        assert_eq!(d, DependencyDecision::Paused);
        assert_eq!(d.kind(), DecisionKind::Paused);
    }

    #[test]
    fn no_upstream_never_fires() {
        assert_eq!(
            decide(false, &[]),
            DependencyDecision::Wait { missing: vec![] }
        );
    }

    #[test]
    fn dedup_key_names_the_logical_time() {
        assert_eq!(dedup_key(1_700_000_000_000), "dep:1700000000000");
    }

    #[test]
    fn a_two_workflow_cycle_is_spelled_out() {
        let err = find_cycle(
            "report",
            &after(&["ingest"]),
            &stored(&[("ingest", &["report"])]),
        )
        .unwrap_err();
        assert_eq!(err.path, ["report", "ingest", "report"]);
        assert_eq!(
            err.to_string(),
            "schedule.after: cycle across workflows: report → ingest → report"
        );
    }

    #[test]
    fn a_longer_cycle_is_spelled_shortest_first() {
        // c after b, b after a; applying a after c closes a → b → c → a.
        let edges = stored(&[("b", &["a"]), ("c", &["b"]), ("y", &["a"])]);
        let err = find_cycle("a", &after(&["c", "y"]), &edges).unwrap_err();
        assert_eq!(
            err.to_string(),
            "schedule.after: cycle across workflows: a → y → a"
        );
        let err = find_cycle("a", &after(&["c"]), &edges).unwrap_err();
        assert_eq!(err.path, ["a", "b", "c", "a"]);
    }

    #[test]
    fn no_cycle_when_the_applied_workflows_old_edges_would_be_the_only_loop() {
        // Stored: report after ingest. Re-applying report after dims drops that edge.
        let edges = stored(&[("report", &["ingest"]), ("ingest", &["dims"])]);
        assert_eq!(find_cycle("report", &after(&["dims"]), &edges), Ok(()));
        // A diamond is not a cycle.
        let edges = stored(&[("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])]);
        assert_eq!(find_cycle("e", &after(&["d", "a"]), &edges), Ok(()));
        // Upstreams that do not exist yet are fine.
        assert_eq!(
            find_cycle("e", &after(&["later"]), &BTreeMap::new()),
            Ok(())
        );
    }

    #[test]
    fn depending_on_itself_is_a_cycle() {
        let err = find_cycle("a", &after(&["a"]), &BTreeMap::new()).unwrap_err();
        assert_eq!(err.path, ["a", "a"]);
    }
}
