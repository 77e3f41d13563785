//! Rolling upgrades with mixed versions (docs/operations.md): every node and worker says its
//! release (a worker that says none is shown as unknown), and a three-node cluster on MySQL
//! goes from the previous release (`.ci/previous-release`, built by
//! `ax_integration_tests::previous_release`) to this build and back, one process at a time, under
//! a steady load of DAG runs and per-second crons.
//!
//! The upgrade is judged as the fault tests are: from the ledger the tasks append to outside ax
//! (`fault_kit`), joined with the store's attempt history: nothing lost, nothing started twice,
//! no two attempts of an instance overlapping, nothing that ran to its end run again, every
//! acknowledged log line stored; and slot by slot for the crons: no slot missed or fired twice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ax_core::release::Release;
use ax_integration_tests::client::{RUN_GUARD, summary};
use ax_integration_tests::fault_kit::{
    Lines, check_invariants_of_runs, numbered_lines, read_notes, script,
};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::previous_release::{self, PREVIOUS_RELEASE};
use ax_integration_tests::process::{
    HANG_GUARD, ProcessCluster, RedisChoice, SchedulerSettings, WorkerSettings,
};
use ax_integration_tests::proto_worker::{ProtoWorker, ProtoWorkerOptions};
use ax_integration_tests::requirements::{MYSQL, REDIS};
use ax_integration_tests::{Backend, TestClient};
use ax_proto::v1 as pb;
use pb::InstanceState as S;
use sqlx::Connection;

use crate::cluster_faults::{
    in_flight, judge_slots, ran_again, read_slot_notes, retried, stored_runs,
};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) upgrade_every_node_and_worker_says_its_release_and_one_that_says_none_is_unknown),
        trial!(async(multi_thread = 2) upgrade_a_node_refuses_a_schema_two_versions_ahead_naming_both),
        trial!(async(multi_thread = 2) upgrade_rolling_from_the_previous_release_and_back_under_dag_and_cron_load_loses_nothing)
            .requires(&MYSQL)
            .requires(&REDIS)
            .requires(&PREVIOUS_RELEASE),
    ]
}

/// This build's release.
const THIS: &str = env!("CARGO_PKG_VERSION");

/// How often a wait polls.
const POLL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Versions shown.

/// A node, a real worker and a worker from the proto that sends no version: `axctl cluster`
/// lists each with its release (the silent one as unknown) and the store's schema release, and
/// the web API answers the same.
async fn upgrade_every_node_and_worker_says_its_release_and_one_that_says_none_is_unknown() {
    let mut cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a node");
    cluster
        .start_live_worker("w-real", &WorkerSettings::default())
        .await
        .expect("a worker");
    let silent = ProtoWorker::start(ProtoWorkerOptions {
        version: String::new(),
        ..ProtoWorkerOptions::new("w-silent", &cluster.endpoint())
    })
    .await
    .expect("a worker that sends no version is accepted");
    let client = cluster.client().await.expect("client");
    client
        .wait_worker_live("w-silent", HANG_GUARD)
        .await
        .expect("the silent worker is live");

    let out = cluster.axctl(&["cluster"]).await.expect("axctl cluster");
    assert_eq!(out.code, Some(0), "{out}");
    let line = |start: &str| -> String {
        out.stdout
            .lines()
            .find(|line| line.starts_with(start))
            .unwrap_or_else(|| panic!("no line for {start}: {out}"))
            .to_string()
    };
    assert!(line("n1").contains(THIS), "{out}");
    assert!(line("w-real").contains(THIS), "{out}");
    assert!(line("w-silent").contains("unknown"), "{out}");
    // The newest migration is the number of the store's migration files.
    let newest = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scheduler/store/migrations/sqlite"
    ))
    .expect("the migrations directory")
    .count();
    assert!(
        out.stdout.contains(&format!(
            "store schema: ax {THIS} (migration {newest}); nodes of ax 0.1.0 or later may run on it"
        )),
        "{out}"
    );

    let base = cluster.endpoint();
    let nodes: serde_json::Value = reqwest::get(format!("{base}/api/v1/nodes"))
        .await
        .expect("GET /api/v1/nodes")
        .json()
        .await
        .expect("json");
    assert_eq!(nodes["schemaRelease"], THIS, "{nodes}");
    assert_eq!(nodes["schemaOldestRelease"], "0.1.0", "{nodes}");
    assert_eq!(nodes["nodes"][0]["version"], THIS, "{nodes}");
    let workers: serde_json::Value = reqwest::get(format!("{base}/api/v1/workers"))
        .await
        .expect("GET /api/v1/workers")
        .json()
        .await
        .expect("json");
    let version_of = |id: &str| {
        workers["workers"]
            .as_array()
            .and_then(|list| list.iter().find(|w| w["id"] == id))
            .map(|w| w["version"].clone())
            .unwrap_or_else(|| panic!("no worker {id}: {workers}"))
    };
    assert_eq!(version_of("w-real"), THIS);
    assert_eq!(version_of("w-silent"), "");

    silent.die();
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// A schema too far ahead.

