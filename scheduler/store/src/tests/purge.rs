//! Conformance scenarios of purging history (retention, `axctl purge`): only ended runs past
//! the cutoff go, with every row of theirs; active runs, newer runs and other workflows stay;
//! steps are bounded and resume by end time; a dry run deletes nothing.

use super::support::{
    Ctx, T0, apply, claim, finished, instance_of, manual, spec, start_run, started, task,
};
use crate::*;
use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::run::RunState;
use ax_core::state::Outcome;

conformance!(
    a_purge_takes_only_ended_runs_past_the_cutoff_with_every_row_of_theirs,
    a_purge_goes_in_bounded_steps_in_end_order,
    a_run_larger_than_a_step_goes_in_parts,
    a_reopened_run_is_not_purged,
    audit_rows_past_the_cutoff_go_oldest_first_in_bounded_steps,
);

mod scenarios {
    use super::*;

    /// Runs `task` of `run` (first attempt) to `outcome`, ending at `at`, with `lines` log
    /// lines and a decision about the instance; returns the instance.
    async fn run_task_at(
        s: &Store,
        run: RunId,
        task: &str,
        outcome: Outcome,
        at: Millis,
    ) -> InstanceRecord {
        let inst = instance_of(s, run, task).await.expect("instance");
        assert_eq!(
            s.mark_dispatched(&[claim(inst.id, inst.attempt.0, "w1")])
                .await
                .unwrap(),
            vec![true]
        );
        s.apply_reports(&[started(inst.id, inst.attempt.0)], at)
            .await
            .unwrap();
        s.append_logs(&[LogChunk::from_lines(
            inst.id,
            inst.attempt,
            1,
            [(LogStream::Stdout, "one"), (LogStream::Stderr, "two")],
            at,
        )])
        .await
        .unwrap();
        s.record_decisions(&[decision(inst.workflow_id, Some(run), Some(inst.id), at)])
            .await
            .unwrap();
        let exit = if outcome == Outcome::Success { 0 } else { 1 };
        s.apply_reports(&[finished(inst.id, inst.attempt.0, outcome, exit)], at)
            .await
            .unwrap();
        inst
    }

    fn decision(
        workflow: WorkflowId,
        run: Option<RunId>,
        instance: Option<InstanceId>,
        at: Millis,
    ) -> DecisionRecord {
        DecisionRecord {
            at,
            workflow_id: workflow,
            slot_at: at,
            run_id: run,
            instance_id: instance,
            task: None,
            kind: DecisionKind::NoWorker,
            detail: format!("about {run:?} {instance:?}"),
            node_id: "node-1".into(),
        }
    }

    fn step(workflow: WorkflowId, ended_before: Millis, dry_run: bool) -> PurgeStep {
        PurgeStep {
            workflow_id: workflow,
            ended_before,
            after: None,
            max_runs: 100,
            max_rows: 10_000,
            dry_run,
        }
    }

    /// Every step of a purge pass, summed.
    async fn pass(s: &Store, first: PurgeStep) -> (PurgeCounts, u32) {
        let (mut total, mut steps) = (PurgeCounts::default(), 0);
        let mut next = first;
        loop {
            let progress = s.purge_runs(&next).await.unwrap();
            total += progress.counts;
            steps += 1;
            assert!(steps < 1_000, "the pass does not end");
            match progress.next {
                Some(cursor) => next.after = Some(cursor),
                None => return (total, steps),
            }
        }
    }

    /// What a store holds of one run: the run, its instances, their attempts and log lines.
    async fn rows_of(s: &Store, run: RunId) -> (bool, usize, usize, usize) {
        let exists = s.get_run(run).await.unwrap().is_some();
        let instances = s.list_instances(run).await.unwrap();
        let mut attempts = 0;
        let mut lines = 0;
        for inst in &instances {
            attempts += s.list_attempts(inst.id).await.unwrap().len();
            lines += s
                .read_logs(inst.id, Attempt(1), 0, 100)
                .await
                .unwrap()
                .len();
        }
        (exists, instances.len(), attempts, lines)
    }

    pub(super) async fn a_purge_takes_only_ended_runs_past_the_cutoff_with_every_row_of_theirs(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("kept", vec![task("a", &[]), task("b", &["a"])])).await;
        let other = apply(s, &spec("other", vec![task("a", &[])])).await;
        let cutoff = T0 + 1_000;

