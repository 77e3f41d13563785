//! Conformance scenarios for concurrency limits, sharded broadcast and once-only decisions
//! (`sql/dispatch.rs`, `sql/decisions.rs`), on SQLite and MySQL like the rest of the suite.

use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::spec::WorkflowSpec;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    limits_are_never_exceeded_under_concurrent_claims_from_two_nodes,
    a_full_limit_refuses_its_claim_and_lets_the_next_one_go,
    every_end_of_an_attempt_releases_its_limits,
    a_sharded_task_fans_out_and_succeeds_when_every_shard_did,
    a_failed_shard_fails_the_task_and_the_run_waits_for_the_other_shards,
    a_shard_whose_worker_is_gone_fails_without_retry,
    decisions_recorded_once_per_instance_and_reason,
);

mod scenarios {
    use std::sync::Arc;

    use ax_core::limits::Limit;
    use ax_core::spec::Routing;

    use super::*;

    async fn start_run(s: &Store, wf: &WorkflowRecord) -> RunRecord {
        s.create_run(&manual(wf)).await.expect("create run").0
    }

    fn limit(scope: &str, max: u32) -> Limit {
        Limit {
            scope: scope.into(),
            max,
        }
    }

    /// The suite's claim, carrying `limits`.
    fn claim(id: InstanceId, attempt: u32, worker: &str, limits: &[Limit]) -> DispatchClaim {
        DispatchClaim {
            limits: limits.to_vec(),
            ..super::super::support::claim(id, attempt, worker)
        }
    }

    fn started(id: InstanceId, attempt: u32, worker: &str) -> Report {
        Report::Started {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: worker.into(),
            pid: 1,
            at: T0 + 20,
        }
    }

    fn finished(id: InstanceId, attempt: u32, outcome: Outcome) -> Report {
        Report::Finished {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: None,
            end: AttemptEnd::Finished(outcome),
            exit_code: Some(if outcome == Outcome::Success { 0 } else { 1 }),
            signal: None,
            at: T0 + 30,
            log_lines: 0,
            message: String::new(),
            outputs: Default::default(),
        }
    }

    async fn usage(s: &Store, scope: &str) -> u32 {
        s.limit_usage(&[scope.to_string()])
            .await
            .unwrap()
            .get(scope)
            .copied()
            .unwrap_or(0)
    }

    /// `n` runs of a one-task workflow: their WAITING instances.
    async fn waiting_instances(s: &Store, name: &str, n: usize) -> Vec<InstanceRecord> {
        let wf = apply(s, &spec(name, vec![task("t", &[])])).await;
        let mut out = Vec::new();
        for _ in 0..n {
            let run = start_run(s, &wf).await;
            out.extend(s.list_instances(run.id).await.unwrap());
        }
        out
    }

