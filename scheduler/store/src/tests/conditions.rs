//! Conformance scenarios of conditions (`sql/conditions.rs`, `sql/reports.rs`,
//! `sql/run_roots.rs`): a task whose rule says it runs has its `if:` judged in the same
//! transaction, on the run's params and its upstreams' states and outputs; false is SKIPPED
//! with a `condition_false` decision naming the values read, and the skip propagates as any;
//! a condition that cannot be judged fails the task with the reason; a root's `if:` is judged
//! as its run starts, and a run whose every task is skipped succeeds.

use std::collections::BTreeMap;

use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, RunId};
use ax_core::run::RunState;
use ax_core::spec::TaskSpec;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::{NewRun, Report, Store};

conformance!(
    a_false_condition_skips_its_task_and_what_needs_it,
    a_true_condition_runs_its_task,
    a_condition_that_cannot_be_judged_fails_its_task_with_the_reason,
    a_root_condition_is_judged_as_its_run_starts,
    a_rerun_judges_a_condition_again_on_the_new_values,
);

fn when(name: &str, upstream: &[&str], condition: &str) -> TaskSpec {
    TaskSpec {
        condition: Some(condition.into()),
        ..task(name, upstream)
    }
}

async fn states(s: &Store, run: RunId) -> BTreeMap<String, InstanceState> {
    s.list_instances(run)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.task, i.state))
        .collect()
}

async fn succeed_with(s: &Store, run: RunId, task: &str, passed: &[(&str, &str)]) {
    let inst = launch(s, run, task).await;
    let mut report = finished(inst.id, inst.attempt.0, Outcome::Success, 0);
    if let Report::Finished { outputs, .. } = &mut report {
        *outputs = passed
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }
    let results = s.apply_reports(&[report], T0 + 30).await.unwrap();
    applied(&results[0]);
}

/// The `condition_false` decisions of the workflow, as (task, detail).
async fn condition_decisions(
    s: &Store,
    wf: &crate::WorkflowRecord,
) -> Vec<(Option<String>, String)> {
    s.list_decisions(wf.id, 0, i64::MAX, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.kind == DecisionKind::ConditionFalse)
        .map(|d| (d.task, d.detail))
        .collect()
}

mod scenarios {
    use super::*;
    use InstanceState::*;

