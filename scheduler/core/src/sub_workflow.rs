//! Sub-workflows: a task `run_workflow: NAME` starts a run of another workflow of its app (the
//! child run) and ends as that run ends.
//!
//! The dispatcher starts the child in the transaction that marks the parent's attempt RUNNING
//! (no worker takes it), under the dedup key [`dedup_key`] of that attempt, so a start repeated
//! after a crash finds the child there and never makes a second one. The node's sweep
//! (`scheduler/src/sub_workflows.rs`) asks [`judge`] about each open wait: end the parent's
//! attempt as the child ended, time it out past the task's `timeout:` (cancelling the child),
//! cancel a child whose parent attempt ended first, or close the wait. At apply, [`find_call_cycle`] refuses a `run_workflow` that would close a loop of
//! workflows, and [`render_params`] is what the child's params are made of at its start.

use std::collections::BTreeMap;
use std::num::NonZeroU64;

use crate::Millis;
use crate::ids::{Attempt, InstanceId};
use crate::outputs::{self, Outputs};
use crate::run::RunState;
use crate::spec::WorkflowSpec;

/// The child run's dedup (and idempotency) key: one child per attempt of the parent task.
pub fn dedup_key(instance: InstanceId, attempt: Attempt) -> String {
    format!("parent:{}:{}", instance.0, attempt.0)
}

/// How the parent task's attempt ends for a child run that ended in `child`; `None` while the
/// child is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentEnd {
    Success,
    Failed,
    Cancelled,
}

impl ParentEnd {
    /// The parent's end for a child in `child`; `None` while the child runs or is queued.
    pub fn of(child: RunState) -> Option<ParentEnd> {
        match child {
            RunState::Success => Some(ParentEnd::Success),
            RunState::Failed => Some(ParentEnd::Failed),
            RunState::Cancelled => Some(ParentEnd::Cancelled),
            RunState::Running | RunState::Queued => None,
        }
    }
}

/// Where the parent's side of a wait stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentSide {
    /// Its instance is RUNNING as the attempt that started the child, within its timeout.
    Waiting,
    /// Still waiting, but longer than the task's `timeout:`.
    PastTimeout,
    /// The attempt has ended (or the instance is gone).
    Ended,
}

impl ParentSide {
    /// The side of an attempt that is RUNNING (`waiting`) since `started_at`, with the task's
    /// `timeout`, at `now`. A `run_workflow` task's timeout bounds its wait for the child as a
    /// command's timeout bounds its process; there is no worker grace to add.
    pub fn of(
        waiting: bool,
        started_at: Option<Millis>,
        timeout_ms: Option<NonZeroU64>,
        now: Millis,
    ) -> ParentSide {
        let past = match (started_at, timeout_ms) {
            (Some(started), Some(timeout)) => {
                now.saturating_sub(started) >= i64::try_from(timeout.get()).unwrap_or(i64::MAX)
            }
            _ => false,
        };
        match (waiting, past) {
            (false, _) => ParentSide::Ended,
            (true, false) => ParentSide::Waiting,
            (true, true) => ParentSide::PastTimeout,
        }
    }
}

/// What the sweep does about one open wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepAction {
    /// Both sides are active: nothing yet.
    Wait,
    /// The child ended while the parent's attempt waits on it: end the attempt so.
    EndParent(ParentEnd),
    /// The parent's attempt outlived its timeout with the child still active: end the attempt
    /// TIMEOUT (retried per its `retries`) and cancel the child, in one transaction.
    TimeOut,
    /// The parent's attempt ended first (cancelled, its run cancelled, retried by hand): the
    /// child is an orphan and is cancelled.
    CancelChild,
    /// Both have ended: the wait is closed.
    Close,
}

