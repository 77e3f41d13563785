//! The read-only views end to end, through the real `axctl` against an in-process scheduler
//! with real workers: `axctl dag` in every format (golden files), `axctl why` for each kind of
//! answer, and `axctl audit` after every mutating call. Every scenario runs on SQLite, and on
//! MySQL when `AX_TEST_MYSQL_URL` is set. Needs `cargo build --bins` first (for `axctl`).

use std::collections::BTreeMap;
use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient, WorkerSpec};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        dag_prints_every_format_and_colours_a_run_by_state,
        why_before_the_first_slot_and_after_a_fired_run_of_a_paused_workflow,
        why_names_the_upstream_a_task_waits_on_and_the_labels_no_worker_has,
        why_shows_a_decision_recorded_in_the_store,
        why_explains_real_throttling_queueing_and_overlap_skips,
        audit_lists_every_mutating_call_with_actor_and_address,
    )
}

/// One worker `w1` with the label `zone=a`.
async fn cluster(backend: Backend) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .redis()
        .labelled_worker(WorkerSpec {
            id: "w1".into(),
            capacity: 8,
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        })
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

struct Ctl {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Ctl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `axctl --actor auditor@test ARGS`, off the async runtime's threads.
async fn axctl(cluster: &Cluster, args: &[&str]) -> Ctl {
    let mut all = vec!["--actor", "auditor@test"];
    all.extend_from_slice(args);
    let output = tokio::task::block_in_place(|| cluster.axctl(&all)).expect("axctl runs");
    Ctl {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("utf-8 stderr"),
    }
}

async fn ok(cluster: &Cluster, args: &[&str]) -> String {
    let out = axctl(cluster, args).await;
    assert_eq!(out.code, 0, "axctl {args:?}: {out:?}");
    out.stdout
}

async fn json(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let text = ok(cluster, &all).await;
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{err}: {text}"))
}

/// Writes `source` into the cluster's scratch dir and applies it with `axctl apply -f`.
async fn apply(cluster: &Cluster, name: &str, source: &str) {
    let path = cluster.dir().join(format!("{name}.yaml"));
    std::fs::write(&path, source).expect("write workflow file");
    ok(cluster, &["apply", "-f", &path.display().to_string()]).await;
}

async fn trigger(cluster: &Cluster, name: &str) -> i64 {
    let text = ok(cluster, &["trigger", name]).await;
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("run id: {text:?}"))
}

/// Polls the run's instances, by task, until `done` holds.
async fn wait_instances(
    client: &TestClient,
    run: i64,
    what: &str,
    done: impl Fn(&BTreeMap<String, pb::Instance>) -> bool,
) -> BTreeMap<String, pb::Instance> {
    let by_task = |all: &[pb::Instance]| -> BTreeMap<String, pb::Instance> {
        all.iter()
            .map(|instance| (instance.task.clone(), instance.clone()))
            .collect()
    };
    let all = client
        .wait_instances(run, what, |all| done(&by_task(all)))
        .await
        .unwrap_or_else(|err| panic!("{err:#}"));
    by_task(&all)
}

fn state(instance: Option<&pb::Instance>) -> Option<pb::InstanceState> {
    instance.and_then(|i| pb::InstanceState::try_from(i.state).ok())
}

