//! Sub-workflows end to end: a real scheduler and real worker processes. A parent's
//! `run_workflow` task starts a run of another workflow of its app with templated params (the
//! child's shell task writes what it was given to a file), waits for it without a worker slot,
//! and ends as it ended; a failing child fails the parent task and run; cancelling the parent
//! cancels the child and kills its process, as does the parent task's timeout. The links are shown both ways (`GetRun`,
//! `GetInstance`, `axctl why`'s facts). Timing is only ever bounded from above, generously.

use std::time::Duration;

use ax_integration_tests::harness::{MYSQL, Test, trial};
use ax_integration_tests::on_every_backend;
use ax_integration_tests::process::{pid_from_file, wait_gone};
use ax_integration_tests::{Backend, Cluster, TestClient, TestDb};
use ax_proto::v1 as pb;
use ax_scheduler::SchedulerOptions;

/// A hang guard, not a timing assertion.
const WITHIN: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    [
        on_every_backend!(
            a_child_run_gets_templated_params_and_its_success_ends_the_parent_task,
            a_failing_child_fails_the_parent_task_and_run,
            cancelling_the_parent_cancels_the_child_and_kills_its_task,
            a_parent_task_past_its_timeout_cancels_its_child_and_times_out,
            the_examples_folder_applies_whole_and_daily_regions_calls_load_region,
        ),
        vec![trial!(async(multi_thread = 4) two_nodes_start_each_child_once).requires(&MYSQL)],
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One worker with ONE slot: a parent task that held a slot while its child waits for one
/// would never end.
async fn cluster(backend: Backend) -> (Cluster, TestClient) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 1)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

