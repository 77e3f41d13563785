//! Conformance scenarios of a person's mark of an instance (`sql/mark.rs`) and of rerunning a
//! selection of tasks with their downstream (`sql/rerun.rs`).

use ax_core::ids::{Attempt, InstanceId};
use ax_core::mark::{MarkAs, MarkRefused};
use ax_core::run::RunState;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    marking_a_failed_task_success_runs_its_downstream_and_the_run_succeeds,
    marking_a_running_task_failed_kills_it_and_its_late_end_changes_nothing,
    marking_a_waiting_task_success_stops_its_dispatch_and_runs_its_downstream,
    marking_a_mapped_item_settles_its_task_again,
    a_mark_to_the_same_state_of_a_pending_or_missing_instance_is_refused,
    a_selection_reruns_its_tops_and_everything_below_them,
);

async fn mark(s: &Store, id: InstanceId, to: MarkAs) -> MarkAnswer {
    s.mark_instance(id, to, "marked by test: why not", T0 + 500)
        .await
        .unwrap()
}

async fn run_state(s: &Store, run: ax_core::ids::RunId) -> RunState {
    s.get_run(run).await.unwrap().unwrap().state
}

mod scenarios {
    use super::*;
    use InstanceState::*;

    pub(super) async fn marking_a_failed_task_success_runs_its_downstream_and_the_run_succeeds(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let failed = run_task(s, run.id, "b", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));
        assert_eq!(
            instance_of(s, run.id, "c").await.unwrap().state,
            UpstreamFailed
        );
        let b = instance_of(s, run.id, "b").await.unwrap();

        let MarkAnswer::Marked {
            record,
            from,
            killed,
        } = mark(s, b.id, MarkAs::Success).await
        else {
            panic!("not marked")
        };
        assert_eq!((record.state, from, killed), (Success, Failed, None));
        assert_eq!(record.attempt, Attempt(1), "a mark keeps the attempt");
        assert_eq!(run_state(s, run.id).await, RunState::Running);
        assert_eq!(instance_of(s, run.id, "c").await.unwrap().state, Waiting);
        let attempts = s.list_attempts(b.id).await.unwrap();
        assert_eq!(attempts.len(), 1, "nothing of b ran again");
        assert_eq!(attempts[0].state, Failed, "the attempt keeps how it ended");
        assert!(
            attempts[0].message.contains("marked by test: why not"),
            "{:?}",
            attempts[0].message
        );
        let last = run_task(s, run.id, "c", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
        assert_eq!(instance_of(s, run.id, "b").await.unwrap().state, Success);
    }

    pub(super) async fn marking_a_running_task_failed_kills_it_and_its_late_end_changes_nothing(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = start_run(s, &wf).await;
        let a = launch(s, run.id, "a").await;
        assert_eq!(a.state, Running);

        let MarkAnswer::Marked { record, killed, .. } = mark(s, a.id, MarkAs::Failed).await else {
            panic!("not marked")
        };
        assert_eq!(record.state, Failed);
        assert_eq!(
            killed,
            Some(CancelledAttempt {
                instance_id: a.id,
                attempt: Attempt(1),
                worker_id: Some("w1".into()),
            })
        );
        assert_eq!(
            instance_of(s, run.id, "b").await.unwrap().state,
            UpstreamFailed
        );
        assert_eq!(run_state(s, run.id).await, RunState::Failed);
        assert_eq!(
            s.list_attempts(a.id).await.unwrap()[0].state,
            Cancelled,
            "its process was killed"
        );

        // The worker's heartbeat and then its end arrive late: the end adds its exit code to
        // the attempt's record, and nothing moves (no retry, no success).
        let heartbeat = Report::TaskHeartbeat {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: Some("w1".into()),
            at: T0 + 600,
        };
        let results = s.apply_reports(&[heartbeat], T0 + 600).await.unwrap();
        assert!(
            matches!(results[0], ReportResult::Stale { state: Failed, .. }),
            "{results:?}"
        );
        let late = Report::Finished {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: Some("w1".into()),
            end: AttemptEnd::Finished(Outcome::Success),
            exit_code: Some(0),
            signal: None,
            at: T0 + 700,
            log_lines: 2,
            message: String::new(),
            outputs: Default::default(),
        };
        s.apply_reports(&[late], T0 + 700).await.unwrap();
        let a = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!((a.state, a.attempt), (Failed, Attempt(1)));
        let attempt = &s.list_attempts(a.id).await.unwrap()[0];
        assert_eq!((attempt.state, attempt.exit_code), (Cancelled, Some(0)));
        assert_eq!(run_state(s, run.id).await, RunState::Failed);
        assert_eq!(
            mark(s, a.id, MarkAs::Failed).await,
            MarkAnswer::Refused(MarkRefused::Already(Failed))
        );
    }

