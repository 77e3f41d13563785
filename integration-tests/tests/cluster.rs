//! Scheduler nodes sharing a store: each holds a lease on its node id, a second node with a
//! live node's id is refused, one SQLite file serves one node, a clean shutdown gives the id up
//! at once, a node whose clock is off goes by the database's, and a node that takes another
//! node's share of the queue stays within its workers' capacity.

use std::net::SocketAddr;
use std::time::Duration;

use ax_integration_tests::fault_kit::{Scenario, Scene, plain};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{ProcessCluster, SchedulerSettings, WorkerSettings};
use ax_integration_tests::requirements::{MYSQL, Requirement};
use ax_integration_tests::{Backend, TestClient, TestDb};
use ax_scheduler::SchedulerOptions;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) sqlite_a_second_node_with_a_live_nodes_id_is_refused),
        trial!(async(multi_thread = 2) mysql_a_second_node_with_a_live_nodes_id_is_refused).requires(&MYSQL),
        trial!(async(multi_thread = 2) a_second_node_on_one_sqlite_file_is_told_a_cluster_needs_mysql),
        trial!(async(multi_thread = 2) nodes_with_their_own_ids_share_mysql).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_cluster_a_node_whose_clock_is_30s_ahead_fires_nothing_early).requires(&MYSQL).requires(&FAKETIME),
        trial!(async(multi_thread = 2) a_database_without_the_run_dedup_key_is_refused_by_name).requires(&MYSQL),
        trial!(async(multi_thread = 2) a_read_only_server_is_refused_before_anything_is_written).requires(&MYSQL),
        trial!(async(multi_thread = 2) three_nodes_started_together_on_a_new_database_all_start).requires(&MYSQL),
        trial!(async(multi_thread = 2) a_node_taking_another_shares_instances_stays_within_its_workers_capacity).requires(&MYSQL),
    ]
}

fn node(url: &str, node_id: &str) -> SchedulerOptions {
    SchedulerOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: url.to_string(),
        node_id: node_id.into(),
        node_lease: Duration::from_secs(2),
        ..SchedulerOptions::default()
    }
}

async fn refusal(options: SchedulerOptions) -> String {
    match ax_scheduler::start(options).await {
        Ok(scheduler) => {
            scheduler.shutdown().await.expect("shutdown");
            panic!("the second node started");
        }
        Err(err) => format!("{err:#}"),
    }
}

async fn a_second_node_with_a_live_nodes_id_is_refused(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(backend, dir.path()).await.expect("test db");
    let first = ax_scheduler::start(node(&db.url, "n1"))
        .await
        .expect("the first node starts");
    let refused = refusal(node(&db.url, "n1")).await;
    let holder = format!("node n1 at http://{}", first.local_addr());
    let says = match backend {
        Backend::MySql => "node id n1 is held by a live scheduler",
        Backend::Sqlite => "this SQLite store already serves a live scheduler",
    };
    assert!(
        refused.contains(says) && refused.contains(&holder),
        "{refused}"
    );
    // A clean shutdown gives the lease up: the id is free at once.
    first.shutdown().await.expect("shutdown");
    let again = tokio::time::timeout(
        Duration::from_secs(60),
        ax_scheduler::start(node(&db.url, "n1")),
    )
    .await
    .expect("no hang")
    .expect("the id is free after a clean shutdown");
    again.shutdown().await.expect("shutdown");
    db.drop_database().await.expect("drop database");
}

async fn sqlite_a_second_node_with_a_live_nodes_id_is_refused() {
    a_second_node_with_a_live_nodes_id_is_refused(Backend::Sqlite).await;
}

async fn mysql_a_second_node_with_a_live_nodes_id_is_refused() {
    a_second_node_with_a_live_nodes_id_is_refused(Backend::MySql).await;
}

async fn a_second_node_on_one_sqlite_file_is_told_a_cluster_needs_mysql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::Sqlite, dir.path())
        .await
        .expect("test db");
    let first = ax_scheduler::start(node(&db.url, "n1"))
        .await
        .expect("the first node starts");
    let refused = refusal(node(&db.url, "n2")).await;
    assert!(
        refused.contains("this SQLite store already serves a live scheduler: node n1")
            && refused.contains("a cluster of schedulers needs MySQL"),
        "{refused}"
    );
    first.shutdown().await.expect("shutdown");
}