    pub(super) async fn limits_are_never_exceeded_under_concurrent_claims_from_two_nodes(ctx: Ctx) {
        let other: Arc<Store> = ctx.second_store().await;
        let a = waiting_instances(ctx.s(), "wf-a", 8).await;
        let b = waiting_instances(ctx.s(), "wf-b", 8).await;
        // Task a: limit 2; task b: limit 5; both in pool p: limit 3.
        let limits_a = vec![limit("pool:p", 3), limit("task:a", 2)];
        let limits_b = vec![limit("pool:p", 3), limit("task:b", 5)];
        let mut handles = Vec::new();
        for (i, inst) in a.iter().chain(&b).enumerate() {
            let store: Arc<Store> = if i % 2 == 0 {
                ctx.store.clone()
            } else {
                other.clone()
            };
            let limits = if i < a.len() {
                limits_a.clone()
            } else {
                limits_b.clone()
            };
            let claim = claim(inst.id, 1, "w1", &limits);
            handles.push(tokio::spawn(async move {
                store.mark_dispatched(&[claim]).await.unwrap()[0]
            }));
        }
        let mut won = Vec::new();
        for handle in handles {
            won.push(handle.await.unwrap());
        }
        let won_a = won[..a.len()].iter().filter(|w| **w).count();
        let won_b = won[a.len()..].iter().filter(|w| **w).count();
        assert!(won_a <= 2, "{won:?}");
        assert_eq!(won_a + won_b, 3, "{won:?}");
        assert_eq!(usage(ctx.s(), "pool:p").await, 3);
        assert_eq!(usage(ctx.s(), "task:a").await as usize, won_a);
        assert_eq!(usage(ctx.s(), "task:b").await as usize, won_b);
        // One ends; exactly one more claim goes through, from whichever node.
        let done = a
            .iter()
            .chain(&b)
            .zip(&won)
            .find(|(_, won)| **won)
            .map(|(inst, _)| inst.id)
            .unwrap();
        ctx.s()
            .apply_reports(&[started(done, 1, "w1")], T0)
            .await
            .unwrap();
        ctx.s()
            .apply_reports(&[finished(done, 1, Outcome::Success)], T0)
            .await
            .unwrap();
        assert_eq!(usage(ctx.s(), "pool:p").await, 2);
        let rest: Vec<DispatchClaim> = b
            .iter()
            .zip(&won[a.len()..])
            .filter(|(_, won)| !**won)
            .map(|(inst, _)| claim(inst.id, 1, "w2", &limits_b))
            .collect();
        let again = other.mark_dispatched(&rest).await.unwrap();
        assert_eq!(again.iter().filter(|w| **w).count(), 1, "{again:?}");
        assert_eq!(usage(ctx.s(), "pool:p").await, 3);
    }

    pub(super) async fn a_full_limit_refuses_its_claim_and_lets_the_next_one_go(ctx: Ctx) {
        let s = ctx.s();
        let a = waiting_instances(s, "wf-a", 3).await;
        let b = waiting_instances(s, "wf-b", 1).await;
        let la = [limit("task:a", 1)];
        // In one batch: a's first wins, its second is refused, b (no limit) goes.
        let won = s
            .mark_dispatched(&[
                claim(a[0].id, 1, "w1", &la),
                claim(a[1].id, 1, "w1", &la),
                claim(b[0].id, 1, "w1", &[]),
            ])
            .await
            .unwrap();
        assert_eq!(won, vec![true, false, true]);
        let refused = s.get_instance(a[1].id).await.unwrap().unwrap();
        assert_eq!(refused.state, InstanceState::Waiting);
        assert_eq!(refused.worker_id, None);
        assert!(s.list_attempts(a[1].id).await.unwrap().is_empty());
        // A later batch is refused too, until the holder ends.
        assert_eq!(
            s.mark_dispatched(&[claim(a[2].id, 1, "w1", &la)])
                .await
                .unwrap(),
            vec![false]
        );
        assert_eq!(usage(s, "task:a").await, 1);
        // A stale claim takes nothing.
        assert_eq!(
            s.mark_dispatched(&[claim(a[0].id, 1, "w1", &[limit("task:z", 5)])])
                .await
                .unwrap(),
            vec![false]
        );
        assert_eq!(usage(s, "task:z").await, 0);
    }

