//! Conformance scenarios of outputs (`sql/reports.rs`, `sql/outputs.rs`, `sql/placing.rs`): a
//! successful attempt's outputs are kept with it and reach the dispatches of the tasks below it;
//! a failed attempt keeps none; a run's outputs are held under their limit by failing the attempt
//! that would pass it; a task naming an output its run does not have fails with a named error
//! before it runs.

use std::collections::BTreeMap;

use ax_core::ids::Attempt;
use ax_core::outputs::{MAX_RUN_BYTES, Outputs};
use ax_core::run::RunState;
use ax_core::spec::TaskSpec;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::{Report, Store};

conformance!(
    outputs_are_kept_with_the_attempt_and_reach_the_task_below,
    a_run_past_its_outputs_limit_fails_the_attempt_that_would_pass_it,
    a_task_naming_a_missing_output_fails_before_it_runs,
);

fn outputs(pairs: &[(&str, &str)]) -> Outputs {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Runs `task` to success, passing on `passed`; returns the report's results' first.
async fn succeed_with(s: &Store, run: ax_core::ids::RunId, task: &str, passed: Outputs) {
    let inst = launch(s, run, task).await;
    let mut report = finished(inst.id, inst.attempt.0, Outcome::Success, 0);
    if let Report::Finished { outputs, .. } = &mut report {
        *outputs = passed;
    }
    let results = s.apply_reports(&[report], T0 + 30).await.unwrap();
    applied(&results[0]);
}

fn naming(name: &str, upstream: &[&str], command: &str) -> TaskSpec {
    TaskSpec {
        command: command.into(),
        ..task(name, upstream)
    }
}

mod scenarios {
    use super::*;

    pub(super) async fn outputs_are_kept_with_the_attempt_and_reach_the_task_below(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "passes",
                vec![
                    task("extract", &[]),
                    naming("load", &["extract"], "load ${tasks.extract.outputs.rows}"),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let passed = outputs(&[("rows", "1250"), ("note", "two\nlines")]);
        succeed_with(s, run.id, "extract", passed.clone()).await;
        let extract = instance_of(s, run.id, "extract").await.unwrap();
        let attempts = s.list_attempts(extract.id).await.unwrap();
        assert_eq!(attempts[0].outputs, passed);
        let load = s
            .waiting(T0 + 1_000, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|w| w.instance.task == "load")
            .expect("load waits");
        assert_eq!(
            load.run_outputs,
            BTreeMap::from([("extract".to_string(), passed)])
        );
        // A failed attempt passes nothing on.
        let run2 = start_run(s, &wf).await;
        let inst = launch(s, run2.id, "extract").await;
        let mut report = finished(inst.id, 1, Outcome::Failed, 1);
        if let Report::Finished { outputs: o, .. } = &mut report {
            *o = outputs(&[("rows", "9")]);
        }
        s.apply_reports(&[report], T0 + 40).await.unwrap();
        assert!(
            s.list_attempts(inst.id).await.unwrap()[0]
                .outputs
                .is_empty()
        );
    }

    pub(super) async fn a_run_past_its_outputs_limit_fails_the_attempt_that_would_pass_it(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec("big", vec![task("a", &[]), task("b", &[]), task("c", &[])]),
        )
        .await;
        let run = start_run(s, &wf).await;
        // Two attempts of 60% of the limit: the second would pass it.
        let big = "x".repeat((MAX_RUN_BYTES as usize) * 6 / 10);
        succeed_with(s, run.id, "a", outputs(&[("blob", &big)])).await;
        let b = launch(s, run.id, "b").await;
        let mut report = finished(b.id, 1, Outcome::Success, 0);
        if let Report::Finished { outputs: o, .. } = &mut report {
            *o = outputs(&[("blob", &big)]);
        }
        let results = s.apply_reports(&[report], T0 + 40).await.unwrap();
        assert_eq!(
            applied(&results[0]).attempt_state,
            Some(InstanceState::Failed)
        );
        let attempt = &s.list_attempts(b.id).await.unwrap()[0];
        assert!(attempt.outputs.is_empty());
        assert!(
            attempt
                .message
                .starts_with("outputs refused: the run's outputs would reach"),
            "{}",
            attempt.message
        );
        // Small outputs still fit.
        succeed_with(s, run.id, "c", outputs(&[("ok", "1")])).await;
        let c = instance_of(s, run.id, "c").await.unwrap();
        assert_eq!(c.state, InstanceState::Success);
    }

    pub(super) async fn a_task_naming_a_missing_output_fails_before_it_runs(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "missing",
                vec![
                    task("extract", &[]),
                    naming("load", &["extract"], "load ${tasks.extract.outputs.rows}"),
                    task("after", &["load"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let done = run_task(s, run.id, "extract", Outcome::Success).await;
        assert_eq!(done.new_waiting, 0, "load never waits for a worker");
        assert_eq!(done.run_finished, Some((run.id, RunState::Failed)));
        let load = instance_of(s, run.id, "load").await.unwrap();
        assert_eq!(
            (load.state, load.attempt),
            (InstanceState::Failed, Attempt(1))
        );
        let attempts = s.list_attempts(load.id).await.unwrap();
        assert_eq!(
            attempts[0].message,
            "${tasks.extract.outputs.rows}: task extract passed on no output rows (it did not \
             succeed, or did not write rows to $AX_OUTPUT)"
        );
        let after = instance_of(s, run.id, "after").await.unwrap();
        assert_eq!(after.state, InstanceState::UpstreamFailed);
    }
}
