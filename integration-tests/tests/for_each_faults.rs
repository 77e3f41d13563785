//! `for_each:` under faults, with real `ax-scheduler` and `ax-worker` processes and the fault
//! kit's ledger (`fault_kit`: every attempt's `start` and `end` written by the task itself,
//! outside ax, joined with the store's attempt history through the API).
//!
//! - A node is killed with kill -9 the moment the list of a 2,000-item `for_each` is written,
//!   while its end report (and with it the fan-out) is in flight, and again while the items
//!   run: three nodes on MySQL, and one SQLite node killed and started again. Afterwards every
//!   item exists exactly once (indexes 0 … 1,999 under the one parent) and ran to its end
//!   exactly once, with no attempt started twice.
//! - A worker is killed with kill -9 after its task wrote `$AX_OUTPUT` but before the end was
//!   reported, on SQLite and on MySQL: the output is never read from the lost attempt. With `retries: 1` the mapped
//!   task below waits and maps over the retry's list; without retries the list task fails
//!   naming the lost worker and the task below is UPSTREAM_FAILED, no item created.
//!
//! Waits give up after generous hang guards; nothing asserts on timing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::client::summary;
use ax_integration_tests::fault_kit::{Scenario, Scene, read_notes, script, violations};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, WorkerSettings};
use ax_integration_tests::requirements::MYSQL;
use ax_proto::v1 as pb;
use pb::InstanceState as S;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) fault_for_each_nodes_killed_while_2000_items_fan_out_on_mysql_run_each_item_once).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_for_each_nodes_killed_just_after_the_list_ends_on_mysql_run_each_item_once).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_for_each_sqlite_node_killed_while_2000_items_fan_out_runs_each_item_once),
        trial!(async(multi_thread = 2) fault_a_worker_killed_after_writing_its_output_has_the_retry_s_list_mapped),
        trial!(async(multi_thread = 2) fault_a_worker_killed_after_writing_its_output_without_retries_fails_the_run_naming_it),
        trial!(async(multi_thread = 2) fault_a_worker_killed_after_writing_its_output_on_mysql_has_the_retry_s_list_mapped).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_a_worker_killed_after_writing_its_output_on_mysql_without_retries_fails_the_run_naming_it).requires(&MYSQL),
    ]
}

/// Items of the big list.
const ITEMS: u32 = 2_000;
const POLL: Duration = Duration::from_millis(10);

/// Waits until `path` exists.
async fn wait_file(path: &Path, what: &str) {
    let until = tokio::time::Instant::now() + HANG_GUARD;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < until,
            "{what}: {} not there after {HANG_GUARD:?}",
            path.display()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Lines of the items' ledger.
fn item_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The workflow of the fan-out fault: `list` writes 0 … ITEMS-1 and a marker, `each` maps over
/// it (each item appends `INDEX ITEM` to `items` between the kit's start and end notes), `join`
/// after all.
fn fan_out_workflow(dir: &Path, effects: &Path) -> String {
    let list = script(
        dir,
        "list",
        effects,
        &format!(
            "sleep 1\nprintf 'items=[%s]\\n' \"$(seq -s, 0 {})\" >> \"$AX_OUTPUT\"\ntouch '{}/listed'",
            ITEMS - 1,
            dir.display()
        ),
    );
    let item = script(
        dir,
        "item",
        effects,
        &format!(
            "echo \"$AX_ITEM_INDEX $AX_ITEM\" >> '{}/items'",
            dir.display()
        ),
    );
    let join = script(dir, "join", effects, "true");
    let quote = |c: &str| c.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "name: fanned\ntasks:\n  - name: list\n    command: \"{}\"\n  - name: each\n    upstream: list\n    retries: 3\n    retry_backoff: 100ms\n    for_each: ${{tasks.list.outputs.items}}\n    command: \"{}\"\n  - name: join\n    upstream: each\n    command: \"{}\"\n",
        quote(&list),
        quote(&item),
        quote(&join)
    )
}

