//! Conformance scenarios of runs' deadlines (`sql/deadlines.rs`): set at creation or at the
//! start from the queue, listed once passed, judged missed once whoever judges, with the
//! decision and (on_deadline: cancel) the cancel in the same transaction.

use ax_core::deadline::Deadline;
use ax_core::decision::DecisionKind;
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;
use ax_core::state::InstanceState;

use super::support::*;
use crate::*;

conformance!(
    a_wall_clock_deadline_is_set_at_creation_and_a_duration_at_the_start,
    a_passed_deadline_is_listed_and_judged_once_with_its_decision,
    two_stores_judging_at_once_judge_once,
    a_cancelling_deadline_cancels_the_run_in_the_same_transaction,
);

mod scenarios {
    use super::*;

    const HOUR: i64 = 3_600_000;

    fn with_deadline(name: &str, deadline: Deadline) -> WorkflowSpec {
        let mut spec = spec(name, vec![task("a", &[])]);
        spec.schedule.timezone = "Asia/Shanghai".into();
        spec.deadline = Some(deadline);
        spec
    }

    fn miss(run: &RunRecord, now: i64, node: &str, cancel: bool) -> DeadlineMiss {
        DeadlineMiss {
            run_id: run.id,
            now,
            node_id: node.into(),
            detail: format!("missed at {now}"),
            cancel,
        }
    }

    async fn missed_decisions(s: &Store, wf: &WorkflowRecord) -> Vec<DecisionRecord> {
        s.list_decisions(wf.id, 0, i64::MAX, 1_000)
            .await
            .unwrap()
            .into_iter()
            .filter(|d| d.kind == DecisionKind::DeadlineMissed)
            .collect()
    }

    pub(super) async fn a_wall_clock_deadline_is_set_at_creation_and_a_duration_at_the_start(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        // 06:30 in Shanghai on the logical date: T0 is 2023-11-14 22:13 UTC, 11-15 in Shanghai.
        let wall = Deadline::WallClock {
            days: 0,
            hour: 6,
            minute: 30,
        };
        let wf = apply(s, &with_deadline("wall", wall)).await;
        let run = start_run(s, &wf).await;
        let due = wall.instant_in_zone(T0, "Asia/Shanghai", None);
        assert_eq!(due, Some(1_700_001_000_000));
        assert_eq!((run.deadline_at, run.deadline_missed_at), (due, None));
        assert_eq!(s.get_run(run.id).await.unwrap().as_ref(), Some(&run));
        // A backfill slot has none: it is late by design.
        let backfill = NewRun {
            trigger: ax_core::spec::TriggerKind::Backfill,
            ..manual(&wf)
        };
        let (slot, _) = s.create_run(&backfill).await.unwrap();
        assert_eq!(slot.deadline_at, None);

        // A duration: from the creation of a run that starts, from the start of a queued one.
        let mut limited = with_deadline(
            "duration",
            Deadline::AfterStart {
                ms: 2 * HOUR as u64,
            },
        );
        limited.schedule.max_active_runs = 1;
        let wf = apply(s, &limited).await;
        let first = start_run(s, &wf).await;
        assert_eq!(first.deadline_at, Some(T0 + 2 * HOUR));
        let (queued, _) = s.create_run(&manual(&wf)).await.unwrap();
        assert_eq!((queued.state, queued.deadline_at), (RunState::Queued, None));
        assert_eq!(
            s.get_run(queued.id).await.unwrap().unwrap().deadline_at,
            None
        );
        s.cancel_run(first.id, T0 + 5_000).await.unwrap();
        let started = s.get_run(queued.id).await.unwrap().unwrap();
        assert_eq!(
            (started.state, started.deadline_at),
            (RunState::Running, Some(T0 + 5_000 + 2 * HOUR))
        );

        // Without a deadline: none.
        let plain = apply(s, &spec("plain", vec![task("a", &[])])).await;
        let run = start_run(s, &plain).await;
        assert_eq!((run.deadline_at, run.deadline_missed_at), (None, None));
    }

    pub(super) async fn a_passed_deadline_is_listed_and_judged_once_with_its_decision(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &with_deadline("etl", Deadline::AfterStart { ms: 1_000 })).await;
        let run = start_run(s, &wf).await;
        let ended = start_run(s, &wf).await;
        s.cancel_run(ended.id, T0 + 500).await.unwrap();

