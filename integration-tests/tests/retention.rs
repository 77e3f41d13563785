//! Retention end to end: an in-process scheduler with a real worker and a cluster default
//! retention of a few seconds purges the ended runs past it (with their instances, attempts
//! and logs) and leaves a running run, a `retention: forever` workflow and a longer-kept one
//! alone; then the real `axctl purge` counts with `--dry-run` (deleting nothing), purges a
//! named workflow whatever its retention, and every other one. Every scenario runs on SQLite,
//! and on MySQL when `AX_TEST_MYSQL_URL` is set. Needs `cargo build --bins` first (for `axctl`).

use std::process::Output;
use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const GUARD: Duration = Duration::from_secs(60);
/// The cluster's default retention in these tests.
const KEEP: Duration = Duration::from_secs(3);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(the_purger_deletes_ended_runs_past_their_retention_and_axctl_purges_on_demand,)
}

fn workflow(name: &str, retention: Option<&str>, command: &str) -> String {
    let retention = retention
        .map(|r| format!("retention: {r}\n"))
        .unwrap_or_default();
    format!("name: {name}\n{retention}tasks:\n  - name: t\n    command: {command}\n")
}

/// Whether the run is gone from the store (GetRun answers NotFound).
async fn gone(client: &TestClient, run: i64) -> bool {
    match client
        .control()
        .get_run(pb::GetRunRequest { id: run })
        .await
    {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::NotFound, "{status}");
            true
        }
        Ok(_) => false,
    }
}

async fn wait_gone(client: &TestClient, runs: &[i64]) {
    let deadline = tokio::time::Instant::now() + GUARD;
    for run in runs {
        while !gone(client, *run).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {run} is still there"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The run's instance, its attempts and its log lines are all there.
async fn kept_whole(client: &TestClient, run: i64) {
    assert!(!gone(client, run).await, "run {run} was purged");
    let instances = client.instances(run).await.expect("instances");
    assert_eq!(instances.len(), 1, "run {run}");
    assert_eq!(instances[0].attempts.len(), 1, "run {run}");
    let lines = client.logs(instances[0].id).await.expect("logs");
    assert_eq!(lines.len(), 1, "run {run}: {lines:?}");
}

async fn axctl(cluster: &Cluster, args: &[&str]) -> Output {
    let mut command =
        std::process::Command::new(ax_integration_tests::binary("axctl").expect("axctl is built"));
    command.args(args).env("AX_SERVER", cluster.endpoint());
    tokio::time::timeout(GUARD, tokio::task::spawn_blocking(move || command.output()))
        .await
        .expect("axctl ends")
        .expect("axctl thread")
        .expect("axctl runs")
}

fn json(output: &Output) -> serde_json::Value {
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("axctl prints JSON")
}

async fn metric(cluster: &Cluster, series: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", cluster.addr))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} not in the scrape"))
}

async fn the_purger_deletes_ended_runs_past_their_retention_and_axctl_purges_on_demand(
    backend: Backend,
) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 4)
        .retention(KEEP)
        .purge_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    for source in [
        workflow("short", None, "echo short"),
        workflow("ledger", Some("forever"), "echo ledger"),
        workflow("monthly", Some("30d"), "echo monthly"),
        workflow("slow", Some("1s"), "'sleep 60'"),
    ] {
        client.apply(&source).await.expect("apply");
    }
    let mut short = Vec::new();
    for _ in 0..2 {
        short.push(client.trigger_run("short").await.expect("trigger").id);
    }
    let ledger = client.trigger_run("ledger").await.expect("trigger").id;
    let monthly = client.trigger_run("monthly").await.expect("trigger").id;
    let slow = client.trigger_run("slow").await.expect("trigger").id;
    for run in short.iter().chain([&ledger, &monthly]) {
        let run = client.wait_run(*run).await.expect("run ends");
        assert_eq!(run.state(), pb::RunState::Success);
    }
    client
        .wait_instance(slow, "t", pb::InstanceState::Running)
        .await
        .expect("the slow task runs");

    // The cluster's default takes the short runs once they ended KEEP ago.
    wait_gone(&client, &short).await;
    kept_whole(&client, ledger).await;
    kept_whole(&client, monthly).await;
    let slow_run = client.get_run(slow).await.expect("the running run stays");
    assert_eq!(slow_run.state(), pb::RunState::Running);
    // Cancelled, the slow run has ended: it goes a second later.
    client.cancel_run(slow, "done").await.expect("cancel");
    wait_gone(&client, &[slow]).await;
    assert_eq!(
        metric(&cluster, r#"ax_purged_rows_total{kind="runs"}"#).await,
        3.0
    );
    assert_eq!(
        metric(&cluster, r#"ax_purged_rows_total{kind="log_chunks"}"#).await,
        2.0,
        "one log chunk of each short run (the slow task printed nothing)"
    );

    // On demand: a dry run counts `monthly` only (`ledger` keeps its runs forever) and deletes
    // nothing.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let dry = json(
        &axctl(
            &cluster,
            &["purge", "--older-than", "1s", "--dry-run", "-o", "json"],
        )
        .await,
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(
        (
            &dry["runs"],
            &dry["instances"],
            &dry["attempts"],
            &dry["log_chunks"]
        ),
        (&1.into(), &1.into(), &1.into(), &1.into()),
        "{dry}"
    );
    assert_eq!(dry["kept_forever"], serde_json::json!(["ledger"]));
    kept_whole(&client, monthly).await;
    // Named, a workflow is purged whatever its retention.
    let named = json(
        &axctl(
            &cluster,
            &[
                "purge",
                "--older-than",
                "1s",
                "--workflow",
                "ledger",
                "-o",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(
        (&named["runs"], &named["dry_run"]),
        (&1.into(), &false.into())
    );
    assert!(gone(&client, ledger).await);
    kept_whole(&client, monthly).await;
    let all = json(&axctl(&cluster, &["purge", "--older-than", "1s", "-o", "json"]).await);
    assert_eq!(all["runs"], 1, "{all}");
    assert!(gone(&client, monthly).await);
    // A bad age is refused before anything is sent; an unknown workflow is not found.
    let bad = axctl(&cluster, &["purge", "--older-than", "90"]).await;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let unknown = axctl(
        &cluster,
        &["purge", "--older-than", "1s", "--workflow", "nope"],
    )
    .await;
    assert_eq!(unknown.status.code(), Some(3), "{unknown:?}");

    // The on-demand purges are audited; the dry run is not.
    let audit = client
        .control()
        .list_audit(pb::ListAuditRequest {
            action: "purge".into(),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries;
    let targets: Vec<&str> = audit.iter().map(|e| e.target.as_str()).collect();
    assert_eq!(targets, ["workflows", "workflow/ledger"], "{audit:?}");
    assert!(audit[0].detail.contains("1 runs"), "{audit:?}");
    cluster.shutdown().await.expect("shutdown");
}
