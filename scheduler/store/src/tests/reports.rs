//! Conformance scenarios of worker reports about one attempt: start and finish, a refused
//! dispatch, heartbeats, retries with backoff, spawn failures, stale and unknown reports, and
//! reports and log lines from a worker the attempt was not dispatched to (`sql/reports.rs`).

use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    started_and_finished_end_a_one_task_run,
    rejected_dispatch_returns_to_waiting_and_reuses_its_attempt_row,
    heartbeat_applies_only_to_a_running_attempt,
    retry_with_backoff_keeps_every_attempt,
    spawn_failure_retries_then_fails,
    stale_report_changes_nothing,
    unknown_instance_is_not_found,
    a_report_from_another_worker_is_not_its_own,
    reports_and_lines_about_attempts_never_dispatched_to_their_worker_are_refused,
);

mod scenarios {
    use super::*;

    pub(super) async fn started_and_finished_end_a_one_task_run(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = launch(s, run.id, "only").await;
        assert_eq!(inst.state, InstanceState::Running);
        assert_eq!(inst.started_at, Some(T0 + 20));
        assert_eq!(inst.worker_id.as_deref(), Some("w1"));
        // A repeated start of the running attempt (a worker re-attaching after a reconnect
        // replays it) is the same fact again: accepted, and it changes nothing.
        let dup = s
            .apply_reports(&[started(inst.id, 1)], T0 + 30)
            .await
            .unwrap();
        assert_eq!(dup, [ReportResult::Applied(Applied::default())]);
        let again = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(again.started_at, Some(T0 + 20));
        assert_eq!(again.state, InstanceState::Running);

        let results = s
            .apply_reports(&[finished(inst.id, 1, Outcome::Success, 0)], T0 + 40)
            .await
            .unwrap();
        let applied = applied(&results[0]);
        assert!(applied.attempt_ended);
        assert_eq!(applied.new_waiting, 0);
        assert_eq!(applied.run_finished, Some((run.id, RunState::Success)));
        let inst = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(
            (inst.state, inst.exit_code, inst.finished_at),
            (InstanceState::Success, Some(0), Some(T0 + 30))
        );
        let attempt = &s.list_attempts(inst.id).await.unwrap()[0];
        assert_eq!(attempt.state, InstanceState::Success);
        assert_eq!(
            (attempt.pid, attempt.exit_code, attempt.log_lines),
            (Some(4242), Some(0), 3)
        );
        assert_eq!(
            (attempt.started_at, attempt.finished_at),
            (Some(T0 + 20), Some(T0 + 30))
        );
        assert_eq!(attempt.message, "exit 0");
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (run.state, run.finished_at),
            (RunState::Success, Some(T0 + 40))
        );
    }

    pub(super) async fn rejected_dispatch_returns_to_waiting_and_reuses_its_attempt_row(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap(),
            [true]
        );
        let reject = Report::Rejected {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: None,
            reason: "full".into(),
            withdrawn: false,
            dispatched_at: None,
        };
        let results = s
            .apply_reports(std::slice::from_ref(&reject), T0)
            .await
            .unwrap();
        assert_eq!(applied(&results[0]).new_waiting, 1);
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt, now.worker_id),
            (InstanceState::Waiting, Attempt(1), None)
        );
        // Rejecting again is stale: it is no longer dispatched.
        let again = s.apply_reports(&[reject], T0).await.unwrap();
        assert_eq!(
            again,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Waiting
            }]
        );
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w2")]).await.unwrap(),
            [true]
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            (attempts[0].state, attempts[0].worker_id.as_deref()),
            (InstanceState::Dispatched, Some("w2"))
        );
        assert_eq!(attempts[0].message, "");
    }

    pub(super) async fn heartbeat_applies_only_to_a_running_attempt(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        let beat = |attempt| Report::TaskHeartbeat {
            instance_id: a.id,
            attempt: Attempt(attempt),
            worker_id: None,
            at: T0 + 50,
        };
        let early = s.apply_reports(&[beat(1)], T0).await.unwrap();
        assert_eq!(
            early,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Waiting
            }]
        );
        launch(s, run.id, "a").await;
        let results = s.apply_reports(&[beat(1), beat(2)], T0).await.unwrap();
        assert_eq!(results[0], ReportResult::Applied(Applied::default()));
        assert_eq!(
            results[1],
            ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Running
            }
        );
    }

    pub(super) async fn retry_with_backoff_keeps_every_attempt(ctx: Ctx) {
        let s = ctx.s();
        let mut flaky = task("flaky", &[]);
        flaky.retries = 2;
        flaky.retry_backoff_ms = 1_000;
        let wf = apply(s, &spec("wf", vec![flaky, task("after", &["flaky"])])).await;
        let run = start_run(s, &wf).await;
        let inst = launch(s, run.id, "flaky").await;
        let fail = Report::Finished {
            instance_id: inst.id,
            attempt: Attempt(1),
            worker_id: None,
            end: AttemptEnd::Finished(Outcome::Timeout),
            exit_code: None,
            signal: Some(9),
            at: T0 + 30,
            log_lines: 7,
            message: "killed after timeout".into(),
            outputs: Default::default(),
        };
        let results = s.apply_reports(&[fail], T0 + 100).await.unwrap();
        let applied1 = applied(&results[0]);
        assert_eq!(
            (
                applied1.new_waiting,
                applied1.attempt_ended,
                applied1.run_finished
            ),
            (1, true, None)
        );
        assert_eq!(
            (applied1.attempt_state, applied1.retry_scheduled),
            (Some(InstanceState::Timeout), true)
        );
        let now = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        // Backoff: 1 s × jitter in [0.5, 1.0] from the report's `now`.
        assert!(
            (T0 + 600..=T0 + 1_100).contains(&now.not_before),
            "{}",
            now.not_before
        );
        assert_eq!((now.worker_id, now.started_at), (None, None));
        assert!(s.waiting(T0 + 100, 10).await.unwrap().is_empty());
        assert_eq!(s.waiting(T0 + 1_100, 10).await.unwrap().len(), 1);
        assert_eq!(
            s.list_attempts(inst.id).await.unwrap().len(),
            1,
            "no row before dispatch"
        );

        run_task(s, run.id, "flaky", Outcome::Success).await;
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert_eq!(attempts.len(), 2);
        // The run's attempts: both of flaky's, then after's (still to run: none), in order.
        run_task(s, run.id, "after", Outcome::Success).await;
        let after = instance_of(s, run.id, "after").await.unwrap().id;
        let of_run: Vec<(InstanceId, Attempt)> = s
            .list_run_attempts(run.id)
            .await
            .unwrap()
            .iter()
            .map(|a| (a.instance_id, a.attempt))
            .collect();
        assert_eq!(
            of_run,
            [
                (inst.id, Attempt(1)),
                (inst.id, Attempt(2)),
                (after, Attempt(1))
            ]
        );
        assert!(
            s.list_run_attempts(RunId(999_999))
                .await
                .unwrap()
                .is_empty()
        );
        let (first, second) = (&attempts[0], &attempts[1]);
        assert_eq!(
            (first.attempt, first.state),
            (Attempt(1), InstanceState::Timeout)
        );
        assert_eq!(
            (first.exit_code, first.signal, first.log_lines),
            (None, Some(9), 7)
        );
        assert_eq!(first.message, "killed after timeout");
        assert_eq!(
            (second.attempt, second.state, second.exit_code),
            (Attempt(2), InstanceState::Success, Some(0))
        );
        assert!(instance_of(s, run.id, "after").await.is_some());
    }

    pub(super) async fn spawn_failure_retries_then_fails(ctx: Ctx) {
        let s = ctx.s();
        let mut t = task("t", &[]);
        t.retries = 1;
        let wf = apply(s, &spec("wf", vec![t])).await;
        let run = start_run(s, &wf).await;
        let spawn_failed = |id, attempt| Report::Finished {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: None,
            end: AttemptEnd::SpawnFailed,
            exit_code: None,
            signal: None,
            at: T0 + 5,
            log_lines: 0,
            message: "no such file".into(),
            outputs: Default::default(),
        };
        let inst = instance_of(s, run.id, "t").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let r = s
            .apply_reports(&[spawn_failed(inst.id, 1)], T0)
            .await
            .unwrap();
        assert_eq!(applied(&r[0]).new_waiting, 1);
        s.mark_dispatched(&[claim(inst.id, 2, "w1")]).await.unwrap();
        let r = s
            .apply_reports(&[spawn_failed(inst.id, 2)], T0)
            .await
            .unwrap();
        assert_eq!(
            applied(&r[0]).run_finished,
            Some((run.id, RunState::Failed))
        );
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert!(
            attempts
                .iter()
                .all(|a| a.state == InstanceState::Failed && a.message == "no such file")
        );
        assert_eq!(attempts.len(), 2);
    }

    pub(super) async fn stale_report_changes_nothing(ctx: Ctx) {
        let s = ctx.s();
        let mut t = task("t", &[]);
        t.retries = 1;
        let wf = apply(s, &spec("wf", vec![t])).await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "t", Outcome::Failed).await;
        let inst = instance_of(s, run.id, "t").await.unwrap();
        assert_eq!(inst.attempt, Attempt(2));
        let before = (
            s.get_instance(inst.id).await.unwrap(),
            s.list_attempts(inst.id).await.unwrap(),
        );
        let old = [
            started(inst.id, 1),
            finished(inst.id, 1, Outcome::Success, 0),
            Report::TaskHeartbeat {
                instance_id: inst.id,
                attempt: Attempt(1),
                worker_id: None,
                at: T0,
            },
            Report::Rejected {
                instance_id: inst.id,
                attempt: Attempt(1),
                worker_id: None,
                reason: String::new(),
                withdrawn: false,
                dispatched_at: None,
            },
        ];
        let results = s.apply_reports(&old, T0 + 500).await.unwrap();
        let stale = ReportResult::Stale {
            current_attempt: Attempt(2),
            state: InstanceState::Waiting,
        };
        assert_eq!(results, vec![stale; 4]);
        // A report for the current attempt in the wrong state is stale too.
        let wrong = s
            .apply_reports(&[finished(inst.id, 2, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        assert_eq!(
            wrong,
            [ReportResult::Stale {
                current_attempt: Attempt(2),
                state: InstanceState::Waiting
            }]
        );
        let after = (
            s.get_instance(inst.id).await.unwrap(),
            s.list_attempts(inst.id).await.unwrap(),
        );
        assert_eq!(before, after);
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
    }

    pub(super) async fn unknown_instance_is_not_found(ctx: Ctx) {
        let s = ctx.s();
        let ghost = InstanceId(987_654_321);
        let results = s
            .apply_reports(
                &[started(ghost, 1), finished(ghost, 1, Outcome::Success, 0)],
                T0,
            )
            .await
            .unwrap();
        // A worker's report about it is about an attempt never dispatched to that worker; the
        // node's own verdict (no worker named) finds nothing.
        assert_eq!(results, [ReportResult::NotYours, ReportResult::NotFound]);
        assert_eq!(
            s.mark_dispatched(&[claim(ghost, 1, "w")]).await.unwrap(),
            [false]
        );
        assert!(s.get_instance(ghost).await.unwrap().is_none());
        assert!(s.cancel_instance(ghost, T0).await.unwrap().is_none());
        assert!(s.cancel_run(RunId(424_242), T0).await.unwrap().is_none());
        assert!(matches!(
            s.run_counts(RunId(424_242)).await,
            Err(StoreError::NotFound(_))
        ));
    }

    pub(super) async fn a_report_from_another_worker_is_not_its_own(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = instance_of(s, run.id, "only").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let impostor = Report::Started {
            instance_id: inst.id,
            attempt: Attempt(1),
            worker_id: "w2".into(),
            pid: 1,
            at: T0 + 20,
        };
        assert_eq!(
            s.apply_reports(&[impostor], T0).await.unwrap(),
            [ReportResult::NotYours]
        );
        let inst = launch_dispatched(s, inst.id).await;
        let mut report = finished(inst.id, 1, Outcome::Success, 0);
        if let Report::Finished { worker_id, .. } = &mut report {
            *worker_id = Some("w2".into());
        }
        assert_eq!(
            s.apply_reports(&[report.clone()], T0).await.unwrap(),
            [ReportResult::NotYours]
        );
        assert_eq!(
            s.get_instance(inst.id).await.unwrap().unwrap().state,
            InstanceState::Running,
            "the impostor's end changed nothing"
        );
        if let Report::Finished { worker_id, .. } = &mut report {
            *worker_id = Some("w1".into());
        }
        let results = s.apply_reports(&[report], T0).await.unwrap();
        assert_eq!(
            applied(&results[0]).run_finished,
            Some((run.id, RunState::Success))
        );
    }

    /// A worker speaks only of attempts dispatched to it: reports about another worker's ended
    /// attempt, about an attempt to come and about an instance that does not exist are
    /// NotYours (not merely stale), and their lines are not stored; its own stale report stays
    /// Stale, and its own lines go in, whether or not the node knew them.
    pub(super) async fn reports_and_lines_about_attempts_never_dispatched_to_their_worker_are_refused(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = instance_of(s, run.id, "only").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let inst = launch_dispatched(s, inst.id).await;
        let results = s
            .apply_reports(&[finished(inst.id, 1, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        applied(&results[0]);
        let as_worker = |report: Report, worker: &str| match report {
            Report::Finished {
                instance_id,
                attempt,
                end,
                exit_code,
                signal,
                at,
                log_lines,
                message,
                outputs,
                ..
            } => Report::Finished {
                instance_id,
                attempt,
                worker_id: Some(worker.into()),
                end,
                exit_code,
                signal,
                at,
                log_lines,
                message,
                outputs,
            },
            Report::Started {
                instance_id,
                attempt,
                pid,
                at,
                ..
            } => Report::Started {
                instance_id,
                attempt,
                worker_id: worker.into(),
                pid,
                at,
            },
            other => other,
        };
        let heartbeat = |id: InstanceId, attempt: u32, worker: &str| Report::TaskHeartbeat {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: Some(worker.into()),
            at: T0,
        };
        let reports = [
            // Another worker's ended attempt.
            as_worker(finished(inst.id, 1, Outcome::Failed, 1), "rogue"),
            // An attempt to come, and an instance that does not exist.
            as_worker(started(inst.id, 2), "rogue"),
            heartbeat(inst.id, 2, "w1"),
            heartbeat(InstanceId(inst.id.0 + 10_000), 1, "rogue"),
            // w1's own late report about its ended attempt: stale, not a stranger's.
            as_worker(started(inst.id, 1), "w1"),
        ];
        let results = s.apply_reports(&reports, T0).await.unwrap();
        assert_eq!(
            results[..4],
            [
                ReportResult::NotYours,
                ReportResult::NotYours,
                ReportResult::NotYours,
                ReportResult::NotYours
            ]
        );
        assert!(
            matches!(results[4], ReportResult::Stale { .. }),
            "{:?}",
            results[4]
        );
        assert_eq!(
            s.get_instance(inst.id).await.unwrap().unwrap().state,
            InstanceState::Success
        );

        let chunk = |attempt: u32, first: u64, text: &str| {
            LogChunk::from_lines(
                inst.id,
                Attempt(attempt),
                first,
                [(LogStream::Stdout, text)],
                T0,
            )
        };
        let chunks = [
            chunk(1, 1, "w1 known"),
            chunk(1, 2, "w1 checked"),
            chunk(1, 3, "INJECTED by rogue"),
            chunk(2, 1, "INJECTED ahead"),
            chunk(2, 2, "INJECTED ahead by w1"),
        ];
        let kept = s
            .append_worker_logs(
                &chunks,
                &[None, Some("w1"), Some("rogue"), Some("rogue"), Some("w1")],
            )
            .await
            .unwrap();
        assert_eq!(kept, [true, true, false, false, false]);
        let lines = |attempt: u32| async move {
            s.read_logs(inst.id, Attempt(attempt), 0, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|line| line.text)
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(1).await, ["w1 known", "w1 checked"]);
        assert!(lines(2).await.is_empty(), "nothing written ahead");
        assert_eq!(
            s.append_worker_logs(&[], &[]).await.unwrap(),
            Vec::<bool>::new()
        );
    }

    /// Starts an attempt already dispatched to w1.
    async fn launch_dispatched(s: &Store, id: InstanceId) -> InstanceRecord {
        let inst = s.get_instance(id).await.unwrap().unwrap();
        let results = s
            .apply_reports(&[started(id, inst.attempt.0)], T0)
            .await
            .unwrap();
        applied(&results[0]);
        s.get_instance(id).await.unwrap().unwrap()
    }
}