    pub(super) async fn every_end_of_an_attempt_releases_its_limits(ctx: Ctx) {
        let s = ctx.s();
        let mut retrying = task("t", &[]);
        retrying.retries = 1;
        retrying.retry_backoff_ms = 0;
        let wf = apply(s, &spec("wf", vec![retrying])).await;
        let l = [limit("task:t", 1), limit("workflow:wf", 5)];
        let check = |want: u32| async move {
            assert_eq!(usage(s, "task:t").await, want);
            assert_eq!(usage(s, "workflow:wf").await, want);
        };
        let run = start_run(s, &wf).await;
        let inst = s.list_instances(run.id).await.unwrap()[0].clone();
        let id = inst.id;
        let l2 = &l;
        let dispatch = |attempt: u32| async move {
            assert_eq!(
                s.mark_dispatched(&[claim(id, attempt, "w1", l2)])
                    .await
                    .unwrap(),
                vec![true]
            );
        };
        // Rejected: back to WAITING.
        dispatch(1).await;
        check(1).await;
        let rejected = Report::Rejected {
            instance_id: id,
            attempt: Attempt(1),
            worker_id: None,
            reason: "busy".into(),
            withdrawn: false,
            dispatched_at: None,
        };
        s.apply_reports(&[rejected], T0).await.unwrap();
        check(0).await;
        // Failed with a retry left: WAITING as attempt 2.
        dispatch(1).await;
        s.apply_reports(&[started(id, 1, "w1")], T0).await.unwrap();
        check(1).await;
        s.apply_reports(&[finished(id, 1, Outcome::Failed)], T0)
            .await
            .unwrap();
        check(0).await;
        // A spawn failure of the last attempt (straight from DISPATCHED).
        dispatch(2).await;
        check(1).await;
        let spawn = Report::Finished {
            instance_id: id,
            attempt: Attempt(2),
            worker_id: None,
            end: AttemptEnd::SpawnFailed,
            exit_code: None,
            signal: None,
            at: T0,
            log_lines: 0,
            message: "no such file".into(),
            outputs: Default::default(),
        };
        s.apply_reports(&[spawn], T0).await.unwrap();
        check(0).await;
        assert_eq!(
            s.get_instance(id).await.unwrap().unwrap().state,
            InstanceState::Failed
        );
        // Success, cancel of an instance, cancel of a run: one run each.
        let run = start_run(s, &wf).await;
        let id = s.list_instances(run.id).await.unwrap()[0].id;
        assert_eq!(
            s.mark_dispatched(&[claim(id, 1, "w1", &l)]).await.unwrap(),
            vec![true]
        );
        s.apply_reports(&[started(id, 1, "w1")], T0).await.unwrap();
        s.apply_reports(&[finished(id, 1, Outcome::Success)], T0)
            .await
            .unwrap();
        check(0).await;
        let run = start_run(s, &wf).await;
        let id = s.list_instances(run.id).await.unwrap()[0].id;
        s.mark_dispatched(&[claim(id, 1, "w1", &l)]).await.unwrap();
        check(1).await;
        s.cancel_instance(id, T0).await.unwrap();
        check(0).await;
        let run = start_run(s, &wf).await;
        let id = s.list_instances(run.id).await.unwrap()[0].id;
        s.mark_dispatched(&[claim(id, 1, "w1", &l)]).await.unwrap();
        s.apply_reports(&[started(id, 1, "w1")], T0).await.unwrap();
        check(1).await;
        let killed = s.cancel_run(run.id, T0).await.unwrap().unwrap();
        assert_eq!(killed.len(), 1);
        check(0).await;
        // A heartbeat or a replayed Started releases nothing.
        let run = start_run(s, &wf).await;
        let id = s.list_instances(run.id).await.unwrap()[0].id;
        s.mark_dispatched(&[claim(id, 1, "w1", &l)]).await.unwrap();
        s.apply_reports(&[started(id, 1, "w1"), started(id, 1, "w1")], T0)
            .await
            .unwrap();
        check(1).await;
    }

    fn sharded_spec(name: &str, retries: u32) -> WorkflowSpec {
        let mut shard = task("s", &[]);
        shard.routing = Routing::ShardedBroadcast;
        shard.retries = retries;
        spec(name, vec![shard, task("d", &["s"])])
    }

