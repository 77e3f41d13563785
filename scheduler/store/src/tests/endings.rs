//! How attempts end when a worker or a node was away: withdrawn dispatches, and the late
//! report of an attempt the scheduler had already ended.

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    a_withdrawn_dispatch_waits_as_the_next_attempt_without_spending_a_retry,
    a_cancelled_attempt_records_how_its_worker_ended_it,
    a_withdrawal_that_finds_its_attempt_running_loses_it,
    a_withdrawal_decided_for_one_worker_spares_the_attempt_sent_to_another,
    a_withdrawal_of_an_earlier_dispatch_spares_the_same_attempt_sent_again,
    an_end_whose_start_was_not_stored_is_recorded_with_its_start,
    a_repeated_end_is_acknowledged_as_the_one_stored,
);

mod scenarios {
    use super::*;

    /// A node's withdrawal of the dispatch it read on w1 (which came back without it): the one
    /// `claim` makes, at T0 + 10.
    fn withdraw(id: InstanceId, attempt: u32) -> Report {
        Report::Rejected {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: Some("w1".into()),
            reason: "worker w1 came back without it".into(),
            withdrawn: true,
            dispatched_at: Some(T0 + 10),
        }
    }

    fn failed_on_w1(id: InstanceId, attempt: u32) -> Report {
        Report::Finished {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: Some("w1".into()),
            end: AttemptEnd::Finished(Outcome::Failed),
            exit_code: Some(1),
            signal: None,
            at: T0 + 30,
            log_lines: 3,
            message: "exit 1".into(),
            outputs: Default::default(),
        }
    }

    pub(super) async fn a_withdrawn_dispatch_waits_as_the_next_attempt_without_spending_a_retry(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let mut flaky = task("a", &[]);
        flaky.retries = 1;
        let wf = apply(s, &spec("wf", vec![flaky])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert!(s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap()[0]);

        let results = s
            .apply_reports(&[withdraw(a.id, 1)], T0 + 40)
            .await
            .unwrap();
        let done = applied(&results[0]);
        assert_eq!((done.new_waiting, done.attempt_ended), (1, true));
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt, now.worker_id, now.not_before),
            (InstanceState::Waiting, Attempt(2), None, T0 + 40)
        );
        // Withdrawing it again is stale: attempt 1 is over, for good.
        assert_eq!(
            s.apply_reports(&[withdraw(a.id, 1)], T0 + 41)
                .await
                .unwrap(),
            [ReportResult::Stale {
                current_attempt: Attempt(2),
                state: InstanceState::Waiting
            }]
        );

        // Attempt 2 fails: the withdrawn attempt was not a failure, so the one retry is left.
        assert!(s.mark_dispatched(&[claim(a.id, 2, "w1")]).await.unwrap()[0]);
        s.apply_reports(&[started(a.id, 2)], T0 + 50).await.unwrap();
        let results = s
            .apply_reports(&[failed_on_w1(a.id, 2)], T0 + 60)
            .await
            .unwrap();
        assert!(applied(&results[0]).retry_scheduled, "{results:?}");
        // Attempt 3 fails too: now the retries are spent.
        let retry = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(retry.attempt, Attempt(3));
        assert!(s.mark_dispatched(&[claim(a.id, 3, "w1")]).await.unwrap()[0]);
        s.apply_reports(&[started(a.id, 3)], T0 + 70).await.unwrap();
        let results = s
            .apply_reports(&[failed_on_w1(a.id, 3)], T0 + 80)
            .await
            .unwrap();
        assert!(!applied(&results[0]).retry_scheduled, "{results:?}");
        assert_eq!(
            s.get_instance(a.id).await.unwrap().unwrap().state,
            InstanceState::Failed
        );

