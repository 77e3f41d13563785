//! Conformance scenarios of workflows applied as a set and deleted (`sql/workflow_sets.rs`): a
//! set is stored whole or not at all, a prune deletes only its app's workflows the set does not
//! name, a deleted workflow is gone from every read by name, list and schedule while its runs
//! stay, its name can be applied again as a new workflow, and a workflow with unfinished runs is
//! not deleted.

use std::collections::BTreeSet;

use ax_core::run::RunState;
use ax_core::spec::{ScheduleSpec, TriggerKind, WorkflowSpec};
use ax_core::state::Outcome;

use super::support::*;
use crate::*;

conformance!(
    a_set_is_stored_whole_and_prunes_only_its_app,
    a_prune_refused_by_an_unfinished_run_stores_nothing,
    a_deleted_workflow_is_gone_but_its_runs_stay_and_its_name_is_free,
    a_plan_reads_what_an_apply_would_do,
);

fn of_app(name: &str, app: &str) -> WorkflowSpec {
    let mut spec = spec(name, vec![task("a", &[])]);
    spec.app = app.into();
    spec
}

fn items(specs: &[WorkflowSpec]) -> Vec<BatchItem<'_>> {
    specs
        .iter()
        .map(|spec| BatchItem {
            spec,
            source: "src",
            next_fire_at: None,
        })
        .collect()
}

async fn live_names(s: &Store) -> Vec<String> {
    s.list_workflows(None)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.name)
        .collect()
}

mod scenarios {
    use super::*;

