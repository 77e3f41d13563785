//! A store on a multi-primary cluster member writes the rows it decides on under a lock
//! (`sql/engine.rs`): run MySQL as Galera would be run and read `lock_version` after each kind
//! of decision. A single server writes none of them.

use super::support::{Ctx, T0, apply, launch, on_backend, spec, start_run, task};
use crate::*;
use ax_core::ids::RunId;
use ax_core::spec::WorkflowSpec;
use ax_core::state::Outcome;

fn capped(name: &str) -> WorkflowSpec {
    let mut spec = spec(name, vec![task("a", &[]), task("b", &[])]);
    spec.schedule.max_active_runs = 1;
    spec
}

async fn workflow_version(ctx: &Ctx, name: &str) -> i64 {
    sqlx::query_scalar("SELECT lock_version FROM workflow WHERE name = ?")
        .bind(name)
        .fetch_one(&ctx.store.pool)
        .await
        .expect("workflow lock_version")
}

async fn run_version(ctx: &Ctx, run: RunId) -> i64 {
    sqlx::query_scalar("SELECT lock_version FROM run WHERE id = ?")
        .bind(run.0)
        .fetch_one(&ctx.store.pool)
        .await
        .expect("run lock_version")
}

/// Creates a run of the capped workflow through `s`, ends both its tasks, and returns the
/// workflow's and the run's `lock_version` after each step.
async fn decide(ctx: &Ctx, s: &Store, name: &str) -> Vec<(&'static str, i64, i64)> {
    let wf = apply(s, &capped(name)).await;
    let run = start_run(s, &wf).await;
    let mut seen = vec![(
        "created",
        workflow_version(ctx, name).await,
        run_version(ctx, run.id).await,
    )];
    for task in ["a", "b"] {
        let instance = launch(s, run.id, task).await;
        s.apply_reports(
            &[super::support::finished(
                instance.id,
                instance.attempt.0,
                Outcome::Success,
                0,
            )],
            T0 + 30,
        )
        .await
        .expect("finish");
        seen.push((
            task,
            workflow_version(ctx, name).await,
            run_version(ctx, run.id).await,
        ));
    }
    assert_eq!(
        s.get_run(run.id).await.unwrap().expect("run").state,
        ax_core::run::RunState::Success
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    ax_test_without_mysql,
    ignore = "set AX_TEST_MYSQL_URL=mysql://USER@HOST:PORT to run the MySQL variants"
)]
async fn on_a_cluster_member_decisions_write_the_rows_they_lock() {
    on_backend(Backend::MySql, |ctx| async move {
        assert_eq!(ctx.store.engine(), Engine::Single);
        let options = StoreOptions {
            write_locked_rows: true,
            ..StoreOptions::default()
        };
        let member = Store::connect_with(&ctx.url, &options).await.unwrap();
        let seen = decide(&ctx, &member, "on-a-member").await;
        // The creation under max_active_runs writes the workflow row; each report batch that
        // ends a task writes its run's row; the batch that ends the run writes the workflow row
        // too (its end looks for queued runs).
        let workflow: Vec<i64> = seen.iter().map(|(_, w, _)| *w).collect();
        let run: Vec<i64> = seen.iter().map(|(_, _, r)| *r).collect();
        assert!(workflow[0] >= 1, "creation: {seen:?}");
        assert_eq!(
            workflow[1], workflow[0],
            "a task end that ends no run: {seen:?}"
        );
        assert!(workflow[2] > workflow[1], "the run's end: {seen:?}");
        assert!(run[1] > run[0] && run[2] > run[1], "task ends: {seen:?}");

        // The same decisions on the single server write none of them.
        let seen = decide(&ctx, &ctx.store, "on-one-server").await;
        assert!(
            seen.iter().all(|(_, w, r)| *w == 0 && *r == 0),
            "a single server wrote lock versions: {seen:?}"
        );
        member.close().await;
    })
    .await;
}
