//! DAG semantics end to end, through gRPC and the real `axctl`: rerun from a task, tasks shown
//! as upstream-failed or pending, cross-workflow dependencies, a run keeping its workflow
//! version, and apply's refusals and warnings. Every scenario runs on SQLite, and on MySQL when
//! `AX_TEST_MYSQL_URL` is set.

use std::collections::BTreeMap;

use ax_core::decision::DecisionKind;
use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

const L: i64 = 1_767_225_600_000;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        rerun_from_a_task_reruns_it_and_its_downstream_and_keeps_history,
        tasks_below_a_failure_show_as_upstream_failed,
        a_dependent_workflow_runs_once_its_upstreams_succeeded_for_a_logical_time,
        a_run_keeps_the_workflow_version_it_started_with,
        apply_spells_out_cycles_and_warns_about_isolated_tasks,
    )
}

async fn cluster(backend: Backend) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .redis()
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn statuses(client: &TestClient, run: i64) -> Vec<(String, String)> {
    client
        .list_instances(run)
        .await
        .expect("list instances")
        .tasks
        .into_iter()
        .map(|t| (t.task, t.status))
        .collect()
}

fn lines_in(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

async fn rerun_from_a_task_reruns_it_and_its_downstream_and_keeps_history(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: chain
tasks:
  - name: a
    command: echo a >> {dir}/a.count
  - name: b
    upstream: [a]
    command: echo b >> {dir}/b.count
  - name: c
    upstream: [b]
    command: echo c >> {dir}/c.count
  - name: gate
    upstream: [a]
    command: while [ ! -f {dir}/go ]; do sleep 0.05; done
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("chain", 0).await.expect("trigger");
    let id = run.id.to_string();
    client
        .wait_instance(run.id, "c", pb::InstanceState::Success)
        .await
        .expect("the instance reaches the state");
    client
        .wait_instance(run.id, "gate", pb::InstanceState::Running)
        .await
        .expect("the instance reaches the state");

    // An unknown task is refused naming it and the run's tasks.
    let out = cluster
        .axctl(&["rerun", &id, "--from", "nope"])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no task \"nope\"; its tasks are: a, b, c, gate"),
        "{}",
        stderr(&out)
    );
    // `a` is below nothing active but `gate`, below it, is running: refused, nothing changes.
    let out = cluster
        .axctl(&["rerun", &id, "--from", "a"])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("gate is RUNNING"), "{}", stderr(&out));

    std::fs::write(cluster.dir().join("go"), "").expect("go");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);

    let out = cluster
        .axctl(&["rerun", &id, "--from", "b"])
        .expect("axctl");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("RUNNING"), "{}", stdout(&out));
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");

    // b and c ran again as attempt 2; a and gate did not run again.
    assert_eq!(lines_in(&cluster.dir().join("a.count")), 1);
    assert_eq!(lines_in(&cluster.dir().join("b.count")), 2);
    assert_eq!(lines_in(&cluster.dir().join("c.count")), 2);
    let instances = client.instances(run.id).await.expect("instances");
    let history: BTreeMap<String, Vec<(u32, i32)>> = instances
        .iter()
        .map(|i| {
            (
                i.task.clone(),
                i.attempts.iter().map(|a| (a.attempt, a.state)).collect(),
            )
        })
        .collect();
    let ok = pb::InstanceState::Success as i32;
    assert_eq!(history["a"], vec![(1, ok)]);
    assert_eq!(history["gate"], vec![(1, ok)]);
    assert_eq!(history["b"], vec![(1, ok), (2, ok)], "history is kept");
    assert_eq!(history["c"], vec![(1, ok), (2, ok)]);

    // One thing at a time: --from and --failed exclude each other.
    let out = cluster.axctl(&["rerun", &id, "--from", "b", "--failed"]);
    assert_eq!(
        out.expect("axctl").status.code(),
        Some(2),
        "one or the other"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn tasks_below_a_failure_show_as_upstream_failed(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: branches
tasks:
  - name: a
    command: while [ ! -f {dir}/go ]; do sleep 0.05; done
  - name: bad
    upstream: [a]
    command: exit 1
  - name: below
    upstream: [bad]
    command: echo never
  - name: further
    upstream: [below]
    command: echo never
  - name: fine
    upstream: [a]
    command: echo fine
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("branches", 0).await.expect("trigger");
    client
        .wait_instance(run.id, "a", pb::InstanceState::Running)
        .await
        .expect("the instance reaches the state");
    let status = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(t, s)| (t.to_string(), s.to_string()))
            .collect()
    };
    assert_eq!(
        statuses(&client, run.id).await,
        status(&[
            ("a", "running"),
            ("bad", "pending"),
            ("below", "pending"),
            ("further", "pending"),
            ("fine", "pending"),
        ])
    );
    std::fs::write(cluster.dir().join("go"), "").expect("go");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32);
    assert_eq!(
        statuses(&client, run.id).await,
        status(&[
            ("a", "success"),
            ("bad", "failed"),
            ("below", "upstream_failed"),
            ("further", "upstream_failed"),
            ("fine", "success"),
        ])
    );

    let out = cluster
        .axctl(&["get", "run", &run.id.to_string()])
        .expect("axctl");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for task in ["below", "further"] {
        assert!(
            text.lines()
                .any(|line| line.contains(task) && line.contains("UPSTREAM_FAILED")),
            "{task} shown upstream-failed in:\n{text}"
        );
    }
    let out = cluster
        .axctl(&["get", "run", &run.id.to_string(), "-o", "json"])
        .expect("axctl");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let tasks = json["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 5);
    assert_eq!(tasks[2]["task"], "below");
    assert_eq!(tasks[2]["status"], "upstream_failed");
    // The advance keeps the verdict as an instance that never ran.
    assert!(tasks[2]["instance_id"].is_i64(), "{}", tasks[2]);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_dependent_workflow_runs_once_its_upstreams_succeeded_for_a_logical_time(
    backend: Backend,
) {
    let (cluster, client) = cluster(backend).await;
    // The dependent first: its upstreams do not exist yet, which is a warning, not a refusal.
    let report = r#"
name: report
schedule:
  after: [ingest, dims]
tasks:
  - name: build
    command: echo "report for $AX_LOGICAL_TIME"
"#;
    let applied = client.apply(report).await.expect("apply report");
    assert_eq!(applied.warnings.len(), 2, "{:?}", applied.warnings);
    assert!(applied.warnings[0].contains("workflow ingest does not exist yet"));
    client
        .apply("name: ingest\ntasks:\n  - {name: load, command: echo ingest}\n")
        .await
        .expect("apply ingest");
    client
        .apply("name: dims\ntasks:\n  - {name: load, command: echo dims}\n")
        .await
        .expect("apply dims");

    // A loop across workflows is refused, spelled out, and changes nothing.
    let dir = cluster.dir();
    std::fs::write(
        dir.join("ingest.yaml"),
        "name: ingest\nschedule: {after: [report]}\ntasks:\n  - {name: load, command: echo x}\n",
    )
    .expect("file");
    let out = cluster
        .axctl(&[
            "apply",
            "-f",
            &dir.join("ingest.yaml").display().to_string(),
        ])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cycle across workflows: ingest → report → ingest"),
        "{}",
        stderr(&out)
    );
    let ingest = client
        .control()
        .get_workflow(pb::GetWorkflowRequest {
            name: "ingest".into(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(ingest.version, 1);

    // Only ingest succeeded for L: no report run, and the decision says what it waits for.
    let first = client.trigger_at("ingest", L).await.expect("trigger");
    let ended = client.wait_run(first.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    assert!(client.runs("report").await.expect("list runs").is_empty());
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let report_wf = store
        .get_workflow("report")
        .await
        .expect("read")
        .expect("report");
    let decisions = store
        .list_decisions(report_wf.id, L, L, 10)
        .await
        .expect("decisions");
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].kind, DecisionKind::WaitingUpstream);
    assert!(decisions[0].detail.contains("dims"), "{:?}", decisions[0]);

    // A run for another logical time does not count for L.
    let other = client.trigger_at("dims", L + 1).await.expect("trigger");
    client.wait_run(other.id).await.expect("ends");
    assert!(client.runs("report").await.expect("list runs").is_empty());

    let second = client.trigger_at("dims", L).await.expect("trigger");
    client.wait_run(second.id).await.expect("ends");
    let runs = client.runs("report").await.expect("list runs");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(run.trigger, pb::TriggerKind::Dependency as i32);
    assert_eq!(run.logical_time_ms, L);
    assert!(run.params.is_empty());
    assert_eq!(
        run.triggered_by,
        format!("ingest run {}, dims run {}", first.id, second.id)
    );
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    let build = client.instances(run.id).await.expect("instances").remove(0);
    let lines = client.logs(build.id).await.expect("logs");
    // L is 2026-01-01T00:00:00Z: the run carries the upstreams' logical time to its tasks.
    assert!(
        lines[0].text.starts_with("report for 2026-01-01T00:00:00"),
        "{:?}",
        lines[0].text
    );
    let decisions = store
        .list_decisions(report_wf.id, L, L, 10)
        .await
        .expect("decisions");
    let fired = decisions.last().expect("fired");
    assert_eq!(
        (fired.kind, fired.run_id.map(|r| r.0)),
        (DecisionKind::Fired, Some(run.id))
    );

    // Upstreams succeeding again for L change nothing.
    for name in ["ingest", "dims"] {
        let again = client.trigger_at(name, L).await.expect("trigger");
        client.wait_run(again.id).await.expect("ends");
    }
    assert_eq!(client.runs("report").await.expect("list runs").len(), 1);
    drop(store);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_run_keeps_the_workflow_version_it_started_with(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let v1 = format!(
        r#"
name: pinned
tasks:
  - name: first
    command: while [ ! -f {dir}/go ]; do sleep 0.05; done; echo v1-first
  - name: second
    upstream: [first]
    command: echo v1-second
"#
    );
    let v2 = r#"
name: pinned
tasks:
  - name: first
    command: echo v2-first
  - name: third
    upstream: [first]
    command: echo v2-third
"#;
    client.apply(&v1).await.expect("apply v1");
    let old = client.trigger_at("pinned", 0).await.expect("trigger");
    client
        .wait_instance(old.id, "first", pb::InstanceState::Running)
        .await
        .expect("the instance reaches the state");
    let applied = client.apply(v2).await.expect("apply v2");
    assert_eq!(applied.workflow.expect("workflow").version, 2);
    std::fs::write(cluster.dir().join("go"), "").expect("go");

    let ended = client.wait_run(old.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");
    assert_eq!(ended.workflow_version, 1);
    let mut got = BTreeMap::new();
    for i in client.instances(old.id).await.expect("instances") {
        let lines = client.logs(i.id).await.expect("logs");
        got.insert(i.task.clone(), lines.last().map(|l| l.text.clone()));
    }
    assert_eq!(
        got,
        BTreeMap::from([
            ("first".to_string(), Some("v1-first".to_string())),
            ("second".to_string(), Some("v1-second".to_string())),
        ])
    );

    let (new, ended) = client.run_to_end("pinned").await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    assert_eq!(new.workflow_version, 2);
    let mut got = BTreeMap::new();
    for i in client.instances(new.id).await.expect("instances") {
        let lines = client.logs(i.id).await.expect("logs");
        got.insert(i.task.clone(), lines.last().map(|l| l.text.clone()));
    }
    assert_eq!(
        got,
        BTreeMap::from([
            ("first".to_string(), Some("v2-first".to_string())),
            ("third".to_string(), Some("v2-third".to_string())),
        ])
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn apply_spells_out_cycles_and_warns_about_isolated_tasks(backend: Backend) {
    let (cluster, _client) = cluster(backend).await;
    let dir = cluster.dir();
    let apply = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("file");
        cluster
            .axctl(&["apply", "-f", &path.display().to_string()])
            .expect("axctl")
    };
    let out = apply(
        "cycle.yaml",
        "name: loop\ntasks:\n  - {name: a, command: x, upstream: [c]}\n  \
         - {name: b, command: x, upstream: [a]}\n  - {name: c, command: x, upstream: [b]}\n",
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cycle: a → b → c → a"),
        "{}",
        stderr(&out)
    );
    let out = apply(
        "self.yaml",
        "name: loop\ntasks:\n  - {name: a, command: x, upstream: [a]}\n",
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("cycle: a → a"), "{}", stderr(&out));
    let out = cluster.axctl(&["get", "workflow", "loop"]).expect("axctl");
    assert_eq!(out.status.code(), Some(3), "nothing was stored");

    let out = apply(
        "isolated.yaml",
        "name: lonely\ntasks:\n  - {name: a, command: x}\n  - {name: b, command: x, upstream: [a]}\n  \
         - {name: alone, command: x}\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim(),
        "warning: task alone has no upstream and no downstream"
    );
    cluster.shutdown().await.expect("shutdown");
}