    async fn fanned_out(
        s: &Store,
        name: &str,
        retries: u32,
    ) -> (RunRecord, InstanceId, Vec<WaitingInstance>) {
        let wf = apply(s, &sharded_spec(name, retries)).await;
        let run = start_run(s, &wf).await;
        let parent = s.list_instances(run.id).await.unwrap()[0].clone();
        assert_eq!(parent.task, "s");
        let workers: Vec<String> = ["w1", "w2", "w3"].map(String::from).to_vec();
        assert!(!s.fan_out(parent.id, Attempt(1), &[], T0).await.unwrap());
        assert!(
            s.fan_out(parent.id, Attempt(1), &workers, T0)
                .await
                .unwrap()
        );
        assert!(
            !s.fan_out(parent.id, Attempt(1), &workers, T0)
                .await
                .unwrap()
        );
        let parent_now = s.get_instance(parent.id).await.unwrap().unwrap();
        assert_eq!(parent_now.state, InstanceState::Running);
        assert_eq!(parent_now.worker_id, None);
        let shards: Vec<WaitingInstance> = s
            .waiting(T0 + 1, 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|w| w.instance.run_id == run.id)
            .collect();
        assert_eq!(shards.len(), 3);
        for (i, shard) in shards.iter().enumerate() {
            let info = shard.shard.as_ref().expect("a shard");
            assert_eq!(info.parent, parent.id);
            assert_eq!(info.total, 3);
            assert_eq!(
                info.worker.as_deref(),
                Some(workers[info.index as usize].as_str())
            );
            assert_eq!(shard.instance.task, "s");
            let _ = i;
        }
        let mut indices: Vec<u32> = shards
            .iter()
            .map(|w| w.shard.as_ref().unwrap().index)
            .collect();
        indices.sort();
        assert_eq!(indices, [0, 1, 2]);
        // The parent is not something a worker runs.
        assert!(
            s.active_attempts(None, 100)
                .await
                .unwrap()
                .iter()
                .all(|a| a.instance_id != parent.id)
        );
        (run, parent.id, shards)
    }

    async fn run_shard(s: &Store, shard: &WaitingInstance, outcome: Outcome) -> Vec<ReportResult> {
        let info = shard.shard.as_ref().unwrap();
        let id = shard.instance.id;
        let attempt = shard.instance.attempt.0;
        assert_eq!(
            s.mark_dispatched(&[claim(id, attempt, info.worker.as_deref().unwrap(), &[])])
                .await
                .unwrap(),
            vec![true]
        );
        s.apply_reports(&[started(id, attempt, info.worker.as_deref().unwrap())], T0)
            .await
            .unwrap();
        s.apply_reports(&[finished(id, attempt, outcome)], T0)
            .await
            .unwrap()
    }