        let attempts = s.list_attempts(a.id).await.unwrap();
        let summary: Vec<(u32, InstanceState)> =
            attempts.iter().map(|a| (a.attempt.0, a.state)).collect();
        assert_eq!(
            summary,
            [
                (1, InstanceState::Failed),
                (2, InstanceState::Failed),
                (3, InstanceState::Failed)
            ]
        );
        assert_eq!(
            attempts[0].message,
            "withdrawn: worker w1 came back without it"
        );
        assert_eq!(attempts[0].finished_at, Some(T0 + 40));
    }

    pub(super) async fn a_cancelled_attempt_records_how_its_worker_ended_it(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = launch(s, run.id, "a").await;
        s.cancel_instance(a.id, T0 + 7)
            .await
            .unwrap()
            .expect("exists");

        let ending_of = |id: InstanceId, worker: &str| Report::Finished {
            instance_id: id,
            attempt: Attempt(1),
            worker_id: Some(worker.into()),
            end: AttemptEnd::Finished(Outcome::Failed),
            exit_code: None,
            signal: Some(15),
            at: T0 + 9,
            log_lines: 7,
            message: "cancelled".into(),
            outputs: Default::default(),
        };
        let ending = |worker: &str| ending_of(a.id, worker);
        // Only the worker it ran on may say how it ended.
        let stranger = s.apply_reports(&[ending("w2")], T0 + 10).await.unwrap();
        assert_eq!(stranger, [ReportResult::NotYours]);
        let results = s.apply_reports(&[ending("w1")], T0 + 10).await.unwrap();
        assert_eq!(results, [ReportResult::Applied(Applied::default())]);
        // A replay after a reconnect is the same fact again.
        let again = s.apply_reports(&[ending("w1")], T0 + 11).await.unwrap();
        assert_eq!(again, [ReportResult::Applied(Applied::default())]);

        let instance = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(instance.state, InstanceState::Cancelled);
        let attempt = &s.list_attempts(a.id).await.unwrap()[0];
        assert_eq!(
            (
                attempt.state,
                attempt.exit_code,
                attempt.signal,
                attempt.log_lines
            ),
            (InstanceState::Cancelled, None, Some(15), 7)
        );
        assert_eq!(attempt.finished_at, Some(T0 + 7));
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );

        // A report of an attempt that ended on its own is still refused: it is not a late ending.
        let b_wf = apply(s, &spec("wf2", vec![task("b", &[])])).await;
        let b_run = start_run(s, &b_wf).await;
        run_task(s, b_run.id, "b", Outcome::Success).await;
        let b = instance_of(s, b_run.id, "b").await.unwrap();
        let results = s
            .apply_reports(&[ending_of(b.id, "w1")], T0 + 40)
            .await
            .unwrap();
        assert!(
            matches!(results[0], ReportResult::Stale { .. }),
            "{results:?}"
        );
    }

    /// A withdrawal decided before the attempt's Started report was applied: the worker ran it and
    /// no longer has it, so it is lost (retried as the task allows), never left RUNNING.
    pub(super) async fn a_withdrawal_that_finds_its_attempt_running_loses_it(ctx: Ctx) {
        let s = ctx.s();
        let mut flaky = task("a", &[]);
        flaky.retries = 1;
        let wf = apply(s, &spec("wf", vec![flaky])).await;
        let run = start_run(s, &wf).await;
        let a = launch(s, run.id, "a").await;
        assert_eq!(a.state, InstanceState::Running);
        let results = s
            .apply_reports(&[withdraw(a.id, 1)], T0 + 40)
            .await
            .unwrap();
        assert!(applied(&results[0]).retry_scheduled, "{results:?}");
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        let first = &s.list_attempts(a.id).await.unwrap()[0];
        assert_eq!(first.state, InstanceState::Failed);
        assert_eq!(first.message, "lost: worker w1 came back without it");
    }

    /// An instance whose attempt 1 went to w1 (at T0 + 10) and that w1 refused as over capacity:
    /// WAITING again as the same attempt.
    async fn refused_by_w1(s: &Store) -> InstanceRecord {
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert!(s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap()[0]);
        let refused = Report::Rejected {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: Some("w1".into()),
            reason: "worker is at capacity (20)".into(),
            withdrawn: false,
            dispatched_at: None,
        };
        s.apply_reports(&[refused], T0 + 12).await.unwrap();
        a
    }

    /// A node reads w1's dispatch and decides to withdraw it; meanwhile w1 refuses the dispatch (at
    /// capacity) and the same attempt goes to w2, which starts it. The withdrawal, named for w1, is
    /// stale: it must not end the attempt w2 runs (which would run the task a second time as
    /// attempt 2).
    pub(super) async fn a_withdrawal_decided_for_one_worker_spares_the_attempt_sent_to_another(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let a = refused_by_w1(s).await;
        assert!(s.mark_dispatched(&[claim(a.id, 1, "w2")]).await.unwrap()[0]);
        let on_w2 = Report::Started {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: "w2".into(),
            pid: 4343,
            at: T0 + 20,
        };
        s.apply_reports(&[on_w2], T0 + 20).await.unwrap();
        let results = s
            .apply_reports(&[withdraw(a.id, 1)], T0 + 40)
            .await
            .unwrap();
        assert_eq!(
            results,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Running
            }]
        );
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt, now.worker_id.as_deref()),
            (InstanceState::Running, Attempt(1), Some("w2"))
        );
    }

    /// The same race with one worker: w1 refuses the dispatch (at capacity) and the same attempt
    /// goes to w1 again. A withdrawal decided on the first dispatch names its `dispatched_at`, and
    /// spares the second, which w1 may be starting; one naming the second applies.
    pub(super) async fn a_withdrawal_of_an_earlier_dispatch_spares_the_same_attempt_sent_again(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let a = refused_by_w1(s).await;
        let again = DispatchClaim {
            at: T0 + 30,
            ..claim(a.id, 1, "w1")
        };
        assert!(s.mark_dispatched(&[again]).await.unwrap()[0]);
        let withdrawal = |read: Millis| Report::Rejected {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: Some("w1".into()),
            reason: "worker w1 came back without it".into(),
            withdrawn: true,
            dispatched_at: Some(read),
        };
        let results = s
            .apply_reports(&[withdrawal(T0 + 10)], T0 + 40)
            .await
            .unwrap();
        assert_eq!(
            results,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Dispatched
            }]
        );
        let results = s
            .apply_reports(&[withdrawal(T0 + 30)], T0 + 41)
            .await
            .unwrap();
        assert_eq!(applied(&results[0]).new_waiting, 1, "{results:?}");
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
    }

    /// A worker's success of the attempt dispatched to it, while the store still has it
    /// DISPATCHED (its Started report never landed): the end is the proof the process ran, so
    /// it is recorded (started at the end's time) and the run goes on, instead of the success
    /// being refused and the task run again. Another worker's end, or an end of another
    /// attempt, is still refused.
    pub(super) async fn an_end_whose_start_was_not_stored_is_recorded_with_its_start(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &["a"])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert!(s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap()[0]);
        let mut from_w2 = succeeded_on_w1(a.id, 1);
        if let Report::Finished { worker_id, .. } = &mut from_w2 {
            *worker_id = Some("w2".into());
        }
        assert_eq!(
            s.apply_reports(&[from_w2], T0 + 20).await.unwrap(),
            [ReportResult::NotYours]
        );
        let results = s
            .apply_reports(&[succeeded_on_w1(a.id, 1)], T0 + 30)
            .await
            .unwrap();
        assert!(
            matches!(results[0], ReportResult::Applied(_)),
            "{results:?}"
        );
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt),
            (InstanceState::Success, Attempt(1))
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            (
                attempts[0].state,
                attempts[0].started_at,
                attempts[0].finished_at
            ),
            (InstanceState::Success, Some(T0 + 30), Some(T0 + 30))
        );
        // The run went on: b is ready.
        let b = instance_of(s, run.id, "b").await.unwrap();
        assert_eq!(b.state, InstanceState::Waiting);
    }

    /// A worker sends an end again until it is acknowledged: on each new stream, and on a live
    /// stream that left it unanswered. The same end again (its attempt's row ended as it says,
    /// at its time, on its worker, or applied earlier in the same batch) is applied as nothing
    /// new, so the node acknowledges it, instead of refusing it as stale once the instance has
    /// moved on (a retry, a success); it changes nothing. Another end of that attempt (another
    /// time, another worker) is still refused.
    pub(super) async fn a_repeated_end_is_acknowledged_as_the_one_stored(ctx: Ctx) {
        let s = ctx.s();
        let mut flaky = task("a", &[]);
        flaky.retries = 1;
        let wf = apply(s, &spec("wf", vec![flaky, task("c", &[])])).await;
        let run = start_run(s, &wf).await;
        let nothing_new = [ReportResult::Applied(Applied::default())];

        // A failure with a retry left: the instance goes on to attempt 2.
        let a = launch(s, run.id, "a").await;
        let results = s
            .apply_reports(&[failed_on_w1(a.id, 1)], T0 + 30)
            .await
            .unwrap();
        assert!(applied(&results[0]).retry_scheduled, "{results:?}");
        let moved_on = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (moved_on.state, moved_on.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        let again = s
            .apply_reports(&[failed_on_w1(a.id, 1)], T0 + 45)
            .await
            .unwrap();
        assert_eq!(again, nothing_new);
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!((now.state, now.attempt), (moved_on.state, moved_on.attempt));
        let first = &s.list_attempts(a.id).await.unwrap()[0];
        assert_eq!(
            (first.state, first.exit_code, first.finished_at),
            (InstanceState::Failed, Some(1), Some(T0 + 30))
        );

        // Another end of attempt 1 is not this one: refused as before.
        let mut later = failed_on_w1(a.id, 1);
        if let Report::Finished { at, .. } = &mut later {
            *at = T0 + 31;
        }
        assert!(
            matches!(
                s.apply_reports(&[later], T0 + 46).await.unwrap()[0],
                ReportResult::Stale { .. }
            ),
            "another end of the attempt"
        );
        let mut from_w2 = failed_on_w1(a.id, 1);
        if let Report::Finished { worker_id, .. } = &mut from_w2 {
            *worker_id = Some("w2".into());
        }
        assert_eq!(
            s.apply_reports(&[from_w2], T0 + 47).await.unwrap(),
            [ReportResult::NotYours]
        );

        // Attempt 2 succeeds; its success again is acknowledged, and the run is not ended twice.
        assert!(s.mark_dispatched(&[claim(a.id, 2, "w1")]).await.unwrap()[0]);
        s.apply_reports(&[started(a.id, 2)], T0 + 50).await.unwrap();
        let results = s
            .apply_reports(&[succeeded_on_w1(a.id, 2)], T0 + 60)
            .await
            .unwrap();
        assert_eq!(
            applied(&results[0]).attempt_state,
            Some(InstanceState::Success)
        );
        let again = s
            .apply_reports(&[succeeded_on_w1(a.id, 2)], T0 + 70)
            .await
            .unwrap();
        assert_eq!(again, nothing_new);

        // The same end twice in one batch (a resend that caught up with the first): both are
        // answered as applied, the second as nothing new.
        let c = launch(s, run.id, "c").await;
        let results = s
            .apply_reports(&[failed_on_w1(c.id, 1), failed_on_w1(c.id, 1)], T0 + 80)
            .await
            .unwrap();
        assert_eq!(
            applied(&results[0]).attempt_state,
            Some(InstanceState::Failed)
        );
        assert_eq!(results[1], nothing_new[0]);
        let c_now = s.get_instance(c.id).await.unwrap().unwrap();
        assert_eq!(c_now.state, InstanceState::Failed);
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Failed
        );
    }

    fn succeeded_on_w1(id: InstanceId, attempt: u32) -> Report {
        Report::Finished {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: Some("w1".into()),
            end: AttemptEnd::Finished(Outcome::Success),
            exit_code: Some(0),
            signal: None,
            at: T0 + 30,
            log_lines: 3,
            message: String::new(),
            outputs: Default::default(),
        }
    }
}