        // Ended before the cutoff: a success (keyed), a failure, a cancelled run.
        let mut keyed = manual(&wf);
        keyed.dedup_key = Some("key:k1".into());
        keyed.idempotency_key = Some("k1".into());
        let (success, _) = s.create_run(&keyed).await.unwrap();
        let a1 = run_task_at(s, success.id, "a", Outcome::Success, T0 + 100).await;
        let b1 = run_task_at(s, success.id, "b", Outcome::Success, T0 + 200).await;
        let failure = start_run(s, &wf).await;
        let a2 = run_task_at(s, failure.id, "a", Outcome::Failed, T0 + 300).await;
        let cancelled = start_run(s, &wf).await;
        s.cancel_run(cancelled.id, T0 + 400).await.unwrap();
        // Active, or ended after the cutoff, or another workflow's: they stay.
        let running = start_run(s, &wf).await;
        let running_a = instance_of(s, running.id, "a").await.unwrap();
        s.mark_dispatched(&[claim(running_a.id, 1, "w1")])
            .await
            .unwrap();
        let late = start_run(s, &wf).await;
        run_task_at(s, late.id, "a", Outcome::Failed, cutoff + 1).await;
        let elsewhere = start_run(s, &other).await;
        run_task_at(s, elsewhere.id, "a", Outcome::Success, T0 + 100).await;
        // A dropped slot's decision (no run), before and after the cutoff.
        s.record_decisions(&[
            decision(wf.id, None, None, T0 + 50),
            decision(wf.id, None, None, cutoff + 50),
            decision(wf.id, Some(running.id), None, T0 + 60),
        ])
        .await
        .unwrap();
        for run in [success.id, failure.id, cancelled.id, late.id] {
            assert!(
                s.get_run(run).await.unwrap().unwrap().state.is_terminal(),
                "run {run} ended"
            );
        }

        // The cancelled run's instance never went out: it has no attempt.
        let expected = PurgeCounts {
            runs: 3,
            instances: 5,
            attempts: 3,
            log_chunks: 3,
            decisions: 3,
        };
        let (dry, _) = pass(s, step(wf.id, cutoff, true)).await;
        assert_eq!(dry, expected, "a dry run counts");
        assert_eq!(
            rows_of(s, success.id).await,
            (true, 2, 2, 4),
            "and deletes nothing"
        );
        assert_eq!(
            s.purge_slot_decisions(wf.id, cutoff, 100, true)
                .await
                .unwrap(),
            1
        );

