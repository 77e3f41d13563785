//! What the store's tests share: a fresh store per scenario on SQLite and on MySQL
//! ([`on_backend`], and `conformance!`, which turns a list of scenarios into a test per backend),
//! and the builders and steps the scenarios are written with (a workflow spec, a run, a claim
//! and the reports of an attempt).
//!
//! A scenario is an `async fn(Ctx)` written once against [`Store`], and gets its store from
//! [`on_backend`]. SQLite gets a fresh file per test; MySQL a fresh database per test, named
//! uniquely so that tests and test processes running at once never meet, and dropped afterwards
//! even when the scenario panics (it runs in a task of its own). Without `AX_TEST_MYSQL_URL` the
//! MySQL variants are reported ignored, saying how to run them (`build.rs`); under `CI=true`
//! they run and fail instead.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::spec::{ScheduleSpec, TaskSpec, TriggerKind, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};
use sqlx::Connection;

use crate::*;

pub(super) const T0: Millis = 1_700_000_000_000;

/// What a scenario gets: the store, and its url to open a second store on the same database.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) store: Arc<Store>,
    pub(super) url: String,
}

impl Ctx {
    pub(super) fn s(&self) -> &Store {
        self.store.as_ref()
    }

    /// A second store on the scenario's database, as a second scheduler node would open.
    pub(super) async fn second_store(&self) -> Arc<Store> {
        Arc::new(Store::connect(&self.url).await.expect("second store"))
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique_suffix() -> String {
    format!(
        "{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random_range(0..1_000_000u32)
    )
}

/// Runs `scenario` in its own task so that a failed assertion still lets the caller clean up.
async fn run_scenario<F, Fut>(ctx: Ctx, scenario: F) -> Result<(), tokio::task::JoinError>
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(scenario(ctx)).await
}

/// Runs `scenario` on a fresh store of `backend`.
pub(super) async fn on_backend<F, Fut>(backend: Backend, scenario: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    match backend {
        Backend::Sqlite => on_sqlite(scenario).await,
        Backend::MySql => on_mysql(scenario).await,
    }
}

async fn on_sqlite<F, Fut>(scenario: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/nested/ax.db", dir.path().display());
    let store = Arc::new(Store::connect(&url).await.expect("open sqlite store"));
    assert_eq!(store.backend(), Backend::Sqlite);
    let result = run_scenario(
        Ctx {
            store: store.clone(),
            url,
        },
        scenario,
    )
    .await;
    store.close().await;
    if let Err(err) = result {
        std::panic::resume_unwind(err.into_panic());
    }
}

/// `mysql://user@host:port` without the database path.
pub(super) fn mysql_server_url(url: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .expect("AX_TEST_MYSQL_URL has a scheme");
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let host = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{host}")
}

/// The MySQL server of the MySQL variants (`AX_TEST_MYSQL_URL`). Without it they are ignored
/// (`build.rs`); one run anyway (`--ignored`, or under `CI=true`) fails saying what it lacks.
pub(super) fn mysql_url() -> String {
    match std::env::var("AX_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "AX_TEST_MYSQL_URL is not set: the MySQL variants need a MySQL server \
             (mysql://USER@HOST:PORT)"
        ),
    }
}

async fn on_mysql<F, Fut>(scenario: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let url = mysql_url();
    let server = mysql_server_url(&url);
    let database = format!("ax_test_{}", unique_suffix());
    let mut admin = sqlx::MySqlConnection::connect(&server)
        .await
        .expect("connect to MySQL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    )))
    .execute(&mut admin)
    .await
    .expect("create test database");
    let db_url = format!("{server}/{database}");
    let opened = Store::connect(&db_url).await;
    let result = match opened {
        Ok(store) => {
            let store = Arc::new(store);
            assert_eq!(store.backend(), Backend::MySql);
            let result = run_scenario(
                Ctx {
                    store: store.clone(),
                    url: db_url,
                },
                scenario,
            )
            .await;
            store.close().await;
            Some(result)
        }
        Err(err) => {
            eprintln!("cannot open the MySQL store: {err}");
            None
        }
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&mut admin)
        .await
        .expect("drop test database");
    match result {
        Some(Ok(())) => {}
        Some(Err(err)) => std::panic::resume_unwind(err.into_panic()),
        None => panic!("the MySQL store did not open"),
    }
}

/// Each scenario named becomes `sqlite::NAME` and `mysql::NAME` in the module that invokes the
/// macro, from that module's `scenarios::NAME`.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    $crate::tests::support::on_backend(
                        $crate::Backend::Sqlite,
                        super::scenarios::$name,
                    )
                    .await;
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                #[cfg_attr(
                    ax_test_without_mysql,
                    ignore = "set AX_TEST_MYSQL_URL=mysql://USER@HOST:PORT to run the MySQL variants"
                )]
                async fn $name() {
                    $crate::tests::support::on_backend(
                        $crate::Backend::MySql,
                        super::scenarios::$name,
                    )
                    .await;
                }
            )*
        }
    };
}

