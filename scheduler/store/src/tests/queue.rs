//! Conformance scenarios of the run queue: max active runs, keyed concurrency, overlap `queue`,
//! promotion when a run ends by any path, and concurrent creators on two stores.

use super::support::{Ctx, T0, apply, spec, task};
use crate::*;
use ax_core::decision::DecisionKind;
use ax_core::ids::RunId;
use ax_core::run::RunState;
use ax_core::spec::{ConcurrencySpec, OverlapPolicy, TriggerKind, WorkflowSpec};
use ax_core::state::Outcome;
use std::collections::BTreeMap;
use std::sync::Arc;

conformance!(
    runs_past_max_active_runs_queue_and_start_in_order_when_runs_end,
    a_cancelled_queued_run_ends_cancelled_without_instances,
    the_key_caps_runs_with_the_same_key_only,
    cancelling_an_instance_that_ends_a_run_promotes_the_next,
    overlap_queue_holds_scheduled_fires_but_not_manual_runs,
    concurrent_creators_on_two_stores_never_exceed_the_cap,
    raising_the_limit_in_a_new_version_starts_queued_runs,
    the_next_fire_time_is_kept_while_paused,
);

mod scenarios {
    use super::*;

    fn capped(name: &str, max_active_runs: u32) -> WorkflowSpec {
        let mut spec = spec(name, vec![task("a", &[])]);
        spec.schedule.max_active_runs = max_active_runs;
        spec
    }

    fn keyed(name: &str) -> WorkflowSpec {
        let mut spec = spec(name, vec![task("a", &[])]);
        spec.concurrency = ConcurrencySpec {
            max_running_tasks: 0,
            key: Some("${customer}".into()),
            max_runs_per_key: 1,
        };
        spec
    }

    fn run_of(wf: &WorkflowRecord, trigger: TriggerKind, customer: &str, at: i64) -> NewRun {
        NewRun {
            workflow_id: wf.id,
            workflow_version: wf.version,
            trigger,
            logical_time: at,
            dedup_key: None,
            idempotency_key: None,
            params: BTreeMap::from([("customer".to_string(), customer.to_string())]),
            triggered_by: "tester".into(),
            now: T0,
            audit_from: None,
        }
    }

    async fn create(s: &Store, run: &NewRun) -> RunRecord {
        let (run, created) = s.create_run(run).await.unwrap();
        assert!(created);
        // The answer (started or queued) is the run as stored.
        assert_eq!(s.get_run(run.id).await.unwrap().as_ref(), Some(&run));
        run
    }

    async fn state(s: &Store, id: RunId) -> RunState {
        s.get_run(id).await.unwrap().unwrap().state
    }

    /// Runs the run's only task to success (dispatch, start, finish).
    async fn finish(s: &Store, run: RunId) {
        let inst = s.list_instances(run).await.unwrap().remove(0);
        let claim = DispatchClaim {
            instance_id: inst.id,
            attempt: inst.attempt,
            worker_id: "w1".into(),
            node_id: "n1".into(),
            at: T0,
            limits: Vec::new(),
        };
        assert_eq!(s.mark_dispatched(&[claim]).await.unwrap(), [true]);
        let reports = [
            Report::Started {
                instance_id: inst.id,
                attempt: inst.attempt,
                worker_id: "w1".into(),
                pid: 1,
                at: T0,
            },
            Report::Finished {
                instance_id: inst.id,
                attempt: inst.attempt,
                worker_id: None,
                end: AttemptEnd::Finished(Outcome::Success),
                exit_code: Some(0),
                signal: None,
                at: T0,
                log_lines: 0,
                message: String::new(),
                outputs: Default::default(),
            },
        ];
        let results = s.apply_reports(&reports, T0 + 1).await.unwrap();
        assert!(
            matches!(&results[1], ReportResult::Applied(a) if a.run_finished == Some((run, RunState::Success))),
            "{results:?}"
        );
    }

