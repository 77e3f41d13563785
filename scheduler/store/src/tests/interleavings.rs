//! Conformance scenarios for the races and lock orders of the run queue, rerun, cancel and
//! sharded retries (`sql/queue.rs`, `sql/rerun.rs`, `sql/cancel.rs`, `sql/locks.rs`).

use super::support::{Ctx, T0, apply, manual, spec, task};
use crate::*;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::spec::{Routing, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};
use std::sync::Arc;

conformance!(
    a_run_ending_while_another_is_queued_never_strands_the_queued_run,
    rerun_from_moves_a_sharded_task_s_instance_not_its_shards_and_it_fans_out_again,
    rerun_from_refuses_while_a_sharded_task_still_has_shards_going,
    a_claim_racing_cancel_run_is_cancelled_and_its_worker_told,
    a_start_racing_cancel_instance_is_cancelled_and_its_worker_told,
    a_sharded_task_is_retried_as_a_whole_once_its_shards_ended,
    the_queued_runs_of_a_workflow_are_read_in_order_by_an_index,
);

mod scenarios {
    use super::*;

    pub(super) fn claim(id: InstanceId, attempt: Attempt, worker: &str) -> DispatchClaim {
        DispatchClaim {
            instance_id: id,
            attempt,
            worker_id: worker.into(),
            node_id: "n1".into(),
            at: T0,
            limits: Vec::new(),
        }
    }

    pub(super) fn started(id: InstanceId, attempt: Attempt, worker: &str) -> Report {
        Report::Started {
            instance_id: id,
            attempt,
            worker_id: worker.into(),
            pid: 1,
            at: T0,
        }
    }

    pub(super) fn finished(id: InstanceId, attempt: Attempt, outcome: Outcome) -> Report {
        Report::Finished {
            instance_id: id,
            attempt,
            worker_id: None,
            end: AttemptEnd::Finished(outcome),
            exit_code: Some(if outcome == Outcome::Success { 0 } else { 1 }),
            signal: None,
            at: T0,
            log_lines: 0,
            message: String::new(),
            outputs: Default::default(),
        }
    }

    /// Dispatches and starts the instance on `worker`.
    pub(super) async fn start(s: &Store, id: InstanceId, attempt: Attempt, worker: &str) {
        assert_eq!(
            s.mark_dispatched(&[claim(id, attempt, worker)])
                .await
                .unwrap(),
            [true]
        );
        s.apply_reports(&[started(id, attempt, worker)], T0)
            .await
            .unwrap();
    }

    /// Runs the instance to `outcome`.
    pub(super) async fn run_to(s: &Store, id: InstanceId, attempt: Attempt, outcome: Outcome) {
        start(s, id, attempt, "w1").await;
        s.apply_reports(&[finished(id, attempt, outcome)], T0)
            .await
            .unwrap();
    }

    pub(super) async fn instance(s: &Store, id: InstanceId) -> InstanceRecord {
        s.get_instance(id).await.unwrap().unwrap()
    }

    pub(super) async fn run_state(s: &Store, id: RunId) -> RunState {
        s.get_run(id).await.unwrap().unwrap().state
    }

