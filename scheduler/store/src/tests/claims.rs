//! Conformance scenarios of the waiting queue and its claims: the queue's order and backoff, a
//! claim that only one caller wins, and the attempts the store lists as on workers
//! (`sql/dispatch.rs`).

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::state::{InstanceState, Outcome};

use super::support::*;

conformance!(
    waiting_orders_by_priority_then_readiness_and_respects_backoff,
    mark_dispatched_is_a_conditional_claim,
    active_attempts_list_what_is_on_workers_with_their_timeouts,
);

mod scenarios {
    use super::*;

    pub(super) async fn waiting_orders_by_priority_then_readiness_and_respects_backoff(ctx: Ctx) {
        let s = ctx.s();
        let mut hi = task("hi", &[]);
        hi.priority = 10;
        let mut lo = task("lo", &[]);
        lo.priority = -1;
        let mut flaky = task("flaky", &[]);
        flaky.priority = 20;
        flaky.retries = 1;
        flaky.retry_backoff_ms = 60_000;
        let wf = apply(s, &spec("wf", vec![lo, task("mid", &[]), hi, flaky])).await;
        let r1 = start_run(s, &wf).await;
        let r2 = start_run(s, &wf).await;
        // r1's flaky fails once: its retry waits out its backoff.
        run_task(s, r1.id, "flaky", Outcome::Failed).await;
        let waiting = s.waiting(T0 + 100, 100).await.unwrap();
        let order: Vec<(RunId, &str)> = waiting
            .iter()
            .map(|w| (w.instance.run_id, w.instance.task.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (r2.id, "flaky"),
                (r1.id, "hi"),
                (r2.id, "hi"),
                (r1.id, "mid"),
                (r2.id, "mid"),
                (r1.id, "lo"),
                (r2.id, "lo"),
            ]
        );
        assert!(waiting.windows(2).all(|w| {
            let (a, b) = (&w[0].instance, &w[1].instance);
            a.priority > b.priority
                || (a.priority == b.priority && (a.not_before, a.id) < (b.not_before, b.id))
        }));
        let first = &waiting[0];
        assert_eq!(first.logical_time, T0);
        assert_eq!(
            first.params.get("day").map(String::as_str),
            Some("2024-01-01")
        );
        assert_eq!(first.instance.workflow, "wf");
        assert_eq!(s.waiting(T0 + 100, 2).await.unwrap().len(), 2);
        // Two nodes' shares of the queue split it by instance id, each in the same order.
        for index in 0..2 {
            let share = crate::QueueShare { nodes: 2, index };
            let mine = s.waiting_share(T0 + 100, 100, share).await.unwrap();
            let expected: Vec<InstanceId> = waiting
                .iter()
                .map(|w| w.instance.id)
                .filter(|id| id.0 % 2 == i64::from(index))
                .collect();
            let got: Vec<InstanceId> = mine.iter().map(|w| w.instance.id).collect();
            assert_eq!(got, expected);
        }
        // After the longest possible backoff the retry is waiting too, by priority among the
        // first, and behind the instance of its priority that was ready before it (r2's first
        // attempt, though r1's instance has the lower id).
        let later = s.waiting(T0 + 30 + 60_000, 100).await.unwrap();
        assert_eq!(later.len(), 8);
        let head: Vec<(RunId, &str, Attempt)> = later[..2]
            .iter()
            .map(|w| {
                (
                    w.instance.run_id,
                    w.instance.task.as_str(),
                    w.instance.attempt,
                )
            })
            .collect();
        assert_eq!(
            head,
            [(r2.id, "flaky", Attempt(1)), (r1.id, "flaky", Attempt(2))]
        );
    }

    pub(super) async fn mark_dispatched_is_a_conditional_claim(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        let b = instance_of(s, run.id, "b").await.unwrap();
        let won = s
            .mark_dispatched(&[
                claim(b.id, 1, "w1"),
                claim(a.id, 2, "w1"),
                claim(a.id, 1, "w2"),
            ])
            .await
            .unwrap();
        assert_eq!(won, [true, false, true], "a stale attempt loses");
        let again = s.mark_dispatched(&[claim(a.id, 1, "w3")]).await.unwrap();
        assert_eq!(again, [false], "a second claim of the same attempt loses");
        let a = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (a.state, a.worker_id.as_deref()),
            (InstanceState::Dispatched, Some("w2"))
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].attempt, Attempt(1));
        assert_eq!(attempts[0].state, InstanceState::Dispatched);
        assert_eq!(attempts[0].worker_id.as_deref(), Some("w2"));
        assert_eq!(attempts[0].dispatched_at, Some(T0 + 10));
        assert!(s.waiting(T0, 10).await.unwrap().is_empty());
        assert_eq!(s.mark_dispatched(&[]).await.unwrap(), Vec::<bool>::new());
    }

    pub(super) async fn active_attempts_list_what_is_on_workers_with_their_timeouts(ctx: Ctx) {
        let s = ctx.s();
        let mut slow = task("slow", &[]);
        slow.timeout_ms = std::num::NonZeroU64::new(60_000);
        let wf = apply(
            s,
            &spec("wf", vec![slow, task("queued", &[]), task("done", &[])]),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "done", Outcome::Success).await;
        let running = launch(s, run.id, "slow").await;
        assert!(
            s.active_attempts(None, 100).await.unwrap().len() == 1,
            "WAITING and finished are not active"
        );

        let queued = instance_of(s, run.id, "queued").await.unwrap();
        s.mark_dispatched(&[claim(queued.id, 1, "w2")])
            .await
            .unwrap();
        let active = s.active_attempts(None, 100).await.unwrap();
        assert!(
            active
                .windows(2)
                .all(|w| w[0].instance_id < w[1].instance_id),
            "oldest first"
        );
        let find = |id: InstanceId| active.iter().find(|a| a.instance_id == id).expect("listed");
        let slow = find(running.id);
        assert_eq!(
            (
                slow.state,
                slow.worker_id.as_deref(),
                slow.timeout_ms,
                slow.started_at
            ),
            (
                InstanceState::Running,
                Some("w1"),
                std::num::NonZeroU64::new(60_000),
                Some(T0 + 20)
            )
        );
        assert_eq!(slow.last_heartbeat_at, Some(T0 + 20));
        let dispatched = find(queued.id);
        assert_eq!(
            (
                dispatched.state,
                dispatched.worker_id.as_deref(),
                dispatched.timeout_ms
            ),
            (InstanceState::Dispatched, Some("w2"), None)
        );
        assert_eq!(
            (dispatched.started_at, dispatched.dispatched_at),
            (None, Some(T0 + 10))
        );
        assert_eq!(active.len(), 2);
        let on_w2 = s.active_attempts(Some("w2"), 100).await.unwrap();
        assert_eq!(
            on_w2.iter().map(|a| a.instance_id).collect::<Vec<_>>(),
            vec![queued.id]
        );
    }
}
