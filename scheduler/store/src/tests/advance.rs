//! Conformance scenarios of the dependency advance: a downstream task is created once, when its
//! last upstream succeeded (a diamond, a fan-in reached at once or in one batch, many runs in
//! one batch, a large workflow), and a failure leaves it uncreated and fails the run
//! (`sql/reports.rs`, `sql/downstream_tasks.rs`).

use std::collections::BTreeSet;

use ax_core::ids::Attempt;
use ax_core::run::RunState;
use ax_core::spec::TaskSpec;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;

conformance!(
    diamond_creates_the_sink_only_after_both_branches,
    concurrent_fan_in_creates_the_sink_once,
    a_failure_marks_its_downstream_upstream_failed_and_fails_the_run,
    advance_creates_exactly_the_ready_downstream_in_a_large_workflow,
    a_fan_in_reached_in_one_batch_creates_the_sink_once_and_the_run_goes_on,
    one_batch_advancing_many_runs_creates_each_runs_ready_tasks_once,
);

mod scenarios {
    use super::*;

    pub(super) async fn diamond_creates_the_sink_only_after_both_branches(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "diamond",
                vec![
                    task("a", &[]),
                    task("b", &["a"]),
                    task("c", &["a"]),
                    task("d", &["b", "c"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        assert_eq!(tasks_of(s, run.id).await, BTreeSet::from(["a".to_string()]));
        let after_a = run_task(s, run.id, "a", Outcome::Success).await;
        assert_eq!((after_a.new_waiting, after_a.run_finished), (2, None));
        assert_eq!(tasks_of(s, run.id).await.len(), 3);
        let after_b = run_task(s, run.id, "b", Outcome::Success).await;
        assert_eq!(after_b.new_waiting, 0);
        assert!(instance_of(s, run.id, "d").await.is_none(), "d waits for c");
        let after_c = run_task(s, run.id, "c", Outcome::Success).await;
        assert_eq!(after_c.new_waiting, 1);
        let d = instance_of(s, run.id, "d").await.expect("d created");
        assert_eq!((d.state, d.attempt), (InstanceState::Waiting, Attempt(1)));
        let after_d = run_task(s, run.id, "d", Outcome::Success).await;
        assert_eq!(after_d.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn concurrent_fan_in_creates_the_sink_once(ctx: Ctx) {
        let s = ctx.s();
        let mut tasks: Vec<TaskSpec> = (0..8).map(|i| task(&format!("u{i}"), &[])).collect();
        let ups: Vec<String> = (0..8).map(|i| format!("u{i}")).collect();
        let ups: Vec<&str> = ups.iter().map(String::as_str).collect();
        tasks.push(task("sink", &ups));
        let wf = apply(s, &spec("fan", tasks)).await;
        for round in 0..3 {
            let run = start_run(s, &wf).await;
            let mut running = Vec::new();
            for up in &ups {
                running.push(launch(s, run.id, up).await);
            }
            let mut created = 0;
            for results in finish_at_once(&ctx.store, running).await {
                created += applied(&results[0]).new_waiting;
            }
            assert_eq!(
                created, 1,
                "round {round}: the sink is created exactly once"
            );
            let sinks = s.list_instances(run.id).await.unwrap();
            assert_eq!(sinks.iter().filter(|i| i.task == "sink").count(), 1);
            let done = run_task(s, run.id, "sink", Outcome::Success).await;
            assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        }
    }

    pub(super) async fn a_failure_marks_its_downstream_upstream_failed_and_fails_the_run(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("bad", &["a"]),
                    task("below", &["bad"]),
                    task("good", &["a"]),
                    task("good2", &["good"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let failed = run_task(s, run.id, "bad", Outcome::Failed).await;
        assert_eq!(
            (
                failed.new_waiting,
                failed.run_finished,
                failed.attempt_ended
            ),
            (0, None, true)
        );
        assert_eq!(
            (failed.attempt_state, failed.retry_scheduled),
            (Some(InstanceState::Failed), false)
        );
        let below = instance_of(s, run.id, "below").await.unwrap();
        assert_eq!(
            (below.state, below.attempt),
            (InstanceState::UpstreamFailed, Attempt(0)),
            "judged at once, never run"
        );
        let good = run_task(s, run.id, "good", Outcome::Success).await;
        assert_eq!(
            (good.new_waiting, good.run_finished),
            (1, None),
            "the other branch goes on"
        );
        let last = run_task(s, run.id, "good2", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Failed)));
        let below = instance_of(s, run.id, "below").await.unwrap();
        assert_eq!(
            (below.state, below.attempt),
            (InstanceState::UpstreamFailed, Attempt(0)),
            "judged at once, never run"
        );
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(
            (
                counts.success,
                counts.failed,
                counts.upstream_failed,
                counts.not_created
            ),
            (3, 1, 1, 0)
        );
        let failed_runs = s
            .list_runs(None, Some(RunState::Failed), None, 10)
            .await
            .unwrap();
        assert_eq!(failed_runs.len(), 1);
    }

    pub(super) async fn advance_creates_exactly_the_ready_downstream_in_a_large_workflow(ctx: Ctx) {
        let s = ctx.s();
        let mut tasks: Vec<TaskSpec> = (0..2_000)
            .map(|i| task(&format!("solo{i:04}"), &[]))
            .collect();
        tasks.push(task("a", &[]));
        tasks.push(task("b", &["a"]));
        let wf = apply(s, &spec("big", tasks)).await;
        let run = start_run(s, &wf).await;
        assert_eq!(s.list_instances(run.id).await.unwrap().len(), 2_001);
        let before = s.run_counts(run.id).await.unwrap();
        assert_eq!((before.waiting, before.not_created), (2_001, 1));
        let done = run_task(s, run.id, "a", Outcome::Success).await;
        assert_eq!((done.new_waiting, done.run_finished), (1, None));
        let instances = s.list_instances(run.id).await.unwrap();
        assert_eq!(instances.len(), 2_002);
        let b = instances.iter().find(|i| i.task == "b").expect("b created");
        assert_eq!(b.state, InstanceState::Waiting);
        assert_eq!(s.run_counts(run.id).await.unwrap().not_created, 0);
    }

    pub(super) async fn a_fan_in_reached_in_one_batch_creates_the_sink_once_and_the_run_goes_on(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("b", &[]), task("c", &[]), task("d", &["b", "c"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let b = launch(s, run.id, "b").await;
        let c = launch(s, run.id, "c").await;
        let batch = [
            finished(b.id, 1, Outcome::Success, 0),
            finished(c.id, 1, Outcome::Success, 0),
        ];
        let results = s.apply_reports(&batch, T0 + 40).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 1, "the sink is created once");
        assert!(
            results.iter().all(|r| applied(r).run_finished.is_none()),
            "the run goes on"
        );
        assert_eq!(
            tasks_of(s, run.id).await,
            BTreeSet::from(["b".into(), "c".into(), "d".into()])
        );
        let last = run_task(s, run.id, "d", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
    }

    /// One batch finishing a root in many runs of a small DAG (the seed's load: more runs than
    /// downstream tasks, counted per task): each run gets its own ready downstream once, and a
    /// fan-in waits in every run for its other upstream.
    pub(super) async fn one_batch_advancing_many_runs_creates_each_runs_ready_tasks_once(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("x", &[]),
                    task("b", &["a"]),
                    task("j", &["a", "x"]),
                ],
            ),
        )
        .await;
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(start_run(s, &wf).await.id);
        }
        let mut batch = Vec::new();
        for &run in &runs {
            let a = launch(s, run, "a").await;
            batch.push(finished(a.id, 1, Outcome::Success, 0));
        }
        let results = s.apply_reports(&batch, T0 + 40).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 3, "b in each run, j in none: {results:?}");
        for &run in &runs {
            assert_eq!(
                tasks_of(s, run).await,
                BTreeSet::from(["a".into(), "x".into(), "b".into()])
            );
        }
        let mut batch = Vec::new();
        for &run in &runs {
            let x = launch(s, run, "x").await;
            batch.push(finished(x.id, 1, Outcome::Success, 0));
        }
        let results = s.apply_reports(&batch, T0 + 50).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 3, "j in each run: {results:?}");
        for &run in &runs {
            let j = instance_of(s, run, "j").await.expect("j exists");
            assert_eq!((j.state, j.attempt), (InstanceState::Waiting, Attempt(1)));
        }
    }
}