/// A node stopped, its store's record rewritten as a release two versions ahead would leave it:
/// the node started again exits before it serves, naming both versions, and the record stays.
async fn upgrade_a_node_refuses_a_schema_two_versions_ahead_naming_both() {
    let mut cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a node");
    let mut node = cluster.take_scheduler().expect("the node");
    node.terminate().expect("SIGTERM");
    node.wait_exit(HANG_GUARD).await.expect("the node stops");

    let this = Release::parse(THIS).expect("this release");
    let ahead = this.series().next().next().first();
    let its_oldest = this.series().next().first();
    let url = cluster.store_url().to_string();
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open the store");
    sqlx::query(
        "UPDATE schema_release SET release_name = ?, migration = 99, oldest_release = ? \
         WHERE id = 1",
    )
    .bind(ahead.to_string())
    .bind(its_oldest.to_string())
    .execute(&mut conn)
    .await
    .expect("rewrite the record");
    conn.close().await.expect("close");

    let refused = cluster
        .start_scheduler()
        .await
        .expect_err("the node refuses the schema");
    let expected = format!(
        "the store's schema is of ax {ahead} (migration 99); this node is ax {THIS} and runs on \
         schemas of {} or {}: upgrade this node",
        this.series(),
        this.series().next()
    );
    assert!(format!("{refused:#}").contains(&expected), "{refused:#}");
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("open the store");
    let kept: String = sqlx::query_scalar("SELECT release_name FROM schema_release")
        .fetch_one(&mut conn)
        .await
        .expect("the record");
    assert_eq!(
        kept,
        ahead.to_string(),
        "the refusing node changed the record"
    );
}

// ---------------------------------------------------------------------------------------------
// The rolling upgrade and the rollback.

const NODES: usize = 3;
const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
/// Per-second cron workflows.
const CRONS: [&str; 3] = ["tick-a", "tick-b", "tick-c"];
/// Numbered lines each task prints.
const LINES: u32 = 2;
/// A slot this close to the crons' start or pause may rightly not have fired.
const EDGE_MS: i64 = 2_000;

/// A DAG of fan-outs and fan-ins: a root, three chains of three, each fanning out to eight and
/// back into a join, the joins into a sink and the sink into a last task.
fn dag(name: &str, command: &str) -> (String, usize) {
    let mut tasks: Vec<(String, Vec<String>)> = vec![("root".into(), Vec::new())];
    let mut joins = Vec::new();
    for branch in 1..=3 {
        let mut previous = "root".to_string();
        for link in 1..=3 {
            let task = format!("b{branch}-chain{link}");
            tasks.push((task.clone(), vec![previous]));
            previous = task;
        }
        let fan: Vec<String> = (1..=8).map(|f| format!("b{branch}-fan{f}")).collect();
        for task in &fan {
            tasks.push((task.clone(), vec![previous.clone()]));
        }
        let join = format!("b{branch}-join");
        tasks.push((join.clone(), fan));
        joins.push(join);
    }
    tasks.push(("sink".into(), joins));
    tasks.push(("last".into(), vec!["sink".into()]));
    let count = tasks.len();
    let command = command.replace('\\', "\\\\").replace('"', "\\\"");
    let mut yaml =
        format!("name: {name}\ndefaults: {{ retries: 3, retry_backoff: 100ms }}\ntasks:\n");
    for (task, upstream) in tasks {
        yaml.push_str(&format!("  - name: {task}\n    command: \"{command}\"\n"));
        if !upstream.is_empty() {
            yaml.push_str(&format!("    upstream: [{}]\n", upstream.join(", ")));
        }
    }
    (yaml, count)
}