/// The node index (in `scene`'s cluster) holding worker `worker`'s stream.
async fn node_of_worker(scene: &Scene, worker: &str) -> usize {
    let listed = scene.client.workers().await.expect("workers");
    let node = listed
        .iter()
        .find(|w| w.id == worker)
        .map(|w| w.scheduler_node.clone())
        .unwrap_or_else(|| panic!("worker {worker} not listed: {listed:?}"));
    (0..scene.cluster.node_count())
        .find(|i| scene.cluster.node_id(*i) == node)
        .unwrap_or_else(|| panic!("worker {worker} is on unknown node {node:?}"))
}

/// Waits until the items' ledger has at least `lines` lines.
async fn wait_items(path: &Path, lines: usize) {
    let until = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let have = item_lines(path).len();
        if have >= lines {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "only {have} of {lines} item lines after {HANG_GUARD:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn nodes_killed_while_items_fan_out(backend: Backend, nodes: usize, after: Duration) {
    let mut scenario = Scenario::new(backend)
        .nodes(nodes)
        .heartbeats("500ms")
        .dead_after(8)
        .worker_settings(WorkerSettings {
            capacity: Some(16),
            kill_grace: Some("1s".into()),
            ..WorkerSettings::default()
        });
    for id in 1..=3 {
        scenario = scenario.worker(&format!("w{id}"));
    }
    let mut scene = scenario.start().await;
    let dir = scene.dir.clone();
    scene
        .client
        .apply(&fan_out_workflow(&dir, &scene.effects))
        .await
        .expect("apply");
    let run = scene
        .client
        .trigger_run("fanned")
        .await
        .expect("trigger")
        .id;

    // The node the list's worker reports to takes its end, and fans out in that transaction:
    // it dies the moment the list has written its output and exits.
    let list = scene
        .client
        .wait_instance(run, "list", S::Running)
        .await
        .expect("list runs");
    let first = node_of_worker(&scene, &list.worker_id).await;
    wait_file(&dir.join("listed"), "the list written").await;
    tokio::time::sleep(after).await;
    scene.cluster.kill_node(first).await.expect("kill -9");
    let fanned_before_kill = items_after_kill(&scene, run, first).await;
    scene
        .cluster
        .start_node(first)
        .await
        .expect("the node starts again under its id");

    // Again while the items run, on another node when there is one.
    wait_items(&dir.join("items"), (ITEMS / 4) as usize).await;
    let second = (first + 1) % nodes;
    scene.cluster.kill_node(second).await.expect("kill -9");
    scene
        .cluster
        .start_node(second)
        .await
        .expect("the node starts again under its id");

    let client = scene.cluster.client().await.expect("a client of n1");
    let ended = client.wait_run(run).await.expect("the run ends");
    let instances = client.instances(run).await.expect("instances");
    assert_eq!(
        ended.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );

    let parents: Vec<&pb::Instance> = instances
        .iter()
        .filter(|i| i.task == "each" && i.shard_parent_id == 0)
        .collect();
    assert_eq!(parents.len(), 1, "one parent of the items");
    let parent = parents[0];
    let items: Vec<&pb::Instance> = instances
        .iter()
        .filter(|i| i.shard_parent_id != 0)
        .collect();
    let mut by_index: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for item in &items {
        assert_eq!(item.shard_parent_id, parent.id, "an item of another parent");
        assert_eq!(item.shard_total, ITEMS, "item {item:?}");
        assert_eq!(item.state(), S::Success, "item {item:?}");
        by_index.entry(item.shard_index).or_default().push(item.id);
    }
    let doubled: Vec<(&u32, &Vec<i64>)> =
        by_index.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(doubled.is_empty(), "items created twice: {doubled:?}");
    assert_eq!(
        by_index.keys().copied().collect::<Vec<_>>(),
        (0..ITEMS).collect::<Vec<_>>(),
        "every item exists exactly once"
    );

    // Every attempt the tasks started is one the store knows, none started twice or
    // overlapping, every success ran to its end (the parent runs no attempt of its own).
    let with_attempts: Vec<pb::Instance> = instances
        .iter()
        .filter(|i| i.id != parent.id)
        .cloned()
        .collect();
    let notes = read_notes(&scene.effects);
    let failures = violations(&with_attempts, &notes);
    assert!(
        failures.is_empty(),
        "{} violations, first: {:?}",
        failures.len(),
        failures.iter().take(10).collect::<Vec<_>>()
    );
    // Each item's body ran exactly once, with its own index as its item.
    let lines = item_lines(&dir.join("items"));
    let mut ran: BTreeMap<u32, u32> = BTreeMap::new();
    for line in &lines {
        let (index, item) = line.split_once(' ').expect("INDEX ITEM");
        assert_eq!(index, item, "item {item} ran as index {index}");
        *ran.entry(index.parse().expect("index")).or_default() += 1;
    }
    let not_once: Vec<(&u32, &u32)> = ran.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        not_once.is_empty(),
        "items that ran more than once: {not_once:?}"
    );
    assert_eq!(ran.len(), ITEMS as usize, "every item ran");
    let join_starts = notes
        .iter()
        .filter(|n| {
            instances
                .iter()
                .any(|i| i.task == "join" && i.id == n.instance)
                && n.what == "start"
        })
        .map(|n| n.index)
        .collect::<Vec<_>>();
    let item_ids: BTreeSet<i64> = items.iter().map(|i| i.id).collect();
    let last_item_note = notes
        .iter()
        .filter(|n| item_ids.contains(&n.instance))
        .map(|n| n.index)
        .max()
        .expect("item notes");
    assert_eq!(join_starts.len(), 1, "join started once");
    assert!(
        join_starts[0] > last_item_note,
        "join started after every item ended"
    );
    let retried = items.iter().filter(|i| i.attempts.len() > 1).count();
    let list_attempts = instances
        .iter()
        .find(|i| i.task == "list")
        .map_or(0, |i| i.attempts.len());
    println!(
        "for_each fan-out fault on {backend:?} with {nodes} node(s), killed {after:?} after the list's output: items when the node died: {fanned_before_kill}; list attempts {list_attempts}; {retried} items needed another attempt"
    );
    scene.cluster.shutdown().await.expect("clean shutdown");
}