    /// Finding 1: node A ends run R while node B creates run Q of a workflow capped at one
    /// active run. Whatever the interleaving, Q never stays QUEUED with nothing running.
    pub(super) async fn a_run_ending_while_another_is_queued_never_strands_the_queued_run(
        ctx: Ctx,
    ) {
        let a: Arc<Store> = ctx.store.clone();
        let b: Arc<Store> = ctx.second_store().await;
        let mut capped = spec("capped", vec![task("t", &[])]);
        capped.schedule.max_active_runs = 1;
        let wf = apply(a.as_ref(), &capped).await;
        let (mut running, created) = a.create_run(&manual(&wf)).await.unwrap();
        assert!(created);
        for round in 0..40 {
            assert_eq!(running.state, RunState::Running, "round {round}");
            let inst = a.list_instances(running.id).await.unwrap().remove(0);
            start(a.as_ref(), inst.id, inst.attempt, "w1").await;
            let ender = {
                let a = a.clone();
                tokio::spawn(async move {
                    a.apply_reports(&[finished(inst.id, inst.attempt, Outcome::Success)], T0)
                        .await
                        .unwrap()
                })
            };
            let creator = {
                let b = b.clone();
                let new_run = manual(&wf);
                tokio::spawn(async move { b.create_run(&new_run).await.unwrap().0 })
            };
            ender.await.unwrap();
            let queued = creator.await.unwrap();
            assert_eq!(run_state(a.as_ref(), running.id).await, RunState::Success);
            let now = a.get_run(queued.id).await.unwrap().unwrap();
            assert_eq!(
                now.state,
                RunState::Running,
                "round {round}: run {} stranded {:?} after run {} ended",
                queued.id,
                now.state,
                running.id
            );
            running = now;
        }
    }

    /// `a → s (sharded broadcast) → d`.
    pub(super) fn sharded(name: &str) -> WorkflowSpec {
        let mut s = task("s", &["a"]);
        s.routing = Routing::ShardedBroadcast;
        spec(name, vec![task("a", &[]), s, task("d", &["s"])])
    }

    pub(super) async fn by_task(s: &Store, run: RunId, name: &str) -> InstanceRecord {
        s.list_instances(run)
            .await
            .unwrap()
            .into_iter()
            .find(|i| i.task == name && i.shard.is_none())
            .unwrap_or_else(|| panic!("no instance of {name}"))
    }

    /// The WAITING shards of `parent`, by shard index.
    pub(super) async fn shards_of(s: &Store, parent: InstanceId) -> Vec<WaitingInstance> {
        let mut shards: Vec<WaitingInstance> = s
            .waiting(T0 + 1_000_000, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|w| w.shard.as_ref().is_some_and(|sh| sh.parent == parent))
            .collect();
        shards.sort_by_key(|w| w.shard.as_ref().unwrap().index);
        shards
    }

    /// Fans the parent out to three workers; returns its shards.
    pub(super) async fn fan_out(
        s: &Store,
        parent: InstanceId,
        attempt: Attempt,
    ) -> Vec<WaitingInstance> {
        let workers: Vec<String> = ["w1", "w2", "w3"].map(String::from).to_vec();
        assert!(s.fan_out(parent, attempt, &workers, T0).await.unwrap());
        let shards = shards_of(s, parent).await;
        assert_eq!(shards.len(), 3);
        shards
    }

    pub(super) async fn run_shard(s: &Store, shard: &WaitingInstance, outcome: Outcome) {
        let worker = shard.shard.as_ref().unwrap().worker.clone().unwrap();
        let (id, attempt) = (shard.instance.id, shard.instance.attempt);
        start(s, id, attempt, &worker).await;
        s.apply_reports(&[finished(id, attempt, outcome)], T0)
            .await
            .unwrap();
    }

    /// A run of `sharded` through `a` and a fan-out of `s`: (run, s's instance, its shards).
    pub(super) async fn sharded_run(
        s: &Store,
        wf: &WorkflowRecord,
    ) -> (RunId, InstanceId, Vec<WaitingInstance>) {
        let run = s.create_run(&manual(wf)).await.unwrap().0.id;
        let a = by_task(s, run, "a").await;
        run_to(s, a.id, a.attempt, Outcome::Success).await;
        let parent = by_task(s, run, "s").await;
        let shards = fan_out(s, parent.id, parent.attempt).await;
        (run, parent.id, shards)
    }

    /// Finding 2: a rerun reads task instances only; a sharded task's instance goes back to
    /// WAITING (or PENDING below the rerun task) and fans out again, its old shards untouched.
    pub(super) async fn rerun_from_moves_a_sharded_task_s_instance_not_its_shards_and_it_fans_out_again(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &sharded("wf")).await;
        let (run, parent, shards) = sharded_run(s, &wf).await;
        for shard in &shards {
            run_shard(s, shard, Outcome::Success).await;
        }
        let d = by_task(s, run, "d").await;
        run_to(s, d.id, d.attempt, Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Success);

