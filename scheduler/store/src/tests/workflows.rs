//! Conformance scenarios of workflows and their schedules: a version is added only when the
//! spec changed, heads list without specs, due schedules advance conditionally, and pause and
//! resume keep across versions (`sql/workflows.rs`).

use ax_core::run::RunState;
use ax_core::spec::{ScheduleSpec, TriggerKind};
use ax_core::state::Outcome;

use super::support::*;
use crate::*;

conformance!(
    workflow_heads_are_the_listed_workflows_without_their_specs,
    apply_creates_then_keeps_then_updates_versions,
    schedules_are_due_and_advance_conditionally,
    pause_and_resume_keep_across_versions,
);

mod scenarios {
    use super::*;

    pub(super) async fn workflow_heads_are_the_listed_workflows_without_their_specs(ctx: Ctx) {
        let s = ctx.s();
        let a = spec("b-second", vec![task("a", &[])]);
        let mut b = spec("a-first", vec![task("a", &[])]);
        b.app = "sales".into();
        apply(s, &a).await;
        apply(s, &b).await;
        let mut b2 = b.clone();
        b2.tasks.push(task("c", &["a"]));
        s.apply_workflow(&b2, "v2", None, T0 + 5).await.unwrap();
        s.set_paused("b-second", true, None, T0 + 6).await.unwrap();
        let heads = s.list_workflow_heads(None).await.unwrap();
        let listed = s.list_workflows(None).await.unwrap();
        assert_eq!(heads.len(), 2);
        for (head, record) in heads.iter().zip(&listed) {
            assert_eq!(
                (
                    head.id,
                    &head.name,
                    head.version,
                    head.paused,
                    head.created_at,
                    head.updated_at
                ),
                (
                    record.id,
                    &record.name,
                    record.version,
                    record.paused,
                    record.created_at,
                    record.updated_at
                )
            );
        }
        let names: Vec<(&str, u32, bool)> = heads
            .iter()
            .map(|h| (h.name.as_str(), h.version, h.paused))
            .collect();
        assert_eq!(names, vec![("a-first", 2, false), ("b-second", 1, true)]);
        let sales = s.list_workflow_heads(Some("sales")).await.unwrap();
        assert_eq!(sales.len(), 1);
        assert_eq!(sales[0].name, "a-first");
    }

    pub(super) async fn apply_creates_then_keeps_then_updates_versions(ctx: Ctx) {
        let s = ctx.s();
        let v1 = spec("daily", vec![task("a", &[]), task("b", &["a"])]);
        let (rec, outcome) = s.apply_workflow(&v1, "file v1", None, T0).await.unwrap();
        assert_eq!(outcome, ApplyOutcome::Created);
        assert_eq!(
            (rec.version, rec.name.as_str(), rec.source.as_str()),
            (1, "daily", "file v1")
        );
        assert_eq!(rec.spec, v1);
        assert!(!rec.paused);

        let (same, outcome) = s
            .apply_workflow(&v1, "file v1 again", None, T0 + 1)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Unchanged);
        assert_eq!(
            (same.id, same.version, same.source.as_str()),
            (rec.id, 1, "file v1")
        );