/// The sweep's decision for a wait whose parent is on `parent`'s side and whose child run is in
/// `child`. A child that has ended wins over a timeout passed in the same instant: its end is
/// what happened.
pub fn judge(parent: ParentSide, child: RunState) -> SweepAction {
    match (parent, ParentEnd::of(child)) {
        (ParentSide::Waiting, None) => SweepAction::Wait,
        (ParentSide::PastTimeout, None) => SweepAction::TimeOut,
        (ParentSide::Waiting | ParentSide::PastTimeout, Some(end)) => SweepAction::EndParent(end),
        (ParentSide::Ended, None) => SweepAction::CancelChild,
        (ParentSide::Ended, Some(_)) => SweepAction::Close,
    }
}

/// The line the parent's attempt ends with: `child run 12 (load-region) ended FAILED`.
pub fn end_message(child_run: i64, child_workflow: &str, child: RunState) -> String {
    format!("child run {child_run} ({child_workflow}) ended {child}")
}

/// The line a timed-out parent's attempt ends with.
pub fn timeout_message(child_run: i64, child_workflow: &str, timeout_ms: u64) -> String {
    format!(
        "timed out: child run {child_run} ({child_workflow}) still active after the task's \
         timeout of {timeout_ms} ms; the child run was cancelled"
    )
}

const PARAMS_OPEN: &str = "${params.";

/// The `${params.NAME}` names in a `params:` value, in order; a malformed one is the error.
pub fn param_references(text: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(PARAMS_OPEN) {
        let after = &rest[start + PARAMS_OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(format!("{PARAMS_OPEN}… is not closed by }}"));
        };
        let name = &after[..end];
        if !crate::spec::is_valid_env_name(name) {
            return Err(format!(
                "${{params.{name}}} is not a param reference: write ${{params.NAME}}"
            ));
        }
        names.push(name.to_string());
        rest = &after[end + 1..];
    }
    Ok(names)
}

/// The child run's params: each template with `${params.NAME}` replaced by the parent run's
/// param (empty when the run has none, as `concurrency.key` reads a missing one) and
/// `${tasks.T.outputs.K}` by the output an upstream passed on. A missing output is the error
/// (apply checked that T is upstream; it may still not have written K).
pub fn render_params(
    templates: &BTreeMap<String, String>,
    params: &BTreeMap<String, String>,
    outputs: &BTreeMap<String, Outputs>,
) -> Result<BTreeMap<String, String>, String> {
    let mut rendered = BTreeMap::new();
    for (name, template) in templates {
        let mut text = String::with_capacity(template.len());
        let mut rest = template.as_str();
        while let Some(start) = rest.find(PARAMS_OPEN) {
            let after = &rest[start + PARAMS_OPEN.len()..];
            let Some(end) = after.find('}') else { break };
            text.push_str(&rest[..start]);
            text.push_str(params.get(&after[..end]).map_or("", String::as_str));
            rest = &after[end + 1..];
        }
        text.push_str(rest);
        let lookup = |r: &outputs::OutputRef| outputs.get(&r.task)?.get(&r.key).cloned();
        let value = outputs::substitute(&text, lookup).map_err(|missing| {
            format!("params.{name}: {missing} is missing: the upstream did not pass it on")
        })?;
        rendered.insert(name.clone(), value);
    }
    Ok(rendered)
}

/// The refusal of deleting `workflow` (of `app`) while live workflows of its app still call it:
/// their next run would fail the calling task, so they are named for the user to change or
/// delete first. `None` when nothing calls it. `calls` is each live workflow's callees,
/// `apps` each live workflow's app.
pub fn callers_refusal(
    workflow: &str,
    app: &str,
    calls: &BTreeMap<String, Vec<String>>,
    apps: &BTreeMap<String, String>,
) -> Option<String> {
    let callers: Vec<&str> = calls
        .iter()
        .filter(|(caller, callees)| {
            caller.as_str() != workflow
                && apps.get(*caller).map(String::as_str) == Some(app)
                && callees.iter().any(|callee| callee == workflow)
        })
        .map(|(caller, _)| caller.as_str())
        .collect();
    if callers.is_empty() {
        return None;
    }
    Some(format!(
        "workflow {workflow} is called by {} (run_workflow): their next runs would fail that \
         task; change or delete them first",
        callers.join(", ")
    ))
}

