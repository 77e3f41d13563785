//! Conformance scenarios of trigger rules and handlers (`sql/reports.rs`, `sql/run_end.rs`,
//! `sql/rerun.rs`): a task whose rule is decided gets its instance at once (to run, SKIPPED or
//! UPSTREAM_FAILED) and what it decides propagates in the same transaction; a run with skipped
//! tasks succeeds; the handler list for the graph's outcome runs before the run ends, told the
//! outcome, without changing it; a retry reopens the run and judges anew.

use std::collections::BTreeMap;

use ax_core::ids::{Attempt, RunId};
use ax_core::run::RunState;
use ax_core::spec::{Handler, TaskSpec};
use ax_core::state::{InstanceState, Outcome};
use ax_core::trigger_rule::TriggerRule;

use super::support::*;
use crate::{ManualRetry, Store};

conformance!(
    a_skip_propagates_under_all_success_and_a_none_failed_join_runs,
    a_failure_runs_its_one_failed_and_all_done_tasks,
    one_success_runs_at_the_first_success,
    handlers_run_for_the_outcome_and_a_retry_judges_again,
);

fn ruled(name: &str, upstream: &[&str], rule: TriggerRule) -> TaskSpec {
    TaskSpec {
        trigger_rule: rule,
        ..task(name, upstream)
    }
}

fn handler(name: &str, list: Handler) -> TaskSpec {
    TaskSpec {
        handler: Some(list),
        ..task(name, &[])
    }
}

/// Each task of `run` with its state, by name.
async fn states(s: &Store, run: RunId) -> BTreeMap<String, InstanceState> {
    s.list_instances(run)
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.task, i.state))
        .collect()
}

fn expect(pairs: &[(&str, InstanceState)]) -> BTreeMap<String, InstanceState> {
    pairs.iter().map(|(t, s)| (t.to_string(), *s)).collect()
}

mod scenarios {
    use super::*;
    use InstanceState::*;

    pub(super) async fn a_skip_propagates_under_all_success_and_a_none_failed_join_runs(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "skips",
                vec![
                    task("a", &[]),
                    ruled("on_error", &["a"], TriggerRule::OneFailed),
                    task("report_error", &["on_error"]),
                    ruled("join", &["a", "report_error"], TriggerRule::NoneFailed),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let done = run_task(s, run.id, "a", Outcome::Success).await;
        assert_eq!(done.new_waiting, 1, "only the join runs");
        assert_eq!(
            states(s, run.id).await,
            expect(&[
                ("a", Success),
                ("on_error", Skipped),
                ("report_error", Skipped),
                ("join", Waiting),
            ])
        );
        let skipped = instance_of(s, run.id, "report_error").await.unwrap();
        assert_eq!(
            skipped.attempt,
            Attempt(0),
            "a skipped task never had an attempt"
        );
        let last = run_task(s, run.id, "join", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!((counts.success, counts.skipped), (2, 2));
    }

    pub(super) async fn a_failure_runs_its_one_failed_and_all_done_tasks(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "cleanup",
                vec![
                    task("load", &[]),
                    task("publish", &["load"]),
                    ruled("alert", &["load"], TriggerRule::OneFailed),
                    ruled("cleanup", &["publish", "alert"], TriggerRule::AllDone),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let failed = run_task(s, run.id, "load", Outcome::Failed).await;
        assert_eq!((failed.new_waiting, failed.run_finished), (1, None));
        assert_eq!(
            states(s, run.id).await,
            expect(&[
                ("load", Failed),
                ("publish", UpstreamFailed),
                ("alert", Waiting)
            ])
        );
        run_task(s, run.id, "alert", Outcome::Success).await;
        assert_eq!(
            instance_of(s, run.id, "cleanup").await.unwrap().state,
            Waiting
        );
        let last = run_task(s, run.id, "cleanup", Outcome::Success).await;
        assert_eq!(
            last.run_finished,
            Some((run.id, RunState::Failed)),
            "a handled failure still fails the run"
        );
    }

    pub(super) async fn one_success_runs_at_the_first_success(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "race",
                vec![
                    task("mirror1", &[]),
                    task("mirror2", &[]),
                    ruled("use", &["mirror1", "mirror2"], TriggerRule::OneSuccess),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let first = run_task(s, run.id, "mirror2", Outcome::Success).await;
        assert_eq!(first.new_waiting, 1);
        assert_eq!(instance_of(s, run.id, "use").await.unwrap().state, Waiting);
        run_task(s, run.id, "use", Outcome::Success).await;
        // The other upstream ending later changes nothing of `use`, and the run ends by it.
        let last = run_task(s, run.id, "mirror1", Outcome::Failed).await;
        assert_eq!(last.new_waiting, 0);
        assert_eq!(last.run_finished, Some((run.id, RunState::Failed)));
        let used = instance_of(s, run.id, "use").await.unwrap();
        assert_eq!((used.state, used.attempt), (Success, Attempt(1)));
    }

    pub(super) async fn handlers_run_for_the_outcome_and_a_retry_judges_again(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "handled",
                vec![
                    task("extract", &[]),
                    task("load", &["extract"]),
                    handler("page", Handler::OnFailure),
                    handler("notify", Handler::OnSuccess),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        assert_eq!(
            states(s, run.id).await,
            expect(&[("extract", Waiting)]),
            "handlers do not start with the run"
        );
        let failed = run_task(s, run.id, "extract", Outcome::Failed).await;
        assert_eq!(
            failed.run_finished, None,
            "the run waits for its on_failure list"
        );
        assert_eq!(
            states(s, run.id).await,
            expect(&[
                ("extract", Failed),
                ("load", UpstreamFailed),
                ("page", Waiting)
            ])
        );
        let waiting = s.waiting(T0 + 1_000, 10).await.unwrap();
        let page = waiting
            .iter()
            .find(|w| w.instance.task == "page")
            .expect("page waits for a worker");
        assert_eq!(
            page.run_env,
            BTreeMap::from([
                ("AX_RUN_STATE".to_string(), "FAILED".to_string()),
                ("AX_FAILED_TASKS".to_string(), "extract".to_string()),
            ])
        );
        let paged = run_task(s, run.id, "page", Outcome::Failed).await;
        assert_eq!(
            paged.run_finished,
            Some((run.id, RunState::Failed)),
            "a handler's failure does not change the outcome"
        );

        // A retry reopens the run: what was judged below the retried task and the handlers
        // wait again; the run's next outcome starts its own list.
        let extract = instance_of(s, run.id, "extract").await.unwrap();
        assert!(matches!(
            s.retry_instance(extract.id, T0 + 2_000).await.unwrap(),
            ManualRetry::Retried(_)
        ));
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        assert_eq!(
            states(s, run.id).await,
            expect(&[("extract", Waiting), ("load", Pending), ("page", Pending)])
        );
        run_task(s, run.id, "extract", Outcome::Success).await;
        let loaded = run_task(s, run.id, "load", Outcome::Success).await;
        assert_eq!(loaded.run_finished, None);
        let notify = s
            .waiting(T0 + 3_000, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|w| w.instance.task == "notify")
            .expect("notify waits for a worker");
        assert_eq!(notify.run_env["AX_RUN_STATE"], "SUCCESS");
        let last = run_task(s, run.id, "notify", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
        assert_eq!(instance_of(s, run.id, "page").await.unwrap().state, Pending);
    }
}
