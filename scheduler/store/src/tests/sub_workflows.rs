//! Conformance scenarios of sub-workflows (`sql/sub_workflows.rs`): a `run_workflow` task's
//! child run is started once per attempt however often the start is repeated, the parent's
//! attempt ends as the child ended, a cancelled parent's child is cancelled, and a retry of the
//! parent (automatic or by hand) starts a new child.

use std::collections::BTreeMap;

use ax_core::ids::{Attempt, InstanceId};
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};
use ax_core::sub_workflow::{ParentEnd, ParentSide, SweepAction};

use super::support::*;
use crate::*;

conformance!(
    a_child_is_started_once_per_attempt_however_often_the_start_is_repeated,
    the_parent_task_ends_as_its_child_run_ended,
    cancelling_the_parent_run_cancels_the_child,
    a_retry_of_the_parent_task_starts_a_new_child,
    a_child_of_another_app_is_never_started,
    a_parent_past_its_timeout_times_out_and_cancels_its_child,
);

mod scenarios {
    use super::*;

    /// `parent` with `call` (run_workflow: `child`, params from the run's `day`), `child` with
    /// one task `load`.
    async fn parent_and_child(s: &Store, retries: u32) -> (WorkflowRecord, WorkflowRecord) {
        parent_and_child_with(s, retries, None).await
    }

    async fn parent_and_child_with(
        s: &Store,
        retries: u32,
        timeout_ms: Option<std::num::NonZeroU64>,
    ) -> (WorkflowRecord, WorkflowRecord) {
        let child = apply(s, &spec("child", vec![task("load", &[])])).await;
        let mut call = task("call", &[]);
        call.timeout_ms = timeout_ms;
        call.command = String::new();
        call.run_workflow = Some("child".into());
        call.retries = retries;
        call.retry_backoff_ms = 0;
        call.params = BTreeMap::from([
            ("region".to_string(), "eu-${params.day}".to_string()),
            ("fixed".to_string(), "1".to_string()),
        ]);
        let parent = apply(s, &spec("parent", vec![call, task("after", &["call"])])).await;
        (parent, child)
    }

    fn start_of(instance: &InstanceRecord, now: i64) -> SubWorkflowStart {
        SubWorkflowStart {
            instance_id: instance.id,
            attempt: instance.attempt,
            node_id: "node-1".into(),
            now,
        }
    }

    /// Starts the current attempt of the parent run's `call`; returns its child run.
    async fn start_child(s: &Store, parent_run: &RunRecord) -> (InstanceRecord, RunRecord) {
        let call = instance_of(s, parent_run.id, "call").await.expect("call");
        match s
            .start_sub_workflow(&start_of(&call, T0 + 5))
            .await
            .unwrap()
        {
            SubWorkflowStarted::Started { child } => {
                let call = s.get_instance(call.id).await.unwrap().unwrap();
                (call, *child)
            }
            other => panic!("expected a child, got {other:?}"),
        }
    }

    async fn settle(s: &Store, call: &InstanceRecord) -> Option<SweepAction> {
        s.settle_sub_workflow(call.id, call.attempt, T0 + 100)
            .await
            .unwrap()
            .map(|(action, _)| action)
    }

    async fn state_of(s: &Store, id: InstanceId) -> InstanceState {
        s.get_instance(id).await.unwrap().unwrap().state
    }

    async fn run_state(s: &Store, run: &RunRecord) -> RunState {
        s.get_run(run.id).await.unwrap().unwrap().state
    }

