//! DAG semantics: rerun from a task, cross-workflow dependencies.

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

pub(in crate::tests) async fn rerun_from_a_task_reruns_it_and_its_downstream_keeping_history(
    ctx: Ctx,
) {
    let s = ctx.s();
    // a → b → c, and a → side.
    let wf = apply(
        s,
        &spec(
            "wf",
            vec![
                task("a", &[]),
                task("b", &["a"]),
                task("c", &["b"]),
                task("side", &["a"]),
            ],
        ),
    )
    .await;
    let run = start_run(s, &wf).await;
    for t in ["a", "b", "side", "c"] {
        run_task(s, run.id, t, Outcome::Success).await;
    }
    assert_eq!(
        s.get_run(run.id).await.unwrap().unwrap().state,
        RunState::Success
    );
    let b = instance_of(s, run.id, "b").await.unwrap();
    let c = instance_of(s, run.id, "c").await.unwrap();

    let answer = s.rerun_from(run.id, "b", T0 + 100).await.unwrap();
    assert_eq!(
        answer,
        RerunFrom::Rerun {
            again: b.id,
            pending: vec![c.id]
        }
    );
    assert_eq!(
        s.get_run(run.id).await.unwrap().unwrap().state,
        RunState::Running
    );
    let b2 = s.get_instance(b.id).await.unwrap().unwrap();
    assert_eq!((b2.state, b2.attempt), (InstanceState::Waiting, Attempt(2)));
    let c2 = s.get_instance(c.id).await.unwrap().unwrap();
    assert_eq!((c2.state, c2.attempt), (InstanceState::Pending, Attempt(1)));
    for untouched in ["a", "side"] {
        let i = instance_of(s, run.id, untouched).await.unwrap();
        assert_eq!((i.state, i.attempt), (InstanceState::Success, Attempt(1)));
    }
    // PENDING is shown as not created, and does not keep the run from ending.
    assert_eq!(s.run_counts(run.id).await.unwrap().not_created, 1);

    let done_b = run_task(s, run.id, "b", Outcome::Success).await;
    assert_eq!(done_b.new_waiting, 1, "c woke as its next attempt");
    let c3 = s.get_instance(c.id).await.unwrap().unwrap();
    assert_eq!((c3.state, c3.attempt), (InstanceState::Waiting, Attempt(2)));
    let done_c = run_task(s, run.id, "c", Outcome::Success).await;
    assert_eq!(done_c.run_finished, Some((run.id, RunState::Success)));

    for id in [b.id, c.id] {
        let attempts = s.list_attempts(id).await.unwrap();
        let states: Vec<_> = attempts.iter().map(|a| (a.attempt.0, a.state)).collect();
        assert_eq!(
            states,
            vec![(1, InstanceState::Success), (2, InstanceState::Success)],
            "the first attempt keeps its record"
        );
    }
}

pub(in crate::tests) async fn a_rerun_task_that_fails_again_fails_the_run_with_the_rest_pending(
    ctx: Ctx,
) {
    let s = ctx.s();
    let wf = apply(
        s,
        &spec(
            "wf",
            vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])],
        ),
    )
    .await;
    let run = start_run(s, &wf).await;
    for t in ["a", "b", "c"] {
        run_task(s, run.id, t, Outcome::Success).await;
    }
    let RerunFrom::Rerun { pending, .. } = s.rerun_from(run.id, "a", T0 + 100).await.unwrap()
    else {
        panic!("rerun refused")
    };
    assert_eq!(pending.len(), 2, "b and c wait again");
    let failed = run_task(s, run.id, "a", Outcome::Failed).await;
    assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));
    let counts = s.run_counts(run.id).await.unwrap();
    assert_eq!((counts.failed, counts.not_created), (1, 2));
    for t in ["b", "c"] {
        let i = instance_of(s, run.id, t).await.unwrap();
        assert_eq!((i.state, i.attempt), (InstanceState::Pending, Attempt(1)));
    }
    // The failed part reruns, and the PENDING ones follow it.
    assert_eq!(
        s.rerun_failed(run.id, T0 + 200)
            .await
            .unwrap()
            .map(|v| v.retried.len()),
        Some(1)
    );
    run_task(s, run.id, "a", Outcome::Success).await;
    run_task(s, run.id, "b", Outcome::Success).await;
    let last = run_task(s, run.id, "c", Outcome::Success).await;
    assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
}

pub(in crate::tests) async fn rerun_from_refuses_unknown_tasks_and_active_instances(ctx: Ctx) {
    let s = ctx.s();
    let wf = apply(
        s,
        &spec(
            "wf",
            vec![task("a", &[]), task("b", &["a"]), task("c", &["b"])],
        ),
    )
    .await;
    let run = start_run(s, &wf).await;
    assert_eq!(
        s.rerun_from(RunId(987_654), "a", T0).await.unwrap(),
        RerunFrom::RunNotFound
    );
    assert_eq!(
        s.rerun_from(run.id, "nope", T0).await.unwrap(),
        RerunFrom::UnknownTask {
            tasks: vec!["a".into(), "b".into(), "c".into()]
        }
    );
    run_task(s, run.id, "a", Outcome::Success).await;
    let b = launch(s, run.id, "b").await;
    // a is done but b, below it, is running: refused, nothing changes.
    assert_eq!(
        s.rerun_from(run.id, "a", T0).await.unwrap(),
        RerunFrom::Active {
            busy: vec![("b".into(), InstanceState::Running)]
        }
    );
    let a = instance_of(s, run.id, "a").await.unwrap();
    assert_eq!((a.state, a.attempt), (InstanceState::Success, Attempt(1)));
    // c never ran: nothing to run again.
    assert_eq!(
        s.rerun_from(run.id, "c", T0).await.unwrap(),
        RerunFrom::NotRun { state: None }
    );
    let results = s
        .apply_reports(&[finished(b.id, 1, Outcome::Failed, 1)], T0 + 40)
        .await
        .unwrap();
    assert_eq!(
        applied(&results[0]).run_finished,
        Some((run.id, RunState::Failed))
    );
    // A failed task can be rerun from too.
    assert!(matches!(
        s.rerun_from(run.id, "b", T0 + 50).await.unwrap(),
        RerunFrom::Rerun { pending, .. } if pending.is_empty()
    ));
}

pub(in crate::tests) async fn a_dependent_fires_once_every_upstream_succeeded_for_the_logical_time(
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

pub(in crate::tests) async fn a_paused_dependent_records_paused_and_creates_nothing(ctx: Ctx) {
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

pub(in crate::tests) async fn concurrent_upstream_successes_create_one_dependent_run(ctx: Ctx) {
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
