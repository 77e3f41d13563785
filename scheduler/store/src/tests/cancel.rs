//! Conformance scenarios of cancelling a run or one instance: the attempts on workers come back
//! for their workers to kill, and the run ends when nothing is left (`sql/cancel.rs`).

use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::spec::TaskSpec;
use ax_core::state::{InstanceState, Outcome};
use ax_core::trigger_rule::TriggerRule;

use super::support::*;
use crate::*;

conformance!(
    cancel_run_returns_live_attempts_and_ends_cancelled,
    cancel_instance_ends_the_run_when_nothing_is_left,
    the_tasks_below_a_cancelled_instance_follow_their_trigger_rules,
);

mod scenarios {
    use super::*;

    pub(super) async fn cancel_run_returns_live_attempts_and_ends_cancelled(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("done", &[]),
                    task("run", &[]),
                    task("disp", &[]),
                    task("wait", &[]),
                    task("later", &["done"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "done", Outcome::Success).await;
        let running = launch(s, run.id, "run").await;
        let disp = instance_of(s, run.id, "disp").await.unwrap();
        s.mark_dispatched(&[claim(disp.id, 1, "w2")]).await.unwrap();
        let killed = s
            .cancel_run(run.id, T0 + 99)
            .await
            .unwrap()
            .expect("run exists");
        let mut killed: Vec<(InstanceId, Attempt, Option<String>)> = killed
            .into_iter()
            .map(|k| (k.instance_id, k.attempt, k.worker_id))
            .collect();
        killed.sort();
        let mut want = vec![
            (running.id, Attempt(1), Some("w1".to_string())),
            (disp.id, Attempt(1), Some("w2".to_string())),
        ];
        want.sort();
        assert_eq!(killed, want);
        let run_now = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (run_now.state, run_now.cancel_requested, run_now.finished_at),
            (RunState::Cancelled, true, Some(T0 + 99))
        );
        for inst in s.list_instances(run.id).await.unwrap() {
            let want = if inst.task == "done" {
                InstanceState::Success
            } else {
                InstanceState::Cancelled
            };
            assert_eq!(inst.state, want, "{}", inst.task);
        }
        for id in [running.id, disp.id] {
            let attempt = &s.list_attempts(id).await.unwrap()[0];
            assert_eq!(
                (attempt.state, attempt.finished_at),
                (InstanceState::Cancelled, Some(T0 + 99))
            );
        }
        // The killed process's late report is stale; cancelling again is a no-op.
        let late = s
            .apply_reports(&[finished(running.id, 1, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        assert!(matches!(
            late[0],
            ReportResult::Stale {
                state: InstanceState::Cancelled,
                ..
            }
        ));
        assert_eq!(
            s.cancel_run(run.id, T0 + 100).await.unwrap(),
            Some(Vec::new())
        );
        assert!(s.waiting(T0 + 1_000, 10).await.unwrap().is_empty());
    }

    pub(super) async fn cancel_instance_ends_the_run_when_nothing_is_left(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &[])])).await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let b = launch(s, run.id, "b").await;
        let (record, killed) = s
            .cancel_instance(b.id, T0 + 7)
            .await
            .unwrap()
            .expect("exists");
        assert_eq!(
            (record.state, record.finished_at),
            (InstanceState::Cancelled, Some(T0 + 7))
        );
        assert_eq!(
            killed,
            Some(CancelledAttempt {
                instance_id: b.id,
                attempt: Attempt(1),
                worker_id: Some("w1".into())
            })
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );
        // Cancelling a finished instance changes nothing and kills nothing.
        let (again, none) = s.cancel_instance(b.id, T0 + 8).await.unwrap().unwrap();
        assert_eq!((again.finished_at, none), (Some(T0 + 7), None));

        // A waiting instance has no attempt to kill, and the run goes on while others run.
        let run2 = start_run(s, &wf).await;
        let a2 = instance_of(s, run2.id, "a").await.unwrap();
        let (_, killed) = s.cancel_instance(a2.id, T0).await.unwrap().unwrap();
        assert_eq!(killed, None);
        assert_eq!(
            s.get_run(run2.id).await.unwrap().unwrap().state,
            RunState::Running
        );
    }
    /// `a` → `cleanup` (all_done), `a` → `load` (all_success), `a` → `alert` (one_failed): a
    /// person's cancel of `a` counts as a failure, so `cleanup` and `alert` run and `load` is
    /// UPSTREAM_FAILED, and the run ends only once they have run.
    pub(super) async fn the_tasks_below_a_cancelled_instance_follow_their_trigger_rules(ctx: Ctx) {
        let s = ctx.s();
        let ruled = |name: &str, rule| TaskSpec {
            trigger_rule: rule,
            ..task(name, &["a"])
        };
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    ruled("cleanup", TriggerRule::AllDone),
                    ruled("load", TriggerRule::AllSuccess),
                    ruled("alert", TriggerRule::OneFailed),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let a = launch(s, run.id, "a").await;
        s.cancel_instance(a.id, T0 + 7)
            .await
            .unwrap()
            .expect("exists");

        let state = |task: &'static str| {
            let run = run.id;
            async move { instance_of(s, run, task).await.map(|i| i.state) }
        };
        assert_eq!(state("cleanup").await, Some(InstanceState::Waiting));
        assert_eq!(state("alert").await, Some(InstanceState::Waiting));
        assert_eq!(state("load").await, Some(InstanceState::UpstreamFailed));
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        run_task(s, run.id, "cleanup", Outcome::Success).await;
        run_task(s, run.id, "alert", Outcome::Success).await;
        // An instance cancelled by hand makes the run CANCELLED.
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );
    }
}