    pub(super) async fn a_false_condition_skips_its_task_and_what_needs_it(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "branch",
                vec![
                    task("extract", &[]),
                    when("load", &["extract"], "int(tasks.extract.outputs.rows) > 0"),
                    task("publish", &["load"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "extract", &[("rows", "0")]).await;
        assert_eq!(
            states(s, run.id).await,
            BTreeMap::from([
                ("extract".to_string(), Success),
                ("load".to_string(), Skipped),
                ("publish".to_string(), Skipped),
            ])
        );
        let load = instance_of(s, run.id, "load").await.unwrap();
        assert_eq!(
            load.attempt,
            Attempt(0),
            "a skipped task never had an attempt"
        );
        assert_eq!(
            condition_decisions(s, &wf).await,
            vec![(
                Some("load".to_string()),
                "if: int(tasks.extract.outputs.rows) > 0 is false \
                 (tasks.extract.outputs.rows = \"0\")"
                    .to_string()
            )],
            "one decision, for the task whose if: was false, not for the one skipped below it"
        );
        let decision = s
            .list_decisions(wf.id, 0, i64::MAX, 100)
            .await
            .unwrap()
            .into_iter()
            .find(|d| d.kind == DecisionKind::ConditionFalse)
            .unwrap();
        assert_eq!(
            (decision.run_id, decision.instance_id),
            (Some(run.id), Some(load.id))
        );
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run.state, RunState::Success, "skipped tasks are no failure");
    }

    pub(super) async fn a_true_condition_runs_its_task(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "branch",
                vec![
                    task("extract", &[]),
                    when(
                        "load",
                        &["extract"],
                        "tasks.extract.state == 'SUCCESS' && params.day == '2024-01-01' \
                         && int(tasks.extract.outputs.rows) > 0",
                    ),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "extract", &[("rows", "12")]).await;
        assert_eq!(
            states(s, run.id).await.get("load"),
            Some(&Waiting),
            "the condition is true: load runs"
        );
        assert!(condition_decisions(s, &wf).await.is_empty());
    }

    pub(super) async fn a_condition_that_cannot_be_judged_fails_its_task_with_the_reason(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "branch",
                vec![
                    task("extract", &[]),
                    // extract passes on no output `rows`: the expression cannot be judged.
                    when("load", &["extract"], "int(tasks.extract.outputs.rows) > 0"),
                    task("publish", &["load"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "extract", &[]).await;
        assert_eq!(
            states(s, run.id).await,
            BTreeMap::from([
                ("extract".to_string(), Success),
                ("load".to_string(), Failed),
                ("publish".to_string(), UpstreamFailed),
            ])
        );
        let load = instance_of(s, run.id, "load").await.unwrap();
        let attempts = s.list_attempts(load.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        let message = &attempts[0].message;
        assert!(
            message.starts_with("if: int(tasks.extract.outputs.rows) > 0 cannot be judged"),
            "{message}"
        );
        assert!(message.contains("rows"), "{message}");
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run.state, RunState::Failed);
    }

    pub(super) async fn a_root_condition_is_judged_as_its_run_starts(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "modes",
                vec![
                    when("full", &[], "params.mode == 'full'"),
                    task("after_full", &["full"]),
                    when("quick", &[], "has(params.mode) && params.mode == 'quick'"),
                ],
            ),
        )
        .await;
        let with_mode = |mode: &str, key: &str| NewRun {
            params: BTreeMap::from([("mode".to_string(), mode.to_string())]),
            dedup_key: Some(key.into()),
            ..new_run(&wf, None)
        };
        let (full, _) = s.create_run(&with_mode("full", "a")).await.unwrap();
        assert_eq!(
            states(s, full.id).await,
            BTreeMap::from([
                ("full".to_string(), Waiting),
                ("quick".to_string(), Skipped),
            ])
        );
        let (neither, _) = s.create_run(&with_mode("none", "b")).await.unwrap();
        assert_eq!(
            states(s, neither.id).await,
            BTreeMap::from([
                ("full".to_string(), Skipped),
                ("after_full".to_string(), Skipped),
                ("quick".to_string(), Skipped),
            ]),
            "a skipped root's downstream is judged as the run starts"
        );
        let neither = s.get_run(neither.id).await.unwrap().unwrap();
        assert_eq!(
            neither.state,
            RunState::Success,
            "a run whose every task was skipped ends at once"
        );
        // A run without the param: `params.mode` cannot be judged, `has()` guards it.
        let (bare, _) = s
            .create_run(&NewRun {
                params: BTreeMap::new(),
                dedup_key: Some("c".into()),
                ..new_run(&wf, None)
            })
            .await
            .unwrap();
        let got = states(s, bare.id).await;
        assert_eq!(got.get("full"), Some(&Failed));
        assert_eq!(got.get("after_full"), Some(&UpstreamFailed));
        assert_eq!(got.get("quick"), Some(&Skipped));
    }

    pub(super) async fn a_rerun_judges_a_condition_again_on_the_new_values(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "again",
                vec![
                    task("extract", &[]),
                    when("load", &["extract"], "int(tasks.extract.outputs.rows) > 0"),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "extract", &[("rows", "5")]).await;
        run_task(s, run.id, "load", Outcome::Success).await;
        // Run again from extract: this time it passes on no rows, so load's if: cannot be
        // judged, and the PENDING load must end FAILED, not wait for ever.
        s.rerun_from(run.id, "extract", T0 + 100).await.unwrap();
        succeed_with(s, run.id, "extract", &[("rows", "0")]).await;
        let got = states(s, run.id).await;
        assert_eq!(got.get("load"), Some(&Skipped), "{got:?}");
        let ended = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(ended.state, RunState::Success);
        s.rerun_from(run.id, "extract", T0 + 200).await.unwrap();
        succeed_with(s, run.id, "extract", &[]).await;
        let got = states(s, run.id).await;
        assert_eq!(got.get("load"), Some(&Failed), "{got:?}");
        let load = instance_of(s, run.id, "load").await.unwrap();
        let attempts = s.list_attempts(load.id).await.unwrap();
        let last = attempts.last().expect("an attempt");
        assert!(
            last.message.contains("cannot be judged"),
            "{}",
            last.message
        );
        let ended = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(ended.state, RunState::Failed);
    }
}
