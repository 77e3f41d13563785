//! Rolling upgrades with mixed versions (docs/operations.md): every node and worker says its
//! release, and a worker that says none is shown as unknown.

use ax_integration_tests::Backend;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, ProcessCluster, WorkerSettings};
use ax_integration_tests::proto_worker::{ProtoWorker, ProtoWorkerOptions};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) upgrade_every_node_and_worker_says_its_release_and_one_that_says_none_is_unknown),
    ]
}

/// This build's release.
const THIS: &str = env!("CARGO_PKG_VERSION");

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
    let newest = "22";
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