async fn nodes_with_their_own_ids_share_mysql() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::MySql, dir.path())
        .await
        .expect("test db");
    let first = ax_scheduler::start(node(&db.url, "n1")).await.expect("n1");
    // n2 has other pools than n1: it says so in its log, and `axctl cluster` shows both.
    let second = ax_scheduler::start(SchedulerOptions {
        pools: std::collections::BTreeMap::from([("etl".to_string(), 8)]),
        ..node(&db.url, "n2")
    })
    .await
    .expect("n2");
    let store = ax_store::open(&db.url).await.expect("store");
    let (now, leases) = store.list_node_leases().await.expect("leases");
    let ids: Vec<&str> = leases.iter().map(|l| l.node_id.as_str()).collect();
    assert_eq!(ids, ["n1", "n2"]);
    assert!(leases.iter().all(|l| l.expires_at > now), "{leases:?}");
    assert_eq!(leases[1].address, format!("http://{}", second.local_addr()));
    // Either node lists both, judged on the store's clock.
    let client = TestClient::connect(&format!("http://{}", first.local_addr()))
        .await
        .expect("client");
    let listed = client
        .control()
        .list_nodes(ax_proto::v1::ListNodesRequest {})
        .await
        .expect("ListNodes")
        .into_inner();
    let live: Vec<(&str, bool)> = listed
        .nodes
        .iter()
        .map(|n| (n.node_id.as_str(), n.live))
        .collect();
    assert_eq!(live, [("n1", true), ("n2", true)]);
    let pools: Vec<&str> = listed.nodes.iter().map(|n| n.pools.as_str()).collect();
    assert_eq!(pools, ["", "etl=8"]);
    assert!(
        listed.nodes.iter().all(|n| n.clock_offset_ms.abs() < 1_000),
        "{listed:?}"
    );
    first.shutdown().await.expect("shutdown");
    second.shutdown().await.expect("shutdown");
    let (_, leases) = store.list_node_leases().await.expect("leases");
    assert!(
        leases.is_empty(),
        "clean shutdowns give the leases up: {leases:?}"
    );
    db.drop_database().await.expect("drop database");
}

/// `faketime`, to run a node whose clock is off (`.ci/run` installs it).
static FAKETIME: Requirement = Requirement::program(
    "faketime",
    &["-f", "+0s", "true"],
    "install faketime to run the test of a node whose clock is off",
);

async fn fault_cluster_a_node_whose_clock_is_30s_ahead_fires_nothing_early() {
    let Scene {
        cluster,
        client,
        effects: ledger,
        ..
    } = Scenario::new(Backend::MySql)
        .clock_shift("+30s")
        .worker("w1")
        .start()
        .await;
    let workflow = format!(
        "name: every-second\n\
         schedule: {{cron: '* * * * * *', misfire: skip}}\n\
         tasks:\n  \
           - name: note\n    \
             command: echo \"$AX_LOGICAL_TIME $(date +%s%3N)\" >> {}\n",
        ledger.display()
    );
    client.apply(&workflow).await.expect("apply");
    tokio::time::sleep(Duration::from_secs(6)).await;
    client.pause("every-second").await.expect("pause");
    let runs = client.runs("every-second").await.expect("runs");
    for run in &runs {
        client.wait_run(run.id).await.expect("the run ends");
    }

    // The node corrects its clock to the database's and says how far off it was.
    let nodes = client
        .control()
        .list_nodes(ax_proto::v1::ListNodesRequest {})
        .await
        .expect("ListNodes")
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let offset = nodes[0].clock_offset_ms;
    assert!(
        (29_000..31_000).contains(&offset),
        "clock offset {offset} ms"
    );
    assert!(
        cluster
            .scheduler_logs()
            .contains("differs from the database's by more than --max-clock-offset"),
        "the offset is not reported:\n{}",
        cluster.scheduler_logs()
    );

    // Every fire happened after its slot on the real clock (a node going by its own clock
    // would fire each slot 30 s early), and no slot fired twice.
    let text = std::fs::read_to_string(&ledger).expect("the tasks wrote the ledger");
    let mut slots = Vec::new();
    for line in text.lines() {
        let (logical, started) = line.split_once(' ').expect("two fields");
        let logical = chrono::DateTime::parse_from_rfc3339(logical)
            .expect("AX_LOGICAL_TIME")
            .timestamp_millis();
        let started: i64 = started.parse().expect("date +%s%3N");
        assert!(
            started >= logical - 1_000,
            "slot {logical} ran at {started}, {} ms early",
            logical - started
        );
        slots.push(logical);
    }
    assert!(slots.len() >= 3, "too few fires to judge: {text}");
    let fired = slots.len();
    slots.sort();
    slots.dedup();
    assert_eq!(slots.len(), fired, "a slot fired twice: {text}");
    assert_eq!(runs.len(), fired, "runs and ledger lines differ");
}