/// A `run_workflow` would close a loop of workflows calling each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("run_workflow: cycle across workflows: {}", path.join(" → "))]
pub struct CallCycle {
    /// In call order, starting and ending with the applied workflow: `[a, b, a]` says a runs b
    /// and b runs a.
    pub path: Vec<String>,
}

/// Whether `workflow`, calling `calls`, closes a loop through the other workflows' calls
/// (`stored`, by caller; `workflow`'s own entry is replaced). The shortest loop is spelled, as
/// `schedule.after` cycles are (`crate::dependency::find_cycle`, whose search this is, with
/// the edges read the other way round).
pub fn find_call_cycle(
    workflow: &str,
    calls: &[String],
    stored: &BTreeMap<String, Vec<String>>,
) -> Result<(), CallCycle> {
    // `find_cycle` follows "runs after" edges from a workflow's upstreams; a callee plays the
    // upstream's part, so its loop comes back in reverse call order.
    crate::dependency::find_cycle(workflow, calls, stored).map_err(|cycle| {
        let mut path = cycle.path;
        path.reverse();
        CallCycle { path }
    })
}

/// Every workflow's calls once a set of files is applied: the stored calls, each member's own
/// in place of its stored ones, none for a pruned workflow (as
/// `crate::workflow_set::dependencies_after` does for `after`).
pub fn calls_after(
    stored: &BTreeMap<String, Vec<String>>,
    members: &[(&str, Vec<String>)],
    pruned: &std::collections::BTreeSet<String>,
) -> BTreeMap<String, Vec<String>> {
    let mut graph: BTreeMap<String, Vec<String>> = stored
        .iter()
        .filter(|(name, _)| !pruned.contains(*name))
        .map(|(name, calls)| (name.clone(), calls.clone()))
        .collect();
    for (name, calls) in members {
        if calls.is_empty() {
            graph.remove(*name);
        } else {
            graph.insert(name.to_string(), calls.clone());
        }
    }
    graph
}

/// One `run_workflow` of a workflow file: the task's field, the line it is on, the workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `tasks[1].run_workflow`, `on_failure[0].run_workflow`.
    pub field: String,
    pub line: usize,
    pub workflow: String,
}

/// The `run_workflow` references of `spec`, read from `source`, in task order. The line is the
/// first `run_workflow:` line naming that workflow (0 when none is found, for a spec that was
/// not read from this source).
pub fn references(spec: &WorkflowSpec, source: &str) -> Vec<Reference> {
    let mut counters: BTreeMap<&str, usize> = BTreeMap::new();
    let mut found = Vec::new();
    for task in &spec.tasks {
        let list = task.handler.map_or("tasks", |h| h.field());
        let counter = counters.entry(list).or_default();
        let index = *counter;
        *counter += 1;
        if let Some(workflow) = &task.run_workflow {
            found.push(Reference {
                field: format!("{list}[{index}].run_workflow"),
                line: reference_line(source, workflow),
                workflow: workflow.clone(),
            });
        }
    }
    found
}

/// The 1-based line of the first `run_workflow: NAME` (plain or quoted, block or flow style).
fn reference_line(source: &str, workflow: &str) -> usize {
    source
        .lines()
        .position(|line| {
            line.split("run_workflow").skip(1).any(|rest| {
                let value = rest
                    .trim_start()
                    .strip_prefix(':')
                    .unwrap_or("")
                    .trim_start();
                let value = value.trim_start_matches(['"', '\'']);
                value.strip_prefix(workflow).is_some_and(|after| {
                    after.is_empty() || after.starts_with(['"', '\'', ',', '}', ' ', '#'])
                })
            })
        })
        .map_or(0, |index| index + 1)
}

