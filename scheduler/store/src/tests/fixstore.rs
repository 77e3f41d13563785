//! Conformance scenarios for the races and lock orders of the run queue, rerun, cancel and
//! sharded retries (`sql/queue.rs`, `sql/rerun.rs`, `sql/ops.rs`, `sql/locks.rs`).

use super::scenarios::{spec, task};
use super::{Ctx, T0, on_mysql, on_sqlite};
use crate::*;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::spec::{Routing, TriggerKind, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};
use std::collections::BTreeMap;
use std::sync::Arc;

conformance!(a_run_ending_while_another_is_queued_never_strands_the_queued_run,);

mod scenarios {
    use super::*;

    pub(super) async fn apply(s: &dyn Store, spec: &WorkflowSpec) -> WorkflowRecord {
        s.apply_workflow(spec, "source", None, T0).await.unwrap().0
    }

    pub(super) fn manual(wf: &WorkflowRecord) -> NewRun {
        NewRun {
            workflow_id: wf.id,
            workflow_version: wf.version,
            trigger: TriggerKind::Manual,
            logical_time: T0,
            dedup_key: None,
            idempotency_key: None,
            params: BTreeMap::new(),
            triggered_by: "tester".into(),
            now: T0,
        }
    }

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
        }
    }

    /// Dispatches and starts the instance on `worker`.
    pub(super) async fn start(s: &dyn Store, id: InstanceId, attempt: Attempt, worker: &str) {
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
    pub(super) async fn run_to(s: &dyn Store, id: InstanceId, attempt: Attempt, outcome: Outcome) {
        start(s, id, attempt, "w1").await;
        s.apply_reports(&[finished(id, attempt, outcome)], T0)
            .await
            .unwrap();
    }

    pub(super) async fn instance(s: &dyn Store, id: InstanceId) -> InstanceRecord {
        s.get_instance(id).await.unwrap().unwrap()
    }

    pub(super) async fn run_state(s: &dyn Store, id: RunId) -> RunState {
        s.get_run(id).await.unwrap().unwrap().state
    }

    /// Finding 1: node A ends run R while node B creates run Q of a workflow capped at one
    /// active run. Whatever the interleaving, Q never stays QUEUED with nothing running.
    pub(super) async fn a_run_ending_while_another_is_queued_never_strands_the_queued_run(
        ctx: Ctx,
    ) {
        let a: Arc<dyn Store> = ctx.store.clone();
        let b: Arc<dyn Store> = Arc::new(SqlStore::connect(&ctx.url).await.unwrap());
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
}