/// How many items existed right after node `killed` died (0: the fan-out had not committed),
/// as another node sees it; with one node, unknown until it restarts.
async fn items_after_kill(scene: &Scene, run: i64, killed: usize) -> String {
    let nodes = scene.cluster.node_count();
    if nodes == 1 {
        return "unknown (the only node was down)".into();
    }
    let other = (killed + 1) % nodes;
    let Ok(client) = scene.cluster.node_client(other).await else {
        return "unknown (no answer)".into();
    };
    match client.instances(run).await {
        Ok(instances) => format!(
            "{}",
            instances.iter().filter(|i| i.shard_parent_id != 0).count()
        ),
        Err(err) => format!("unknown ({err:#})"),
    }
}

async fn fault_for_each_nodes_killed_while_2000_items_fan_out_on_mysql_run_each_item_once() {
    nodes_killed_while_items_fan_out(Backend::MySql, 3, Duration::ZERO).await;
}

/// Later, so that the end report (and the fan-out) more likely committed before the kill.
async fn fault_for_each_nodes_killed_just_after_the_list_ends_on_mysql_run_each_item_once() {
    nodes_killed_while_items_fan_out(Backend::MySql, 3, Duration::from_millis(150)).await;
}

async fn fault_for_each_sqlite_node_killed_while_2000_items_fan_out_runs_each_item_once() {
    nodes_killed_while_items_fan_out(Backend::Sqlite, 1, Duration::ZERO).await;
}

