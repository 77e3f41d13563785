//! End to end: cron overlap policies (allow, skip, queue, replace) with a per-second schedule and
//! tasks that sleep, misfire policies across a pause, backfill (order, no doubles, DST, refusals)
//! and keyed run concurrency. Every scenario runs on SQLite, and on MySQL when
//! `AX_TEST_MYSQL_URL` is set.

use std::time::Duration;

use ax_core::decision::DecisionKind;
use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;
use ax_store::DecisionRecord;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        overlap_allow_runs_fires_side_by_side,
        overlap_skip_drops_fires_while_a_run_is_active,
        overlap_queue_runs_every_fire_one_after_another,
        overlap_replace_cancels_the_active_run,
        misfire_policies_apply_to_the_slots_missed_while_paused,
        backfill_creates_one_run_per_slot_in_order_and_never_doubles,
        backfill_refusals_create_nothing,
        keyed_runs_with_the_same_key_never_overlap,
    )
}

async fn cluster(backend: Backend, capacity: u32) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .redis()
        .worker("w1", capacity)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// Sleeps until the middle of a wall-clock second, so a call made next is far from any
/// per-second slot.
async fn mid_second() {
    let ms = now_ms().rem_euclid(1_000);
    let wait = (1_500 - ms) % 1_000;
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
}

/// The workflow's runs by logical time.
async fn runs(client: &TestClient, workflow: &str) -> Vec<pb::Run> {
    let mut runs = client.runs(workflow).await.expect("list runs");
    runs.sort_by_key(|run| (run.logical_time_ms, run.id));
    runs
}

/// Waits until every run of the workflow has ended.
async fn wait_all(client: &TestClient, workflow: &str) -> Vec<pb::Run> {
    for run in runs(client, workflow).await {
        client.wait_run(run.id).await.expect("run ends");
    }
    runs(client, workflow).await
}

/// When the run's only task ran: (started, finished); `None` when it never started.
async fn interval(client: &TestClient, run: i64) -> Option<(i64, i64)> {
    let instances = client.instances(run).await.expect("instances");
    let instance = instances.first()?;
    (instance.started_at_ms > 0).then(|| {
        let end = if instance.finished_at_ms > 0 {
            instance.finished_at_ms
        } else {
            i64::MAX
        };
        (instance.started_at_ms, end)
    })
}

