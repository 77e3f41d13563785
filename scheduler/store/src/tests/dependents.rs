//! Conformance scenarios of dependencies between workflows: a dependent fires once every
//! upstream succeeded for a logical time, records why it did not while paused, and is created
//! once when its upstreams succeed at once (`sql/dependents.rs`).

use std::collections::{BTreeMap, BTreeSet};

use ax_core::decision::DecisionKind;
use ax_core::run::RunState;
use ax_core::spec::{TriggerKind, WorkflowSpec};
use ax_core::state::Outcome;

use super::support::*;
use crate::*;

conformance!(
    a_dependent_fires_once_every_upstream_succeeded_for_the_logical_time,
    a_paused_dependent_records_paused_and_creates_nothing,
    concurrent_upstream_successes_create_one_dependent_run,
);

mod scenarios {
    use super::*;

    fn after(name: &str, upstreams: &[&str]) -> WorkflowSpec {
        let mut s = spec(name, vec![task("only", &[])]);
        s.schedule.trigger = TriggerKind::Dependency;
        s.schedule.after = upstreams.iter().map(|u| u.to_string()).collect();
        s
    }

    /// Runs every task of a one-task workflow's new run to success; returns the run.
    async fn succeed_once(s: &Store, wf: &WorkflowRecord) -> RunRecord {
        let (run, created) = s.create_run(&new_run(wf, None)).await.unwrap();
        assert!(created);
        let done = run_task(s, run.id, "only", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        run
    }

    async fn runs_of(s: &Store, workflow: &str) -> Vec<RunRecord> {
        s.list_runs(Some(workflow), None, None, 100).await.unwrap()
    }

    async fn kinds(s: &Store, wf: &WorkflowRecord) -> Vec<(DecisionKind, String)> {
        s.list_decisions(wf.id, T0 - 1, T0 + 1, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.kind, d.detail))
            .collect()
    }

    pub(super) async fn a_dependent_fires_once_every_upstream_succeeded_for_the_logical_time(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let a = apply(s, &spec("ingest", vec![task("only", &[])])).await;
        let b = apply(s, &spec("dims", vec![task("only", &[])])).await;
        let d = apply(s, &after("report", &["ingest", "dims"])).await;
        assert_eq!(
            s.workflow_dependencies().await.unwrap(),
            BTreeMap::from([(
                "report".to_string(),
                vec!["ingest".to_string(), "dims".to_string()]
            )])
        );

        let a_run = succeed_once(s, &a).await;
        assert!(runs_of(s, "report").await.is_empty(), "dims has not run");
        assert_eq!(
            kinds(s, &d).await,
            vec![(
                DecisionKind::WaitingUpstream,
                format!(
                    "waiting for dims to succeed for logical time {}",
                    ax_core::rfc3339(T0)
                )
            )]
        );

        let b_run = succeed_once(s, &b).await;
        let runs = runs_of(s, "report").await;
        assert_eq!(runs.len(), 1);
        let r = &runs[0];
        assert_eq!(
            (r.trigger, r.logical_time, r.state),
            (TriggerKind::Dependency, T0, RunState::Running)
        );
        assert!(r.params.is_empty());
        assert_eq!(
            r.triggered_by,
            format!("ingest run {}, dims run {}", a_run.id, b_run.id)
        );
        assert_eq!(
            tasks_of(s, r.id).await,
            BTreeSet::from(["only".to_string()])
        );
        let decisions = s.list_decisions(d.id, T0, T0, 10).await.unwrap();
        let fired = decisions.last().unwrap();
        assert_eq!(
            (fired.kind, fired.run_id),
            (DecisionKind::Fired, Some(r.id))
        );

        // Another success of an upstream for the same logical time creates nothing more.
        succeed_once(s, &a).await;
        succeed_once(s, &b).await;
        assert_eq!(runs_of(s, "report").await.len(), 1);

        // The dependent's own success goes on down a chain.
        let e = apply(s, &after("publish", &["report"])).await;
        let done = run_task(s, r.id, "only", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((r.id, RunState::Success)));
        let published = runs_of(s, "publish").await;
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].workflow_id, e.id);
    }

    pub(super) async fn a_paused_dependent_records_paused_and_creates_nothing(ctx: Ctx) {
        let s = ctx.s();
        let a = apply(s, &spec("ingest", vec![task("only", &[])])).await;
        // Applied before its upstream exists is fine: it waits for it by name.
        let d = apply(s, &after("report", &["ingest", "later"])).await;
        s.set_paused("report", true, None, T0).await.unwrap();
        succeed_once(s, &a).await;
        assert!(runs_of(s, "report").await.is_empty());
        assert_eq!(kinds(s, &d).await[0].0, DecisionKind::Paused);

        s.set_paused("report", false, None, T0).await.unwrap();
        succeed_once(s, &a).await;
        assert!(runs_of(s, "report").await.is_empty());
        assert_eq!(
            kinds(s, &d).await[1],
            (
                DecisionKind::WaitingUpstream,
                format!(
                    "waiting for later to succeed for logical time {}",
                    ax_core::rfc3339(T0)
                )
            )
        );
        // Re-applied without `after`, it is no longer a dependent.
        apply(s, &spec("report", vec![task("only", &[])])).await;
        assert!(s.workflow_dependencies().await.unwrap().is_empty());
        succeed_once(s, &a).await;
        assert_eq!(kinds(s, &d).await.len(), 2);
    }

    pub(super) async fn concurrent_upstream_successes_create_one_dependent_run(ctx: Ctx) {
        let s = ctx.s();
        let names: Vec<String> = (0..6).map(|i| format!("up{i}")).collect();
        let mut upstreams = Vec::new();
        for name in &names {
            upstreams.push(apply(s, &spec(name, vec![task("only", &[])])).await);
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let d = apply(s, &after("joined", &refs)).await;
        for round in 0..3i64 {
            let logical = T0 + round * 1000;
            let mut running = Vec::new();
            for wf in &upstreams {
                let (run, _) = s
                    .create_run(&NewRun {
                        logical_time: logical,
                        ..new_run(wf, None)
                    })
                    .await
                    .unwrap();
                running.push(launch(s, run.id, "only").await);
            }
            finish_at_once(&ctx.store, running).await;
            let runs: Vec<RunRecord> = runs_of(s, "joined")
                .await
                .into_iter()
                .filter(|r| r.logical_time == logical)
                .collect();
            assert_eq!(runs.len(), 1, "round {round}: exactly one dependent run");
            let decisions = s.list_decisions(d.id, logical, logical, 100).await.unwrap();
            let fired: Vec<_> = decisions
                .iter()
                .filter(|x| x.kind == DecisionKind::Fired)
                .collect();
            assert_eq!(fired.len(), 1, "round {round}: {decisions:?}");
            assert_eq!(fired[0].run_id, Some(runs[0].id));
            assert_eq!(
                decisions.len(),
                names.len(),
                "one decision per upstream success: the others waited"
            );
        }
    }
}
