//! Conformance scenarios of what the bounds on waiting instances read and write: WAITING
//! instances counted in total and by app (`Store::waiting_counts`), and the
//! `admitted_over_bound` decision a run that is never refused gets in its own transaction when
//! the node's bounds say it is past one (`Store::set_waiting_bounds`), for a cron fire, a
//! dependency fire and a group of fires, never for a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ax_core::Millis;
use ax_core::admission::{Bound, Past};
use ax_core::decision::DecisionKind;
use ax_core::ids::WorkflowId;
use ax_core::spec::TriggerKind;
use ax_core::state::Outcome;

use super::support::*;
use crate::*;

conformance!(
    waiting_instances_are_counted_in_total_and_by_app,
    a_fact_past_a_bound_is_created_with_its_decision_and_a_request_without,
);

mod scenarios {
    use super::*;

    /// Bounds that put app `etl` past its bound while `past` holds, and nothing else.
    struct EtlPast {
        past: AtomicBool,
    }

    impl WaitingBounds for EtlPast {
        fn past_bound(&self, app: &str, _trigger: TriggerKind, _now: Millis) -> Option<Past> {
            (app == "etl" && self.past.load(Ordering::Relaxed)).then_some(Past {
                bound: Bound::App,
                waiting: 7,
                limit: 5,
            })
        }

        fn node_id(&self) -> &str {
            "node-a"
        }
    }

    pub(super) async fn waiting_instances_are_counted_in_total_and_by_app(ctx: Ctx) {
        let s = ctx.s();
        assert_eq!(
            s.waiting_counts(true).await.unwrap(),
            WaitingCounts::default()
        );
        let etl = apply(
            s,
            &spec(
                "load",
                vec![task("a", &[]), task("b", &[]), task("c", &["a"])],
            ),
        )
        .await;
        let mut web_spec = spec("page", vec![task("only", &[])]);
        web_spec.app = "web".into();
        let web = apply(s, &web_spec).await;
        let mut loose_spec = spec("loose", vec![task("only", &[])]);
        loose_spec.app = String::new();
        let loose = apply(s, &loose_spec).await;
        for _ in 0..3 {
            s.create_run(&manual(&etl)).await.unwrap();
        }
        s.create_run(&manual(&web)).await.unwrap();
        s.create_run(&manual(&loose)).await.unwrap();
        // Two roots per etl run; a started instance no longer waits.
        let run = start_run(s, &web).await;
        run_task(s, run.id, "only", Outcome::Success).await;

        let counts = s.waiting_counts(true).await.unwrap();
        assert_eq!(counts.total, 8);
        assert_eq!(
            counts.by_app,
            [
                ("etl".to_string(), 6),
                ("web".to_string(), 1),
                (String::new(), 1)
            ]
            .into_iter()
            .collect()
        );
        let total_only = s.waiting_counts(false).await.unwrap();
        assert_eq!((total_only.total, total_only.by_app.len()), (8, 0));
    }

    pub(super) async fn a_fact_past_a_bound_is_created_with_its_decision_and_a_request_without(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let etl = apply(s, &spec("load", vec![task("only", &[])])).await;
        let mut web_spec = spec("page", vec![task("only", &[])]);
        web_spec.app = "web".into();
        let web = apply(s, &web_spec).await;
        let bounds = Arc::new(EtlPast {
            past: AtomicBool::new(true),
        });
        assert!(s.set_waiting_bounds(bounds.clone()));
        assert!(!s.set_waiting_bounds(bounds.clone()), "set once");

        let fire = |wf: &WorkflowRecord, slot: Millis| NewRun {
            trigger: TriggerKind::Cron,
            logical_time: slot,
            dedup_key: Some(format!("cron:{slot}")),
            ..manual(wf)
        };
        // A group: a request and two fires of etl, a fire of web (within its bounds).
        let group = [
            manual(&etl),
            fire(&etl, T0),
            fire(&etl, T0 + 1_000),
            fire(&web, T0),
        ];
        let created = s.create_runs(&group).await.unwrap();
        assert!(created.iter().all(|(_, new)| *new));
        let decisions = |wf: WorkflowId| async move {
            s.list_decisions(wf, T0 - 10_000, T0 + 10_000, 100)
                .await
                .unwrap()
                .into_iter()
                .filter(|d| d.kind == DecisionKind::AdmittedOverBound)
                .collect::<Vec<_>>()
        };
        let etl_decisions = decisions(etl.id).await;
        assert_eq!(
            etl_decisions
                .iter()
                .map(|d| (d.run_id, d.slot_at, d.node_id.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (Some(created[1].0.id), T0, "node-a"),
                (Some(created[2].0.id), T0 + 1_000, "node-a"),
            ]
        );
        assert_eq!(
            etl_decisions[0].detail,
            "admitted past the bound on waiting instances: 7 instances of app \"etl\" were waiting \
             (bound 5 per app); a cron fire is never refused"
        );
        assert!(decisions(web.id).await.is_empty());

        // A fire found already there is not decided again.
        let (_, new) = s.create_run(&fire(&etl, T0)).await.unwrap();
        assert!(!new);
        assert_eq!(decisions(etl.id).await.len(), 2);

        // A dependency fire at an upstream's end, in the end's transaction.
        let mut after = spec("report", vec![task("only", &[])]);
        after.schedule.trigger = TriggerKind::Dependency;
        after.schedule.after = vec!["page".into()];
        let report = apply(s, &after).await;
        let upstream = start_run(s, &web).await;
        run_task(s, upstream.id, "only", Outcome::Success).await;
        let fired = decisions(report.id).await;
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert!(
            fired[0]
                .detail
                .ends_with("a dependency fire is never refused"),
            "{}",
            fired[0].detail
        );

        // Within the bounds nothing is said.
        bounds.past.store(false, Ordering::Relaxed);
        s.create_run(&fire(&etl, T0 + 2_000)).await.unwrap();
        assert_eq!(decisions(etl.id).await.len(), 2);
    }
}
