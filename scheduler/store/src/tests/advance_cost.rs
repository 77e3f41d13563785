//! The cost of one dependency advance, counted in statements (`Store::report_statements`):
//! finishing an instance with the same direct downstream costs the same in a 10-task and a
//! 10,000-task workflow, and with 1 or 50 earlier runs in the store; a task's downstream tasks
//! are read the first time it finishes, and never again. Runs on SQLite and MySQL through the
//! suite's `conformance!` macro.

use ax_core::ids::RunId;
use ax_core::spec::{ScheduleSpec, TaskSpec, WorkflowSpec};

use super::support::*;
use crate::*;

conformance!(
    one_advance_costs_the_same_statements_in_ten_and_ten_thousand_tasks,
    one_advance_costs_the_same_statements_after_one_or_fifty_runs,
);

mod scenarios {
    use super::*;

    /// Tasks of the local shape every scenario finishes `a` in: `a` and `x` are roots, `b`
    /// waits for `a` alone (ready when `a` succeeds) and `c` for `a` and `x` (not ready yet).
    /// `fillers` more tasks hang below `x` in layers of 100, each with two upstreams.
    fn workflow(name: &str, fillers: usize) -> WorkflowSpec {
        let task = |name: String, upstream: Vec<String>| TaskSpec {
            command: format!("echo {name}"),
            name,
            upstream,
            ..TaskSpec::default()
        };
        let mut tasks = vec![
            task("a".into(), vec![]),
            task("x".into(), vec![]),
            task("b".into(), vec!["a".into()]),
            task("c".into(), vec!["a".into(), "x".into()]),
        ];
        let width = 100;
        let filler = |i: usize| format!("f{}_{}", i / width, i % width);
        for i in 0..fillers {
            let upstream = if i < width {
                vec!["x".to_string()]
            } else {
                let above = i - width;
                let next = (above / width) * width + (above % width + 1) % width;
                vec![filler(above), filler(next)]
            };
            tasks.push(task(filler(i), upstream));
        }
        WorkflowSpec {
            name: name.to_string(),
            app: "scale".into(),
            owner: "alice".into(),
            description: String::new(),
            schedule: ScheduleSpec::default(),
            concurrency: Default::default(),
            retention: None,
            tasks,
            deadline: None,
            on_deadline: Default::default(),
            params: Vec::new(),
        }
    }

    async fn start(s: &Store, wf: &WorkflowRecord) -> RunId {
        let (run, created) = s.create_run(&manual(wf)).await.expect("create run");
        assert!(created);
        run.id
    }

    /// Dispatches, starts and finishes `task` of `run` with success; returns the statements
    /// the finish report cost and what it did.
    async fn finish(ctx: &Ctx, run: RunId, task: &str) -> (u64, Applied) {
        let s = ctx.s();
        let instance = instance_of(s, run, task).await.expect("instance exists");
        let finished = start_on_w1(s, &instance).await;
        let before = ctx.store.report_statements();
        let results = s.apply_reports(&[finished], T0 + 30).await.unwrap();
        let cost = ctx.store.report_statements() - before;
        match results.as_slice() {
            [ReportResult::Applied(applied)] => (cost, applied.clone()),
            other => panic!("expected one applied report, got {other:?}"),
        }
    }

    pub(super) async fn one_advance_costs_the_same_statements_in_ten_and_ten_thousand_tasks(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let small = apply(s, &workflow("small", 6)).await;
        let large = apply(s, &workflow("large", 9_996)).await;
        assert_eq!(small.spec.tasks.len(), 10);
        assert_eq!(large.spec.tasks.len(), 10_000);

        let small_run = start(s, &small).await;
        let large_run = start(s, &large).await;
        let (small_cost, small_done) = finish(&ctx, small_run, "a").await;
        let (large_cost, large_done) = finish(&ctx, large_run, "a").await;
        assert_eq!(
            small_done.new_waiting, 1,
            "b is created, c still waits for x"
        );
        assert_eq!(
            large_done.new_waiting, 1,
            "b is created, c still waits for x"
        );
        assert!(small_cost > 0, "the statements are counted");
        assert_eq!(
            small_cost, large_cost,
            "finishing `a` costs the same in 10 and in 10,000 tasks"
        );

        // Nor does it grow with the direct downstream: `x` has 101 of them in the large
        // workflow (c and the first filler layer), every one of them ready now, and they are
        // read and counted together, then inserted in chunks of 64 + 32 + 4 + 1 rows.
        let (x_cost, x_done) = finish(&ctx, large_run, "x").await;
        assert_eq!(x_done.new_waiting, 101);
        assert_eq!(
            x_cost,
            large_cost + 3,
            "creating 101 downstream instances costs three inserts more than creating 1"
        );
    }

    pub(super) async fn one_advance_costs_the_same_statements_after_one_or_fifty_runs(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &workflow("history", 6)).await;
        let first = start(s, &wf).await;
        let (first_cost, _) = finish(&ctx, first, "a").await;
        let second = start(s, &wf).await;
        let (second_cost, _) = finish(&ctx, second, "a").await;
        assert_eq!(
            second_cost,
            first_cost - 1,
            "a task's downstream tasks are read when it first finishes only"
        );
        // Fifty runs in all, each with `a` and `x` done and their downstream created, some of it
        // succeeded too: history with the same task names in every run.
        finish(&ctx, first, "x").await;
        finish(&ctx, second, "x").await;
        for _ in 0..48 {
            let run = start(s, &wf).await;
            finish(&ctx, run, "a").await;
            finish(&ctx, run, "x").await;
            finish(&ctx, run, "b").await;
        }
        let last = start(s, &wf).await;
        let (last_cost, last_done) = finish(&ctx, last, "a").await;
        assert_eq!(last_done.new_waiting, 1);
        assert!(second_cost > 0, "the statements are counted");
        assert_eq!(
            second_cost, last_cost,
            "finishing `a` costs the same after 1 and after 50 runs"
        );
    }
}
