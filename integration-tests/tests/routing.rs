//! End to end: routing (sharded broadcast, consistent hash, failover), concurrency limits
//! (task, workflow, pool), priority order and the NoWorker and Throttled decisions. Every
//! scenario runs on SQLite, and on MySQL when `AX_TEST_MYSQL_URL` is set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ax_core::decision::DecisionKind;
use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

/// A hang guard, not a timing assertion.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        sharded_broadcast_runs_one_shard_per_worker_and_waits_for_all,
        a_failing_shard_fails_the_sharded_task,
        a_shard_retry_waits_for_its_worker_and_fails_when_it_is_gone,
        consistent_hash_keeps_a_task_on_one_worker,
        failover_takes_workers_in_id_order,
        task_workflow_and_pool_limits_are_never_exceeded,
        waiting_instances_start_highest_priority_first,
        a_task_without_a_worker_for_its_labels_waits_with_one_no_worker_decision,
    )
}

async fn start(
    backend: Backend,
    workers: &[(&str, u32)],
    pools: &[(&str, u32)],
) -> (Cluster, TestClient) {
    let mut builder = Cluster::builder(backend).redis();
    for (id, capacity) in workers {
        builder = builder.worker(id, *capacity);
    }
    for (pool, limit) in pools {
        builder = builder.pool(pool, *limit);
    }
    let cluster = builder.start().await.expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

fn state(instance: &pb::Instance) -> pb::InstanceState {
    pb::InstanceState::try_from(instance.state).expect("known state")
}

/// (started, finished) of every attempt that ran, with its worker.
fn spans(instances: &[pb::Instance]) -> Vec<(String, i64, i64)> {
    instances
        .iter()
        .flat_map(|i| i.attempts.iter())
        .filter(|a| a.started_at_ms > 0)
        .map(|a| (a.worker_id.clone(), a.started_at_ms, a.finished_at_ms))
        .collect()
}

/// The most intervals that overlap at any instant (ends sort before starts at one instant).
fn max_overlap(spans: &[(i64, i64)]) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for &(start, end) in spans {
        events.push((start, 1));
        events.push((end, -1));
    }
    events.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        max = max.max(now);
    }
    max as usize
}

async fn store_of(cluster: &Cluster) -> std::sync::Arc<ax_store::Store> {
    ax_store::open(cluster.store_url())
        .await
        .expect("open the store")
}

async fn decisions(cluster: &Cluster, workflow: &str) -> Vec<ax_store::DecisionRecord> {
    let store = store_of(cluster).await;
    let wf = store
        .get_workflow(workflow)
        .await
        .expect("read workflow")
        .expect("workflow exists");
    store
        .list_decisions(wf.id, 0, i64::MAX, 10_000)
        .await
        .expect("list decisions")
}