    pub(super) async fn a_child_is_started_once_per_attempt_however_often_the_start_is_repeated(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let (parent, child_wf) = parent_and_child(s, 0).await;
        let run = start_run(s, &parent).await;
        let call = instance_of(s, run.id, "call").await.unwrap();
        // The dispatcher's read finds it, whatever room workers have.
        assert_eq!(
            s.waiting_sub_workflows(T0 + 5, 10).await.unwrap(),
            vec![(call.id, Attempt(1))]
        );

        // Two nodes start the same attempt at once: one child.
        let other = ctx.second_store().await;
        let start = start_of(&call, T0 + 5);
        let (a, b) = tokio::join!(
            s.start_sub_workflow(&start),
            other.start_sub_workflow(&start),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        let started: Vec<&SubWorkflowStarted> = [&a, &b]
            .into_iter()
            .filter(|r| matches!(r, SubWorkflowStarted::Started { .. }))
            .collect();
        assert_eq!(started.len(), 1, "{a:?} {b:?}");
        assert!(
            [&a, &b].contains(&&SubWorkflowStarted::NotWaiting),
            "{a:?} {b:?}"
        );
        let SubWorkflowStarted::Started { child } = started[0].clone() else {
            unreachable!()
        };
        let child = *child;
        // Started again later (a node retrying a lost answer): nothing more.
        assert_eq!(
            s.start_sub_workflow(&start_of(&call, T0 + 6))
                .await
                .unwrap(),
            SubWorkflowStarted::NotWaiting
        );
        assert!(
            s.waiting_sub_workflows(T0 + 5, 10)
                .await
                .unwrap()
                .is_empty()
        );

        assert_eq!(child.workflow_id, child_wf.id);
        assert_eq!(child.trigger, TriggerKind::Parent);
        assert_eq!(child.state, RunState::Running);
        assert_eq!(child.logical_time, run.logical_time);
        assert_eq!(child.parent_run_id, Some(run.id));
        assert_eq!(child.parent_instance_id, Some(call.id));
        assert_eq!(
            child.idempotency_key.as_deref(),
            Some(&*format!("parent:{}:1", call.id.0))
        );
        // Params rendered over the parent run's.
        assert_eq!(
            child.params,
            BTreeMap::from([
                ("fixed".to_string(), "1".to_string()),
                ("region".to_string(), "eu-2024-01-01".to_string()),
            ])
        );
        assert_eq!(s.child_runs(run.id).await.unwrap(), vec![child.id]);
        // A create under the child's key (a start that got past the instance's check) finds
        // the child: the unique dedup key is the last guard.
        let again = NewRun {
            dedup_key: Some(format!("parent:{}:1", call.id.0)),
            ..manual(&child_wf)
        };
        let (found, created) = s.create_run(&again).await.unwrap();
        assert!(!created);
        assert_eq!(found.id, child.id);

        // The parent's attempt runs on no worker, and no liveness check looks at it.
        let call = s.get_instance(call.id).await.unwrap().unwrap();
        assert_eq!(
            (call.state, call.worker_id.as_deref()),
            (InstanceState::Running, None)
        );
        assert!(s.active_attempts(None, 100).await.unwrap().is_empty());
        let waits = s.sub_workflow_waits_of_run(run.id).await.unwrap();
        assert_eq!(waits.len(), 1);
        assert_eq!(
            (
                waits[0].child_run_id,
                waits[0].parent_waiting,
                waits[0].closed
            ),
            (child.id, true, false)
        );
        // Both sides active: the sweep waits.
        assert_eq!(settle(s, &call).await, None);
    }

    pub(super) async fn the_parent_task_ends_as_its_child_run_ended(ctx: Ctx) {
        let s = ctx.s();
        let (parent, _) = parent_and_child(s, 0).await;
        for (outcome, want) in [
            (Some(Outcome::Success), ParentEnd::Success),
            (Some(Outcome::Failed), ParentEnd::Failed),
            (None, ParentEnd::Cancelled),
        ] {
            let run = start_run(s, &parent).await;
            let (call, child) = start_child(s, &run).await;
            match outcome {
                Some(outcome) => {
                    run_task(s, child.id, "load", outcome).await;
                }
                None => {
                    s.cancel_run(child.id, T0 + 50).await.unwrap();
                }
            }
            assert_eq!(settle(s, &call).await, Some(SweepAction::EndParent(want)));
            // Settled once: the wait is closed.
            assert_eq!(settle(s, &call).await, None);
            let (call_state, run_end) = match want {
                ParentEnd::Success => (InstanceState::Success, RunState::Running),
                ParentEnd::Failed => (InstanceState::Failed, RunState::Failed),
                ParentEnd::Cancelled => (InstanceState::Cancelled, RunState::Cancelled),
            };
            assert_eq!(state_of(s, call.id).await, call_state, "{want:?}");
            let attempts = s.list_attempts(call.id).await.unwrap();
            let child_state = run_state(s, &child).await;
            assert_eq!(
                attempts[0].message,
                format!("child run {} (child) ended {child_state}", child.id.0)
            );
            if want == ParentEnd::Success {
                // The task below it runs as after any success.
                let after = instance_of(s, run.id, "after").await.unwrap();
                assert_eq!(after.state, InstanceState::Waiting);
                run_task(s, run.id, "after", Outcome::Success).await;
                assert_eq!(run_state(s, &run).await, RunState::Success);
            } else {
                assert_eq!(run_state(s, &run).await, run_end, "{want:?}");
            }
        }
    }

    pub(super) async fn cancelling_the_parent_run_cancels_the_child(ctx: Ctx) {
        let s = ctx.s();
        let (parent, _) = parent_and_child(s, 0).await;
        let run = start_run(s, &parent).await;
        let (call, child) = start_child(s, &run).await;
        let load = launch(s, child.id, "load").await;

        s.cancel_run(run.id, T0 + 40).await.unwrap();
        assert_eq!(state_of(s, call.id).await, InstanceState::Cancelled);
        let waits = s.open_sub_workflow_waits(10).await.unwrap();
        assert_eq!(waits.len(), 1);
        assert!(!waits[0].parent_waiting);
        assert_eq!(waits[0].child_state, RunState::Running);

        let (action, killed) = s
            .settle_sub_workflow(call.id, call.attempt, T0 + 100)
            .await
            .unwrap()
            .expect("settled");
        assert_eq!(action, SweepAction::CancelChild);
        // The child's running task is to be killed on its worker.
        assert_eq!(killed.len(), 1);
        assert_eq!(
            (killed[0].instance_id, killed[0].worker_id.as_deref()),
            (load.id, Some("w1"))
        );
        assert_eq!(run_state(s, &child).await, RunState::Cancelled);
        assert!(s.open_sub_workflow_waits(10).await.unwrap().is_empty());
    }

    pub(super) async fn a_retry_of_the_parent_task_starts_a_new_child(ctx: Ctx) {
        let s = ctx.s();
        let (parent, _) = parent_and_child(s, 1).await;
        let run = start_run(s, &parent).await;
        let (call, first) = start_child(s, &run).await;
        run_task(s, first.id, "load", Outcome::Failed).await;
        assert_eq!(
            settle(s, &call).await,
            Some(SweepAction::EndParent(ParentEnd::Failed))
        );
        // Its retry waits as attempt 2, and gets a child of its own.
        let retry = s.get_instance(call.id).await.unwrap().unwrap();
        assert_eq!(
            (retry.state, retry.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        let (call, second) = start_child(s, &run).await;
        assert_ne!(second.id, first.id);
        assert_eq!(
            second.idempotency_key.as_deref(),
            Some(&*format!("parent:{}:2", call.id.0))
        );
        run_task(s, second.id, "load", Outcome::Failed).await;
        assert_eq!(
            settle(s, &call).await,
            Some(SweepAction::EndParent(ParentEnd::Failed))
        );
        assert_eq!(state_of(s, call.id).await, InstanceState::Failed);
        assert_eq!(run_state(s, &run).await, RunState::Failed);

        // A retry by hand: a third attempt, a third child.
        s.retry_instance(call.id, T0 + 200).await.unwrap();
        let (call, third) = start_child(s, &run).await;
        assert_eq!(call.attempt, Attempt(3));
        assert!(third.id != first.id && third.id != second.id);
        let mut children = s.child_runs(run.id).await.unwrap();
        children.sort();
        assert_eq!(children, vec![first.id, second.id, third.id]);
        run_task(s, third.id, "load", Outcome::Success).await;
        assert_eq!(
            settle(s, &call).await,
            Some(SweepAction::EndParent(ParentEnd::Success))
        );
        assert_eq!(state_of(s, call.id).await, InstanceState::Success);
    }

    pub(super) async fn a_child_of_another_app_is_never_started(ctx: Ctx) {
        let s = ctx.s();
        // `child` exists, but in another app than its caller's: said as not found.
        let mut other: WorkflowSpec = spec("child", vec![task("load", &[])]);
        other.app = "billing".into();
        apply(s, &other).await;
        let mut call = task("call", &[]);
        call.command = String::new();
        call.run_workflow = Some("child".into());
        let parent = apply(s, &spec("parent", vec![call])).await;
        let run = start_run(s, &parent).await;
        let call = instance_of(s, run.id, "call").await.unwrap();
        assert_eq!(
            s.start_sub_workflow(&start_of(&call, T0 + 5))
                .await
                .unwrap(),
            SubWorkflowStarted::Failed {
                reason: "run_workflow: workflow child not found".into()
            }
        );
        assert_eq!(state_of(s, call.id).await, InstanceState::Failed);
        assert_eq!(run_state(s, &run).await, RunState::Failed);
        assert!(s.child_runs(run.id).await.unwrap().is_empty());
        let attempts = s.list_attempts(call.id).await.unwrap();
        assert_eq!(
            attempts[0].message,
            "run_workflow: workflow child not found"
        );
    }
    pub(super) async fn a_parent_past_its_timeout_times_out_and_cancels_its_child(ctx: Ctx) {
        let s = ctx.s();
        let minute = std::num::NonZeroU64::new(60_000);
        let (parent, _) = parent_and_child_with(s, 1, minute).await;
        let run = start_run(s, &parent).await;
        let (call, first) = start_child(s, &run).await;
        let load = launch(s, first.id, "load").await;
        let started = call.started_at.expect("started");

        // Within the timeout the open wait just waits.
        let waits = s.open_sub_workflow_waits(10).await.unwrap();
        assert_eq!(waits.len(), 1);
        assert_eq!(waits[0].parent_timeout_ms, minute);
        assert_eq!(waits[0].parent_side(started + 59_999), ParentSide::Waiting);
        assert_eq!(
            waits[0].parent_side(started + 60_000),
            ParentSide::PastTimeout
        );
        let early = s
            .settle_sub_workflow(call.id, call.attempt, started + 59_999)
            .await
            .unwrap();
        assert_eq!(early, None);

        // Past it: the attempt ends TIMEOUT, the child is cancelled and its task is to be
        // killed, and the retry waits for a child of its own.
        let (action, killed) = s
            .settle_sub_workflow(call.id, call.attempt, started + 60_000)
            .await
            .unwrap()
            .expect("settled");
        assert_eq!(action, SweepAction::TimeOut);
        assert_eq!(
            killed.iter().map(|k| k.instance_id).collect::<Vec<_>>(),
            vec![load.id]
        );
        assert_eq!(run_state(s, &first).await, RunState::Cancelled);
        let attempts = s.list_attempts(call.id).await.unwrap();
        assert_eq!(attempts[0].state, InstanceState::Timeout);
        assert_eq!(
            attempts[0].message,
            format!(
                "timed out: child run {} (child) still active after the task's timeout of \
                 60000 ms; the child run was cancelled",
                first.id.0
            )
        );
        let retry = s.get_instance(call.id).await.unwrap().unwrap();
        assert_eq!(
            (retry.state, retry.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        assert!(s.open_sub_workflow_waits(10).await.unwrap().is_empty());

        // The second attempt times out too: out of retries, the task and its run end so.
        let (call, second) = start_child(s, &run).await;
        assert_ne!(second.id, first.id);
        let started = call.started_at.expect("started");
        assert_eq!(
            s.settle_sub_workflow(call.id, call.attempt, started + 60_000)
                .await
                .unwrap()
                .map(|(action, _)| action),
            Some(SweepAction::TimeOut)
        );
        assert_eq!(state_of(s, call.id).await, InstanceState::Timeout);
        assert_eq!(run_state(s, &second).await, RunState::Cancelled);
        assert_eq!(run_state(s, &run).await, RunState::Failed);
    }
}