/// The child run `run` started, once it has one.
async fn child_of(client: &TestClient, run: i64) -> pb::Run {
    let until = tokio::time::Instant::now() + WITHIN;
    loop {
        let parent = client.get_run(run).await.expect("get run");
        if let Some(&child) = parent.child_run_ids.first() {
            return client.get_run(child).await.expect("get child");
        }
        assert!(
            tokio::time::Instant::now() < until,
            "run {run} started no child: {parent:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn instance_of(client: &TestClient, run: i64, task: &str) -> pb::Instance {
    let instances = client.instances(run).await.expect("instances");
    let found = instances
        .into_iter()
        .find(|i| i.task == task)
        .unwrap_or_else(|| panic!("no instance of {task} in run {run}"));
    client
        .control()
        .get_instance(pb::GetInstanceRequest { id: found.id })
        .await
        .expect("get instance")
        .into_inner()
}

async fn a_child_run_gets_templated_params_and_its_success_ends_the_parent_task(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let child = format!(
        r#"
name: load-region
tasks:
  - name: load
    command: echo "$AX_PARAM_region $AX_PARAM_day $AX_PARAM_rows" >> {dir}/loaded
"#
    );
    let parent = format!(
        r#"
name: daily-regions
tasks:
  - name: count
    command: echo rows=42 >> "$AX_OUTPUT"
  - name: load-eu
    upstream: count
    run_workflow: load-region
    params:
      region: eu
      day: ${{params.day}}
      rows: ${{tasks.count.outputs.rows}}
  - name: report
    upstream: load-eu
    command: echo report >> {dir}/loaded
"#
    );
    client.apply(&child).await.expect("apply child");
    client.apply(&parent).await.expect("apply parent");
    let run = client
        .trigger("daily-regions", &[("day", "2026-01-31")], "")
        .await
        .expect("trigger")
        .run
        .expect("run");
    let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");

    // The child's shell task saw the rendered params, and the task below ran after it.
    let loaded = std::fs::read_to_string(cluster.dir().join("loaded")).expect("ledger");
    assert_eq!(
        loaded.lines().collect::<Vec<_>>(),
        ["eu 2026-01-31 42", "report"]
    );

    // Linked both ways.
    assert_eq!(ended.child_run_ids.len(), 1, "{ended:?}");
    let child = client.get_run(ended.child_run_ids[0]).await.expect("child");
    assert_eq!(child.workflow, "load-region");
    assert_eq!(child.state, pb::RunState::Success as i32);
    assert_eq!(child.trigger, pb::TriggerKind::Parent as i32);
    assert_eq!(child.parent_run_id, run.id);
    assert_eq!(child.parent_task, "load-eu");
    assert_eq!(child.params.get("rows").map(String::as_str), Some("42"));
    let task = instance_of(&client, run.id, "load-eu").await;
    assert_eq!(task.state, pb::InstanceState::Success as i32);
    assert_eq!(task.attempts.len(), 1);
    let attempt = &task.attempts[0];
    assert_eq!(attempt.child_run_id, child.id);
    // No worker ran it.
    assert_eq!(attempt.worker_id, "");
    assert_eq!(
        attempt.message,
        format!("child run {} (load-region) ended SUCCESS", child.id)
    );
    // The run's instance list with attempts links the child too (the run page's Worker cell).
    let listed = client
        .control()
        .list_instances(pb::ListInstancesRequest {
            run_id: run.id,
            attempts: true,
            ..Default::default()
        })
        .await
        .expect("list instances")
        .into_inner();
    let children: Vec<(String, i64)> = listed
        .instances
        .iter()
        .flat_map(|i| {
            i.attempts
                .iter()
                .map(move |a| (i.task.clone(), a.child_run_id))
        })
        .filter(|(_, child)| *child != 0)
        .collect();
    assert_eq!(children, [("load-eu".to_string(), child.id)]);
}

async fn a_failing_child_fails_the_parent_task_and_run(backend: Backend) {
    let (_cluster, client) = cluster(backend).await;
    client
        .apply(
            "
name: breaks
tasks:
  - name: boom
    command: exit 3
",
        )
        .await
        .expect("apply child");
    client
        .apply(
            "
name: calls-breaks
tasks:
  - name: call
    run_workflow: breaks
  - name: after
    upstream: call
    command: 'true'
",
        )
        .await
        .expect("apply parent");
    let run = client.trigger_run("calls-breaks").await.expect("trigger");
    let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32, "{ended:?}");
    let child = client.get_run(ended.child_run_ids[0]).await.expect("child");
    assert_eq!(child.state, pb::RunState::Failed as i32);
    let call = instance_of(&client, run.id, "call").await;
    assert_eq!(call.state, pb::InstanceState::Failed as i32);
    assert_eq!(
        call.attempts[0].message,
        format!("child run {} (breaks) ended FAILED", child.id)
    );
    let after = client
        .instances(run.id)
        .await
        .expect("instances")
        .into_iter()
        .find(|i| i.task == "after");
    // `after` never ran: it is UPSTREAM_FAILED or was never created.
    assert!(
        after
            .as_ref()
            .is_none_or(|i| i.state == pb::InstanceState::UpstreamFailed as i32),
        "{after:?}"
    );
}

async fn cancelling_the_parent_cancels_the_child_and_kills_its_task(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    client
        .apply(&format!(
            r#"
name: slow-child
tasks:
  - name: sleep
    command: echo $$ > {dir}/child.pid; exec sleep 300
"#
        ))
        .await
        .expect("apply child");
    client
        .apply(
            "
name: waits-long
tasks:
  - name: call
    run_workflow: slow-child
",
        )
        .await
        .expect("apply parent");
    let run = client.trigger_run("waits-long").await.expect("trigger");
    let child = child_of(&client, run.id).await;
    // Wait until the child's process runs.
    let pid = pid_from_file(&cluster.dir().join("child.pid"), WITHIN).await;

    // `axctl why` says which child run the task waits on, and its state.
    let why = client
        .control()
        .explain_workflow(pb::ExplainWorkflowRequest {
            name: "waits-long".into(),
            at_ms: 0,
        })
        .await
        .expect("ExplainWorkflow")
        .into_inner();
    let call = why.tasks.iter().find(|t| t.task == "call").expect("call");
    assert_eq!(call.reason, "waiting_child", "{call:?}");
    assert_eq!(
        call.text,
        format!(
            "waiting on its child run {} (slow-child), which is RUNNING; the task ends as that \
             run ends",
            child.id
        )
    );

    client.cancel_run(run.id, "test").await.expect("cancel");
    let child = client
        .wait_run_within(child.id, WITHIN)
        .await
        .expect("child ends");
    assert_eq!(child.state, pb::RunState::Cancelled as i32, "{child:?}");
    let parent = client.get_run(run.id).await.expect("parent");
    assert_eq!(parent.state, pb::RunState::Cancelled as i32);
    // The child's process is killed by its worker.
    wait_gone(pid, WITHIN).await;
}

async fn a_parent_task_past_its_timeout_cancels_its_child_and_times_out(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    client
        .apply(&format!(
            r#"
name: hangs
tasks:
  - name: sleep
    command: echo $$ > {dir}/hang.pid; exec sleep 300
"#
        ))
        .await
        .expect("apply child");
    client
        .apply(
            "
name: bounded
tasks:
  - name: call
    run_workflow: hangs
    timeout: 2s
",
        )
        .await
        .expect("apply parent");
    let run = client.trigger_run("bounded").await.expect("trigger");
    let child = child_of(&client, run.id).await;
    let pid = pid_from_file(&cluster.dir().join("hang.pid"), WITHIN).await;

    let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32, "{ended:?}");
    let call = instance_of(&client, run.id, "call").await;
    assert_eq!(call.state, pb::InstanceState::Timeout as i32, "{call:?}");
    assert_eq!(
        call.attempts[0].message,
        format!(
            "timed out: child run {} (hangs) still active after the task's timeout of 2000 ms; \
             the child run was cancelled",
            child.id
        )
    );
    let child = client
        .wait_run_within(child.id, WITHIN)
        .await
        .expect("child ends");
    assert_eq!(child.state, pb::RunState::Cancelled as i32, "{child:?}");
    // The child's process is killed by its worker.
    wait_gone(pid, WITHIN).await;
}