    pub(super) async fn a_set_is_stored_whole_and_prunes_only_its_app(ctx: Ctx) {
        let s = ctx.s();
        for spec in [
            of_app("old-sales", "sales"),
            of_app("kept-sales", "sales"),
            of_app("books", "finance"),
        ] {
            apply(s, &spec).await;
        }
        let mut changed = of_app("kept-sales", "sales");
        changed.tasks.push(task("b", &["a"]));
        let set = [changed, of_app("new-sales", "sales")];
        let answer = s
            .apply_workflow_set(&items(&set), Some("sales"), T0 + 10)
            .await
            .unwrap();
        let BatchApplied::Applied { applied, deleted } = answer else {
            panic!("refused: {answer:?}");
        };
        let outcomes: Vec<(&str, u32, ApplyOutcome)> = applied
            .iter()
            .map(|(w, o)| (w.name.as_str(), w.version, *o))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("kept-sales", 2, ApplyOutcome::Updated),
                ("new-sales", 1, ApplyOutcome::Created)
            ]
        );
        let deleted: Vec<(&str, &str, u32)> = deleted
            .iter()
            .map(|w| (w.name.as_str(), w.app.as_str(), w.version))
            .collect();
        assert_eq!(deleted, [("old-sales", "sales", 1)]);
        assert_eq!(live_names(s).await, ["books", "kept-sales", "new-sales"]);

        // Applied again, nothing changes and nothing more goes.
        let again = s
            .apply_workflow_set(&items(&set), Some("sales"), T0 + 20)
            .await
            .unwrap();
        let BatchApplied::Applied { applied, deleted } = again else {
            panic!("refused: {again:?}");
        };
        assert!(applied.iter().all(|(_, o)| *o == ApplyOutcome::Unchanged));
        assert!(deleted.is_empty());
    }

    pub(super) async fn a_prune_refused_by_an_unfinished_run_stores_nothing(ctx: Ctx) {
        let s = ctx.s();
        let busy = apply(s, &of_app("busy", "sales")).await;
        apply(s, &of_app("idle", "sales")).await;
        let run = start_run(s, &busy).await;
        let plan = s.plan_prune("sales", &BTreeSet::new()).await.unwrap();
        assert_eq!(
            plan.gone
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>(),
            ["busy", "idle"]
        );
        assert_eq!(
            plan.busy,
            [BusyWorkflow {
                name: "busy".into(),
                runs: vec![(run.id, RunState::Running)]
            }]
        );

        let set = [of_app("fresh", "sales")];
        let answer = s
            .apply_workflow_set(&items(&set), Some("sales"), T0 + 10)
            .await
            .unwrap();
        assert_eq!(answer, BatchApplied::Busy(plan.busy.clone()));
        assert_eq!(live_names(s).await, ["busy", "idle"], "nothing stored");

        // Once the run has ended, the same set goes through.
        run_task(s, run.id, "a", Outcome::Success).await;
        let answer = s
            .apply_workflow_set(&items(&set), Some("sales"), T0 + 20)
            .await
            .unwrap();
        assert!(matches!(answer, BatchApplied::Applied { .. }), "{answer:?}");
        assert_eq!(live_names(s).await, ["fresh"]);
    }

    pub(super) async fn a_deleted_workflow_is_gone_but_its_runs_stay_and_its_name_is_free(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let mut cron = of_app("nightly", "sales");
        cron.schedule = ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("0 0 2 * * *".into()),
            ..ScheduleSpec::default()
        };
        let (wf, _) = s
            .apply_workflow(&cron, "v1", Some(T0 + 1_000), T0)
            .await
            .unwrap();
        let mut dependent = of_app("report", "sales");
        dependent.schedule = ScheduleSpec {
            trigger: TriggerKind::Dependency,
            after: vec!["nightly".into()],
            ..ScheduleSpec::default()
        };
        let mut upstream_of_nightly = cron.clone();
        upstream_of_nightly.schedule = ScheduleSpec {
            trigger: TriggerKind::Dependency,
            after: vec!["report-src".into()],
            ..ScheduleSpec::default()
        };
        apply(s, &dependent).await;
        let run = start_run(s, &wf).await;

        // Refused while its run is unfinished, and nothing changes.
        let refused = s.delete_workflow(wf.id, T0 + 2).await.unwrap();
        assert_eq!(
            refused,
            Deleted::Busy(BusyWorkflow {
                name: "nightly".into(),
                runs: vec![(run.id, RunState::Running)]
            })
        );
        assert!(s.get_workflow("nightly").await.unwrap().is_some());
        run_task(s, run.id, "a", Outcome::Success).await;

        let deleted = s.delete_workflow(wf.id, T0 + 3).await.unwrap();
        assert_eq!(
            deleted,
            Deleted::Deleted(GoneWorkflow {
                id: wf.id,
                name: "nightly".into(),
                app: "sales".into(),
                version: 1
            })
        );
        assert_eq!(
            s.delete_workflow(wf.id, T0 + 4).await.unwrap(),
            Deleted::NotFound
        );
        assert!(s.workflow_deleted(wf.id).await.unwrap());
        // Gone from every read by name, list and schedule.
        assert!(s.get_workflow("nightly").await.unwrap().is_none());
        assert!(s.latest_version("nightly").await.unwrap().is_none());
        assert_eq!(live_names(s).await, ["report"]);
        assert!(
            s.list_workflow_heads(Some("sales"))
                .await
                .unwrap()
                .iter()
                .all(|h| h.name != "nightly")
        );
        assert!(s.due_schedules(T0 + 10_000, 10).await.unwrap().is_empty());
        assert!(s.schedule_next_fire(wf.id).await.unwrap().is_none());
        assert!(
            s.set_paused("nightly", true, None, T0 + 5)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            s.list_runs(Some("nightly"), None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // Its history stays: the run, its version, and its place among the heads of history.
        let kept = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (kept.workflow.as_str(), kept.state),
            ("nightly", RunState::Success)
        );
        assert!(s.get_workflow_version(wf.id, 1).await.unwrap().is_some());
        assert!(
            s.history_heads(Some("sales"))
                .await
                .unwrap()
                .iter()
                .any(|h| h.id == wf.id)
        );
        // A new run of it is refused.
        assert!(s.create_run(&new_run(&wf, None)).await.is_err());
        // The dependent's edge stays (it names a workflow that does not exist now).
        let edges = s.workflow_dependencies().await.unwrap();
        assert_eq!(edges.get("report"), Some(&vec!["nightly".to_string()]));

        // The name is free: applied again, it is a new workflow with no runs.
        let (again, outcome) = s
            .apply_workflow(&upstream_of_nightly, "v1 again", None, T0 + 6)
            .await
            .unwrap();
        assert_eq!((outcome, again.version), (ApplyOutcome::Created, 1));
        assert_ne!(again.id, wf.id);
        assert!(
            s.list_runs(Some("nightly"), None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let edges = s.workflow_dependencies().await.unwrap();
        assert_eq!(edges.get("nightly"), Some(&vec!["report-src".to_string()]));
        // Deleted again, its `after` edges go with it.
        assert!(matches!(
            s.delete_workflow(again.id, T0 + 7).await.unwrap(),
            Deleted::Deleted(_)
        ));
        assert!(
            !s.workflow_dependencies()
                .await
                .unwrap()
                .contains_key("nightly")
        );
    }

    pub(super) async fn a_plan_reads_what_an_apply_would_do(ctx: Ctx) {
        let s = ctx.s();
        let same = of_app("same", "sales");
        let (stored, _) = s.apply_workflow(&same, "same v1", None, T0).await.unwrap();
        let mut changed = of_app("changed", "sales");
        s.apply_workflow(&changed, "changed v1", None, T0)
            .await
            .unwrap();
        changed.tasks.push(task("b", &["a"]));
        let new = of_app("new", "sales");
        let planned = s.plan_apply(&[&same, &changed, &new]).await.unwrap();
        assert_eq!(
            planned,
            [
                PlannedApply {
                    outcome: ApplyOutcome::Unchanged,
                    stored: Some((1, "same v1".into()))
                },
                PlannedApply {
                    outcome: ApplyOutcome::Updated,
                    stored: Some((1, "changed v1".into()))
                },
                PlannedApply {
                    outcome: ApplyOutcome::Created,
                    stored: None
                },
            ]
        );
        // A plan writes nothing.
        assert_eq!(s.get_workflow("changed").await.unwrap().unwrap().version, 1);
        assert!(s.get_workflow("new").await.unwrap().is_none());
        assert_eq!(stored.version, 1);
    }
}
