//! The cost of a group, counted in statements: creating 64 runs in one `create_runs`, with their
//! trigger audit rows, costs what creating one does, and one report batch that ends 64 runs costs what ending one does.
//! Runs on SQLite and MySQL through the suite's `conformance!` macro.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::ids::RunId;
use ax_core::run::RunState;

use super::support::*;
use crate::*;

conformance!(
    a_group_of_sixty_four_runs_costs_the_statements_of_one,
    ending_sixty_four_runs_in_one_batch_costs_the_statements_of_one,
);

mod scenarios {
    use super::*;

    /// 64: one multi-row statement per table, as for a single row (`pow2_chunks`).
    const GROUP: usize = 64;

    fn runs(wf: &WorkflowRecord, n: usize) -> Vec<NewRun> {
        (0..n)
            .map(|i| NewRun {
                params: BTreeMap::from([("i".to_string(), i.to_string())]),
                audit_from: Some(Caller {
                    remote: "10.0.0.9:5000".into(),
                    token: "ci".into(),
                }),
                ..new_run(wf, None)
            })
            .collect()
    }

    async fn create_cost(ctx: &Ctx, runs: &[NewRun]) -> (u64, Vec<(RunRecord, bool)>) {
        let before = ctx.store.create_statements();
        let created = ctx.s().create_runs(runs).await.expect("create runs");
        (ctx.store.create_statements() - before, created)
    }

    pub(super) async fn a_group_of_sixty_four_runs_costs_the_statements_of_one(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("a", &[]), task("b", &[]), task("c", &["a"])],
            ),
        )
        .await;
        // Warm the id allocator's blocks, whose reservations are not counted anyway.
        create_cost(&ctx, &runs(&wf, 1)).await;
        let (one, _) = create_cost(&ctx, &runs(&wf, 1)).await;
        let (group, created) = create_cost(&ctx, &runs(&wf, GROUP)).await;
        assert!(one > 0, "the statements are counted");
        assert_eq!(group, one, "64 runs cost what one run costs");
        assert_eq!(created.len(), GROUP);
        for (i, (run, new)) in created.iter().enumerate() {
            assert!(new);
            assert_eq!(run.state, RunState::Running);
            assert_eq!(run.params.get("i"), Some(&i.to_string()));
            assert_eq!(s.get_run(run.id).await.unwrap().as_ref(), Some(run));
            assert_eq!(
                tasks_of(s, run.id).await,
                BTreeSet::from(["a".to_string(), "b".to_string()]),
                "each run has its two roots and nothing else"
            );
        }
        let ids: BTreeSet<RunId> = created.iter().map(|(run, _)| run.id).collect();
        assert_eq!(ids.len(), GROUP);
        let audited = s.list_audit(1_000).await.unwrap();
        assert_eq!(
            audited.len(),
            GROUP + 2,
            "a trigger row per new run, in the group"
        );
    }

    /// Dispatches and starts the one instance of each run; returns its Finished report.
    async fn start_all(s: &Store, runs: &[RunRecord]) -> Vec<Report> {
        let mut finished = Vec::new();
        for run in runs {
            let instance = s.list_instances(run.id).await.expect("instances").remove(0);
            finished.push(start_on_w1(s, &instance).await);
        }
        finished
    }

    async fn finish_cost(ctx: &Ctx, reports: &[Report]) -> (u64, Vec<ReportResult>) {
        let before = ctx.store.report_statements();
        let results = ctx
            .s()
            .apply_reports(reports, T0 + 30)
            .await
            .expect("reports");
        (ctx.store.report_statements() - before, results)
    }

    pub(super) async fn ending_sixty_four_runs_in_one_batch_costs_the_statements_of_one(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let created = s.create_runs(&runs(&wf, GROUP + 2)).await.unwrap();
        let mut runs: Vec<RunRecord> = created.into_iter().map(|(run, _)| run).collect();
        let mut finished = start_all(s, &runs).await;
        // The first finish of the task reads its downstream tasks, kept for every later one.
        finish_cost(&ctx, &finished[..1]).await;
        runs.remove(0);
        finished.remove(0);

        let (one, results) = finish_cost(&ctx, &finished[..1]).await;
        match results.as_slice() {
            [ReportResult::Applied(applied)] => {
                assert_eq!(applied.run_finished, Some((runs[0].id, RunState::Success)))
            }
            other => panic!("expected one applied report, got {other:?}"),
        }
        let (group, results) = finish_cost(&ctx, &finished[1..]).await;
        assert!(one > 0, "the statements are counted");
        assert_eq!(group, one, "ending 64 runs costs what ending one costs");
        for (run, result) in runs[1..].iter().zip(&results) {
            match result {
                ReportResult::Applied(applied) => {
                    assert_eq!(applied.run_finished, Some((run.id, RunState::Success)))
                }
                other => panic!("expected an applied report, got {other:?}"),
            }
            let stored = s.get_run(run.id).await.unwrap().expect("run");
            assert_eq!(stored.state, RunState::Success);
            assert_eq!(stored.finished_at, Some(T0 + 30));
        }
    }
}