    async fn kinds(s: &Store, wf: &WorkflowRecord) -> Vec<(DecisionKind, Option<RunId>)> {
        s.list_decisions(wf.id, 0, i64::MAX, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.kind, d.run_id))
            .collect()
    }

    pub(super) async fn runs_past_max_active_runs_queue_and_start_in_order_when_runs_end(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &capped("capped", 1)).await;
        let r1 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let r2 = create(s, &run_of(&wf, TriggerKind::Api, "x", T0 + 1)).await;
        let r3 = create(s, &run_of(&wf, TriggerKind::Backfill, "x", T0 + 2)).await;
        assert_eq!(
            (r1.state, r2.state, r3.state),
            (RunState::Running, RunState::Queued, RunState::Queued)
        );
        // A queued run has no instances yet.
        assert!(s.list_instances(r2.id).await.unwrap().is_empty());
        assert_eq!(s.run_counts(r2.id).await.unwrap().not_created, 1);
        assert_eq!(
            s.unfinished_runs(wf.id, 10)
                .await
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect::<Vec<_>>(),
            [r1.id, r2.id, r3.id]
        );

        finish(s, r1.id).await;
        assert_eq!(state(s, r2.id).await, RunState::Running);
        assert_eq!(state(s, r3.id).await, RunState::Queued);
        assert_eq!(s.list_instances(r2.id).await.unwrap().len(), 1);
        // The promoted run's root is WAITING for the dispatcher.
        let waiting = s.waiting(T0 + 10, 10).await.unwrap();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].instance.run_id, r2.id);

        // Cancelling the running one starts the last.
        s.cancel_run(r2.id, T0 + 5).await.unwrap().unwrap();
        assert_eq!(state(s, r2.id).await, RunState::Cancelled);
        assert_eq!(state(s, r3.id).await, RunState::Running);
        assert_eq!(
            kinds(s, &wf).await,
            [
                // By slot (the runs' logical times), then in the order decided.
                (DecisionKind::Queued, Some(r2.id)),
                (DecisionKind::Dequeued, Some(r2.id)),
                (DecisionKind::Queued, Some(r3.id)),
                (DecisionKind::Dequeued, Some(r3.id)),
            ]
        );
        // A fourth queues behind nobody once the cap is free again.
        finish(s, r3.id).await;
        let r4 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0 + 3)).await;
        assert_eq!(r4.state, RunState::Running);
    }

    pub(super) async fn a_cancelled_queued_run_ends_cancelled_without_instances(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &capped("capped", 1)).await;
        let r1 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let r2 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let r3 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let killed = s.cancel_run(r2.id, T0 + 5).await.unwrap().unwrap();
        assert!(killed.is_empty());
        let r2 = s.get_run(r2.id).await.unwrap().unwrap();
        assert_eq!(r2.state, RunState::Cancelled);
        assert_eq!(r2.finished_at, Some(T0 + 5));
        assert!(s.list_instances(r2.id).await.unwrap().is_empty());
        // The cap is still taken by r1: r3 waits, and starts when r1 ends.
        assert_eq!(state(s, r3.id).await, RunState::Queued);
        finish(s, r1.id).await;
        assert_eq!(state(s, r3.id).await, RunState::Running);
        assert_eq!(state(s, r2.id).await, RunState::Cancelled);
    }

    pub(super) async fn the_key_caps_runs_with_the_same_key_only(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &keyed("keyed")).await;
        let a1 = create(s, &run_of(&wf, TriggerKind::Manual, "acme", T0)).await;
        let a2 = create(s, &run_of(&wf, TriggerKind::Manual, "acme", T0)).await;
        let b1 = create(s, &run_of(&wf, TriggerKind::Manual, "bolt", T0)).await;
        let b2 = create(s, &run_of(&wf, TriggerKind::Manual, "bolt", T0)).await;
        assert_eq!(a1.run_key.as_deref(), Some("acme"));
        assert_eq!(
            [a1.state, a2.state, b1.state, b2.state],
            [
                RunState::Running,
                RunState::Queued,
                RunState::Running,
                RunState::Queued
            ]
        );
        // bolt ending starts bolt's queued run only: acme's is still held by a1.
        finish(s, b1.id).await;
        assert_eq!(state(s, b2.id).await, RunState::Running);
        assert_eq!(state(s, a2.id).await, RunState::Queued);
        finish(s, a1.id).await;
        assert_eq!(state(s, a2.id).await, RunState::Running);
    }

    pub(super) async fn cancelling_an_instance_that_ends_a_run_promotes_the_next(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &keyed("keyed")).await;
        let a1 = create(s, &run_of(&wf, TriggerKind::Manual, "acme", T0)).await;
        let a2 = create(s, &run_of(&wf, TriggerKind::Manual, "acme", T0)).await;
        let inst = s.list_instances(a1.id).await.unwrap().remove(0);
        s.cancel_instance(inst.id, T0 + 5).await.unwrap().unwrap();
        assert_eq!(state(s, a1.id).await, RunState::Cancelled);
        assert_eq!(state(s, a2.id).await, RunState::Running);
        assert_eq!(s.list_instances(a2.id).await.unwrap().len(), 1);
    }

    pub(super) async fn overlap_queue_holds_scheduled_fires_but_not_manual_runs(ctx: Ctx) {
        let s = ctx.s();
        let mut spec = spec("queued", vec![task("a", &[])]);
        spec.schedule.overlap = OverlapPolicy::Queue;
        let wf = apply(s, &spec).await;
        let c1 = create(s, &run_of(&wf, TriggerKind::Cron, "", T0)).await;
        let c2 = create(s, &run_of(&wf, TriggerKind::Cron, "", T0 + 60_000)).await;
        let m = create(s, &run_of(&wf, TriggerKind::Manual, "", T0)).await;
        assert_eq!(
            [c1.state, c2.state, m.state],
            [RunState::Running, RunState::Queued, RunState::Running]
        );
        finish(s, c1.id).await;
        // The manual run is still active: the queued fire waits for it too.
        assert_eq!(state(s, c2.id).await, RunState::Queued);
        finish(s, m.id).await;
        assert_eq!(state(s, c2.id).await, RunState::Running);
    }

    pub(super) async fn concurrent_creators_on_two_stores_never_exceed_the_cap(ctx: Ctx) {
        let other = ctx.second_store().await;
        let wf = apply(ctx.s(), &capped("capped", 2)).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(12));
        let mut handles = Vec::new();
        for i in 0..12 {
            let store: Arc<Store> = if i % 2 == 0 {
                ctx.store.clone()
            } else {
                other.clone()
            };
            let (barrier, run) = (
                barrier.clone(),
                run_of(&wf, TriggerKind::Manual, "x", T0 + i),
            );
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store.create_run(&run).await.expect("create run").0
            }));
        }
        for handle in handles {
            handle.await.unwrap();
        }
        let s = ctx.s();
        let runs = s.unfinished_runs(wf.id, 100).await.unwrap();
        let running: Vec<_> = runs
            .iter()
            .filter(|r| r.state == RunState::Running)
            .collect();
        assert_eq!((runs.len(), running.len()), (12, 2));
        // Ending both starts exactly the two oldest queued ones.
        let queued: Vec<RunId> = runs
            .iter()
            .filter(|r| r.state == RunState::Queued)
            .map(|r| r.id)
            .collect();
        let ends: Vec<RunId> = running.iter().map(|r| r.id).collect();
        let (a, b) = (ends[0], ends[1]);
        let s2: &Store = other.as_ref();
        let (x, y) = tokio::join!(finish(s, a), finish(s2, b));
        let _ = (x, y);
        let now_running: Vec<RunId> = s
            .unfinished_runs(wf.id, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.state == RunState::Running)
            .map(|r| r.id)
            .collect();
        assert_eq!(now_running, queued[..2]);
        other.close().await;
    }

    pub(super) async fn raising_the_limit_in_a_new_version_starts_queued_runs(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &capped("capped", 1)).await;
        let r1 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let r2 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        let r3 = create(s, &run_of(&wf, TriggerKind::Manual, "x", T0)).await;
        assert_eq!(state(s, r3.id).await, RunState::Queued);
        let (v2, outcome) = s
            .apply_workflow(&capped("capped", 2), "v2", None, T0 + 1)
            .await
            .unwrap();
        assert_eq!((outcome, v2.version), (ApplyOutcome::Updated, 2));
        assert_eq!(
            [
                state(s, r1.id).await,
                state(s, r2.id).await,
                state(s, r3.id).await
            ],
            [RunState::Running, RunState::Running, RunState::Queued]
        );
        // The promoted run keeps the version it was created with.
        let r2 = s.get_run(r2.id).await.unwrap().unwrap();
        assert_eq!(r2.workflow_version, 1);
        assert_eq!(
            s.list_instances(r2.id).await.unwrap()[0].workflow_version,
            1
        );
    }

    pub(super) async fn the_next_fire_time_is_kept_while_paused(ctx: Ctx) {
        let s = ctx.s();
        let mut cron = spec("cron", vec![task("a", &[])]);
        cron.schedule.trigger = TriggerKind::Cron;
        cron.schedule.cron = Some("* * * * *".into());
        let (wf, _) = s
            .apply_workflow(&cron, "", Some(T0 + 60_000), T0)
            .await
            .unwrap();
        assert_eq!(
            s.schedule_next_fire(wf.id).await.unwrap(),
            Some(T0 + 60_000)
        );
        s.set_paused("cron", true, None, T0 + 1).await.unwrap();
        // Resume reads it back to apply the misfire policy to the slots passed meanwhile.
        assert_eq!(
            s.schedule_next_fire(wf.id).await.unwrap(),
            Some(T0 + 60_000)
        );
        s.set_paused("cron", false, Some(T0 + 120_000), T0 + 2)
            .await
            .unwrap();
        assert_eq!(
            s.schedule_next_fire(wf.id).await.unwrap(),
            Some(T0 + 120_000)
        );
        let manual = apply(s, &spec("manual", vec![task("a", &[])])).await;
        assert_eq!(s.schedule_next_fire(manual.id).await.unwrap(), None);
        assert_eq!(
            s.schedule_next_fire(ax_core::ids::WorkflowId(9_999))
                .await
                .unwrap(),
            None
        );
    }
}
