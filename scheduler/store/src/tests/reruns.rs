//! Conformance scenarios of running finished tasks again: a manual retry, rerunning a run's
//! failed part, and rerunning from a task down, each keeping the earlier attempts
//! (`sql/rerun.rs`).

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    a_manual_retry_reopens_the_run_and_keeps_the_history,
    rerun_failed_retries_the_failed_part_and_its_downstream_follows,
    rerun_from_a_task_reruns_it_and_its_downstream_keeping_history,
    a_rerun_task_that_fails_again_fails_the_run_with_the_rest_upstream_failed,
    rerun_from_refuses_unknown_tasks_and_active_instances,
);

mod scenarios {
    use super::*;

    pub(super) async fn a_manual_retry_reopens_the_run_and_keeps_the_history(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let failed = run_task(s, run.id, "only", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));
        let inst = instance_of(s, run.id, "only").await.unwrap();

        let retried = s.retry_instance(inst.id, T0 + 100).await.unwrap();
        let ManualRetry::Retried(record) = retried else {
            panic!("{retried:?}")
        };
        assert_eq!(
            (record.state, record.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert_eq!(
            attempts.len(),
            1,
            "attempt 2 has no row until it is dispatched"
        );
        assert_eq!(attempts[0].state, InstanceState::Failed);

        let done = run_task(s, run.id, "only", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        let attempts = s.list_attempts(inst.id).await.unwrap();
        let states: Vec<_> = attempts.iter().map(|a| (a.attempt, a.state)).collect();
        assert_eq!(
            states,
            vec![
                (Attempt(1), InstanceState::Failed),
                (Attempt(2), InstanceState::Success)
            ]
        );
        assert_eq!(
            s.retry_instance(inst.id, T0).await.unwrap(),
            ManualRetry::NotRetryable(InstanceState::Success)
        );
        assert_eq!(
            s.retry_instance(InstanceId(987_654), T0).await.unwrap(),
            ManualRetry::NotFound
        );
    }

    pub(super) async fn rerun_failed_retries_the_failed_part_and_its_downstream_follows(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("a", &[]), task("bad", &["a"]), task("below", &["bad"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let failed = run_task(s, run.id, "bad", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));

        let bad = instance_of(s, run.id, "bad").await.unwrap();
        let retried = s.rerun_failed(run.id, T0 + 100).await.unwrap().unwrap();
        assert_eq!(retried.retried, vec![bad.id]);
        assert!(retried.shards_active.is_empty());
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        run_task(s, run.id, "bad", Outcome::Success).await;
        let last = run_task(s, run.id, "below", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
        assert_eq!(
            s.rerun_failed(run.id, T0).await.unwrap(),
            Some(RerunFailed::default())
        );
        assert_eq!(s.rerun_failed(RunId(987_654), T0).await.unwrap(), None);
    }

    pub(super) async fn rerun_from_a_task_reruns_it_and_its_downstream_keeping_history(ctx: Ctx) {
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
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Success
        );
        let b = instance_of(s, run.id, "b").await.unwrap();
        let c = instance_of(s, run.id, "c").await.unwrap();

        let answer = s.rerun_from(run.id, "b", T0 + 100).await.unwrap();
        assert_eq!(
            answer,
            RerunFrom::Rerun {
                again: b.id,
                pending: vec![c.id]
            }
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        let b2 = s.get_instance(b.id).await.unwrap().unwrap();
        assert_eq!((b2.state, b2.attempt), (InstanceState::Waiting, Attempt(2)));
        let c2 = s.get_instance(c.id).await.unwrap().unwrap();
        assert_eq!((c2.state, c2.attempt), (InstanceState::Pending, Attempt(1)));
        for untouched in ["a", "side"] {
            let i = instance_of(s, run.id, untouched).await.unwrap();
            assert_eq!((i.state, i.attempt), (InstanceState::Success, Attempt(1)));
        }
        // PENDING is shown as not created, and does not keep the run from ending.
        assert_eq!(s.run_counts(run.id).await.unwrap().not_created, 1);

        let done_b = run_task(s, run.id, "b", Outcome::Success).await;
        assert_eq!(done_b.new_waiting, 1, "c woke as its next attempt");
        let c3 = s.get_instance(c.id).await.unwrap().unwrap();
        assert_eq!((c3.state, c3.attempt), (InstanceState::Waiting, Attempt(2)));
        let done_c = run_task(s, run.id, "c", Outcome::Success).await;
        assert_eq!(done_c.run_finished, Some((run.id, RunState::Success)));

        for id in [b.id, c.id] {
            let attempts = s.list_attempts(id).await.unwrap();
            let states: Vec<_> = attempts.iter().map(|a| (a.attempt.0, a.state)).collect();
            assert_eq!(
                states,
                vec![(1, InstanceState::Success), (2, InstanceState::Success)],
                "the first attempt keeps its record"
            );
        }
    }

    pub(super) async fn a_rerun_task_that_fails_again_fails_the_run_with_the_rest_upstream_failed(
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
        for t in ["a", "b", "c"] {
            run_task(s, run.id, t, Outcome::Success).await;
        }
        let RerunFrom::Rerun { pending, .. } = s.rerun_from(run.id, "a", T0 + 100).await.unwrap()
        else {
            panic!("rerun refused")
        };
        assert_eq!(pending.len(), 2, "b and c wait again");
        let failed = run_task(s, run.id, "a", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(
            (counts.failed, counts.upstream_failed, counts.not_created),
            (1, 2, 0)
        );
        for t in ["b", "c"] {
            let i = instance_of(s, run.id, t).await.unwrap();
            assert_eq!(
                (i.state, i.attempt),
                (InstanceState::UpstreamFailed, Attempt(1)),
                "judged again, keeping the attempt that ran"
            );
        }
        // The failed part reruns, and the ones below it wait for it again, then follow it.
        assert_eq!(
            s.rerun_failed(run.id, T0 + 200)
                .await
                .unwrap()
                .map(|v| v.retried.len()),
            Some(1)
        );
        run_task(s, run.id, "a", Outcome::Success).await;
        run_task(s, run.id, "b", Outcome::Success).await;
        let last = run_task(s, run.id, "c", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn rerun_from_refuses_unknown_tasks_and_active_instances(ctx: Ctx) {
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
        assert_eq!(
            s.rerun_from(RunId(987_654), "a", T0).await.unwrap(),
            RerunFrom::RunNotFound
        );
        assert_eq!(
            s.rerun_from(run.id, "nope", T0).await.unwrap(),
            RerunFrom::UnknownTask {
                tasks: vec!["a".into(), "b".into(), "c".into()]
            }
        );
        run_task(s, run.id, "a", Outcome::Success).await;
        let b = launch(s, run.id, "b").await;
        // a is done but b, below it, is running: refused, nothing changes.
        assert_eq!(
            s.rerun_from(run.id, "a", T0).await.unwrap(),
            RerunFrom::Active {
                busy: vec![("b".into(), InstanceState::Running)]
            }
        );
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert_eq!((a.state, a.attempt), (InstanceState::Success, Attempt(1)));
        // c never ran: nothing to run again.
        assert_eq!(
            s.rerun_from(run.id, "c", T0).await.unwrap(),
            RerunFrom::NotRun { state: None }
        );
        let results = s
            .apply_reports(&[finished(b.id, 1, Outcome::Failed, 1)], T0 + 40)
            .await
            .unwrap();
        assert_eq!(
            applied(&results[0]).run_finished,
            Some((run.id, RunState::Failed))
        );
        // A failed task can be rerun from too; c, upstream-failed, waits for it again.
        let c = instance_of(s, run.id, "c").await.unwrap();
        assert_eq!(
            (c.state, c.attempt),
            (InstanceState::UpstreamFailed, Attempt(0))
        );
        assert!(matches!(
            s.rerun_from(run.id, "b", T0 + 50).await.unwrap(),
            RerunFrom::Rerun { pending, .. } if pending == [c.id]
        ));
    }
}