        let mut v2 = v1.clone();
        v2.tasks.push(task("c", &["a", "b"]));
        let (rec2, outcome) = s
            .apply_workflow(&v2, "file v2", None, T0 + 2)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Updated);
        assert_eq!((rec2.id, rec2.version), (rec.id, 2));
        assert_eq!(rec2.updated_at, T0 + 2);

        let latest = s.get_workflow("daily").await.unwrap().unwrap();
        assert_eq!((latest.version, latest.spec.tasks.len()), (2, 3));
        let old = s.get_workflow_version(rec.id, 1).await.unwrap().unwrap();
        assert_eq!(
            (old.version, old.spec.clone(), old.source.as_str()),
            (1, v1, "file v1")
        );
        assert!(s.get_workflow_version(rec.id, 3).await.unwrap().is_none());
        assert!(s.get_workflow("nope").await.unwrap().is_none());

        s.apply_workflow(&spec("other", vec![task("x", &[])]), "", None, T0)
            .await
            .unwrap();
        let mut misc = spec("zeta", vec![task("x", &[])]);
        misc.app = "misc".into();
        s.apply_workflow(&misc, "", None, T0).await.unwrap();
        let names: Vec<String> = s
            .list_workflows(None)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["daily", "other", "zeta"]);
        let etl: Vec<String> = s
            .list_workflows(Some("etl"))
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(etl, ["daily", "other"]);

        // Runs of version 1 still see version 1's DAG after the update.
        let run = start_run(s, &old).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        run_task(s, run.id, "b", Outcome::Success).await;
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run.state, RunState::Success);
    }

    pub(super) async fn schedules_are_due_and_advance_conditionally(ctx: Ctx) {
        let s = ctx.s();
        let mut cron = spec("nightly", vec![task("a", &[])]);
        cron.schedule = ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("0 0 2 * * *".into()),
            timezone: "Asia/Shanghai".into(),
            ..ScheduleSpec::default()
        };
        let (wf, _) = s
            .apply_workflow(&cron, "", Some(T0 + 1_000), T0)
            .await
            .unwrap();
        s.apply_workflow(&spec("manual", vec![task("a", &[])]), "", None, T0)
            .await
            .unwrap();
        let mut later = cron.clone();
        later.name = "later".into();
        s.apply_workflow(&later, "", Some(T0 + 5_000), T0)
            .await
            .unwrap();

        assert!(s.due_schedules(T0 + 999, 10).await.unwrap().is_empty());
        let due = s.due_schedules(T0 + 1_000, 10).await.unwrap();
        assert_eq!(
            due,
            [DueSchedule {
                workflow_id: wf.id,
                workflow: "nightly".into(),
                workflow_version: 1,
                cron: "0 0 2 * * *".into(),
                timezone: "Asia/Shanghai".into(),
                next_fire_at: T0 + 1_000,
            }]
        );
        assert_eq!(s.due_schedules(T0 + 10_000, 10).await.unwrap().len(), 2);
        assert_eq!(s.due_schedules(T0 + 10_000, 1).await.unwrap().len(), 1);

        assert!(
            s.advance_schedule(wf.id, T0 + 1_000, T0 + 2_000)
                .await
                .unwrap()
        );
        assert!(
            !s.advance_schedule(wf.id, T0 + 1_000, T0 + 3_000)
                .await
                .unwrap(),
            "someone else advanced it"
        );
        let due = s.due_schedules(T0 + 2_000, 10).await.unwrap();
        assert_eq!(due[0].next_fire_at, T0 + 2_000);
        // In a group, each move is conditional on its own.
        assert_eq!(
            s.advance_schedules(&[
                (wf.id, T0 + 2_000, T0 + 2_500),
                (wf.id, T0 + 2_000, T0 + 9_000)
            ])
            .await
            .unwrap(),
            [true, false]
        );
        assert!(
            s.advance_schedule(wf.id, T0 + 2_500, T0 + 2_000)
                .await
                .unwrap()
        );

        // An unchanged apply keeps the stored fire time; a new version replaces it and is the
        // version a due schedule names.
        s.apply_workflow(&cron, "", Some(T0 + 50_000), T0)
            .await
            .unwrap();
        assert_eq!(s.due_schedules(T0 + 2_000, 10).await.unwrap().len(), 1);
        let mut v2 = cron.clone();
        v2.tasks.push(task("b", &["a"]));
        s.apply_workflow(&v2, "", Some(T0 + 3_000), T0)
            .await
            .unwrap();
        assert!(
            s.due_schedules(T0 + 2_999, 10)
                .await
                .unwrap()
                .iter()
                .all(|d| d.workflow != "nightly")
        );
        let due = s.due_schedules(T0 + 3_000, 10).await.unwrap();
        let nightly = due.iter().find(|d| d.workflow == "nightly").unwrap();
        assert_eq!(
            (nightly.workflow_version, nightly.next_fire_at),
            (2, T0 + 3_000)
        );
    }

    pub(super) async fn pause_and_resume_keep_across_versions(ctx: Ctx) {
        let s = ctx.s();
        let mut cron = spec("nightly", vec![task("a", &[])]);
        cron.schedule = ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("0 * * * *".into()),
            timezone: "UTC".into(),
            ..ScheduleSpec::default()
        };
        s.apply_workflow(&cron, "", Some(T0), T0).await.unwrap();
        let paused = s
            .set_paused("nightly", true, None, T0 + 1)
            .await
            .unwrap()
            .unwrap();
        assert!(paused.paused);
        assert_eq!(paused.updated_at, T0 + 1);
        assert!(s.due_schedules(T0 + 10, 10).await.unwrap().is_empty());
        let mut v2 = cron.clone();
        v2.description = "changed".into();
        let (rec, outcome) = s
            .apply_workflow(&v2, "", Some(T0 + 5), T0 + 2)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Updated);
        assert!(rec.paused, "pausing keeps across versions");
        assert!(s.due_schedules(T0 + 10, 10).await.unwrap().is_empty());
        let resumed = s
            .set_paused("nightly", false, Some(T0 + 100), T0 + 3)
            .await
            .unwrap()
            .unwrap();
        assert!(!resumed.paused);
        assert!(s.due_schedules(T0 + 99, 10).await.unwrap().is_empty());
        assert_eq!(
            s.due_schedules(T0 + 100, 10).await.unwrap()[0].next_fire_at,
            T0 + 100
        );
        assert!(
            s.set_paused("ghost", true, None, T0)
                .await
                .unwrap()
                .is_none()
        );
        assert!(!s.list_workflows(None).await.unwrap()[0].paused);
    }
}