async fn sharded_broadcast_runs_one_shard_per_worker_and_waits_for_all(backend: Backend) {
    let (cluster, client) = start(backend, &[("w1", 2), ("w2", 2), ("w3", 2)], &[]).await;
    let source = r#"
name: broadcast
tasks:
  - name: shards
    routing: sharded_broadcast
    command: 'sleep 0.$AX_SHARD_INDEX; echo "shard=$AX_SHARD_INDEX total=$AX_SHARD_TOTAL"'
  - name: after
    upstream: shards
    command: 'echo "after shard=${AX_SHARD_INDEX:-none}"'
"#;
    client.apply(source).await.expect("apply");
    let run = client.trigger_run("broadcast").await.expect("trigger").id;
    let ended = client.wait_run(run).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    let instances = client.instances(run).await.expect("instances");
    let shards: Vec<&pb::Instance> = instances
        .iter()
        .filter(|i| i.task == "shards" && !i.attempts.is_empty())
        .collect();
    assert_eq!(shards.len(), 3, "{instances:?}");
    let workers: BTreeSet<String> = shards
        .iter()
        .map(|i| i.attempts[0].worker_id.clone())
        .collect();
    assert_eq!(
        workers,
        BTreeSet::from(["w1", "w2", "w3"].map(String::from))
    );
    let mut seen = Vec::new();
    for shard in &shards {
        assert_eq!(state(shard), pb::InstanceState::Success);
        let lines = client.logs(shard.id).await.expect("logs");
        assert_eq!(lines.len(), 1, "{lines:?}");
        seen.push(lines[0].text.clone());
    }
    seen.sort();
    assert_eq!(
        seen,
        ["shard=0 total=3", "shard=1 total=3", "shard=2 total=3"]
    );
    // The task's own instance is SUCCESS, and its downstream ran after the last shard ended.
    let parent = instances
        .iter()
        .find(|i| i.task == "shards" && i.attempts.is_empty())
        .expect("the sharded task's instance");
    assert_eq!(state(parent), pb::InstanceState::Success);
    // The API names each shard's parent, index and total; the parent is no shard.
    assert_eq!(parent.shard_total, 0);
    let mut indexes: Vec<u32> = shards
        .iter()
        .map(|s| {
            assert_eq!((s.shard_parent_id, s.shard_total), (parent.id, 3), "{s:?}");
            s.shard_index
        })
        .collect();
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2]);
    let after = instances
        .iter()
        .find(|i| i.task == "after")
        .expect("after ran");
    let last_shard_end = shards
        .iter()
        .map(|s| s.attempts[0].finished_at_ms)
        .max()
        .unwrap();
    assert!(after.attempts[0].started_at_ms >= last_shard_end);
    let lines = client.logs(after.id).await.expect("logs");
    assert_eq!(lines[0].text, "after shard=none");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_failing_shard_fails_the_sharded_task(backend: Backend) {
    let (cluster, client) = start(backend, &[("w1", 2), ("w2", 2), ("w3", 2)], &[]).await;
    let source = r#"
name: broadcast-fails
tasks:
  - name: shards
    routing: sharded_broadcast
    command: 'test "$AX_SHARD_INDEX" != 1'
  - name: after
    upstream: shards
    command: 'true'
"#;
    client.apply(source).await.expect("apply");
    let run = client
        .trigger_run("broadcast-fails")
        .await
        .expect("trigger")
        .id;
    let ended = client.wait_run(run).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32);
    let instances = client.instances(run).await.expect("instances");
    assert!(
        instances
            .iter()
            .filter(|i| i.task == "after")
            .all(|i| state(i) == pb::InstanceState::UpstreamFailed && i.attempts.is_empty()),
        "{instances:?}"
    );
    let mut states: Vec<(String, pb::InstanceState)> = instances
        .iter()
        .filter(|i| !i.attempts.is_empty())
        .map(|i| (i.attempts[0].worker_id.clone(), state(i)))
        .collect();
    states.sort();
    let failed = states
        .iter()
        .filter(|(_, s)| *s == pb::InstanceState::Failed)
        .count();
    let succeeded = states
        .iter()
        .filter(|(_, s)| *s == pb::InstanceState::Success)
        .count();
    assert_eq!((failed, succeeded), (1, 2), "{states:?}");
    let parent = instances
        .iter()
        .find(|i| i.attempts.is_empty())
        .expect("the sharded task's instance");
    assert_eq!(state(parent), pb::InstanceState::Failed);
    // The task-level views show the task by its parent (FAILED), never by a shard (the shards
    // come after the parent, and the last of them may have succeeded).
    let run_arg = run.to_string();
    let dag = axctl_json(
        &cluster,
        &["dag", "broadcast-fails", "--run", &run_arg, "-o", "json"],
    );
    let node = |task: &str| {
        dag["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["task"] == task)
            .unwrap_or_else(|| panic!("{task} in {dag}"))
            .clone()
    };
    assert_eq!(node("shards")["state"], "FAILED", "{dag}");
    assert_eq!(node("shards")["instance_id"], parent.id, "{dag}");
    assert_eq!(node("after")["state"], "UPSTREAM_FAILED", "{dag}");
    let why = axctl_json(&cluster, &["why", "broadcast-fails", "-o", "json"]);
    assert_eq!(why["run"]["id"], run, "{why}");
    let task = why["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .find(|t| t["task"] == "shards")
        .unwrap_or_else(|| panic!("shards in {why}"))
        .clone();
    assert_eq!(task["state"], "FAILED", "{why}");
    assert_eq!(task["instance_id"], parent.id, "{why}");
    let got = client
        .list_instances(run)
        .await
        .expect("list instances")
        .tasks
        .into_iter()
        .find(|t| t.task == "shards")
        .expect("the shards task's status");
    assert_eq!(
        (got.status.as_str(), got.instance_id),
        ("failed", parent.id)
    );
    cluster.shutdown().await.expect("shutdown");
}

/// `axctl ARGS` (which end in `-o json`) must succeed; its output parsed.
fn axctl_json(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = tokio::task::block_in_place(|| cluster.axctl(args)).expect("axctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "axctl {args:?}: {out:?}");
    serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("{err}: {stdout}"))
}

async fn a_shard_retry_waits_for_its_worker_and_fails_when_it_is_gone(backend: Backend) {
    let (mut cluster, client) = start(backend, &[("w1", 2), ("w2", 2)], &[]).await;
    // Shard 1 (on w2, the second worker id) fails its first attempt; its retry would succeed.
    let source = r#"
name: broadcast-gone
tasks:
  - name: shards
    routing: sharded_broadcast
    retries: 2
    retry_backoff: 8s
    command: 'if [ "$AX_SHARD_INDEX" = 1 ] && [ "$AX_ATTEMPT" = 1 ]; then exit 1; fi'
"#;
    client.apply(source).await.expect("apply");
    let run = client
        .trigger_run("broadcast-gone")
        .await
        .expect("trigger")
        .id;
    // Wait for the first attempt of the shard on w2 to fail, then take w2 away.
    let failed_on_w2 = |i: &pb::Instance| {
        i.attempts
            .first()
            .is_some_and(|a| a.worker_id == "w2" && a.state == pb::InstanceState::Failed as i32)
    };
    let shard = client
        .wait_instances(run, "the shard on w2 failed once", |all| {
            all.iter().any(failed_on_w2)
        })
        .await
        .expect("the shard on w2 fails")
        .into_iter()
        .find(failed_on_w2)
        .expect("the shard on w2");
    cluster.stop_worker("w2").await.expect("w2 stops");
    let ended = client.wait_run(run).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32);
    let instances = client.instances(run).await.expect("instances");
    let shard = instances
        .iter()
        .find(|i| i.id == shard.id)
        .expect("the shard");
    assert_eq!(state(shard), pb::InstanceState::Failed);
    // The retry never ran anywhere else; it failed because its worker is gone.
    assert_eq!(shard.attempts.len(), 2, "{shard:?}");
    let retry = &shard.attempts[1];
    assert_eq!(retry.worker_id, "w2");
    assert_eq!(retry.started_at_ms, 0);
    assert!(retry.message.contains("w2"), "{retry:?}");
    let other = instances
        .iter()
        .find(|i| i.attempts.first().is_some_and(|a| a.worker_id == "w1"))
        .expect("the shard on w1");
    assert_eq!(state(other), pb::InstanceState::Success);
    cluster.shutdown().await.expect("shutdown");
}