        // Not before the deadline; at it, only the run still active.
        assert!(s.runs_past_deadline(T0 + 999, 10).await.unwrap().is_empty());
        assert_eq!(
            s.miss_deadline(&miss(&run, T0 + 999, "n1", false))
                .await
                .unwrap(),
            None
        );
        let past: Vec<_> = s
            .runs_past_deadline(T0 + 1_000, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(past, vec![run.id]);
        assert_eq!(
            s.miss_deadline(&miss(&ended, T0 + 2_000, "n1", false))
                .await
                .unwrap(),
            None
        );

        let missed = s
            .miss_deadline(&miss(&run, T0 + 1_500, "n1", false))
            .await
            .unwrap()
            .expect("judged");
        assert_eq!(missed.cancelled, None);
        assert_eq!(
            (missed.run.state, missed.run.deadline_missed_at),
            (RunState::Running, Some(T0 + 1_500))
        );
        // Once: again, or later, changes nothing, and the run is no longer listed.
        assert_eq!(
            s.miss_deadline(&miss(&run, T0 + 1_600, "n2", false))
                .await
                .unwrap(),
            None
        );
        assert!(
            s.runs_past_deadline(T0 + 9_999, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let decisions = missed_decisions(s, &wf).await;
        assert_eq!(decisions.len(), 1, "{decisions:?}");
        let d = &decisions[0];
        assert_eq!(
            (
                d.at,
                d.slot_at,
                d.run_id,
                d.instance_id,
                d.node_id.as_str(),
                d.detail.as_str()
            ),
            (
                T0 + 1_500,
                run.logical_time,
                Some(run.id),
                None,
                "n1",
                "missed at 1700000001500"
            )
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().deadline_missed_at,
            Some(T0 + 1_500)
        );
    }

    pub(super) async fn two_stores_judging_at_once_judge_once(ctx: Ctx) {
        let s = ctx.s();
        let other = ctx.second_store().await;
        let wf = apply(s, &with_deadline("etl", Deadline::AfterStart { ms: 1_000 })).await;
        let mut runs = Vec::new();
        for _ in 0..5 {
            runs.push(start_run(s, &wf).await);
        }
        let mut won = 0;
        for run in &runs {
            let (mine, theirs) = (
                miss(run, T0 + 2_000, "n1", false),
                miss(run, T0 + 2_000, "n2", false),
            );
            let (a, b) = tokio::join!(s.miss_deadline(&mine), other.miss_deadline(&theirs));
            let judged = [a.unwrap(), b.unwrap()];
            assert_eq!(judged.iter().flatten().count(), 1, "run {}", run.id);
            won += 1;
        }
        assert_eq!(won, runs.len());
        assert_eq!(missed_decisions(s, &wf).await.len(), runs.len());
    }

    pub(super) async fn a_cancelling_deadline_cancels_the_run_in_the_same_transaction(ctx: Ctx) {
        let s = ctx.s();
        let mut spec = with_deadline("etl", Deadline::AfterStart { ms: 1_000 });
        spec.tasks.push(task("b", &[]));
        let wf = apply(s, &spec).await;
        let run = start_run(s, &wf).await;
        let running = launch(s, run.id, "a").await;
        let missed = s
            .miss_deadline(&miss(&run, T0 + 3_000, "n1", true))
            .await
            .unwrap()
            .expect("judged");
        assert_eq!(missed.run.state, RunState::Cancelled);
        assert_eq!(missed.run.finished_at, Some(T0 + 3_000));
        let killed: Vec<_> = missed
            .cancelled
            .expect("cancelled")
            .into_iter()
            .map(|k| (k.instance_id, k.worker_id))
            .collect();
        assert_eq!(killed, vec![(running.id, Some("w1".to_string()))]);
        for instance in s.list_instances(run.id).await.unwrap() {
            assert_eq!(
                instance.state,
                InstanceState::Cancelled,
                "{}",
                instance.task
            );
        }
        assert_eq!(missed_decisions(s, &wf).await.len(), 1);

        // A queued run past a wall-clock deadline ends CANCELLED too, without instances.
        let mut capped = with_deadline(
            "capped",
            Deadline::WallClock {
                days: 0,
                hour: 6,
                minute: 30,
            },
        );
        capped.schedule.max_active_runs = 1;
        capped.on_deadline = ax_core::deadline::OnDeadline::Cancel;
        let wf = apply(s, &capped).await;
        let _active = start_run(s, &wf).await;
        let (queued, _) = s.create_run(&manual(&wf)).await.unwrap();
        assert_eq!(queued.state, RunState::Queued);
        let due = queued
            .deadline_at
            .expect("a wall-clock deadline is set while queued");
        let missed = s
            .miss_deadline(&miss(&queued, due, "n1", true))
            .await
            .unwrap()
            .expect("judged");
        assert_eq!(
            (missed.run.state, missed.cancelled),
            (RunState::Cancelled, Some(Vec::new()))
        );
        assert!(s.list_instances(queued.id).await.unwrap().is_empty());
    }
}