/// The JSON export names the run and instances by id; ids differ between stores.
fn redact_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = ["\"run_id\": ", "\"instance_id\": "]
        .iter()
        .filter_map(|key| rest.find(key).map(|i| (i, key.len())))
        .min()
    {
        let (start, len) = pos;
        out.push_str(&rest[..start + len]);
        rest = &rest[start + len..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            out.push_str("ID");
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

fn golden(name: &str, actual: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/views");
    let path = format!("{dir}/{name}");
    if std::env::var_os("AX_BLESS").is_some() {
        std::fs::create_dir_all(dir).expect("golden dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{path}: {err} (AX_BLESS=1 creates it)"));
    assert_eq!(actual, expected, "{path} differs (AX_BLESS=1 rewrites it)");
}

/// A diamond (extract → clean, audit → load) with a fan-out (clean → publish_a, _b, _c);
/// `audit` fails, so `load` can never run.
const SHAPES: &str = r#"name: shapes
tasks:
  - name: extract
    command: "true"
  - name: clean
    command: "true"
    upstream: [extract]
  - name: audit
    command: "exit 3"
    upstream: [extract]
  - name: load
    command: "true"
    upstream: [clean, audit]
  - name: publish_a
    command: "true"
    upstream: [clean]
  - name: publish_b
    command: "true"
    upstream: [clean]
  - name: publish_c
    command: "true"
    upstream: [clean]
"#;

async fn dag_prints_every_format_and_colours_a_run_by_state(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    apply(&cluster, "shapes", SHAPES).await;
    let formats = [
        ("ascii", "txt"),
        ("dot", "dot"),
        ("mermaid", "mmd"),
        ("json", "json"),
    ];
    for (format, ext) in formats {
        let text = ok(&cluster, &["dag", "shapes", "-o", format]).await;
        golden(&format!("shapes.{ext}"), &text);
    }
    // The default is the tree.
    assert_eq!(
        ok(&cluster, &["dag", "shapes"]).await,
        ok(&cluster, &["dag", "shapes", "-o", "ascii"]).await
    );

    let run = trigger(&cluster, "shapes").await;
    let ended = client.wait_run(run).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32, "{ended:?}");
    let run_arg = run.to_string();
    for (format, ext) in formats {
        let text = ok(
            &cluster,
            &["dag", "shapes", "--run", &run_arg, "-o", format],
        )
        .await;
        assert!(!text.contains('\x1b'), "no colours into a pipe: {text}");
        golden(&format!("shapes_run.{ext}"), &redact_ids(&text));
    }
    let exported = json(&cluster, &["dag", "shapes", "--run", &run_arg]).await;
    assert_eq!(exported["run_id"], run);

    // The same graph over the API, for the web UI.
    let dag = client
        .control()
        .get_dag(pb::GetDagRequest {
            workflow: "shapes".into(),
            version: 0,
            run_id: run,
            ..Default::default()
        })
        .await
        .expect("GetDag")
        .into_inner();
    let load = dag.nodes.iter().find(|n| n.task == "load").expect("load");
    // The advance keeps the verdict as an instance that never ran.
    assert_eq!(load.state.as_str(), "UPSTREAM_FAILED");
    assert_ne!(load.instance_id, 0);
    let audit = dag.nodes.iter().find(|n| n.task == "audit").expect("audit");
    assert_eq!(audit.state, "FAILED");
    assert!(audit.instance_id > 0);
    assert_eq!(dag.edges.len(), 7);

    // Bad input: an unknown workflow or run, a run of another workflow, a missing version.
    assert_eq!(axctl(&cluster, &["dag", "nope"]).await.code, 3);
    assert_eq!(
        axctl(&cluster, &["dag", "shapes", "--run", "999999"])
            .await
            .code,
        3
    );
    assert_eq!(
        axctl(&cluster, &["dag", "shapes", "--version", "9"])
            .await
            .code,
        3
    );
    apply(
        &cluster,
        "other",
        "name: other\ntasks:\n  - name: t\n    command: \"true\"\n",
    )
    .await;
    let out = axctl(&cluster, &["dag", "other", "--run", &run_arg]).await;
    assert_eq!(out.code, 4, "{out:?}");
    assert!(
        out.stderr.contains("is a run of workflow \"shapes\""),
        "{out:?}"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn why_before_the_first_slot_and_after_a_fired_run_of_a_paused_workflow(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    // Not yet time: a yearly schedule with no run.
    apply(
        &cluster,
        "yearly",
        "name: yearly\nschedule:\n  cron: \"0 0 1 1 *\"\n  timezone: Europe/Paris\ntasks:\n  - name: t\n    command: \"true\"\n",
    )
    .await;
    let why = json(&cluster, &["why", "yearly"]).await;
    assert!(why["run"].is_null(), "{why}");
    assert_eq!(why["tasks"][0]["reason"], "not_yet_time", "{why}");
    let next = why["schedule"]["next_slot"].as_str().expect("next slot");
    assert!(
        next.ends_with("-12-31T23:00:00.000Z"),
        "midnight in Paris: {next}"
    );
    let text = ok(&cluster, &["why", "yearly"]).await;
    assert!(text.contains("not yet time: the next slot is"), "{text}");
    assert!(text.contains("No run yet."), "{text}");

    // Fired and succeeded: an every-second schedule, asked about its first run's slot.
    apply(
        &cluster,
        "ticker",
        "name: ticker\nschedule:\n  cron: \"* * * * * *\"\ntasks:\n  - name: one\n    command: \"true\"\n  - name: two\n    command: \"true\"\n    upstream: [one]\n",
    )
    .await;
    let mut control = client.control();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let succeeded = loop {
        let runs = control
            .list_runs(pb::ListRunsRequest {
                workflow: "ticker".into(),
                limit: 50,
                state: pb::RunState::Success as i32,
                ..Default::default()
            })
            .await
            .expect("list runs")
            .into_inner()
            .runs;
        if let Some(run) = runs.last() {
            break run.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ticker run succeeded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ok(&cluster, &["pause", "ticker"]).await;
    let at = rfc3339(succeeded.logical_time_ms);
    let why = json(&cluster, &["why", "ticker", "--at", &at]).await;
    assert_eq!(why["run"]["id"], succeeded.id, "{why}");
    assert_eq!(why["schedule"]["paused"], true);
    let verdict: Vec<&str> = why["verdict"]
        .as_array()
        .expect("verdict")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(verdict[0].contains("paused"), "{verdict:?}");
    let fired = format!("run {}", succeeded.id);
    assert!(
        verdict[1].contains("fired") && verdict[1].contains(&fired),
        "{verdict:?}"
    );
    for task in why["tasks"].as_array().expect("tasks") {
        assert_eq!(task["reason"], "done", "{why}");
        assert!(
            task["text"].as_str().unwrap().starts_with("succeeded at"),
            "{why}"
        );
        assert_eq!(task["worker"], "w1");
    }
    let text = ok(&cluster, &["why", "ticker", "--at", &at]).await;
    assert!(text.contains("State:          PAUSED"), "{text}");
    assert!(
        text.contains(&format!("Run {} (cron,", succeeded.id)),
        "{text}"
    );

    // A time that is not one.
    let out = axctl(&cluster, &["why", "ticker", "--at", "31/01/2026"]).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert_eq!(axctl(&cluster, &["why", "nope"]).await.code, 3);
    cluster.shutdown().await.expect("shutdown");
}

/// RFC 3339 in UTC with milliseconds, from epoch milliseconds.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("a valid instant")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn why_names_the_upstream_a_task_waits_on_and_the_labels_no_worker_has(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    apply(
        &cluster,
        "blocked",
        r#"name: blocked
tasks:
  - name: slow
    command: "sleep 30"
  - name: after_slow
    command: "true"
    upstream: [slow]
  - name: gpu
    command: "true"
    labels: {gpu: a100}
"#,
    )
    .await;
    let run = trigger(&cluster, "blocked").await;
    wait_instances(&client, run, "slow running", |i| {
        state(i.get("slow")) == Some(pb::InstanceState::Running)
    })
    .await;
    let why = json(&cluster, &["why", "blocked"]).await;
    assert_eq!(why["run"]["id"], run, "{why}");
    let task = |name: &str| {
        why["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .find(|t| t["task"] == name)
            .unwrap_or_else(|| panic!("{name} in {why}"))
            .clone()
    };
    let slow = task("slow");
    assert_eq!(slow["reason"], "running");
    assert!(
        slow["text"]
            .as_str()
            .unwrap()
            .starts_with("running on worker w1 since "),
        "{slow}"
    );
    let after = task("after_slow");
    assert_eq!(
        (&after["state"], &after["reason"]),
        (&"PENDING".into(), &"waiting_upstream".into())
    );
    assert_eq!(after["text"], "waiting on upstream slow (RUNNING)");
    let gpu = task("gpu");
    assert_eq!(
        (&gpu["state"], &gpu["reason"]),
        (&"WAITING".into(), &"no_worker".into())
    );
    assert_eq!(
        gpu["text"],
        "no live worker with labels gpu=a100 (live: w1 [zone=a])"
    );
    let text = ok(&cluster, &["why", "blocked"]).await;
    assert!(
        text.contains("no live worker with labels gpu=a100"),
        "{text}"
    );
    assert!(
        text.contains("waiting on upstream slow (RUNNING)"),
        "{text}"
    );

    ok(&cluster, &["cancel", "run", &run.to_string()]).await;
    let why = json(&cluster, &["why", "blocked"]).await;
    let after = why["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task"] == "after_slow")
        .unwrap()
        .clone();
    assert_eq!(
        after["text"], "will not run: upstream slow was CANCELLED and trigger_rule is all_success",
        "{why}"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn why_shows_a_decision_recorded_in_the_store(backend: Backend) {
    let (cluster, _client) = cluster(backend).await;
    apply(
        &cluster,
        "daily",
        "name: daily\nschedule:\n  cron: \"30 2 * * *\"\n  overlap: skip\ntasks:\n  - name: t\n    command: \"true\"\n",
    )
    .await;
    // 2026-01-31T02:30:00Z, a slot of the schedule.
    let slot = 1_769_826_600_000;
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let workflow = store
        .get_workflow("daily")
        .await
        .expect("get workflow")
        .expect("daily exists");
    store
        .record_decisions(&[ax_store::DecisionRecord {
            at: slot + 5,
            workflow_id: workflow.id,
            slot_at: slot,
            run_id: None,
            instance_id: None,
            task: None,
            kind: ax_core::decision::DecisionKind::SkippedOverlap,
            detail: "previous run 41 still running".into(),
            node_id: "node-x".into(),
        }])
        .await
        .expect("record decision");

    let why = json(&cluster, &["why", "daily", "--at", "2026-01-31T02:31"]).await;
    assert_eq!(why["decisions"][0]["kind"], "skipped_overlap", "{why}");
    assert_eq!(
        why["decisions"][0]["detail"],
        "previous run 41 still running"
    );
    assert_eq!(why["schedule"]["previous_slot"], "2026-01-31T02:30:00.000Z");
    assert_eq!(
        why["verdict"][0],
        "the slot at 2026-01-31 02:30:00 UTC was skipped: an earlier run was still active: \
         previous run 41 still running"
    );
    let text = ok(&cluster, &["why", "daily", "--at", "2026-01-31T02:31:00Z"]).await;
    assert!(
        text.contains("skipped_overlap   slot 2026-01-31 02:30:00 UTC: skipped_overlap: previous run 41 still running"),
        "{text}"
    );
    // A day later the decision is out of the window.
    let why = json(&cluster, &["why", "daily", "--at", "2026-02-01T02:31"]).await;
    assert_eq!(why["decisions"], serde_json::json!([]), "{why}");
    drop(store);
    cluster.shutdown().await.expect("shutdown");
}

/// The task of `why`'s JSON answer named `name`.
fn why_task(why: &serde_json::Value, name: &str) -> serde_json::Value {
    why["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["task"] == name)
        .unwrap_or_else(|| panic!("{name} in {why}"))
        .clone()
}

/// Polls `axctl why WORKFLOW -o json` until `done` holds (or fails after [`TIMEOUT`]).
async fn wait_why(
    cluster: &Cluster,
    workflow: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let why = json(cluster, &["why", workflow]).await;
        if done(&why) {
            return why;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{workflow}: {what} not explained: {why}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Decisions the scheduler itself makes (no rows inserted by the test) reach `axctl why`: an
/// instance held back by a task limit, a run queued behind max_active_runs, cron slots dropped
/// by the overlap policy `skip`.
async fn why_explains_real_throttling_queueing_and_overlap_skips(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    // A task limit of 1: the second run's instance waits for the first.
    apply(
        &cluster,
        "limited",
        "name: limited\ntasks:\n  - name: work\n    command: \"sleep 30\"\n    concurrency: 1\n",
    )
    .await;
    let first = trigger(&cluster, "limited").await;
    wait_instances(&client, first, "work running", |i| {
        state(i.get("work")) == Some(pb::InstanceState::Running)
    })
    .await;
    let second = trigger(&cluster, "limited").await;
    let why = wait_why(&cluster, "limited", "the throttled instance", |why| {
        why["run"]["id"] == second && why_task(why, "work")["reason"] == "throttled"
    })
    .await;
    assert_eq!(
        why_task(&why, "work")["text"],
        "throttled: task limit 1 reached",
        "{why}"
    );
    let text = ok(&cluster, &["why", "limited"]).await;
    assert!(text.contains("throttled: task limit 1 reached"), "{text}");

    // max_active_runs 1: the second run is created QUEUED and says why.
    apply(
        &cluster,
        "serial",
        "name: serial\nschedule:\n  max_active_runs: 1\ntasks:\n  - name: step\n    command: \"sleep 30\"\n",
    )
    .await;
    let active = trigger(&cluster, "serial").await;
    wait_instances(&client, active, "step running", |i| {
        state(i.get("step")) == Some(pb::InstanceState::Running)
    })
    .await;
    let queued = trigger(&cluster, "serial").await;
    let why = wait_why(&cluster, "serial", "the queued run", |why| {
        why["run"]["id"] == queued
    })
    .await;
    let step = why_task(&why, "step");
    assert_eq!(step["reason"], "queued", "{why}");
    assert_eq!(
        step["text"], "run queued: max_active_runs 1 reached",
        "{why}"
    );
    assert!(
        why["decisions"]
            .as_array()
            .expect("decisions")
            .iter()
            .any(|d| d["kind"] == "queued"),
        "{why}"
    );

    // Every second, overlap skip, a task of 30 s: the slots after the first are skipped.
    apply(
        &cluster,
        "ticker",
        "name: ticker\nschedule:\n  cron: \"* * * * * *\"\n  overlap: skip\ntasks:\n  - name: tick\n    command: \"sleep 30\"\n",
    )
    .await;
    let why = wait_why(&cluster, "ticker", "a skipped slot", |why| {
        why["decisions"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["kind"] == "skipped_overlap"))
    })
    .await;
    let text = ok(&cluster, &["why", "ticker"]).await;
    assert!(text.contains("skipped_overlap"), "{text}\n{why}");
    ok(&cluster, &["pause", "ticker"]).await;
    let runs = client.runs("ticker").await.expect("list runs");
    assert_eq!(runs.len(), 1, "overlap skip keeps one run: {runs:?}");
    cluster.shutdown().await.expect("shutdown");
}

async fn audit_lists_every_mutating_call_with_actor_and_address(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let flaky = "name: flaky\ntasks:\n  - name: f\n    command: \"exit 1\"\n";
    apply(&cluster, "flaky", flaky).await;
    let path = cluster.dir().join("flaky.yaml").display().to_string();
    ok(&cluster, &["apply", "--dry-run", "-f", &path]).await;
    let run = trigger(&cluster, "flaky").await;
    client.wait_run(run).await.expect("run ends");
    let failed = client.instances(run).await.expect("instances")[0].id;
    ok(&cluster, &["retry", &failed.to_string()]).await;
    client.wait_run(run).await.expect("retry ends");
    ok(&cluster, &["rerun", &run.to_string(), "--failed"]).await;
    client.wait_run(run).await.expect("rerun ends");
    ok(&cluster, &["pause", "flaky"]).await;
    ok(&cluster, &["resume", "flaky"]).await;

    apply(
        &cluster,
        "sleepy",
        "name: sleepy\ntasks:\n  - name: s\n    command: \"sleep 30\"\n",
    )
    .await;
    let first = trigger(&cluster, "sleepy").await;
    ok(&cluster, &["cancel", "run", &first.to_string()]).await;
    let second = trigger(&cluster, "sleepy").await;
    let instances = wait_instances(&client, second, "an instance", |i| !i.is_empty()).await;
    let instance = instances["s"].id;
    ok(&cluster, &["cancel", "instance", &instance.to_string()]).await;

    let rows = json(&cluster, &["audit", "--limit", "100"]).await;
    let rows = rows.as_array().expect("rows");
    let seen: Vec<(String, String)> = rows
        .iter()
        .rev()
        .map(|row| {
            (
                row["action"].as_str().unwrap().to_string(),
                row["target"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("apply", "workflow/flaky".to_string()),
        ("trigger", "workflow/flaky".to_string()),
        ("retry", format!("instance/{failed}")),
        ("rerun", format!("run/{run}")),
        ("pause", "workflow/flaky".to_string()),
        ("resume", "workflow/flaky".to_string()),
        ("apply", "workflow/sleepy".to_string()),
        ("trigger", "workflow/sleepy".to_string()),
        ("cancel", format!("run/{first}")),
        ("trigger", "workflow/sleepy".to_string()),
        ("cancel", format!("instance/{instance}")),
    ]
    .into_iter()
    .map(|(a, t)| (a.to_string(), t))
    .collect();
    assert_eq!(
        seen, expected,
        "the dry run wrote nothing; everything else one row each"
    );
    for row in rows {
        assert_eq!(row["actor"], "auditor@test", "{row}");
        let remote = row["remote"].as_str().unwrap();
        assert!(remote.starts_with("127.0.0.1:"), "{row}");
        assert!(row["at"].as_str().is_some(), "{row}");
    }

    // Details are plain text: numbers and names, no Debug dumps.
    let detail = |action: &str| {
        rows.iter()
            .find(|row| row["action"] == action)
            .and_then(|row| row["detail"].as_str())
            .unwrap_or_else(|| panic!("a {action} row with a detail"))
            .to_string()
    };
    let rerun_detail = detail("rerun");
    let listed = rerun_detail
        .strip_prefix("failed part: instances ")
        .unwrap_or_else(|| panic!("{rerun_detail}"));
    assert!(
        listed.split(", ").all(|id| id.parse::<i64>().is_ok()),
        "{rerun_detail}"
    );
    let trigger_detail = detail("trigger");
    assert!(
        trigger_detail.starts_with("run ") && trigger_detail.ends_with(", no params"),
        "{trigger_detail}"
    );
    let paused = json(&cluster, &["audit", "--action", "pause"]).await;
    assert_eq!(paused.as_array().unwrap().len(), 1, "{paused}");
    assert_eq!(paused[0]["target"], "workflow/flaky");
    let cancels = json(&cluster, &["audit", "--target", &format!("run/{first}")]).await;
    assert_eq!(cancels.as_array().unwrap().len(), 1, "{cancels}");
    assert_eq!(cancels[0]["action"], "cancel");
    let by_other = json(&cluster, &["audit", "--by", "someone-else"]).await;
    assert_eq!(by_other, serde_json::json!([]));
    let limited = json(&cluster, &["audit", "--limit", "2"]).await;
    assert_eq!(limited[0]["action"], "cancel");
    assert_eq!(limited.as_array().unwrap().len(), 2);

    let table = ok(&cluster, &["audit", "--action", "trigger"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for header in ["WHEN", "WHO", "ACTION", "TARGET", "FROM", "DETAIL"] {
        assert!(lines[0].contains(header), "{table}");
    }
    assert!(
        lines[1].contains("auditor@test") && lines[1].contains("127.0.0.1:"),
        "{table}"
    );
    cluster.shutdown().await.expect("shutdown");
}
