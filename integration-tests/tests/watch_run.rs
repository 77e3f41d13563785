//! `WatchRun`, the stream the SDKs' `wait` follows, against a real scheduler and worker on each
//! backend: it sends the run and each change of it, and after a cancel it stays open until the
//! killed process's end is stored, so a waiter learns the run ended only once nothing of it
//! runs. A task that takes its time to stop on SIGTERM shows the difference: the run is
//! CANCELLED at once, the process ends a second later, and the stream ends after that.

use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::process::pid_from_file;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const WITHIN: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        the_stream_ends_after_a_cancelled_process_is_gone,
        a_finished_run_is_sent_once_and_the_stream_ends,
        a_stopping_node_ends_the_stream_with_unavailable,
    )
}

/// A `WatchRun` stream of `run` with the default settle time.
async fn watch(client: &TestClient, run: i64) -> tonic::Streaming<pb::Run> {
    client
        .control()
        .watch_run(pb::WatchRunRequest {
            id: run,
            settle_ms: 0,
        })
        .await
        .expect("WatchRun")
        .into_inner()
}

async fn the_stream_ends_after_a_cancelled_process_is_gone(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let dir = cluster.dir().to_path_buf();
    let pid_file = dir.join("slow.pid");
    let done_file = dir.join("slow.done");
    let source = format!(
        "name: slow-stop\ntasks:\n  - name: t\n    command: |\n      echo $$ > {pid}\n      \
         trap 'sleep 1; echo stopped > {done}; exit 143' TERM\n      \
         while true; do sleep 0.1; done\n",
        pid = pid_file.display(),
        done = done_file.display(),
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("slow-stop").await.expect("trigger");
    pid_from_file(&pid_file, WITHIN).await;

    let mut stream = watch(&client, run.id).await;
    let first = stream.message().await.expect("a message").expect("the run");
    assert_eq!(first.id, run.id);
    assert_eq!(first.state, pb::RunState::Running as i32, "{first:?}");

    client
        .cancel_run(run.id, "watch test")
        .await
        .expect("cancel");
    let mut states = vec![first.state];
    let ended_stream = tokio::time::timeout(WITHIN, async {
        while let Some(run) = stream.message().await.expect("the stream holds") {
            states.push(run.state);
        }
    })
    .await;
    assert!(ended_stream.is_ok(), "the stream did not end: {states:?}");
    assert_eq!(
        states.last(),
        Some(&(pb::RunState::Cancelled as i32)),
        "{states:?}"
    );
    // The stream ended after the process did: its trap had run, and its end is stored.
    assert_eq!(
        std::fs::read_to_string(&done_file)
            .expect("the trap ran")
            .trim(),
        "stopped"
    );
    let instances = client.instances(run.id).await.expect("instances");
    let attempt = instances[0].attempts.last().expect("an attempt");
    assert_eq!(attempt.state, pb::InstanceState::Cancelled as i32);
    assert!(
        attempt.exit_code.is_some() || attempt.signal.is_some(),
        "the process's end is stored: {attempt:?}"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn a_finished_run_is_sent_once_and_the_stream_ends(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    client
        .apply("name: quick\ntasks:\n  - name: t\n    command: echo hi\n")
        .await
        .expect("apply");
    let run = client.trigger_run("quick").await.expect("trigger");
    let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
    let mut stream = watch(&client, run.id).await;
    let sent = tokio::time::timeout(WITHIN, async {
        let mut sent = Vec::new();
        while let Some(run) = stream.message().await.expect("the stream holds") {
            sent.push(run);
        }
        sent
    })
    .await
    .expect("the stream of an ended run ends");
    assert_eq!(sent, vec![ended]);

    // A run that does not exist, and a settle time past the bound, are refused by name.
    let missing = client
        .control()
        .watch_run(pb::WatchRunRequest {
            id: 987_654,
            settle_ms: 0,
        })
        .await
        .expect_err("no such run");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    assert_eq!(missing.message(), "run 987654 not found");
    let too_long = client
        .control()
        .watch_run(pb::WatchRunRequest {
            id: run.id,
            settle_ms: 3_600_000,
        })
        .await
        .expect_err("settle too long");
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument);
    assert!(
        too_long.message().contains("settle_ms 3600000"),
        "{}",
        too_long.message()
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn a_stopping_node_ends_the_stream_with_unavailable(backend: Backend) {
    // No worker: the run waits for one, and the cluster's shutdown stops the node at once.
    let cluster = Cluster::builder(backend)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    client
        .apply("name: long\ntasks:\n  - name: t\n    command: sleep 60\n")
        .await
        .expect("apply");
    let run = client.trigger_run("long").await.expect("trigger");
    let mut stream = watch(&client, run.id).await;
    stream.message().await.expect("a message").expect("the run");
    // The node stops while the run waits: the stream ends at once, saying so, and the
    // shutdown does not wait for it.
    let stopping = tokio::spawn(cluster.shutdown());
    let ended = tokio::time::timeout(WITHIN, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the stream ends with the node");
    let status = ended.expect_err("an error status");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(status.message().contains("is stopping"), "{status}");
    tokio::time::timeout(WITHIN, stopping)
        .await
        .expect("the node stops")
        .expect("join")
        .expect("shutdown");
}
