//! Conformance scenario of the decision log, read back by workflow and slot
//! (`sql/decisions.rs`).

use ax_core::decision::DecisionKind;
use ax_core::ids::{InstanceId, RunId};

use super::support::*;
use crate::*;

conformance!(decisions_round_trip_by_workflow_and_slot);

mod scenarios {
    use super::*;

    pub(super) async fn decisions_round_trip_by_workflow_and_slot(ctx: Ctx) {
        let s = ctx.s();
        let a = apply(s, &spec("a", vec![task("t", &[])])).await;
        let b = apply(s, &spec("b", vec![task("t", &[])])).await;
        let decision = |wf: &WorkflowRecord, slot_at, kind, detail: &str| DecisionRecord {
            at: T0 + 100,
            workflow_id: wf.id,
            slot_at,
            run_id: None,
            instance_id: None,
            task: None,
            kind,
            detail: detail.into(),
            node_id: "sched-a".into(),
        };
        let fired = DecisionRecord {
            run_id: Some(RunId(7)),
            instance_id: Some(InstanceId(9)),
            task: Some("t".into()),
            ..decision(&a, T0, DecisionKind::Fired, "cron slot")
        };
        let later = decision(
            &a,
            T0 + 60_000,
            DecisionKind::SkippedOverlap,
            "run 7 active",
        );
        let earlier = decision(&a, T0 - 60_000, DecisionKind::Misfired, "scheduler down");
        let other = decision(&b, T0, DecisionKind::NoWorker, "no worker with gpu=a100");
        s.record_decisions(&[later.clone(), fired.clone(), other.clone(), earlier.clone()])
            .await
            .unwrap();
        s.record_decisions(&[]).await.unwrap();
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0 + 60_000, 10)
                .await
                .unwrap(),
            [earlier.clone(), fired.clone(), later]
        );
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0, 10).await.unwrap(),
            [earlier.clone(), fired]
        );
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0 + 60_000, 1)
                .await
                .unwrap(),
            [earlier]
        );
        assert_eq!(
            s.list_decisions(b.id, 0, i64::MAX, 10).await.unwrap(),
            [other]
        );
    }
}