fn overlaps(a: (i64, i64), b: (i64, i64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

async fn decisions(cluster: &Cluster, workflow: &str) -> Vec<DecisionRecord> {
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let record = store
        .get_workflow(workflow)
        .await
        .expect("workflow")
        .expect("workflow exists");
    store
        .list_decisions(record.id, 0, i64::MAX, 10_000)
        .await
        .expect("decisions")
}

fn count(decisions: &[DecisionRecord], kind: DecisionKind) -> usize {
    decisions.iter().filter(|d| d.kind == kind).count()
}

fn every_two_seconds(name: &str, overlap: &str, command: &str) -> String {
    format!(
        r#"
name: {name}
schedule:
  cron: "*/2 * * * * *"
  overlap: {overlap}
tasks:
  - name: work
    command: {command}
"#
    )
}

async fn overlap_allow_runs_fires_side_by_side(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    client
        .apply(&every_two_seconds("ov-allow", "allow", "sleep 3"))
        .await
        .expect("apply");
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    client.pause("ov-allow").await.expect("pause");
    let runs = wait_all(&client, "ov-allow").await;
    assert!(runs.len() >= 3, "{} fires in 6.5 s", runs.len());
    let mut side_by_side = false;
    for pair in runs.windows(2) {
        assert_eq!(pair[1].logical_time_ms - pair[0].logical_time_ms, 2_000);
        let a = interval(&client, pair[0].id).await.expect("ran");
        let b = interval(&client, pair[1].id).await.expect("ran");
        side_by_side |= overlaps(a, b);
    }
    assert!(side_by_side, "allow: a 3 s task fired every 2 s overlaps");
    for run in &runs {
        assert_eq!(run.state, pb::RunState::Success as i32);
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn overlap_skip_drops_fires_while_a_run_is_active(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    client
        .apply(&every_two_seconds("ov-skip", "skip", "sleep 3"))
        .await
        .expect("apply");
    tokio::time::sleep(Duration::from_millis(8_500)).await;
    client.pause("ov-skip").await.expect("pause");
    let runs = wait_all(&client, "ov-skip").await;
    assert!(runs.len() >= 2, "{} fires in 8.5 s", runs.len());
    for pair in runs.windows(2) {
        assert!(
            pair[1].logical_time_ms - pair[0].logical_time_ms >= 4_000,
            "the slot after a fire is skipped while its 3 s run is active"
        );
        let a = interval(&client, pair[0].id).await.expect("ran");
        let b = interval(&client, pair[1].id).await.expect("ran");
        assert!(!overlaps(a, b), "skip: runs never overlap");
    }
    let decisions = decisions(&cluster, "ov-skip").await;
    assert!(count(&decisions, DecisionKind::SkippedOverlap) >= 1);
    assert_eq!(count(&decisions, DecisionKind::Fired), runs.len());
    cluster.shutdown().await.expect("shutdown");
}

async fn overlap_queue_runs_every_fire_one_after_another(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    client
        .apply(&every_two_seconds("ov-queue", "queue", "sleep 2.5"))
        .await
        .expect("apply");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(7_500);
    let mut seen_queued = false;
    while tokio::time::Instant::now() < deadline {
        let now = runs(&client, "ov-queue").await;
        seen_queued |= now.iter().any(|r| r.state == pb::RunState::Queued as i32);
        let active = now
            .iter()
            .filter(|r| r.state == pb::RunState::Running as i32)
            .count();
        assert!(active <= 1, "queue: one active run at a time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client.pause("ov-queue").await.expect("pause");
    assert!(seen_queued, "a fire while a run was active was queued");
    let all = runs(&client, "ov-queue").await;
    assert!(all.len() >= 3, "{} fires in 7.5 s", all.len());
    for pair in all.windows(2) {
        assert_eq!(
            pair[1].logical_time_ms - pair[0].logical_time_ms,
            2_000,
            "queue: no fire is dropped"
        );
    }
    // Cancel what is still queued: it ends CANCELLED without ever running.
    let mut cancelled_queued = 0;
    for run in &all {
        if run.state == pb::RunState::Queued as i32 {
            let ended = client
                .cancel_run(run.id, "test over")
                .await
                .expect("cancel");
            if ended.state == pb::RunState::Cancelled as i32
                && interval(&client, run.id).await.is_none()
            {
                cancelled_queued += 1;
            }
        }
    }
    let all = wait_all(&client, "ov-queue").await;
    let mut ran = Vec::new();
    for run in &all {
        if let Some(span) = interval(&client, run.id).await {
            ran.push(span);
        }
    }
    assert!(ran.len() >= 2);
    for pair in ran.windows(2) {
        assert!(!overlaps(pair[0], pair[1]), "queue: runs never overlap");
    }
    let decisions = decisions(&cluster, "ov-queue").await;
    assert!(count(&decisions, DecisionKind::Queued) >= 1);
    assert!(count(&decisions, DecisionKind::Dequeued) >= 1);
    assert!(cancelled_queued <= all.len());
    cluster.shutdown().await.expect("shutdown");
}

async fn overlap_replace_cancels_the_active_run(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    client
        .apply(&every_two_seconds("ov-replace", "replace", "sleep 30"))
        .await
        .expect("apply");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(5_500);
    while tokio::time::Instant::now() < deadline {
        let active = runs(&client, "ov-replace")
            .await
            .iter()
            .filter(|r| r.state == pb::RunState::Running as i32)
            .count();
        assert!(active <= 1, "replace: one active run at a time");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    client.pause("ov-replace").await.expect("pause");
    let all = runs(&client, "ov-replace").await;
    assert!(all.len() >= 2, "{} fires in 5.5 s", all.len());
    let (last, earlier) = all.split_last().expect("runs");
    for run in earlier {
        let ended = client.wait_run(run.id).await.expect("ends");
        assert_eq!(ended.state, pb::RunState::Cancelled as i32, "replaced");
        let instance = &client.instances(run.id).await.expect("instances")[0];
        assert_eq!(instance.state, pb::InstanceState::Cancelled as i32);
    }
    assert_eq!(last.state, pb::RunState::Running as i32);
    let decisions = decisions(&cluster, "ov-replace").await;
    assert_eq!(count(&decisions, DecisionKind::Replaced), earlier.len());
    client
        .cancel_run(last.id, "test over")
        .await
        .expect("cancel");
    cluster.shutdown().await.expect("shutdown");
}

async fn misfire_policies_apply_to_the_slots_missed_while_paused(backend: Backend) {
    let (cluster, client) = cluster(backend, 20).await;
    let names = ["mf-skip", "mf-once", "mf-catch"];
    let policies = [
        "misfire: skip",
        "misfire: fire_once",
        "misfire: catch_up\n  max_catch_up: 2",
    ];
    for (name, policy) in names.iter().zip(policies) {
        let source = format!(
            "name: {name}\nschedule:\n  cron: \"* * * * * *\"\n  {policy}\ntasks:\n  - name: t\n    command: \"true\"\n"
        );
        client.apply(&source).await.expect("apply");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    mid_second().await;
    let mut paused_at = Vec::new();
    for name in names {
        client.pause(name).await.expect("pause");
        paused_at.push(now_ms());
    }
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    mid_second().await;
    let mut resumed_at = Vec::new();
    for name in names {
        resumed_at.push(now_ms());
        client.resume(name).await.expect("resume");
    }
    // Long enough for the cron loop to fire the kept slots (it is woken by the resume).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for name in names {
        client.pause(name).await.expect("pause");
    }
    let expected = [0usize, 1, 2];
    for (i, name) in names.iter().enumerate() {
        let all = wait_all(&client, name).await;
        let paused_slots: Vec<i64> = all
            .iter()
            .map(|r| r.logical_time_ms)
            .filter(|&t| t > paused_at[i] && t <= resumed_at[i])
            .collect();
        // The latest slots before the resume, in order.
        let last_slot = resumed_at[i] - resumed_at[i].rem_euclid(1_000);
        let want: Vec<i64> = (0..expected[i] as i64)
            .rev()
            .map(|k| last_slot - k * 1_000)
            .collect();
        assert_eq!(paused_slots, want, "{name}: slots run after the pause");
        for run in &all {
            assert_eq!(run.state, pb::RunState::Success as i32, "{name}");
        }
        let decisions = decisions(&cluster, name).await;
        assert_eq!(count(&decisions, DecisionKind::Paused), 1, "{name}");
    }
    cluster.shutdown().await.expect("shutdown");
}

fn axctl_ok(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = cluster.axctl(args).expect("axctl runs");
    assert!(
        out.status.success(),
        "axctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json output")
}

fn axctl_exit(cluster: &Cluster, args: &[&str]) -> (i32, String) {
    let out = cluster.axctl(args).expect("axctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const HOURLY_NY: &str = r#"
name: bf
schedule:
  cron: "0 * * * *"
  timezone: America/New_York
  max_active_runs: 1
tasks:
  - name: t
    command: sleep 0.2
"#;

/// The logical times of `axctl -o json get runs`' runs, in its order.
fn logical_times(runs: &serde_json::Value) -> Vec<&str> {
    runs.as_array()
        .expect("a list")
        .iter()
        .map(|run| run["logical_time"].as_str().expect("logical time"))
        .collect()
}

/// 2026-03-08T05:00:00Z, 00:00 EST; the clocks jump at 07:00Z (02:00 EST → 03:00 EDT).
const SPRING_0500Z: i64 = 1_772_946_000_000;
const HOUR: i64 = 3_600_000;

async fn backfill_creates_one_run_per_slot_in_order_and_never_doubles(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    client.apply(HOURLY_NY).await.expect("apply");
    // 00:00 .. 04:00 New York time across spring forward: 02:00 does not exist and collapses
    // with 03:00 EDT into one slot at 07:00Z.
    let dry = axctl_ok(
        &cluster,
        &[
            "-o",
            "json",
            "backfill",
            "bf",
            "--from",
            "2026-03-08",
            "--to",
            "2026-03-08T04:00",
            "--dry-run",
        ],
    );
    assert_eq!(dry["slots"].as_array().map(Vec::len), Some(4), "{dry}");
    assert!(
        runs(&client, "bf").await.is_empty(),
        "a dry run creates nothing"
    );
    let first = axctl_ok(
        &cluster,
        &[
            "-o",
            "json",
            "backfill",
            "bf",
            "--from",
            "2026-03-08",
            "--to",
            "2026-03-08T04:00",
        ],
    );
    assert_eq!(first["created"], 4, "{first}");
    // An overlapping range: the two slots that have runs are not doubled.
    let response = client
        .control()
        .backfill_workflow(pb::BackfillWorkflowRequest {
            name: "bf".into(),
            from_ms: SPRING_0500Z + 2 * HOUR,
            to_ms: SPRING_0500Z + 5 * HOUR,
            max_runs: 0,
            actor: "tester".into(),
            dry_run: false,
        })
        .await
        .expect("backfill")
        .into_inner();
    assert_eq!((response.created, response.existing), (2, 2));
    let all = wait_all(&client, "bf").await;
    let logical: Vec<i64> = all.iter().map(|r| r.logical_time_ms).collect();
    let want: Vec<i64> = (0..6).map(|h| SPRING_0500Z + h * HOUR).collect();
    assert_eq!(logical, want);
    // max_active_runs 1: they ran one at a time, in slot order.
    let mut previous: Option<(i64, i64)> = None;
    for run in &all {
        assert_eq!(run.state, pb::RunState::Success as i32);
        assert_eq!(run.trigger, pb::TriggerKind::Backfill as i32);
        let span = interval(&client, run.id).await.expect("ran");
        if let Some(previous) = previous {
            assert!(
                span.0 >= previous.1,
                "run {} started before the previous ended",
                run.id
            );
        }
        previous = Some(span);
    }
    // `get runs` finds them by trigger and logical time (both bounds inclusive).
    let found = axctl_ok(
        &cluster,
        &[
            "-o",
            "json",
            "get",
            "runs",
            "--workflow",
            "bf",
            "--trigger",
            "backfill",
            "--from",
            "2026-03-08T07:00:00Z",
            "--to",
            "2026-03-08T08:00:00Z",
        ],
    );
    let times = logical_times(&found);
    assert_eq!(
        times,
        ["2026-03-08T08:00:00.000Z", "2026-03-08T07:00:00.000Z"]
    );
    // Bare times are the workflow's own (New York: 03:00 EDT is 07:00Z, 04:00 EDT 08:00Z).
    let zoned = axctl_ok(
        &cluster,
        &[
            "-o",
            "json",
            "get",
            "runs",
            "--workflow",
            "bf",
            "--from",
            "2026-03-08T03:00",
            "--to",
            "2026-03-08T04:00",
        ],
    );
    assert_eq!(logical_times(&zoned), times, "{zoned}");
    let cron = axctl_ok(
        &cluster,
        &[
            "-o",
            "json",
            "get",
            "runs",
            "--workflow",
            "bf",
            "--trigger",
            "cron",
        ],
    );
    assert_eq!(cron.as_array().map(Vec::len), Some(0), "{cron}");
    let (code, err) = axctl_exit(&cluster, &["get", "runs", "--from", "yesterday"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from \"yesterday\""), "{err}");
    let decisions = decisions(&cluster, "bf").await;
    assert_eq!(count(&decisions, DecisionKind::Fired), 6);
    assert!(count(&decisions, DecisionKind::Queued) >= 1);
    let audit = cluster.axctl(&["get", "workflow", "bf"]).expect("axctl");
    let text = String::from_utf8_lossy(&audit.stdout);
    assert!(text.contains("max active runs 1"), "{text}");
    assert!(text.contains("Next fires"), "{text}");
    cluster.shutdown().await.expect("shutdown");
}

async fn backfill_refusals_create_nothing(backend: Backend) {
    let (cluster, client) = cluster(backend, 4).await;
    client.apply(HOURLY_NY).await.expect("apply");
    client
        .apply("name: manual\ntasks:\n  - name: t\n    command: \"true\"\n")
        .await
        .expect("apply");
    let (code, err) = axctl_exit(
        &cluster,
        &[
            "backfill",
            "bf",
            "--from",
            "2026-03-08T04:00",
            "--to",
            "2026-03-08T03:00",
        ],
    );
    assert_eq!(code, 4, "reversed: {err}");
    assert!(err.contains("reversed"), "{err}");
    let (code, err) = axctl_exit(
        &cluster,
        &[
            "backfill",
            "bf",
            "--from",
            "2026-03-08",
            "--to",
            "2026-03-08T04:00",
            "--max",
            "3",
        ],
    );
    assert_eq!(code, 4, "too many: {err}");
    assert!(err.contains("more than 3 slots"), "{err}");
    let (code, err) = axctl_exit(
        &cluster,
        &[
            "backfill",
            "bf",
            "--from",
            "yesterday",
            "--to",
            "2026-03-08",
        ],
    );
    assert_eq!(code, 2, "bad time: {err}");
    let (code, err) = axctl_exit(
        &cluster,
        &[
            "backfill",
            "manual",
            "--from",
            "2026-03-08",
            "--to",
            "2026-03-09",
        ],
    );
    assert_eq!(code, 6, "no cron: {err}");
    assert!(err.contains("no cron schedule"), "{err}");
    let (code, err) = axctl_exit(
        &cluster,
        &[
            "backfill",
            "nope",
            "--from",
            "2026-03-08",
            "--to",
            "2026-03-09",
        ],
    );
    assert_eq!(code, 3, "unknown: {err}");
    assert!(runs(&client, "bf").await.is_empty());
    assert!(runs(&client, "manual").await.is_empty());
    cluster.shutdown().await.expect("shutdown");
}

async fn keyed_runs_with_the_same_key_never_overlap(backend: Backend) {
    let (cluster, client) = cluster(backend, 8).await;
    let source = r#"
name: keyed
concurrency:
  key: "${customer}"
  max_runs_per_key: 1
tasks:
  - name: t
    command: sleep 1
"#;
    client.apply(source).await.expect("apply");
    let trigger = |customer: &'static str| {
        let client = &client;
        async move {
            client
                .trigger("keyed", &[("customer", customer)], "")
                .await
                .expect("trigger")
                .run
                .expect("run")
        }
    };
    // Without the param the key names, a trigger is refused and creates nothing (it would
    // silently share the key "" with every other such run).
    let err = client
        .trigger("keyed", &[("other", "x")], "")
        .await
        .expect_err("a trigger without the key's param is refused");
    let status = err
        .downcast_ref::<tonic::Status>()
        .unwrap_or_else(|| panic!("a gRPC status: {err:#}"));
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("missing param customer")
            && status.message().contains("\"${customer}\""),
        "{status:?}"
    );
    assert!(runs(&client, "keyed").await.is_empty());
    let acme1 = trigger("acme").await;
    let acme2 = trigger("acme").await;
    let bolt = trigger("bolt").await;
    assert_eq!(acme1.state, pb::RunState::Running as i32);
    assert_eq!(acme2.state, pb::RunState::Queued as i32);
    assert_eq!(bolt.state, pb::RunState::Running as i32);
    for run in [&acme1, &acme2, &bolt] {
        let ended = client.wait_run(run.id).await.expect("ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
    }
    let a1 = interval(&client, acme1.id).await.expect("ran");
    let a2 = interval(&client, acme2.id).await.expect("ran");
    let b = interval(&client, bolt.id).await.expect("ran");
    assert!(!overlaps(a1, a2), "same key: {a1:?} {a2:?}");
    assert!(
        overlaps(a1, b),
        "different keys run side by side: {a1:?} {b:?}"
    );
    cluster.shutdown().await.expect("shutdown");
}