    pub(super) async fn marking_a_waiting_task_success_stops_its_dispatch_and_runs_its_downstream(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert_eq!(a.state, Waiting);
        let MarkAnswer::Marked { killed, .. } = mark(s, a.id, MarkAs::Success).await else {
            panic!("not marked")
        };
        assert_eq!(killed, None, "nothing reached a worker");
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap(),
            vec![false],
            "a marked instance is never dispatched"
        );
        assert!(s.list_attempts(a.id).await.unwrap().is_empty());
        let last = run_task(s, run.id, "b", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn marking_a_mapped_item_settles_its_task_again(ctx: Ctx) {
        use ax_core::for_each::ForEach;
        let s = ctx.s();
        let mapped = ax_core::spec::TaskSpec {
            for_each: Some(ForEach::Output {
                task: "list".into(),
                key: "files".into(),
            }),
            max_items: Some(5),
            ..task("map", &["list"])
        };
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![task("list", &[]), mapped, task("sink", &["map"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let list = launch(s, run.id, "list").await;
        let mut report = finished(list.id, 1, Outcome::Success, 0);
        if let Report::Finished { outputs, .. } = &mut report {
            *outputs = [("files".to_string(), "[1, 2]".to_string())]
                .into_iter()
                .collect();
        }
        s.apply_reports(&[report], T0 + 30).await.unwrap();
        let instances = s.list_instances(run.id).await.unwrap();
        let parent = instances
            .iter()
            .find(|i| i.task == "map" && i.shard.is_none())
            .unwrap()
            .clone();
        let mut items: Vec<&InstanceRecord> = instances
            .iter()
            .filter(|i| i.task == "map" && i.shard.is_some())
            .collect();
        items.sort_by_key(|i| i.shard.as_ref().map(|sh| sh.index));
        let (first, second) = (items[0].id, items[1].id);

        // The task's own instance is not marked while its items go.
        assert_eq!(
            mark(s, parent.id, MarkAs::Success).await,
            MarkAnswer::ChildrenGoing { unfinished: 2 }
        );
        // The first item fails: the task fails, the sink will not run; the second is marked
        // SUCCESS while it waits.
        let won = s.mark_dispatched(&[claim(first, 1, "w1")]).await.unwrap();
        assert_eq!(won, vec![true]);
        s.apply_reports(&[started(first, 1)], T0).await.unwrap();
        s.apply_reports(&[finished(first, 1, Outcome::Failed, 1)], T0 + 40)
            .await
            .unwrap();
        assert_eq!(
            s.get_instance(parent.id).await.unwrap().unwrap().state,
            Failed
        );
        assert!(matches!(
            mark(s, second, MarkAs::Success).await,
            MarkAnswer::Marked { .. }
        ));
        assert_eq!(run_state(s, run.id).await, RunState::Failed);
        // Marking the failed item SUCCESS settles the task SUCCESS: the sink runs.
        assert!(matches!(
            mark(s, first, MarkAs::Success).await,
            MarkAnswer::Marked { .. }
        ));
        assert_eq!(
            s.get_instance(parent.id).await.unwrap().unwrap().state,
            Success
        );
        assert_eq!(run_state(s, run.id).await, RunState::Running);
        assert_eq!(instance_of(s, run.id, "sink").await.unwrap().state, Waiting);
        let last = run_task(s, run.id, "sink", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn a_mark_to_the_same_state_of_a_pending_or_missing_instance_is_refused(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        run_task(s, run.id, "b", Outcome::Success).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        let b = instance_of(s, run.id, "b").await.unwrap();
        assert_eq!(
            mark(s, a.id, MarkAs::Success).await,
            MarkAnswer::Refused(MarkRefused::Already(Success))
        );
        s.rerun_from(run.id, "a", T0 + 100).await.unwrap();
        assert_eq!(
            mark(s, b.id, MarkAs::Failed).await,
            MarkAnswer::Refused(MarkRefused::Pending)
        );
        assert_eq!(
            mark(s, InstanceId(987_654), MarkAs::Failed).await,
            MarkAnswer::NotFound
        );
    }

    pub(super) async fn a_selection_reruns_its_tops_and_everything_below_them(ctx: Ctx) {
        let s = ctx.s();
        // a → b → c, and a → side.
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("b", &["a"]),
                    task("c", &["b"]),
                    task("side", &["a"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        for t in ["a", "b", "side", "c"] {
            run_task(s, run.id, t, Outcome::Success).await;
        }
        let id = |t: &'static str| async move { instance_of(s, run.id, t).await.unwrap().id };
        let (a, b, c, side) = (
            id("a").await,
            id("b").await,
            id("c").await,
            id("side").await,
        );

        let unknown = s.rerun_tasks(run.id, &["b", "nope"], T0).await.unwrap();
        assert!(
            matches!(&unknown, RerunSelection::Refused { task, why: RerunFrom::UnknownTask { .. } } if task == "nope"),
            "{unknown:?}"
        );
        // c is below b: it waits for b instead of running at once.
        let answer = s
            .rerun_tasks(run.id, &["c", "b", "side"], T0 + 100)
            .await
            .unwrap();
        assert_eq!(
            answer,
            RerunSelection::Rerun {
                again: vec![b, side],
                pending: vec![c],
            }
        );
        assert_eq!(run_state(s, run.id).await, RunState::Running);
        assert_eq!(s.get_instance(a).await.unwrap().unwrap().state, Success);
        // While they run, a selection touching them is refused, changing nothing.
        let busy = s.rerun_tasks(run.id, &["a"], T0 + 200).await.unwrap();
        assert!(
            matches!(
                busy,
                RerunSelection::Refused {
                    why: RerunFrom::Active { .. },
                    ..
                }
            ),
            "{busy:?}"
        );
        for t in ["b", "side", "c"] {
            run_task(s, run.id, t, Outcome::Success).await;
        }
        assert_eq!(run_state(s, run.id).await, RunState::Success);
        assert_eq!(
            s.get_instance(c).await.unwrap().unwrap().attempt,
            Attempt(2)
        );
    }
}
