//! Conformance scenarios for first attempts placed in the transaction that creates them
//! (`Placement`, `sql/placing.rs`): a placed attempt is created DISPATCHED with its attempt row,
//! as a claim leaves it, and goes on like any dispatched attempt; what is not placed is WAITING;
//! an instance that existed already (a rerun's pending task) is woken, never placed twice.

use std::collections::BTreeMap;

use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::state::InstanceState;

use super::support::*;
use crate::*;

conformance!(
    placed_roots_are_created_dispatched_with_their_attempt,
    an_advance_places_the_tasks_it_makes_ready,
    a_pending_task_woken_by_an_advance_is_not_placed,
);

mod scenarios {
    use super::*;

    /// Places the tasks named in `take` on worker `w1`, and remembers what it was offered.
    struct TakeNamed {
        take: Vec<&'static str>,
        offered: Vec<NewAttempt>,
    }

    impl TakeNamed {
        fn new(take: &[&'static str]) -> TakeNamed {
            TakeNamed {
                take: take.to_vec(),
                offered: Vec::new(),
            }
        }
    }

    impl Placement for TakeNamed {
        fn node_id(&self) -> &str {
            "node-p"
        }

        fn place(&mut self, attempt: &NewAttempt) -> Option<String> {
            self.offered.push(attempt.clone());
            self.take
                .contains(&attempt.task.as_str())
                .then(|| "w1".to_string())
        }
    }

    pub(in crate::tests) async fn placed_roots_are_created_dispatched_with_their_attempt(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("a", &[]), task("b", &[]), task("c", &["a", "b"])],
            ),
        )
        .await;
        let mut placement = TakeNamed::new(&["a"]);
        let (created, placed) = s
            .create_runs_placed(&[new_run(&wf, None)], &mut placement)
            .await
            .unwrap();
        let run = &created[0].0;
        assert!(created[0].1);
        let offered: Vec<&str> = placement.offered.iter().map(|a| a.task.as_str()).collect();
        assert_eq!(offered, ["a", "b"], "only the roots are offered");
        assert_eq!(placed.len(), 1);
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert_eq!(
            placed[0],
            PlacedAttempt {
                attempt: NewAttempt {
                    instance_id: a.id,
                    run_id: run.id,
                    workflow_id: wf.id,
                    workflow_version: wf.version,
                    task: "a".into(),
                    priority: 0,
                    created_at: T0,
                },
                worker_id: "w1".into(),
                dispatched_at: T0,
                logical_time: T0,
                params: run.params.clone(),
                run_env: BTreeMap::new(),
                run_outputs: BTreeMap::new(),
            }
        );
        assert_eq!(
            (a.state, a.attempt, a.worker_id.as_deref()),
            (InstanceState::Dispatched, Attempt(1), Some("w1"))
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            (
                attempts[0].state,
                attempts[0].node_id.as_deref(),
                attempts[0].dispatched_at
            ),
            (InstanceState::Dispatched, Some("node-p"), Some(T0))
        );
        let b = instance_of(s, run.id, "b").await.unwrap();
        assert_eq!(b.state, InstanceState::Waiting);
        let waiting: Vec<InstanceId> = s
            .waiting(T0 + 1, 10)
            .await
            .unwrap()
            .iter()
            .map(|w| w.instance.id)
            .collect();
        assert_eq!(waiting, [b.id], "a placed attempt is not in the queue");
        // A claim of the placed attempt loses: it is no longer WAITING.
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w2")]).await.unwrap(),
            [false]
        );
        // It goes on as any dispatched attempt.
        let results = s
            .apply_reports(
                &[
                    started(a.id, 1),
                    finished(a.id, 1, ax_core::state::Outcome::Success, 0),
                ],
                T0 + 40,
            )
            .await
            .unwrap();
        assert!(applied(&results[1]).attempt_ended);
        let a = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(a.state, InstanceState::Success);
    }

    pub(in crate::tests) async fn an_advance_places_the_tasks_it_makes_ready(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("chain", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = s.create_run(&new_run(&wf, None)).await.unwrap().0;
        let a = launch(s, run.id, "a").await;
        let mut placement = TakeNamed::new(&["b"]);
        let (results, placed) = s
            .apply_reports_placed(
                &[finished(a.id, 1, ax_core::state::Outcome::Success, 0)],
                T0 + 40,
                &mut placement,
            )
            .await
            .unwrap();
        assert!(applied(&results[0]).attempt_ended);
        let b = instance_of(s, run.id, "b").await.unwrap();
        assert_eq!(placed.len(), 1);
        assert_eq!(placed[0].attempt.instance_id, b.id);
        assert_eq!(placed[0].dispatched_at, T0 + 40);
        // What the dispatch carries is the run's, read in the transaction.
        assert_eq!(
            (placed[0].logical_time, &placed[0].params),
            (run.logical_time, &run.params)
        );
        assert_eq!(
            (b.state, b.worker_id.as_deref(), b.created_at),
            (InstanceState::Dispatched, Some("w1"), T0 + 40)
        );
        let results = s
            .apply_reports(
                &[
                    started(b.id, 1),
                    finished(b.id, 1, ax_core::state::Outcome::Success, 0),
                ],
                T0 + 50,
            )
            .await
            .unwrap();
        assert_eq!(
            applied(&results[1]).run_finished,
            Some((run.id, RunState::Success))
        );
    }

    pub(in crate::tests) async fn a_pending_task_woken_by_an_advance_is_not_placed(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("chain", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = s.create_run(&new_run(&wf, None)).await.unwrap().0;
        for t in ["a", "b"] {
            run_task(s, run.id, t, ax_core::state::Outcome::Success).await;
        }
        let b = instance_of(s, run.id, "b").await.unwrap();
        s.rerun_from(run.id, "a", T0 + 100).await.unwrap();
        let a = launch(s, run.id, "a").await;
        let mut placement = TakeNamed::new(&["b"]);
        let (results, placed) = s
            .apply_reports_placed(
                &[finished(
                    a.id,
                    a.attempt.0,
                    ax_core::state::Outcome::Success,
                    0,
                )],
                T0 + 200,
                &mut placement,
            )
            .await
            .unwrap();
        assert_eq!(applied(&results[0]).new_waiting, 1);
        assert_eq!(placement.offered.len(), 1, "b was offered under a fresh id");
        assert!(
            placed.is_empty(),
            "the fresh id was not inserted: {placed:?}"
        );
        let offered = placement.offered[0].instance_id;
        assert!(s.get_instance(offered).await.unwrap().is_none());
        assert!(s.list_attempts(offered).await.unwrap().is_empty());
        let b2 = s.get_instance(b.id).await.unwrap().unwrap();
        assert_eq!((b2.state, b2.attempt), (InstanceState::Waiting, Attempt(2)));
    }
}