        let (purged, _) = pass(s, step(wf.id, cutoff, false)).await;
        assert_eq!(
            purged, expected,
            "the purge deletes what the dry run counted"
        );
        for run in [success.id, failure.id, cancelled.id] {
            assert_eq!(rows_of(s, run).await, (false, 0, 0, 0), "run {run}");
        }
        for inst in [a1.id, b1.id, a2.id] {
            assert_eq!(s.get_instance(inst).await.unwrap(), None);
            assert!(s.list_attempts(inst).await.unwrap().is_empty());
            assert!(
                s.read_logs(inst, Attempt(1), 0, 10)
                    .await
                    .unwrap()
                    .is_empty()
            );
        }
        assert_eq!(rows_of(s, running.id).await, (true, 1, 1, 0), "running");
        assert_eq!(
            s.get_instance(running_a.id).await.unwrap().unwrap().state,
            ax_core::state::InstanceState::Dispatched
        );
        // Its failed task's downstream is kept as UPSTREAM_FAILED: a second instance row.
        assert_eq!(rows_of(s, late.id).await, (true, 2, 1, 2), "ended late");
        assert_eq!(rows_of(s, elsewhere.id).await, (true, 1, 1, 2), "other");
        let left = s.list_decisions(wf.id, 0, i64::MAX, 100).await.unwrap();
        let about: Vec<(Option<RunId>, Millis)> =
            left.iter().map(|d| (d.run_id, d.slot_at)).collect();
        assert_eq!(
            about,
            vec![
                (None, T0 + 50),
                (Some(running.id), T0 + 60),
                (Some(late.id), cutoff + 1),
                (None, cutoff + 50),
            ],
            "the decisions of purged runs went, the others stayed"
        );
        assert_eq!(
            s.list_decisions(other.id, 0, i64::MAX, 100)
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            s.purge_slot_decisions(wf.id, cutoff, 100, false)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            s.list_decisions(wf.id, 0, i64::MAX, 100)
                .await
                .unwrap()
                .len(),
            3
        );
        // A second pass finds nothing.
        assert_eq!(
            pass(s, step(wf.id, cutoff, false)).await.0,
            PurgeCounts::default()
        );
        // The listing and counts of what is left read as before.
        let listed: Vec<RunId> = s
            .list_runs(Some("kept"), None, None, 10)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, vec![late.id, running.id]);
        // A purged run's idempotency key is free again: a documented limit of retention.
        let (again, created) = s.create_run(&keyed).await.unwrap();
        assert!(created && again.id != success.id);
    }

    pub(super) async fn a_purge_goes_in_bounded_steps_in_end_order(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("steps", vec![task("a", &[])])).await;
        // Seven runs ending in the reverse order of their creation.
        let mut runs = Vec::new();
        for _ in 0..7 {
            runs.push(start_run(s, &wf).await.id);
        }
        for (n, run) in runs.iter().enumerate() {
            run_task_at(s, *run, "a", Outcome::Success, T0 + 1_000 - n as i64).await;
        }
        let mut first = step(wf.id, T0 + 10_000, true);
        first.max_runs = 3;
        // A dry run walks every step and deletes nothing.
        let (dry, steps) = pass(s, first.clone()).await;
        assert_eq!((dry.runs, dry.instances, steps), (7, 7, 3));
        assert_eq!(
            s.list_runs(Some("steps"), None, None, 10)
                .await
                .unwrap()
                .len(),
            7
        );

        // Each step takes the next three runs by end time: the newest-created go first.
        let mut real = first.clone();
        real.dry_run = false;
        let progress = s.purge_runs(&real).await.unwrap();
        assert_eq!(progress.counts.runs, 3);
        let cursor = progress.next.expect("more to come");
        let left: Vec<RunId> = runs[..4].to_vec();
        let mut listed: Vec<RunId> = s
            .list_runs(Some("steps"), None, None, 10)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        listed.sort();
        assert_eq!(listed, left);
        assert_eq!(cursor.finished_at, T0 + 1_000 - 4);
        // Rows bound a step too: three rows per run (its instance, attempt and log chunk), so
        // seven rows fit two runs.
        real.after = Some(cursor);
        real.max_rows = 7;
        let progress = s.purge_runs(&real).await.unwrap();
        assert_eq!(progress.counts.runs, 2);
        real.after = progress.next;
        assert!(progress.next.is_some(), "the step was full by rows");
        real.after = progress.next;
        let progress = s.purge_runs(&real).await.unwrap();
        assert_eq!(progress.counts.runs, 2);
        assert_eq!(progress.next, None, "the last runs fitted");
        assert!(
            s.list_runs(Some("steps"), None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub(super) async fn a_run_larger_than_a_step_goes_in_parts(ctx: Ctx) {
        let s = ctx.s();
        let tasks: Vec<_> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|name| task(name, &[]))
            .collect();
        let wf = apply(s, &spec("wide", tasks)).await;
        let run = start_run(s, &wf).await;
        for name in ["a", "b", "c", "d", "e"] {
            run_task_at(s, run.id, name, Outcome::Success, T0 + 100).await;
        }
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Success
        );
        let mut first = step(wf.id, T0 + 1_000, false);
        // Three rows per instance (itself, its attempt, its log chunk): two instances a step.
        first.max_rows = 6;
        let progress = s.purge_runs(&first).await.unwrap();
        assert_eq!(
            (progress.counts.runs, progress.counts.instances),
            (0, 2),
            "the first part"
        );
        assert!(progress.next.is_some());
        assert_eq!(rows_of(s, run.id).await.1, 3, "the run stays with the rest");
        let (rest, steps) = pass(s, first).await;
        assert_eq!((rest.runs, rest.instances, steps), (1, 3, 2));
        assert_eq!(rows_of(s, run.id).await, (false, 0, 0, 0));
        assert!(
            s.list_decisions(wf.id, 0, i64::MAX, 100)
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub(super) async fn a_reopened_run_is_not_purged(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("reopened", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = run_task_at(s, run.id, "a", Outcome::Failed, T0 + 100).await;
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Failed
        );
        // A person retries it: the run runs again, however long ago it ended.
        assert!(matches!(
            s.retry_instance(inst.id, T0 + 5_000).await.unwrap(),
            ManualRetry::Retried(_)
        ));
        let (counts, _) = pass(s, step(wf.id, T0 + 1_000, false)).await;
        assert_eq!(counts, PurgeCounts::default());
        let (kept, instances, attempts, _) = rows_of(s, run.id).await;
        assert_eq!((kept, instances, attempts), (true, 1, 1));
    }

    pub(super) async fn audit_rows_past_the_cutoff_go_oldest_first_in_bounded_steps(ctx: Ctx) {
        let s = ctx.s();
        let row = |at: Millis| AuditRecord {
            at,
            actor: "anonymous".into(),
            action: "auth_failed".into(),
            target: "ListRuns".into(),
            detail: format!("at {at}"),
            remote: "10.0.0.1:1".into(),
            token: String::new(),
        };
        let rows: Vec<AuditRecord> = (0..5).map(|i| row(T0 + i * 10)).collect();
        s.insert_audits(&rows).await.unwrap();
        let cutoff = T0 + 30;
        assert_eq!(s.purge_audit(cutoff, 1, true).await.unwrap(), 3, "dry run");
        assert_eq!(s.list_audit(10).await.unwrap().len(), 5, "deletes nothing");
        assert_eq!(s.purge_audit(cutoff, 2, false).await.unwrap(), 2);
        let left: Vec<Millis> = s
            .list_audit(10)
            .await
            .unwrap()
            .iter()
            .map(|r| r.at)
            .collect();
        assert_eq!(
            left,
            vec![T0 + 40, T0 + 30, T0 + 20],
            "the oldest went first"
        );
        assert_eq!(s.purge_audit(cutoff, 2, false).await.unwrap(), 1);
        assert_eq!(s.purge_audit(cutoff, 2, false).await.unwrap(), 0);
        assert_eq!(s.list_audit(10).await.unwrap().len(), 2);
    }
}