    pub(super) async fn a_sharded_task_fans_out_and_succeeds_when_every_shard_did(ctx: Ctx) {
        let s = ctx.s();
        let (run, parent, shards) = fanned_out(s, "wf", 0).await;
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(
            (counts.running, counts.waiting, counts.not_created),
            (1, 0, 1)
        );
        run_shard(s, &shards[0], Outcome::Success).await;
        run_shard(s, &shards[1], Outcome::Success).await;
        let tasks: Vec<String> = s
            .list_instances(run.id)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.task)
            .collect();
        assert!(!tasks.contains(&"d".to_string()), "{tasks:?}");
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Running
        );
        let results = run_shard(s, &shards[2], Outcome::Success).await;
        match &results[0] {
            ReportResult::Applied(applied) => assert_eq!(applied.new_waiting, 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Success
        );
        let d = s
            .list_instances(run.id)
            .await
            .unwrap()
            .into_iter()
            .find(|i| i.task == "d")
            .expect("downstream created once the whole task succeeded");
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        s.mark_dispatched(&[claim(d.id, 1, "w1", &[])])
            .await
            .unwrap();
        s.apply_reports(&[started(d.id, 1, "w1")], T0)
            .await
            .unwrap();
        s.apply_reports(&[finished(d.id, 1, Outcome::Success)], T0)
            .await
            .unwrap();
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Success
        );
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!((counts.success, counts.not_created), (2, 0));
    }

    pub(super) async fn a_failed_shard_fails_the_task_and_the_run_waits_for_the_other_shards(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let (run, parent, shards) = fanned_out(s, "wf", 1).await;
        // A failure with a retry left: the shard is WAITING again, pinned to the same worker.
        run_shard(s, &shards[0], Outcome::Failed).await;
        let again = s
            .waiting(T0 + 1_000_000, 100)
            .await
            .unwrap()
            .into_iter()
            .find(|w| w.instance.id == shards[0].instance.id)
            .expect("the retry waits");
        assert_eq!(again.instance.attempt, Attempt(2));
        assert_eq!(again.shard, shards[0].shard);
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Running
        );
        // Its last attempt fails: the task fails, the run waits for the shards still going.
        run_shard(s, &shards[1], Outcome::Success).await;
        run_shard(s, &again, Outcome::Failed).await;
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Failed
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        run_shard(s, &shards[2], Outcome::Success).await;
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Failed
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Failed
        );
        assert!(
            s.list_instances(run.id)
                .await
                .unwrap()
                .iter()
                .all(|i| i.task != "d" || i.state == InstanceState::UpstreamFailed)
        );
    }

    pub(super) async fn a_shard_whose_worker_is_gone_fails_without_retry(ctx: Ctx) {
        let s = ctx.s();
        let (run, parent, shards) = fanned_out(s, "wf", 3).await;
        let gone = &shards[1];
        assert!(
            s.fail_shard(gone.instance.id, Attempt(1), "worker w2 is gone", T0)
                .await
                .unwrap()
        );
        assert!(
            !s.fail_shard(gone.instance.id, Attempt(1), "again", T0)
                .await
                .unwrap()
        );
        assert!(
            !s.fail_shard(parent, Attempt(1), "not a shard", T0)
                .await
                .unwrap()
        );
        let attempts = s.list_attempts(gone.instance.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].state, InstanceState::Failed);
        assert_eq!(attempts[0].message, "worker w2 is gone");
        assert_eq!(
            s.get_instance(parent).await.unwrap().unwrap().state,
            InstanceState::Failed
        );
        // The task below is judged at once, as after a reported failure.
        assert_eq!(
            instance_of(s, run.id, "d").await.map(|d| d.state),
            Some(InstanceState::UpstreamFailed)
        );
        // The other shards still pending: cancelling the run ends it.
        s.cancel_run(run.id, T0).await.unwrap();
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );
        // Cancelling a running sharded task's instance cancels its pending shards too.
        let (run, parent, shards) = fanned_out(s, "wf", 3).await;
        s.cancel_instance(parent, T0).await.unwrap();
        for shard in &shards {
            assert_eq!(
                s.get_instance(shard.instance.id)
                    .await
                    .unwrap()
                    .unwrap()
                    .state,
                InstanceState::Cancelled
            );
        }
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );
    }

    pub(super) async fn decisions_recorded_once_per_instance_and_reason(ctx: Ctx) {
        let s = ctx.s();
        let inst = waiting_instances(s, "wf", 1).await.remove(0);
        let decision = |detail: &str| DecisionRecord {
            at: T0,
            workflow_id: inst.workflow_id,
            slot_at: T0,
            run_id: Some(inst.run_id),
            instance_id: Some(inst.id),
            task: Some("t".into()),
            kind: DecisionKind::Throttled,
            detail: detail.into(),
            node_id: "n1".into(),
        };
        let first = decision("task limit 2 reached");
        assert_eq!(
            s.record_decisions_once(std::slice::from_ref(&first))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            s.record_decisions_once(std::slice::from_ref(&first))
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            s.record_decisions_once(&[decision("pool limit 4 reached")])
                .await
                .unwrap(),
            1
        );
        let stored = s
            .list_decisions(inst.workflow_id, T0, T0, 100)
            .await
            .unwrap();
        assert_eq!(stored.len(), 2);
        assert_eq!(stored[0], first);
    }
}