        // From above the sharded task: its instance waits as PENDING, not a shard.
        let a = by_task(s, run, "a").await;
        match s.rerun_from(run, "a", T0 + 10).await.unwrap() {
            RerunFrom::Rerun { again, pending } => {
                assert_eq!(again, a.id);
                assert_eq!(pending, vec![parent, d.id]);
            }
            other => panic!("{other:?}"),
        }
        for shard in &shards {
            assert_eq!(
                instance(s, shard.instance.id).await.state,
                InstanceState::Success
            );
        }
        assert_eq!(instance(s, parent).await.state, InstanceState::Pending);
        run_to(s, a.id, Attempt(2), Outcome::Success).await;
        let woken = instance(s, parent).await;
        assert_eq!(
            (woken.state, woken.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        let again = fan_out(s, parent, Attempt(2)).await;
        assert!(again.iter().all(|w| w.instance.id != shards[0].instance.id));
        for shard in &again {
            run_shard(s, shard, Outcome::Success).await;
        }
        assert_eq!(instance(s, parent).await.state, InstanceState::Success);
        let d_again = instance(s, d.id).await;
        assert_eq!(
            (d_again.state, d_again.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        run_to(s, d.id, Attempt(2), Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Success);

        // From the sharded task itself: its instance again, as attempt 3.
        match s.rerun_from(run, "s", T0 + 20).await.unwrap() {
            RerunFrom::Rerun { again, pending } => {
                assert_eq!(again, parent);
                assert_eq!(pending, vec![d.id]);
            }
            other => panic!("{other:?}"),
        }
        let third = fan_out(s, parent, Attempt(3)).await;
        for shard in &third {
            run_shard(s, shard, Outcome::Success).await;
        }
        run_to(s, d.id, Attempt(3), Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Success);
    }

    /// Finding 2: a sharded task that failed on its first failed shard while the others still
    /// go cannot be rerun (nor anything above it) until they end.
    pub(super) async fn rerun_from_refuses_while_a_sharded_task_still_has_shards_going(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &sharded("wf")).await;
        let (run, parent, shards) = sharded_run(s, &wf).await;
        run_shard(s, &shards[0], Outcome::Failed).await;
        start(s, shards[1].instance.id, Attempt(1), "w2").await;
        assert_eq!(instance(s, parent).await.state, InstanceState::Failed);
        assert_eq!(run_state(s, run).await, RunState::Running);
        for from in ["s", "a"] {
            assert_eq!(
                s.rerun_from(run, from, T0 + 10).await.unwrap(),
                RerunFrom::ShardsActive {
                    shards: vec![("s".to_string(), 2)]
                },
                "rerun from {from}"
            );
        }
        // Nothing moved.
        assert_eq!(instance(s, parent).await.attempt, Attempt(1));
        assert_eq!(by_task(s, run, "a").await.attempt, Attempt(1));
        // Once the shards ended, the rerun goes.
        s.apply_reports(
            &[finished(
                shards[1].instance.id,
                Attempt(1),
                Outcome::Success,
            )],
            T0,
        )
        .await
        .unwrap();
        run_shard(s, &shards[2], Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Failed);
        match s.rerun_from(run, "s", T0 + 20).await.unwrap() {
            RerunFrom::Rerun { again, .. } => assert_eq!(again, parent),
            other => panic!("{other:?}"),
        }
        assert_eq!(run_state(s, run).await, RunState::Running);
    }

    /// Finding 3: node B claims a run's instances while node A cancels the run. Whatever the
    /// interleaving, no instance stays DISPATCHED, and every claim that won is in the kill list.
    pub(super) async fn a_claim_racing_cancel_run_is_cancelled_and_its_worker_told(ctx: Ctx) {
        let a: Arc<Store> = ctx.store.clone();
        let b: Arc<Store> = ctx.second_store().await;
        let tasks = (0..8).map(|i| task(&format!("t{i}"), &[])).collect();
        let wf = apply(a.as_ref(), &spec("wide", tasks)).await;
        for round in 0..30 {
            let run = a.create_run(&manual(&wf)).await.unwrap().0.id;
            let instances = a.list_instances(run).await.unwrap();
            let claims: Vec<DispatchClaim> = instances
                .iter()
                .map(|i| claim(i.id, i.attempt, "w1"))
                .collect();
            let claimer = {
                let b = b.clone();
                tokio::spawn(async move {
                    let mut won = Vec::new();
                    // One claim per transaction, as the dispatcher of a busy node may.
                    for claim in claims {
                        if b.mark_dispatched(std::slice::from_ref(&claim))
                            .await
                            .unwrap()[0]
                        {
                            won.push(claim.instance_id);
                        }
                    }
                    won
                })
            };
            let canceller = {
                let a = a.clone();
                tokio::spawn(async move { a.cancel_run(run, T0).await.unwrap().unwrap() })
            };
            let won = claimer.await.unwrap();
            let killed: Vec<InstanceId> = canceller
                .await
                .unwrap()
                .iter()
                .map(|k| k.instance_id)
                .collect();
            assert_eq!(run_state(a.as_ref(), run).await, RunState::Cancelled);
            for inst in a.list_instances(run).await.unwrap() {
                assert_eq!(
                    inst.state,
                    InstanceState::Cancelled,
                    "round {round}: instance {} escaped the cancel (claims won {won:?}, killed {killed:?})",
                    inst.id
                );
            }
            for id in &won {
                assert!(
                    killed.contains(id),
                    "round {round}: {id} was dispatched but its worker was not told: {killed:?}"
                );
            }
        }
    }

    /// A batch of Started reports takes no run lock: a cancel of one instance must still win
    /// over a start that lands between its read and its update, and tell the worker.
    pub(super) async fn a_start_racing_cancel_instance_is_cancelled_and_its_worker_told(ctx: Ctx) {
        let a: Arc<Store> = ctx.store.clone();
        let b: Arc<Store> = ctx.second_store().await;
        let tasks = (0..8).map(|i| task(&format!("t{i}"), &[])).collect();
        let wf = apply(a.as_ref(), &spec("wide", tasks)).await;
        for round in 0..30 {
            let run = a.create_run(&manual(&wf)).await.unwrap().0.id;
            let instances = a.list_instances(run).await.unwrap();
            let claims: Vec<DispatchClaim> = instances
                .iter()
                .map(|i| claim(i.id, i.attempt, "w1"))
                .collect();
            assert!(a.mark_dispatched(&claims).await.unwrap().iter().all(|w| *w));
            let starter = {
                let b = b.clone();
                let keys: Vec<(InstanceId, Attempt)> =
                    instances.iter().map(|i| (i.id, i.attempt)).collect();
                tokio::spawn(async move {
                    for (id, attempt) in keys {
                        b.apply_reports(&[started(id, attempt, "w1")], T0)
                            .await
                            .unwrap();
                    }
                })
            };
            let canceller = {
                let a = a.clone();
                let ids: Vec<InstanceId> = instances.iter().map(|i| i.id).collect();
                tokio::spawn(async move {
                    let mut told = Vec::new();
                    for id in ids {
                        let (_, killed) = a.cancel_instance(id, T0).await.unwrap().unwrap();
                        told.push((id, killed.is_some()));
                    }
                    told
                })
            };
            starter.await.unwrap();
            let told = canceller.await.unwrap();
            for inst in a.list_instances(run).await.unwrap() {
                assert_eq!(
                    inst.state,
                    InstanceState::Cancelled,
                    "round {round}: instance {} escaped its cancel",
                    inst.id
                );
            }
            for (id, killed) in told {
                assert!(
                    killed,
                    "round {round}: {id} was cancelled but its worker not told"
                );
            }
        }
    }

    /// Finding 4: a shard is not retried on its own, and a sharded task's instance that failed
    /// on its first failed shard is retried (alone or by `rerun --failed`) only once its other
    /// shards ended: never two sets of shards at once.
    pub(super) async fn a_sharded_task_is_retried_as_a_whole_once_its_shards_ended(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &sharded("wf")).await;
        let (run, parent, shards) = sharded_run(s, &wf).await;
        run_shard(s, &shards[0], Outcome::Failed).await;
        assert_eq!(instance(s, parent).await.state, InstanceState::Failed);
        assert_eq!(
            s.retry_instance(shards[0].instance.id, T0).await.unwrap(),
            ManualRetry::Shard { parent }
        );
        assert_eq!(
            s.retry_instance(parent, T0).await.unwrap(),
            ManualRetry::ShardsActive { unfinished: 2 }
        );
        assert_eq!(
            s.rerun_failed(run, T0).await.unwrap(),
            Some(RerunFailed {
                retried: vec![],
                shards_active: vec![(parent, 2)],
            })
        );
        // Nothing moved: no new attempt, so no second fan-out.
        assert_eq!(instance(s, parent).await.attempt, Attempt(1));
        assert_eq!(
            instance(s, shards[0].instance.id).await.state,
            InstanceState::Failed
        );
        run_shard(s, &shards[1], Outcome::Success).await;
        assert_eq!(
            s.retry_instance(parent, T0).await.unwrap(),
            ManualRetry::ShardsActive { unfinished: 1 }
        );
        run_shard(s, &shards[2], Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Failed);
        // All shards ended: rerun --failed retries the task's instance, which fans out again.
        assert_eq!(
            s.rerun_failed(run, T0).await.unwrap(),
            Some(RerunFailed {
                retried: vec![parent],
                shards_active: vec![],
            })
        );
        let again = fan_out(s, parent, Attempt(2)).await;
        for shard in &again {
            run_shard(s, shard, Outcome::Success).await;
        }
        assert_eq!(instance(s, parent).await.state, InstanceState::Success);
        let d = by_task(s, run, "d").await;
        run_to(s, d.id, d.attempt, Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Success);
        // The same through retry_instance, on a second run.
        let (run, parent, shards) = sharded_run(s, &wf).await;
        run_shard(s, &shards[1], Outcome::Failed).await;
        run_shard(s, &shards[0], Outcome::Success).await;
        run_shard(s, &shards[2], Outcome::Success).await;
        assert_eq!(run_state(s, run).await, RunState::Failed);
        match s.retry_instance(parent, T0).await.unwrap() {
            ManualRetry::Retried(record) => assert_eq!(record.attempt, Attempt(2)),
            other => panic!("{other:?}"),
        }
        assert_eq!(run_state(s, run).await, RunState::Running);
    }

    /// Finding 6 (migration 0007): promote's `workflow_id = ? AND state = 'QUEUED' ORDER BY id`
    /// has an index of exactly those columns, on both backends.
    pub(super) async fn the_queued_runs_of_a_workflow_are_read_in_order_by_an_index(ctx: Ctx) {
        use sqlx::Row;
        let columns_sql = match ctx.store.backend() {
            Backend::Sqlite => {
                "SELECT name AS col FROM pragma_index_info('idx_run_queue_order') ORDER BY seqno"
            }
            Backend::MySql => {
                "SELECT column_name AS col FROM information_schema.statistics \
                 WHERE table_schema = DATABASE() AND table_name = 'run' \
                 AND index_name = 'idx_run_queue_order' ORDER BY seq_in_index"
            }
        };
        let columns: Vec<String> = sqlx::query(columns_sql)
            .fetch_all(&ctx.store.pool)
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get::<String, _>("col").unwrap().to_lowercase())
            .collect();
        assert_eq!(columns, ["workflow_id", "state", "id"]);
    }
}