/// A worker killed after `list` wrote `$AX_OUTPUT` (attempt 1 writes `["lost"]` and then
/// sleeps; attempt 2 writes `["x","y","z"]`); returns the run's instances, the run and the
/// items' ledger.
async fn worker_killed_after_the_output(
    backend: Backend,
    retries: u32,
) -> (Vec<pb::Instance>, pb::Run, Vec<String>) {
    let Scene {
        mut cluster,
        client,
        dir,
        worker,
        ..
    } = Scenario::new(backend)
        .heartbeats("300ms")
        .dead_after(4)
        .worker_settings(WorkerSettings {
            capacity: Some(4),
            kill_grace: Some("500ms".into()),
            ..WorkerSettings::default()
        })
        .worker("a")
        .start()
        .await;
    let d = dir.display();
    let source = format!(
        r#"
name: lost_output
tasks:
  - name: list
    retries: {retries}
    retry_backoff: 100ms
    command: if [ "$AX_ATTEMPT" = 1 ]; then echo 'files=["lost"]' >> "$AX_OUTPUT"; touch {d}/written; sleep 60; else echo 'files=["x","y","z"]' >> "$AX_OUTPUT"; fi
  - name: copy
    upstream: list
    for_each: ${{tasks.list.outputs.files}}
    command: echo "$AX_ITEM $AX_ITEM_INDEX" >> {d}/items
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("lost_output").await.expect("trigger").id;
    wait_file(&dir.join("written"), "attempt 1 wrote its output").await;
    // The start stored too: a worker that dies before it is (under load its report can lag the
    // task) has the attempt withdrawn and run again without counting against retries, which is
    // another case than this one.
    client
        .wait_instance(run, "list", S::Running)
        .await
        .expect("attempt 1's start stored");
    cluster.kill_worker("a").await.expect("SIGKILL worker a");
    cluster
        .start_live_worker("b", &worker)
        .await
        .expect("worker b");
    let ended = client.wait_run(run).await.expect("the run ends");
    let instances = client.instances(run).await.expect("instances");
    let lines = item_lines(&dir.join("items"));
    cluster.shutdown().await.expect("clean shutdown");
    (instances, ended, lines)
}

async fn fault_a_worker_killed_after_writing_its_output_has_the_retry_s_list_mapped() {
    retry_s_list_mapped(Backend::Sqlite).await;
}

async fn fault_a_worker_killed_after_writing_its_output_on_mysql_has_the_retry_s_list_mapped() {
    retry_s_list_mapped(Backend::MySql).await;
}

async fn fault_a_worker_killed_after_writing_its_output_without_retries_fails_the_run_naming_it() {
    no_retry_fails_naming_the_worker(Backend::Sqlite).await;
}

async fn fault_a_worker_killed_after_writing_its_output_on_mysql_without_retries_fails_the_run_naming_it()
 {
    no_retry_fails_naming_the_worker(Backend::MySql).await;
}

async fn retry_s_list_mapped(backend: Backend) {
    let (instances, run, mut lines) = worker_killed_after_the_output(backend, 1).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let list = instances.iter().find(|i| i.task == "list").expect("list");
    assert_eq!(list.attempts.len(), 2, "{list:?}");
    assert_ne!(list.attempts[0].state(), S::Success, "{list:?}");
    assert_eq!(list.attempts[0].message, "lost: worker a is dead");
    assert!(
        list.attempts[0].outputs.is_empty(),
        "the lost attempt's output was never taken: {list:?}"
    );
    assert_eq!(
        list.attempts[1].outputs.get("files").map(String::as_str),
        Some(r#"["x","y","z"]"#)
    );
    lines.sort();
    assert_eq!(
        lines,
        vec!["x 0", "y 1", "z 2"],
        "the items are the retry's list, never the lost attempt's"
    );
}

async fn no_retry_fails_naming_the_worker(backend: Backend) {
    let (instances, run, lines) = worker_killed_after_the_output(backend, 0).await;
    assert_eq!(run.state(), pb::RunState::Failed, "{}", summary(&instances));
    let list = instances.iter().find(|i| i.task == "list").expect("list");
    assert_eq!(list.attempts.len(), 1, "{list:?}");
    assert_eq!(list.state(), S::Failed, "{list:?}");
    assert_eq!(
        list.attempts[0].message, "lost: worker a is dead",
        "the failure names the lost worker"
    );
    assert!(list.attempts[0].outputs.is_empty());
    let copy: Vec<&pb::Instance> = instances.iter().filter(|i| i.task == "copy").collect();
    assert_eq!(
        copy.len(),
        1,
        "no item was created: {}",
        summary(&instances)
    );
    assert_eq!(copy[0].state(), S::UpstreamFailed);
    assert!(lines.is_empty(), "no item ran: {lines:?}");
}