pub(super) fn task(name: &str, upstream: &[&str]) -> TaskSpec {
    TaskSpec {
        name: name.to_string(),
        command: format!("echo {name}"),
        upstream: upstream.iter().map(|s| s.to_string()).collect(),
        ..TaskSpec::default()
    }
}

pub(super) fn spec(name: &str, tasks: Vec<TaskSpec>) -> WorkflowSpec {
    WorkflowSpec {
        name: name.to_string(),
        app: "etl".into(),
        owner: "alice".into(),
        description: String::new(),
        schedule: ScheduleSpec::default(),
        concurrency: Default::default(),
        retention: None,
        tasks,
        deadline: None,
        on_deadline: Default::default(),
        params: Vec::new(),
    }
}

pub(super) async fn apply(s: &Store, spec: &WorkflowSpec) -> WorkflowRecord {
    s.apply_workflow(spec, "source", None, T0)
        .await
        .expect("apply")
        .0
}

pub(super) fn new_run(wf: &WorkflowRecord, dedup_key: Option<&str>) -> NewRun {
    NewRun {
        workflow_id: wf.id,
        workflow_version: wf.version,
        trigger: TriggerKind::Manual,
        logical_time: T0,
        dedup_key: dedup_key.map(str::to_string),
        idempotency_key: None,
        params: BTreeMap::from([("day".to_string(), "2024-01-01".to_string())]),
        triggered_by: "tester".into(),
        now: T0,
        audit_from: None,
    }
}

/// A manual run of `wf` without params or dedup key.
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
        audit_from: None,
    }
}

pub(super) async fn start_run(s: &Store, wf: &WorkflowRecord) -> RunRecord {
    let (run, created) = s.create_run(&new_run(wf, None)).await.expect("create run");
    assert!(created);
    run
}

pub(super) async fn instance_of(s: &Store, run: RunId, task: &str) -> Option<InstanceRecord> {
    let all = s.list_instances(run).await.expect("list instances");
    all.into_iter().find(|i| i.task == task)
}

/// Claims `instance` for worker `w1` and applies its Started report; returns the Finished
/// report of its success, for the caller to apply (and measure).
pub(super) async fn start_on_w1(s: &Store, instance: &InstanceRecord) -> Report {
    let claim = DispatchClaim {
        instance_id: instance.id,
        attempt: instance.attempt,
        worker_id: "w1".into(),
        node_id: "node-1".into(),
        at: T0 + 10,
        limits: Vec::new(),
    };
    assert_eq!(s.mark_dispatched(&[claim]).await.unwrap(), vec![true]);
    let started = Report::Started {
        instance_id: instance.id,
        attempt: instance.attempt,
        worker_id: "w1".into(),
        pid: 4242,
        at: T0 + 20,
    };
    s.apply_reports(&[started], T0 + 20).await.unwrap();
    Report::Finished {
        instance_id: instance.id,
        attempt: instance.attempt,
        worker_id: Some("w1".into()),
        end: AttemptEnd::Finished(Outcome::Success),
        exit_code: Some(0),
        signal: None,
        at: T0 + 30,
        log_lines: 0,
        message: String::new(),
        outputs: Default::default(),
    }
}