async fn a_database_without_the_run_dedup_key_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::MySql, dir.path())
        .await
        .expect("test db");
    // ax creates the schema; then someone drops the key that makes each cron slot fire once.
    drop(ax_store::open(&db.url).await.expect("store"));
    let pool = sqlx::MySqlPool::connect(&db.url).await.expect("pool");
    sqlx::query("ALTER TABLE run DROP INDEX uq_run_dedup")
        .execute(&pool)
        .await
        .expect("drop the key");
    pool.close().await;
    let refused = refusal(node(&db.url, "n1")).await;
    assert!(
        refused.contains("table run has no unique key on (workflow_id, dedup_key)"),
        "{refused}"
    );
    db.drop_database().await.expect("drop database");
}

async fn a_read_only_server_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server =
        ax_integration_tests::mariadb_server::MariaDbServer::start(dir.path(), &["--read-only"])
            .await
            .expect("a private read-only mariadbd (a replica's setting)");
    let refused = refusal(node(&server.url("mysql"), "n1")).await;
    assert!(
        refused.contains("the MySQL server is read-only"),
        "{refused}"
    );
    // Nothing was created on it: the refusal comes before the migrations.
    let pool = sqlx::MySqlPool::connect(&server.url("mysql"))
        .await
        .expect("pool");
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_NAME = 'run'")
            .fetch_all(&pool)
            .await
            .expect("tables");
    assert!(tables.is_empty(), "{tables:?}");
}

async fn three_nodes_started_together_on_a_new_database_all_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::MySql, dir.path())
        .await
        .expect("test db");
    // All three migrate the empty database at once: one at a time, the others find it done.
    let (a, b, c) = tokio::join!(
        ax_scheduler::start(node(&db.url, "n1")),
        ax_scheduler::start(node(&db.url, "n2")),
        ax_scheduler::start(node(&db.url, "n3")),
    );
    let nodes: Vec<_> = [a, b, c]
        .into_iter()
        .map(|started| started.expect("every node starts"))
        .collect();
    let store = ax_store::open(&db.url).await.expect("store");
    let (_, leases) = store.list_node_leases().await.expect("leases");
    assert_eq!(leases.len(), 3, "{leases:?}");
    for node in nodes {
        node.shutdown().await.expect("shutdown");
    }
    db.drop_database().await.expect("drop database");
}

/// A node dispatches within its worker's capacity when it also takes what waited in another
/// node's share of the queue: every task needs a label only n1's worker (capacity 2) carries, so
/// n2 leaves its share to n1, whose passes over its own share and over the others' both fill
/// the same two slots. A pass planned on slots an earlier pass already filled sends past the
/// capacity, and the worker refuses those dispatches.
async fn a_node_taking_another_shares_instances_stays_within_its_workers_capacity() {
    let settings = SchedulerSettings {
        nodes: 2,
        ..SchedulerSettings::default()
    };
    let mut cluster = ProcessCluster::start_with(Backend::MySql, settings)
        .await
        .expect("two nodes start");
    let only_n1 = WorkerSettings {
        endpoint: Some(cluster.node_endpoint(0)),
        capacity: Some(2),
        labels: vec![("gpu".into(), "yes".into())],
        ..WorkerSettings::default()
    };
    cluster
        .start_live_worker("gpu", &only_n1)
        .await
        .expect("the gpu worker on n1");
    let only_n2 = WorkerSettings {
        endpoint: Some(cluster.node_endpoint(1)),
        ..WorkerSettings::default()
    };
    cluster
        .start_live_worker("plain", &only_n2)
        .await
        .expect("the plain worker on n2");
    let mut spec = String::from("name: trains\ntasks:\n");
    for n in 0..24 {
        spec.push_str(&format!(
            "  - name: t{n}\n    labels: {{gpu: 'yes'}}\n    command: sleep 0.2\n"
        ));
    }
    let client = cluster.node_client(1).await.expect("client of n2");
    client.apply(&spec).await.expect("apply");
    let run = client.trigger_run("trains").await.expect("trigger");
    let ended = client
        .wait_run_within(run.id, Duration::from_secs(120))
        .await
        .expect("the run ends");
    assert_eq!(ended.state(), ax_proto::v1::RunState::Success);
    for instance in client.instances(run.id).await.expect("instances") {
        assert_eq!(instance.attempts.len(), 1, "{instance:?}");
        assert_eq!(instance.attempts[0].worker_id, "gpu");
    }
    let log = plain(&cluster.worker("gpu").expect("gpu").log_text());
    let refused: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("at capacity"))
        .collect();
    assert!(
        refused.is_empty(),
        "n1 sent past the worker's capacity:\n{}",
        refused.join("\n")
    );
    cluster.shutdown().await.expect("shutdown");
}