/// One file of a set being applied, as the reference checks need it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub file: &'a str,
    pub source: &'a str,
    pub spec: &'a WorkflowSpec,
}

/// The refusals of the `run_workflow` references of a set of files (one file for a single
/// apply), each `FILE:LINE: FIELD: why`: a workflow that will not exist once the set is applied
/// or is of another app (said alike: an app sees only its own names), and a loop of calls
/// through the set and the stored workflows. `apps` names the live workflows' apps, `stored`
/// their calls; `pruned` are going.
pub fn check_references(
    members: &[Member<'_>],
    apps: &BTreeMap<String, String>,
    stored: &BTreeMap<String, Vec<String>>,
    pruned: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut app_after: BTreeMap<&str, &str> = apps
        .iter()
        .filter(|(name, _)| !pruned.contains(*name))
        .map(|(name, app)| (name.as_str(), app.as_str()))
        .collect();
    for member in members {
        app_after.insert(&member.spec.name, &member.spec.app);
    }
    let calls: Vec<(&str, Vec<String>)> = members
        .iter()
        .map(|m| {
            let mut calls: Vec<String> = m
                .spec
                .tasks
                .iter()
                .filter_map(|t| t.run_workflow.clone())
                .collect();
            calls.sort();
            calls.dedup();
            (m.spec.name.as_str(), calls)
        })
        .collect();
    let graph = calls_after(stored, &calls, pruned);
    let mut refusals = Vec::new();
    for (member, (_, own)) in members.iter().zip(&calls) {
        let references = references(member.spec, member.source);
        let mut refused = false;
        for reference in &references {
            if app_after.get(reference.workflow.as_str()) != Some(&member.spec.app.as_str()) {
                refusals.push(format!(
                    "{}:{}: {}: workflow {} not found in app {}: run_workflow names a workflow of \
                     its own app that exists or is applied with it",
                    member.file,
                    reference.line,
                    reference.field,
                    reference.workflow,
                    member.spec.app
                ));
                refused = true;
            }
        }
        if refused {
            continue;
        }
        if let Err(cycle) = find_call_cycle(&member.spec.name, own, &graph) {
            let at = cycle
                .path
                .get(1)
                .and_then(|callee| references.iter().find(|r| &r.workflow == callee));
            let (line, field) = at.map_or((0, "tasks"), |r| (r.line, r.field.as_str()));
            refusals.push(format!("{}:{line}: {field}: {cycle}", member.file));
        }
    }
    refusals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        edges
            .iter()
            .map(|(caller, calls)| (caller.to_string(), names(calls)))
            .collect()
    }

    #[test]
    fn a_parent_ends_as_its_child_ended() {
        let cases = [
            (RunState::Success, Some(ParentEnd::Success)),
            (RunState::Failed, Some(ParentEnd::Failed)),
            (RunState::Cancelled, Some(ParentEnd::Cancelled)),
            (RunState::Running, None),
            (RunState::Queued, None),
        ];
        for (child, end) in cases {
            assert_eq!(ParentEnd::of(child), end, "{child}");
        }
    }

    #[test]
    fn the_sweep_ends_parents_cancels_orphans_and_closes_the_rest() {
        use ParentSide::{Ended, PastTimeout, Waiting};
        let cases = [
            (Waiting, RunState::Running, SweepAction::Wait),
            (Waiting, RunState::Queued, SweepAction::Wait),
            (
                Waiting,
                RunState::Success,
                SweepAction::EndParent(ParentEnd::Success),
            ),
            (
                Waiting,
                RunState::Failed,
                SweepAction::EndParent(ParentEnd::Failed),
            ),
            (
                Waiting,
                RunState::Cancelled,
                SweepAction::EndParent(ParentEnd::Cancelled),
            ),
            (PastTimeout, RunState::Running, SweepAction::TimeOut),
            (PastTimeout, RunState::Queued, SweepAction::TimeOut),
            (
                PastTimeout,
                RunState::Success,
                SweepAction::EndParent(ParentEnd::Success),
            ),
            (
                PastTimeout,
                RunState::Failed,
                SweepAction::EndParent(ParentEnd::Failed),
            ),
            (Ended, RunState::Running, SweepAction::CancelChild),
            (Ended, RunState::Queued, SweepAction::CancelChild),
            (Ended, RunState::Success, SweepAction::Close),
            (Ended, RunState::Cancelled, SweepAction::Close),
        ];
        for (parent, child, action) in cases {
            assert_eq!(judge(parent, child), action, "{parent:?} {child}");
        }
        assert_eq!(
            end_message(12, "load-region", RunState::Failed),
            "child run 12 (load-region) ended FAILED"
        );
    }

    #[test]
    fn a_wait_is_past_its_timeout_from_the_attempts_start() {
        let minute = NonZeroU64::new(60_000);
        let cases = [
            (true, Some(1_000), minute, 60_999, ParentSide::Waiting),
            (true, Some(1_000), minute, 61_000, ParentSide::PastTimeout),
            (true, Some(1_000), None, i64::MAX, ParentSide::Waiting),
            (true, None, minute, i64::MAX, ParentSide::Waiting),
            (false, Some(1_000), minute, 61_000, ParentSide::Ended),
            (false, Some(1_000), minute, 0, ParentSide::Ended),
        ];
        for (waiting, started, timeout, now, side) in cases {
            assert_eq!(
                ParentSide::of(waiting, started, timeout, now),
                side,
                "{waiting} {started:?} {timeout:?} {now}"
            );
        }
        assert_eq!(
            timeout_message(12, "load-region", 90_000),
            "timed out: child run 12 (load-region) still active after the task's timeout of \
             90000 ms; the child run was cancelled"
        );
    }

    #[test]
    fn a_workflow_its_app_still_calls_is_not_deleted() {
        let calls = BTreeMap::from([
            ("daily".to_string(), vec!["load".to_string()]),
            (
                "weekly".to_string(),
                vec!["load".to_string(), "sum".to_string()],
            ),
            ("theirs".to_string(), vec!["load".to_string()]),
        ]);
        let apps = BTreeMap::from([
            ("daily".to_string(), "etl".to_string()),
            ("weekly".to_string(), "etl".to_string()),
            ("theirs".to_string(), "other".to_string()),
        ]);
        assert_eq!(
            callers_refusal("load", "etl", &calls, &apps).as_deref(),
            Some(
                "workflow load is called by daily, weekly (run_workflow): their next runs would \
                 fail that task; change or delete them first"
            )
        );
        // Another app's caller (theirs) could never start it: it is not named above.
        assert_eq!(callers_refusal("daily", "etl", &calls, &apps), None);
    }

    #[test]
    fn one_child_key_per_attempt() {
        assert_eq!(dedup_key(InstanceId(7), Attempt(1)), "parent:7:1");
        assert_ne!(
            dedup_key(InstanceId(7), Attempt(1)),
            dedup_key(InstanceId(7), Attempt(2))
        );
    }

    #[test]
    fn params_are_rendered_from_the_run_and_its_upstreams() {
        let templates = BTreeMap::from([
            ("region".to_string(), "${params.region}".to_string()),
            (
                "file".to_string(),
                "s3://${params.bucket}/${tasks.list.outputs.key}.csv".to_string(),
            ),
            ("plain".to_string(), "as is $HOME".to_string()),
            ("absent".to_string(), "[${params.nope}]".to_string()),
        ]);
        let params = BTreeMap::from([
            ("region".to_string(), "eu".to_string()),
            ("bucket".to_string(), "b1".to_string()),
        ]);
        let outputs = BTreeMap::from([(
            "list".to_string(),
            Outputs::from([("key".to_string(), "2024-05-01".to_string())]),
        )]);
        let rendered = render_params(&templates, &params, &outputs).unwrap();
        assert_eq!(rendered["region"], "eu");
        assert_eq!(rendered["file"], "s3://b1/2024-05-01.csv");
        assert_eq!(rendered["plain"], "as is $HOME");
        assert_eq!(rendered["absent"], "[]");

        let missing = BTreeMap::from([("x".to_string(), "${tasks.list.outputs.nope}".to_string())]);
        assert_eq!(
            render_params(&missing, &params, &outputs).unwrap_err(),
            "params.x: ${tasks.list.outputs.nope} is missing: the upstream did not pass it on"
        );
    }

    #[test]
    fn param_references_are_checked() {
        assert_eq!(
            param_references("${params.a}-${params.b_2}"),
            Ok(names(&["a", "b_2"]))
        );
        assert_eq!(
            param_references("${params.a-b}"),
            Err("${params.a-b} is not a param reference: write ${params.NAME}".to_string())
        );
        assert_eq!(
            param_references("x ${params.a"),
            Err("${params.… is not closed by }".to_string())
        );
    }

    /// Each stored workflow's calls: (caller, callees).
    type Stored = &'static [(&'static str, &'static [&'static str])];

    /// (applied workflow, its calls, stored calls, the cycle spelled or none).
    const CYCLES: &[(&str, &[&str], Stored, Option<&str>)] = &[
        (
            "a",
            &["a"],
            &[],
            Some("run_workflow: cycle across workflows: a → a"),
        ),
        (
            "a",
            &["b"],
            &[("b", &["a"])],
            Some("run_workflow: cycle across workflows: a → b → a"),
        ),
        (
            "a",
            &["b"],
            &[("b", &["c"]), ("c", &["a"])],
            Some("run_workflow: cycle across workflows: a → b → c → a"),
        ),
        // a's own stored calls are replaced by the applied ones.
        ("a", &["c"], &[("a", &["b"]), ("b", &["a"])], None),
        ("a", &["b", "c"], &[("b", &["c"]), ("c", &["d"])], None),
        ("a", &[], &[("b", &["a"])], None),
    ];

    #[test]
    fn call_cycles_are_spelled_in_call_order() {
        for (workflow, calls, stored, want) in CYCLES {
            let got = find_call_cycle(workflow, &names(calls), &graph(stored))
                .err()
                .map(|cycle| cycle.to_string());
            assert_eq!(got.as_deref(), *want, "{workflow} calls {calls:?}");
        }
    }

    #[test]
    fn a_set_of_files_that_call_each_other_is_a_cycle() {
        let stored = graph(&[("old", &["a"]), ("x", &["y"])]);
        let members = [
            ("a", names(&["b"])),
            ("b", names(&["a"])),
            ("x", Vec::new()),
        ];
        let pruned = std::collections::BTreeSet::from(["old".to_string()]);
        let after = calls_after(&stored, &members, &pruned);
        assert_eq!(after, graph(&[("a", &["b"]), ("b", &["a"])]));
        let cycle = find_call_cycle("a", &after["a"], &after).unwrap_err();
        assert_eq!(cycle.path, names(&["a", "b", "a"]));
    }

    fn caller(name: &str, app: &str, calls: &[&str]) -> WorkflowSpec {
        let mut tasks = vec![crate::spec::TaskSpec {
            name: "first".into(),
            command: "true".into(),
            ..Default::default()
        }];
        for (i, callee) in calls.iter().enumerate() {
            tasks.push(crate::spec::TaskSpec {
                name: format!("call{i}"),
                run_workflow: Some(callee.to_string()),
                ..Default::default()
            });
        }
        WorkflowSpec {
            name: name.into(),
            app: app.into(),
            tasks,
            ..Default::default()
        }
    }

    fn source_of(spec: &WorkflowSpec) -> String {
        let mut text = format!(
            "name: {}\ntasks:\n  - {{name: first, command: 'true'}}\n",
            spec.name
        );
        for task in spec.tasks.iter().skip(1) {
            text.push_str(&format!(
                "  - name: {}\n    run_workflow: {}\n",
                task.name,
                task.run_workflow.as_deref().unwrap_or_default()
            ));
        }
        text
    }

    #[test]
    fn references_are_placed_at_their_line() {
        let spec = caller("daily", "etl", &["load-region", "report"]);
        let source = source_of(&spec);
        assert_eq!(
            references(&spec, &source),
            vec![
                Reference {
                    field: "tasks[1].run_workflow".into(),
                    line: 5,
                    workflow: "load-region".into()
                },
                Reference {
                    field: "tasks[2].run_workflow".into(),
                    line: 7,
                    workflow: "report".into()
                },
            ]
        );
        // Flow style and quotes; a longer name is not a shorter one's line.
        let flow = "name: x\ntasks:\n  - {name: a, run_workflow: \"load-regions\"}\n  - {name: b, run_workflow: 'load-region'}\n";
        assert_eq!(reference_line(flow, "load-region"), 4);
    }

    #[test]
    fn set_references_are_refused_with_file_and_line() {
        let a = caller("a", "etl", &["b"]);
        let b = caller("b", "etl", &["a"]);
        let lone = caller("lone", "etl", &["nowhere"]);
        let cross = caller("cross", "etl", &["billing-job"]);
        let (sa, sb, sl, sc) = (
            source_of(&a),
            source_of(&b),
            source_of(&lone),
            source_of(&cross),
        );
        let apps = BTreeMap::from([
            ("billing-job".to_string(), "billing".to_string()),
            ("c".to_string(), "etl".to_string()),
        ]);
        let none = std::collections::BTreeSet::new();
        let member = |file, source, spec| Member { file, source, spec };
        // Two files of a set that call each other: a cycle, seen from each.
        let refusals = check_references(
            &[member("a.yaml", &sa, &a), member("b.yaml", &sb, &b)],
            &apps,
            &BTreeMap::new(),
            &none,
        );
        assert_eq!(
            refusals,
            [
                "a.yaml:5: tasks[1].run_workflow: run_workflow: cycle across workflows: a → b → a",
                "b.yaml:5: tasks[1].run_workflow: run_workflow: cycle across workflows: b → a → b",
            ]
        );
        // Against a stored workflow: c calls a, a is applied calling c.
        let a_to_c = caller("a", "etl", &["c"]);
        let s_ac = source_of(&a_to_c);
        let stored = BTreeMap::from([("c".to_string(), vec!["a".to_string()])]);
        let apps_with_a = {
            let mut apps = apps.clone();
            apps.insert("a".into(), "etl".into());
            apps
        };
        assert_eq!(
            check_references(
                &[member("a.yaml", &s_ac, &a_to_c)],
                &apps_with_a,
                &stored,
                &none
            ),
            ["a.yaml:5: tasks[1].run_workflow: run_workflow: cycle across workflows: a → c → a"]
        );
        // Unknown, and another app's: said alike.
        assert_eq!(
            check_references(
                &[
                    member("lone.yaml", &sl, &lone),
                    member("cross.yaml", &sc, &cross)
                ],
                &apps,
                &BTreeMap::new(),
                &none
            ),
            [
                "lone.yaml:5: tasks[1].run_workflow: workflow nowhere not found in app etl: \
                 run_workflow names a workflow of its own app that exists or is applied with it",
                "cross.yaml:5: tasks[1].run_workflow: workflow billing-job not found in app etl: \
                 run_workflow names a workflow of its own app that exists or is applied with it",
            ]
        );
        // A pruned callee is gone.
        let pruned = std::collections::BTreeSet::from(["c".to_string()]);
        assert_eq!(
            check_references(
                &[member("a.yaml", &s_ac, &a_to_c)],
                &apps,
                &BTreeMap::new(),
                &pruned
            )
            .len(),
            1
        );
    }
}
