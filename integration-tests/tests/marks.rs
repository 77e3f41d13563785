//! Marking instances SUCCESS or FAILED end to end, through the real `axctl` and gRPC against a
//! real node and worker: a failed task marked SUCCESS lets its downstream run and the run end
//! SUCCESS; a running task marked FAILED is killed, its worker's late end changes nothing, and
//! the rest of its running run goes on; a mapped task's failed item marked SUCCESS settles the
//! task SUCCESS. Every scenario runs on SQLite, and on MySQL when `AX_TEST_MYSQL_URL` is set.

use std::time::{Duration, Instant};

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;
use pb::InstanceState as S;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        a_failed_task_marked_success_through_axctl_lets_its_downstream_run,
        a_running_task_marked_failed_is_killed_for_good_while_its_run_goes_on,
        a_failed_item_marked_success_settles_its_mapped_task,
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn task<'a>(instances: &'a [pb::Instance], name: &str) -> &'a pb::Instance {
    instances
        .iter()
        .find(|i| i.task == name && i.shard_parent_id == 0)
        .unwrap_or_else(|| panic!("no instance of {name}"))
}

async fn a_failed_task_marked_success_through_axctl_lets_its_downstream_run(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: marked
tasks:
  - name: boom
    command: exit 1
  - name: after
    upstream: [boom]
    command: echo after >> {dir}/after.count
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("marked", 0).await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed);
    let id = run.id.to_string();

    let out = cluster
        .axctl(&["mark", &id, "boom", "--success"])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(2), "a reason is required");
    let out = cluster
        .axctl(&["mark", &id, "boom", "--success", "--reason", "   "])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("needs a reason"),
        "{}",
        text(&out.stderr)
    );
    let out = cluster
        .axctl(&[
            "mark",
            &id,
            "boom",
            "--success",
            "--reason",
            "the input was fixed by hand",
        ])
        .expect("axctl");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("SUCCESS"),
        "{}",
        text(&out.stdout)
    );
    let ended = client.wait_run(run.id).await.expect("ends again");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let after = std::fs::read_to_string(cluster.dir().join("after.count")).expect("after ran");
    assert_eq!(after.lines().count(), 1);
    let instances = client.instances(run.id).await.expect("instances");
    let boom = task(&instances, "boom");
    assert_eq!(
        (boom.state(), boom.attempt, boom.attempts.len()),
        (S::Success, 1, 1),
        "nothing of boom ran again"
    );

    // Again: refused, naming the state it has (exit 6, failed precondition).
    let out = cluster
        .axctl(&["mark", &id, "boom", "--success", "--reason", "again"])
        .expect("axctl");
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("SUCCESS already"),
        "{}",
        text(&out.stderr)
    );
    let audit = client
        .control()
        .list_audit(pb::ListAuditRequest {
            target: format!("instance/{}", boom.id),
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner();
    let marks: Vec<&str> = audit
        .entries
        .iter()
        .filter(|e| e.action == "mark")
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(marks, ["SUCCESS (was FAILED): the input was fixed by hand"]);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_running_task_marked_failed_is_killed_for_good_while_its_run_goes_on(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: stuck
tasks:
  - name: slow
    command: echo $$ > {dir}/slow.pid; sleep 300; touch {dir}/slow.survived
  - name: next
    upstream: [slow]
    command: echo never
  - name: other
    command: while [ ! -f {dir}/go ]; do sleep 0.05; done
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("stuck", 0).await.expect("trigger");
    let slow = client
        .wait_instance(run.id, "slow", S::Running)
        .await
        .expect("slow runs");
    let pid_file = cluster.dir().join("slow.pid");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "slow never wrote its pid");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let marked = client
        .control()
        .mark_instance(pb::MarkInstanceRequest {
            id: slow.id,
            state: S::Failed.into(),
            reason: "stuck on a lock".into(),
            actor: "tester".into(),
        })
        .await
        .expect("mark")
        .into_inner();
    assert_eq!(marked.state(), S::Failed);
    // The run goes on: `other` still runs; `next` will not run.
    assert_eq!(
        client.get_run(run.id).await.expect("run").state(),
        pb::RunState::Running
    );
    client
        .wait_instance(run.id, "next", S::UpstreamFailed)
        .await
        .expect("next does not run");

    // The process is killed, and the worker's late end is kept as the attempt's exit, changing
    // nothing else.
    let deadline = Instant::now() + Duration::from_secs(60);
    let late = loop {
        let instances = client.instances(run.id).await.expect("instances");
        let slow = task(&instances, "slow").clone();
        let attempt = &slow.attempts[0];
        if attempt.exit_code.is_some() || attempt.signal.is_some() {
            break slow;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never reported the end"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((late.state(), late.attempt), (S::Failed, 1), "{late:?}");
    assert_eq!(late.attempts.len(), 1, "no retry");
    assert_eq!(late.attempts[0].state(), S::Cancelled);
    assert!(
        late.attempts[0]
            .message
            .contains("marked FAILED by tester: stuck on a lock"),
        "{:?}",
        late.attempts[0].message
    );
    // Whether the process still lives: `kill -0`.
    let alive = std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .status()
        .expect("kill -0");
    assert!(!alive.success(), "slow's process {pid} still runs");
    assert!(!cluster.dir().join("slow.survived").exists());

    std::fs::write(cluster.dir().join("go"), "").expect("go");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(task(&instances, "other").state(), S::Success);
    assert_eq!(task(&instances, "slow").state(), S::Failed);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_failed_item_marked_success_settles_its_mapped_task(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: mapped-mark
tasks:
  - name: list
    command: echo 'files=["a","b"]' >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    for_each: ${{tasks.list.outputs.files}}
    command: '[ "$AX_ITEM" != b ]'
  - name: join
    upstream: copy
    command: echo join >> {dir}/join.count
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("mapped-mark", 0).await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed);
    let instances = client.instances(run.id).await.expect("instances");
    let copy = task(&instances, "copy").clone();
    let failed_item = instances
        .iter()
        .find(|i| i.task == "copy" && i.shard_parent_id != 0 && i.state() == S::Failed)
        .expect("the failed item")
        .clone();
    // The item a person fixed is marked: its task's end is settled again from its items.
    let out = cluster
        .axctl(&[
            "mark",
            &failed_item.id.to_string(),
            "--success",
            "--reason",
            "copied b by hand",
        ])
        .expect("axctl");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ended = client.wait_run(run.id).await.expect("ends again");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(task(&instances, "copy").state(), S::Success);
    assert_eq!(task(&instances, "copy").id, copy.id);
    assert_eq!(task(&instances, "join").state(), S::Success);
    let joins = std::fs::read_to_string(cluster.dir().join("join.count")).expect("join ran");
    assert_eq!(joins.lines().count(), 1);
    cluster.shutdown().await.expect("shutdown");
}