/// `axctl apply -f examples/` as one set (the README's tour), then the example that calls another.
async fn the_examples_folder_applies_whole_and_daily_regions_calls_load_region(backend: Backend) {
    let (_cluster, client) = cluster(backend).await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            files.push(pb::WorkflowFile {
                source_name: path.display().to_string(),
                source: std::fs::read_to_string(&path).expect("example"),
            });
        }
    }
    files.sort_by(|a, b| a.source_name.cmp(&b.source_name));
    let count = files.len();
    let applied = client
        .control()
        .apply_workflows(pb::ApplyWorkflowsRequest {
            files,
            ..Default::default()
        })
        .await
        .expect("the whole folder applies")
        .into_inner();
    assert_eq!(applied.files.len(), count);

    let run = client
        .trigger("daily-regions", &[("day", "2026-01-31")], "")
        .await
        .expect("trigger")
        .run
        .expect("run");
    let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");
    assert_eq!(ended.child_run_ids.len(), 2, "{ended:?}");
    let mut regions = Vec::new();
    for id in &ended.child_run_ids {
        let child = client.get_run(*id).await.expect("child");
        assert_eq!(child.workflow, "load-region");
        assert_eq!(child.state, pb::RunState::Success as i32);
        assert_eq!(
            child.params.get("day").map(String::as_str),
            Some("2026-01-31")
        );
        regions.push(child.params.get("region").cloned().unwrap_or_default());
    }
    regions.sort();
    assert_eq!(regions, ["eu", "us"]);

    // The called workflow is not deleted while daily-regions calls it; once the caller is gone
    // it is.
    let delete = |name: &str| pb::DeleteWorkflowRequest {
        name: name.into(),
        ..Default::default()
    };
    let refused = client
        .control()
        .delete_workflow(delete("load-region"))
        .await
        .expect_err("a called workflow is not deleted");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        refused.message(),
        "workflow load-region is called by daily-regions (run_workflow): their next runs would \
         fail that task; change or delete them first"
    );
    client
        .control()
        .delete_workflow(delete("daily-regions"))
        .await
        .expect("the caller is deleted");
    client
        .control()
        .delete_workflow(delete("load-region"))
        .await
        .expect("with no caller left, the called one is deleted");
}

fn node(url: &str, node_id: &str) -> SchedulerOptions {
    SchedulerOptions {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        store_url: url.to_string(),
        node_id: node_id.into(),
        node_lease: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(500),
        ..SchedulerOptions::default()
    }
}

/// Two nodes share a MySQL store; both dispatchers look for `run_workflow` tasks and both
/// sweeps settle waits. Three runs of six parallel calls: each call gets exactly one child,
/// and every run ends SUCCESS.
async fn two_nodes_start_each_child_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDb::create(Backend::MySql, dir.path())
        .await
        .expect("test db");
    let n1 = ax_scheduler::start(node(&db.url, "n1")).await.expect("n1");
    let n2 = ax_scheduler::start(node(&db.url, "n2")).await.expect("n2");
    let n1_url = format!("http://{}", n1.local_addr());
    let cancel = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(ax_worker::run(
        ax_worker::WorkerOptions {
            endpoints: vec![n1_url.clone()],
            worker_id: "w1".into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            capacity: 2,
            heartbeat_interval: Duration::from_millis(500),
            ..ax_worker::WorkerOptions::default()
        },
        cancel.clone(),
    ));
    // The client talks to the other node: applies and triggers land where no worker is.
    let client = TestClient::connect(&format!("http://{}", n2.local_addr()))
        .await
        .expect("client");
    client
        .wait_for_workers(1, WITHIN)
        .await
        .expect("the worker is live");
    client
        .apply("name: leaf\ntasks:\n  - name: t\n    command: 'true'\n")
        .await
        .expect("apply leaf");
    let calls: String = (0..6)
        .map(|i| format!("  - name: call{i}\n    run_workflow: leaf\n"))
        .collect();
    client
        .apply(&format!("name: fan\ntasks:\n{calls}"))
        .await
        .expect("apply fan");
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(client.trigger_run("fan").await.expect("trigger"));
    }
    let mut children = Vec::new();
    for run in &runs {
        let ended = client.wait_run_within(run.id, WITHIN).await.expect("ends");
        assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");
        assert_eq!(
            ended.child_run_ids.len(),
            6,
            "one child per call: {ended:?}"
        );
        children.extend(ended.child_run_ids.iter().copied());
    }
    // Every child run of leaf is one of those, once.
    let leaf_runs = client.runs("leaf").await.expect("leaf runs");
    let mut all: Vec<i64> = leaf_runs.iter().map(|r| r.id).collect();
    all.sort();
    children.sort();
    assert_eq!(all, children, "no call has a second child");
    for run in &leaf_runs {
        assert_eq!(run.state, pb::RunState::Success as i32);
        assert_eq!(run.trigger, pb::TriggerKind::Parent as i32);
    }

    cancel.cancel();
    let _ = tokio::time::timeout(WITHIN, worker).await;
    n2.shutdown().await.expect("shutdown n2");
    n1.shutdown().await.expect("shutdown n1");
    db.drop_database().await.expect("drop database");
}