async fn consistent_hash_keeps_a_task_on_one_worker(backend: Backend) {
    let (cluster, client) = start(backend, &[("w1", 4), ("w2", 4), ("w3", 4)], &[]).await;
    let source = r#"
name: sticky
tasks:
  - name: hashed
    routing: consistent_hash
    command: 'true'
"#;
    client.apply(source).await.expect("apply");
    // The worker first in the rendezvous order of "sticky/hashed".
    let home = ["w1", "w2", "w3"]
        .into_iter()
        .max_by_key(|w| ax_core::placement::rendezvous_score("sticky/hashed", w))
        .unwrap();
    for _ in 0..5 {
        let run = client.trigger_run("sticky").await.expect("trigger").id;
        let ended = client.wait_run(run).await.expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
        let instances = client.instances(run).await.expect("instances");
        assert_eq!(instances[0].attempts[0].worker_id, home);
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn failover_takes_workers_in_id_order(backend: Backend) {
    let (cluster, client) = start(backend, &[("w3", 1), ("w2", 1), ("w1", 1)], &[]).await;
    let source = r#"
name: failover
tasks:
  - name: only
    routing: failover
    command: 'true'
"#;
    client.apply(source).await.expect("apply");
    for _ in 0..3 {
        let run = client.trigger_run("failover").await.expect("trigger").id;
        client.wait_run(run).await.expect("run ends");
        let instances = client.instances(run).await.expect("instances");
        assert_eq!(instances[0].attempts[0].worker_id, "w1");
    }
    // Two at once: w1 has one slot, so the second goes to the next id.
    let source = r#"
name: failover-two
tasks:
  - name: a
    routing: failover
    command: 'sleep 1'
  - name: b
    routing: failover
    command: 'sleep 1'
"#;
    client.apply(source).await.expect("apply");
    let run = client
        .trigger_run("failover-two")
        .await
        .expect("trigger")
        .id;
    client.wait_run(run).await.expect("run ends");
    let instances = client.instances(run).await.expect("instances");
    let workers: BTreeSet<String> = instances
        .iter()
        .map(|i| i.attempts[0].worker_id.clone())
        .collect();
    assert_eq!(workers, BTreeSet::from(["w1", "w2"].map(String::from)));
    cluster.shutdown().await.expect("shutdown");
}

async fn task_workflow_and_pool_limits_are_never_exceeded(backend: Backend) {
    let (cluster, client) = start(backend, &[("w1", 10), ("w2", 10)], &[("etl", 2)]).await;
    let limited = r#"
name: limited
concurrency:
  max_running_tasks: 3
tasks:
  - name: a
    priority: 10
    concurrency: 2
    command: 'sleep 0.3'
  - name: b
    priority: 10
    pool: etl
    command: 'sleep 0.3'
  - name: c
    priority: 10
    pool: etl
    command: 'sleep 0.3'
"#;
    let free = r#"
name: free
tasks:
  - name: f
    priority: -5
    command: 'sleep 0.3'
"#;
    let pooled = r#"
name: pooled
tasks:
  - name: p
    priority: 10
    pool: etl
    command: 'sleep 0.3'
"#;
    for source in [limited, free, pooled] {
        client.apply(source).await.expect("apply");
    }
    let mut runs = BTreeMap::new();
    for i in 0..6 {
        runs.insert(
            client.trigger_run("limited").await.expect("trigger").id,
            "limited",
        );
        if i % 2 == 0 {
            runs.insert(
                client.trigger_run("free").await.expect("trigger").id,
                "free",
            );
            runs.insert(
                client.trigger_run("pooled").await.expect("trigger").id,
                "pooled",
            );
        }
    }
    let mut by_workflow: BTreeMap<&str, Vec<pb::Instance>> = BTreeMap::new();
    for (run, name) in &runs {
        let ended = client.wait_run(*run).await.expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
        by_workflow
            .entry(name)
            .or_default()
            .extend(client.instances(*run).await.expect("instances"));
    }
    let span_of = |instances: &[&pb::Instance]| -> Vec<(i64, i64)> {
        let owned: Vec<pb::Instance> = instances.iter().map(|i| (*i).clone()).collect();
        spans(&owned).into_iter().map(|(_, s, e)| (s, e)).collect()
    };
    let limited: Vec<&pb::Instance> = by_workflow["limited"].iter().collect();
    let task_a: Vec<&pb::Instance> = limited.iter().copied().filter(|i| i.task == "a").collect();
    let pool: Vec<&pb::Instance> = limited
        .iter()
        .copied()
        .filter(|i| i.task != "a")
        .chain(by_workflow["pooled"].iter())
        .collect();
    assert_eq!(task_a.len(), 6);
    assert_eq!(pool.len(), 15);
    let (a, wf, p) = (
        max_overlap(&span_of(&task_a)),
        max_overlap(&span_of(&limited)),
        max_overlap(&span_of(&pool)),
    );
    assert!(a <= 2, "task limit 2 exceeded: {a}");
    assert!(wf <= 3, "workflow limit 3 exceeded: {wf}");
    assert!(p <= 2, "pool limit 2 exceeded: {p}");
    // The limits were reached (20 slots were free): the test would see a breach.
    assert!(wf >= 2 && p >= 2, "limits never reached: wf {wf}, pool {p}");
    // The unlimited, lower-priority workflow was not held behind the throttled instances: its
    // first instance started before the limited ones were all done.
    let free_first = span_of(&by_workflow["free"].iter().collect::<Vec<_>>())
        .iter()
        .map(|s| s.0)
        .min()
        .unwrap();
    let limited_last = span_of(&limited).iter().map(|s| s.0).max().unwrap();
    assert!(
        free_first < limited_last,
        "free {free_first} limited {limited_last}"
    );
    // Throttled decisions name the limit, once per instance and reason.
    let throttled: Vec<_> = decisions(&cluster, "limited")
        .await
        .into_iter()
        .filter(|d| d.kind == DecisionKind::Throttled)
        .collect();
    assert!(!throttled.is_empty());
    let mut keys = BTreeSet::new();
    for d in &throttled {
        assert!(
            [
                "task limit 2 reached",
                "workflow limit 3 reached",
                "pool limit 2 reached"
            ]
            .contains(&d.detail.as_str()),
            "{d:?}"
        );
        assert!(
            keys.insert((d.instance_id, d.detail.clone())),
            "repeated: {d:?}"
        );
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn waiting_instances_start_highest_priority_first(backend: Backend) {
    let (cluster, client) = start(backend, &[("w1", 1)], &[]).await;
    let gate = cluster.dir().join("gate");
    let blocker = format!(
        "name: blocker\ntasks:\n  - name: block\n    priority: 100\n    command: 'while [ ! -e {} ]; do sleep 0.05; done'\n",
        gate.display()
    );
    client.apply(&blocker).await.expect("apply");
    for (name, priorities) in [("low", [1, 2]), ("high", [9, 7]), ("mid", [5, 3])] {
        let source = format!(
            "name: {name}\ntasks:\n  - name: x\n    priority: {}\n    command: 'true'\n  - name: y\n    priority: {}\n    command: 'true'\n",
            priorities[0], priorities[1]
        );
        client.apply(&source).await.expect("apply");
    }
    let block_run = client.trigger_run("blocker").await.expect("trigger").id;
    // Wait until the blocker holds the only slot.
    client
        .wait_instances(block_run, "the blocker running", |all| {
            all.first()
                .is_some_and(|i| state(i) == pb::InstanceState::Running)
        })
        .await
        .expect("the blocker runs");
    // Two runs of each, the lowest priorities triggered first.
    let mut runs = Vec::new();
    for name in ["low", "mid", "high", "low", "mid", "high"] {
        runs.push(client.trigger_run(name).await.expect("trigger").id);
    }
    std::fs::write(&gate, b"").expect("open the gate");
    let mut started: Vec<(i64, i32, i64)> = Vec::new();
    for run in runs {
        client.wait_run(run).await.expect("run ends");
        for instance in client.instances(run).await.expect("instances") {
            started.push((
                instance.attempts[0].started_at_ms,
                instance.priority,
                instance.id,
            ));
        }
    }
    started.sort();
    let order: Vec<i32> = started.iter().map(|s| s.1).collect();
    let mut want = order.clone();
    want.sort_by(|a, b| b.cmp(a));
    assert_eq!(order, want, "start order by priority");
    // Equal priorities: the older instance first.
    for pair in started.windows(2) {
        if pair[0].1 == pair[1].1 {
            assert!(pair[0].2 < pair[1].2, "{started:?}");
        }
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn a_task_without_a_worker_for_its_labels_waits_with_one_no_worker_decision(
    backend: Backend,
) {
    let (mut cluster, client) = start(backend, &[("w1", 2)], &[]).await;
    let source = r#"
name: needs-gpu
tasks:
  - name: train
    labels: {gpu: a100}
    command: 'echo trained'
"#;
    client.apply(source).await.expect("apply");
    let first = client.trigger_run("needs-gpu").await.expect("trigger").id;
    let deadline = tokio::time::Instant::now() + RUN_TIMEOUT;
    let wait_for = |count: usize| {
        let cluster = &cluster;
        async move {
            loop {
                let found: Vec<_> = decisions(cluster, "needs-gpu")
                    .await
                    .into_iter()
                    .filter(|d| d.kind == DecisionKind::NoWorker)
                    .collect();
                if found.len() >= count {
                    return found;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no NoWorker decision"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let found = wait_for(1).await;
    assert_eq!(found[0].detail, "no live worker with labels gpu=a100");
    // Several passes later (a second run got its own decision), still one for the first.
    let second = client.trigger_run("needs-gpu").await.expect("trigger").id;
    let found = wait_for(2).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let found_later = wait_for(2).await;
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        found_later.len(),
        2,
        "one decision per instance: {found_later:?}"
    );
    let run = client.get_run(first).await.expect("get run");
    assert_eq!(run.state, pb::RunState::Running as i32);
    // A worker with the label arrives: both runs go.
    cluster.add_worker(ax_integration_tests::WorkerSpec {
        id: "gpu1".into(),
        capacity: 2,
        labels: BTreeMap::from([("gpu".to_string(), "a100".to_string())]),
    });
    for run in [first, second] {
        let ended = client.wait_run(run).await.expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
        let instances = client.instances(run).await.expect("instances");
        assert_eq!(instances[0].attempts[0].worker_id, "gpu1");
    }
    cluster.shutdown().await.expect("shutdown");
}