/// The cluster under upgrade, a client of each node, and the binaries of both releases.
struct Rolling {
    cluster: ProcessCluster,
    clients: Vec<TestClient>,
    /// The previous release's binaries.
    old: PathBuf,
    /// Each worker's settings, but for the binaries.
    worker: WorkerSettings,
}

impl Rolling {
    fn release_name(binaries: &Option<PathBuf>, old: &str) -> String {
        match binaries {
            Some(_) => old.to_string(),
            None => THIS.to_string(),
        }
    }

    /// The LIVE workers as node `ask` sees them: (node, version) by worker id.
    async fn workers(&self, ask: usize) -> anyhow::Result<BTreeMap<String, (String, String)>> {
        Ok(self.clients[ask]
            .workers()
            .await?
            .into_iter()
            .filter(|w| w.state() == pb::WorkerState::Live)
            .map(|w| (w.id, (w.scheduler_node, w.version)))
            .collect())
    }

    /// Waits until `done` holds of the LIVE workers as the node after `index` sees them.
    async fn wait_workers(
        &self,
        index: usize,
        what: &str,
        done: impl Fn(&BTreeMap<String, (String, String)>) -> bool,
    ) {
        let ask = (index + 1) % NODES;
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            let last = match self.workers(ask).await {
                Ok(seen) if done(&seen) => return,
                Ok(seen) => format!("{seen:?}"),
                Err(err) => format!("{err:#}"),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "not {what} after {HANG_GUARD:?}; last seen: {last}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until node `index` is live with release `version`, as the next node sees it.
    async fn wait_node(&self, index: usize, version: &str) {
        let ask = (index + 1) % NODES;
        let id = self.cluster.node_id(index).to_string();
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            let last = match self.clients[ask]
                .control()
                .list_nodes(pb::ListNodesRequest {})
                .await
            {
                Ok(listed) => {
                    let nodes = listed.into_inner().nodes;
                    if nodes
                        .iter()
                        .any(|n| n.node_id == id && n.live && n.version == version)
                    {
                        return;
                    }
                    format!("{nodes:?}")
                }
                Err(status) => status.to_string(),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} not live as {version} after {HANG_GUARD:?}: {last}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops node `index` (SIGTERM), starts it again from `binaries` under its id and port, and
    /// waits until it is live as that release and holds a worker again (the others hand one
    /// over within a few spread intervals): it takes load.
    async fn replace_node(&mut self, index: usize, binaries: Option<PathBuf>, old: &str) {
        let version = Self::release_name(&binaries, old);
        self.cluster.stop_node(index).await.expect("SIGTERM");
        self.cluster.set_node_binaries(index, binaries);
        self.cluster
            .start_node(index)
            .await
            .expect("the node starts on the store as the other release");
        self.wait_node(index, &version).await;
        let id = self.cluster.node_id(index).to_string();
        self.wait_workers(index, &format!("a worker on {id}"), |seen| {
            seen.values().any(|(node, _)| *node == id)
        })
        .await;
    }

    /// Stops worker `id` (SIGTERM: it drains), starts it again from `binaries` under its id,
    /// and waits until it is LIVE as that release.
    async fn replace_worker(&mut self, id: &str, binaries: Option<PathBuf>, old: &str) {
        let version = Self::release_name(&binaries, old);
        self.cluster
            .stop_worker(id)
            .await
            .expect("the worker drains");
        let settings = WorkerSettings {
            binaries,
            ..self.worker.clone()
        };
        self.cluster
            .start_worker_with(id, &settings)
            .expect("the worker starts as the other release");
        self.wait_workers(0, &format!("{id} LIVE as {version}"), |seen| {
            seen.get(id).is_some_and(|(_, v)| *v == version)
        })
        .await;
    }
}

/// Three nodes and three workers of the previous release on MySQL with Redis, under DAG runs
/// (one more triggered at every step) and three per-second crons: each node is replaced by
/// this build in turn, then each worker; then each worker goes back to the previous release,
/// then each node (a rollback, which the schema allows: this release's migrations only add).
/// Judged by the ledger and the slots.
async fn upgrade_rolling_from_the_previous_release_and_back_under_dag_and_cron_load_loses_nothing()
{
    let old = tokio::task::spawn_blocking(previous_release::binaries)
        .await
        .expect("the build's thread")
        .expect("the previous release's binaries");
    let old_version = previous_release::release_of(&old).expect("the previous release's version");
    let old_version = old_version.as_str();
    assert_ne!(old_version, THIS, "the previous release is this one");
    let settings = SchedulerSettings {
        redis: RedisChoice::FromEnv,
        nodes: NODES,
        heartbeat_interval: Some("500ms".into()),
        dead_after_missed_heartbeats: Some(8),
        binaries: Some(old.clone()),
        ..SchedulerSettings::default()
    };
    let mut cluster = ProcessCluster::start_with(Backend::MySql, settings)
        .await
        .expect("three nodes of the previous release");
    let worker = WorkerSettings {
        capacity: Some(8),
        kill_grace: Some("1s".into()),
        heartbeat_interval: Some("500ms".into()),
        ..WorkerSettings::default()
    };
    for id in WORKERS {
        cluster
            .start_worker_with(
                id,
                &WorkerSettings {
                    binaries: Some(old.clone()),
                    ..worker.clone()
                },
            )
            .expect("a worker of the previous release");
    }
    let mut clients = Vec::new();
    for index in 0..NODES {
        clients.push(cluster.node_client(index).await.expect("a client"));
    }
    let mut rolling = Rolling {
        cluster,
        clients,
        old: old.clone(),
        worker,
    };
    rolling
        .wait_workers(
            NODES - 1,
            "every worker LIVE as the previous release",
            |seen| {
                WORKERS
                    .iter()
                    .all(|id| seen.get(*id).is_some_and(|(_, v)| v == old_version))
            },
        )
        .await;

    // The load: three per-second crons and DAG runs, all writing the ledger.
    let dir = rolling.cluster.dir().to_path_buf();
    let effects = dir.join("effects");
    let slots = dir.join("slots");
    let body = format!(
        "S='{}'\nslot() {{ echo \"$AX_WORKFLOW $AX_LOGICAL_TIME $AX_INSTANCE_ID $AX_ATTEMPT $1\" >> \"$S\"; }}\nslot start\n{}\nslot end",
        slots.display(),
        numbered_lines(LINES, "0.1")
    );
    let tick = script(&dir, "tick", &effects, &body);
    let work = script(&dir, "dag", &effects, &numbered_lines(LINES, "0.1"));
    let client = rolling.clients[0].clone();
    let (yaml, tasks_per_run) = dag("dag", &work);
    client.apply(&yaml).await.expect("apply the DAG");
    let applied_ms = now_ms();
    for workflow in CRONS {
        let yaml = format!(
            "name: {workflow}\n\
             schedule: {{cron: '* * * * * *', misfire: catch_up, max_catch_up: 1000}}\n\
             defaults: {{ retries: 3, retry_backoff: 100ms }}\n\
             tasks:\n  - name: tick\n    command: \"{}\"\n",
            tick.replace('\\', "\\\\").replace('"', "\\\"")
        );
        client.apply(&yaml).await.expect("apply a cron");
    }
    let mut dag_runs = vec![client.trigger_run("dag").await.expect("trigger").id];

    // Up: each node, then each worker; down: each worker, then each node. Before each step, the
    // attempts in flight by the ledger: the steps happen under load.
    let mut steps = Vec::new();
    let mut in_flight_at = Vec::new();
    for index in 0..NODES {
        in_flight_at.push(in_flight(&read_notes(&effects)));
        rolling.replace_node(index, None, old_version).await;
        steps.push(format!("{} up", rolling.cluster.node_id(index)));
        let trigger_on = rolling.clients[index].clone();
        dag_runs.push(trigger_on.trigger_run("dag").await.expect("trigger").id);
    }
    let schema = read_schema_release(rolling.cluster.store_url()).await;
    assert_eq!(
        schema.as_deref(),
        Some(THIS),
        "the first node of this release records it in the store"
    );
    for id in WORKERS {
        in_flight_at.push(in_flight(&read_notes(&effects)));
        rolling.replace_worker(id, None, old_version).await;
        steps.push(format!("{id} up"));
        dag_runs.push(client.trigger_run("dag").await.expect("trigger").id);
    }
    for id in WORKERS {
        in_flight_at.push(in_flight(&read_notes(&effects)));
        rolling
            .replace_worker(id, Some(rolling.old.clone()), old_version)
            .await;
        steps.push(format!("{id} down"));
        dag_runs.push(client.trigger_run("dag").await.expect("trigger").id);
    }
    for index in 0..NODES {
        in_flight_at.push(in_flight(&read_notes(&effects)));
        let old = rolling.old.clone();
        rolling.replace_node(index, Some(old), old_version).await;
        steps.push(format!("{} down", rolling.cluster.node_id(index)));
        let trigger_on = rolling.clients[index].clone();
        dag_runs.push(trigger_on.trigger_run("dag").await.expect("trigger").id);
    }
    assert_eq!(
        read_schema_release(rolling.cluster.store_url())
            .await
            .as_deref(),
        Some(THIS),
        "the previous release leaves the newer record alone"
    );

    // Let the last DAG run go on under a few more cron slots, then pause the crons.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let paused_ms = now_ms();
    for workflow in CRONS {
        client.pause(workflow).await.expect("pause");
    }
    let url = rolling.cluster.store_url().to_string();
    let mut runs = stored_runs(&url).await;
    loop {
        for run in &runs {
            client
                .wait_run_within(run.id, RUN_GUARD)
                .await
                .expect("the run ends");
        }
        let again = stored_runs(&url).await;
        let settled = again.len() == runs.len();
        runs = again;
        if settled {
            break;
        }
    }

    // Nothing lost, nothing started twice, no overlap, nothing run again after its end.
    let run_ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    let instances =
        check_invariants_of_runs(&client, &run_ids, &effects, Lines::Exactly(LINES.into())).await;
    let again = ran_again(&read_notes(&effects));
    assert!(again.is_empty(), "{}", again.join("\n"));
    let dag_instances = instances
        .iter()
        .filter(|i| dag_runs.contains(&i.run_id))
        .count();
    assert_eq!(
        dag_instances,
        dag_runs.len() * tasks_per_run,
        "DAG instances lost or doubled"
    );
    let unsuccessful: Vec<String> = runs
        .iter()
        .filter(|r| r.state != "SUCCESS")
        .map(|r| format!("run {} ({}): {}", r.id, r.workflow, r.state))
        .collect();
    assert!(
        unsuccessful.is_empty(),
        "runs not SUCCESS: {unsuccessful:?}\n{}",
        summary(&instances)
    );
    assert!(
        instances.iter().all(|i| i.state() == S::Success),
        "{}",
        summary(&instances)
    );

    // Every cron slot between the edges fired once and its task ran once.
    let ledger = read_slot_notes(&slots);
    let window = (applied_ms + EDGE_MS, paused_ms - EDGE_MS);
    let mut problems = Vec::new();
    let mut fires = 0;
    let mut in_window = 0;
    for workflow in CRONS {
        let figures = judge_slots(workflow, &runs, &ledger, window);
        fires += figures.fires;
        in_window += figures.in_window;
        problems.extend(
            figures
                .duplicates
                .iter()
                .map(|d| format!("{workflow}: {d}")),
        );
        problems.extend(
            figures
                .missed
                .iter()
                .map(|m| format!("{workflow}: missed {m}")),
        );
        problems.extend(
            figures
                .not_run_once
                .iter()
                .map(|n| format!("{workflow}: {n}")),
        );
    }
    println!(
        "upgrade: steps {steps:?}; attempts in flight at each {in_flight_at:?}; {} DAG runs of {tasks_per_run} tasks; {fires} cron fires, {in_window} slots in the window; {} instances needed another attempt",
        dag_runs.len(),
        retried(&instances)
    );
    assert!(problems.is_empty(), "cron slots: {problems:?}");
    assert!(in_window > 0, "the window holds no slot");
    assert!(
        in_flight_at.iter().filter(|n| **n > 0).count() >= in_flight_at.len() / 2,
        "too few steps had attempts in flight {in_flight_at:?}: the test proved little"
    );
    rolling.cluster.shutdown().await.expect("clean shutdown");
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The release the store records as having migrated it, read from the database itself.
async fn read_schema_release(url: &str) -> Option<String> {
    let mut conn = sqlx::MySqlConnection::connect(url)
        .await
        .expect("connect to the store");
    sqlx::query_scalar("SELECT release_name FROM schema_release WHERE id = 1")
        .fetch_optional(&mut conn)
        .await
        .expect("read the schema's release")
}
