//! A secret's value printed across a worker's line cut: ax-worker cuts lines at 64 KiB, and a
//! value printed after 65,530 other characters arrives at the node in two lines (in one chunk
//! or two). The node masks it across the cut, at every offset within the value and at two cuts
//! of one line; and for a worker of the proto alone that cuts lines wherever it likes and sends
//! each piece in a chunk of its own. Read back from the store: no stored line holds a piece of
//! the value of 4 bytes or more.

use ax_core::ids::{Attempt, InstanceId};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::proto_worker::{ProtoWorker, ProtoWorkerOptions};
use ax_integration_tests::requirements::MYSQL;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) sqlite_a_value_across_ax_workers_line_cut_is_masked),
        trial!(async(multi_thread) mysql_a_value_across_ax_workers_line_cut_is_masked)
            .requires(&MYSQL),
        trial!(async(multi_thread) a_value_cut_into_chunks_by_a_worker_of_the_proto_is_masked),
    ]
}

/// No `x` in it: the filler is `x`s, so any 4 bytes of the value found in a line are a leak.
const VALUE: &str = "S3CR3T-token-0123456789-ABCDEF";
/// Where ax-worker cuts a long line: set small (its default is 1 MiB) to keep the output short.
const CUT: usize = 64 * 1024;

fn key() -> ax_scheduler::secrets::SecretKey {
    // A key made for this test alone: 32 bytes, base64.
    ax_scheduler::secrets::SecretKey::from_base64("dGhpcyBpcyB0aGUgc2VjcmV0cyB0ZXN0J3Mga2V5ISE=")
        .expect("key")
}

/// A workflow whose task has the secret in `$S` and runs `script`.
fn workflow(name: &str, script: &str) -> String {
    format!(
        "name: {name}\ntasks:\n  - name: t\n    command: |\n{}\n    env:\n      S: {{ secret: cut-test }}\n",
        script
            .lines()
            .map(|line| format!("      {line}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

async fn set_secret(client: &TestClient) {
    client
        .control()
        .set_secret(pb::SetSecretRequest {
            name: "cut-test".into(),
            value: VALUE.into(),
            ..Default::default()
        })
        .await
        .expect("set the secret");
}

/// Runs `name` to its end and answers its instance's stored lines, read from the store (after
/// `GetLogs` has flushed the node's queue).
async fn stored_lines(cluster: &Cluster, client: &TestClient, name: &str) -> Vec<String> {
    let (_, run) = client.run_to_end(name).await.expect("run");
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    let instance = client.instances(run.id).await.expect("instances")[0].clone();
    let through_api = client.logs(instance.id).await.expect("logs");
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let lines: Vec<String> = store
        .read_logs(
            InstanceId(instance.id),
            Attempt(instance.attempt),
            0,
            1_000_000,
        )
        .await
        .expect("read the store")
        .into_iter()
        .map(|line| line.text)
        .collect();
    assert_eq!(lines.len(), through_api.len());
    lines
}

/// Every line that holds 4 bytes of the value in a row, with the piece.
fn leaks(lines: &[String]) -> Vec<(usize, String)> {
    let pieces: Vec<&str> = (0..=VALUE.len() - 4).map(|i| &VALUE[i..i + 4]).collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| {
            pieces
                .iter()
                .find(|piece| line.contains(**piece))
                .map(|piece| (i, piece.to_string()))
        })
        .collect()
}

async fn a_value_across_ax_workers_line_cut_is_masked(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .secret_key(key())
        .worker("w1", 2)
        .max_line_bytes(CUT)
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.expect("client");
    set_secret(&client).await;
    // Line k (k = 1 .. len-1) puts the cut k bytes into the value; the last line has two cuts,
    // the second 3 bytes into a second copy of the value.
    let script = format!(
        "i=1\n\
         while [ $i -lt ${{#S}} ]; do\n\
         \x20 head -c $(({CUT} - i)) /dev/zero | tr '\\0' x; printf '%s-end\\n' \"$S\"; i=$((i + 1))\n\
         done\n\
         head -c 65530 /dev/zero | tr '\\0' x; printf '%s' \"$S\"\n\
         head -c $(({two} - 65530 - ${{#S}} - 3)) /dev/zero | tr '\\0' x; printf '%s-end\\n' \"$S\"\n\
         echo \"whole: $S\"",
        two = 2 * CUT,
    );
    client
        .apply(&workflow("cut-ax-worker", &script))
        .await
        .expect("apply");
    let lines = stored_lines(&cluster, &client, "cut-ax-worker").await;
    let offsets = VALUE.len() - 1;
    // Each value line is two lines once cut, the two-cut line three, and the last line one.
    assert_eq!(
        lines.len(),
        offsets * 2 + 3 + 1,
        "the cuts are where they were meant"
    );
    assert_eq!(lines.last().map(String::as_str), Some("whole: ***"));
    for k in 1..=offsets {
        // The rest of the value after the cut is masked; so is its start before the cut, but
        // for a piece of under 4 bytes left at the end of a chunk (the next line went out in
        // the next chunk).
        let (first, second) = (&lines[2 * (k - 1)], &lines[2 * (k - 1) + 1]);
        let rest = VALUE.len() - k;
        assert!(
            second.starts_with("***") || rest < 4,
            "cut {k} bytes into the value: {:?} | {second:?}",
            &first[first.len().saturating_sub(40)..]
        );
        assert!(first.ends_with("***") || k < 4, "cut at {k}");
    }
    assert_eq!(leaks(&lines), Vec::new(), "pieces of the value were stored");
    cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_a_value_across_ax_workers_line_cut_is_masked() {
    a_value_across_ax_workers_line_cut_is_masked(Backend::Sqlite).await;
}

async fn mysql_a_value_across_ax_workers_line_cut_is_masked() {
    a_value_across_ax_workers_line_cut_is_masked(Backend::MySql).await;
}

/// A worker of the proto alone cutting lines at 7 bytes and sending each piece as a chunk of
/// its own: every piece of the value is at a chunk's edge, or a whole chunk inside it.
async fn a_value_cut_into_chunks_by_a_worker_of_the_proto_is_masked() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .secret_key(key())
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.expect("client");
    set_secret(&client).await;
    let mut options = ProtoWorkerOptions::new("proto-cutter", &cluster.endpoint());
    options.max_line_bytes = Some(7);
    let worker = ProtoWorker::start(options).await.expect("worker");
    client
        .wait_worker_live("proto-cutter", std::time::Duration::from_secs(20))
        .await
        .expect("live");
    // Seven lines put the value at each offset from the 7-byte cuts.
    let script =
        "for pad in '' x xx xxx xxxx xxxxx xxxxxx; do printf '%s%s\\n' \"$pad\" \"$S\"; done";
    client
        .apply(&workflow("cut-proto", script))
        .await
        .expect("apply");
    let lines = stored_lines(&cluster, &client, "cut-proto").await;
    assert!(lines.len() > 7 * 4, "the lines were cut: {lines:?}");
    assert_eq!(
        leaks(&lines),
        Vec::new(),
        "pieces of the value were stored: {lines:?}"
    );
    // The node's shutdown waits for its worker streams to end.
    worker.die();
    cluster.shutdown().await.expect("shutdown");
}