pub(super) async fn tasks_of(s: &Store, run: RunId) -> BTreeSet<String> {
    let all = s.list_instances(run).await.expect("list instances");
    all.into_iter().map(|i| i.task).collect()
}

pub(super) fn claim(id: InstanceId, attempt: u32, worker: &str) -> DispatchClaim {
    DispatchClaim {
        instance_id: id,
        attempt: Attempt(attempt),
        worker_id: worker.into(),
        node_id: "node-1".into(),
        at: T0 + 10,
        limits: Vec::new(),
    }
}

pub(super) fn started(id: InstanceId, attempt: u32) -> Report {
    Report::Started {
        instance_id: id,
        attempt: Attempt(attempt),
        worker_id: "w1".into(),
        pid: 4242,
        at: T0 + 20,
    }
}

pub(super) fn finished(id: InstanceId, attempt: u32, outcome: Outcome, exit: i32) -> Report {
    Report::Finished {
        instance_id: id,
        attempt: Attempt(attempt),
        worker_id: None,
        end: AttemptEnd::Finished(outcome),
        exit_code: Some(exit),
        signal: None,
        at: T0 + 30,
        log_lines: 3,
        message: format!("exit {exit}"),
        outputs: Default::default(),
    }
}

pub(super) fn applied(result: &ReportResult) -> &Applied {
    match result {
        ReportResult::Applied(applied) => applied,
        other => panic!("expected Applied, got {other:?}"),
    }
}

/// Dispatches and starts the current attempt of `task` in `run`.
pub(super) async fn launch(s: &Store, run: RunId, task: &str) -> InstanceRecord {
    let inst = instance_of(s, run, task).await.expect("instance exists");
    assert_eq!(inst.state, InstanceState::Waiting, "{task}");
    let won = s
        .mark_dispatched(&[claim(inst.id, inst.attempt.0, "w1")])
        .await
        .unwrap();
    assert_eq!(won, vec![true]);
    let results = s
        .apply_reports(&[started(inst.id, inst.attempt.0)], T0)
        .await
        .unwrap();
    applied(&results[0]);
    s.get_instance(inst.id).await.unwrap().expect("instance")
}

/// Runs `task` to `outcome` and returns what the finish changed.
pub(super) async fn run_task(s: &Store, run: RunId, task: &str, outcome: Outcome) -> Applied {
    let inst = launch(s, run, task).await;
    let exit = if outcome == Outcome::Success { 0 } else { 1 };
    let results = s
        .apply_reports(&[finished(inst.id, inst.attempt.0, outcome, exit)], T0 + 30)
        .await
        .unwrap();
    applied(&results[0]).clone()
}

/// Applies the successful Finished report of each of `running` (first attempts, started) from a
/// task of its own, all let go at once by a barrier; their results in `running`'s order.
pub(super) async fn finish_at_once(
    store: &Arc<Store>,
    running: Vec<InstanceRecord>,
) -> Vec<Vec<ReportResult>> {
    let barrier = Arc::new(tokio::sync::Barrier::new(running.len()));
    let mut handles = Vec::new();
    for inst in running {
        let (store, barrier) = (store.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let report = finished(inst.id, 1, Outcome::Success, 0);
            store
                .apply_reports(&[report], T0 + 50)
                .await
                .expect("apply")
        }));
    }
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await.unwrap());
    }
    results
}

#[test]
fn mysql_server_url_strips_the_database() {
    assert_eq!(
        mysql_server_url("mysql://root@127.0.0.1:3306"),
        "mysql://root@127.0.0.1:3306"
    );
    assert_eq!(
        mysql_server_url("mysql://u:p@h:1/db?x=1"),
        "mysql://u:p@h:1"
    );
}
