//! `for_each:` end to end, through a real scheduler and real `ax-worker` processes: a task maps
//! over an upstream's output list or a run's param list, one item instance per element, each
//! told `AX_ITEM` and `AX_ITEM_INDEX`; the tasks append to a ledger outside ax, which the tests
//! join with the store's instances (through the API). They show each item runs exactly once with
//! its own index and the join after every item; an item that fails once is retried alone; an
//! item that fails for good fails its task (the join is UPSTREAM_FAILED, an `all_done` one
//! runs); a list over `max_items` fails the run naming the cap; an empty list is SKIPPED;
//! `concurrency: 2` holds across the items; a manual retry of one failed item reruns only it.
//! Every scenario runs on SQLite, and on MySQL when `AX_TEST_MYSQL_URL` is set. Timing is never
//! asserted, only bounded from above by the client's hang guards.

use std::collections::BTreeMap;
use std::path::Path;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;
use pb::InstanceState as S;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        each_item_of_an_output_list_runs_once_and_the_join_after_all,
        a_param_list_maps_strings_as_they_are_and_other_elements_as_json,
        an_item_that_fails_once_is_retried_alone,
        an_item_that_fails_for_good_fails_its_task_and_the_join_follows_its_rule,
        a_list_over_the_cap_fails_the_run_naming_the_cap_and_an_empty_list_is_skipped,
        concurrency_two_never_runs_more_than_two_items_at_once,
        a_manual_retry_of_a_failed_item_reruns_only_that_item,
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

/// The ledger's lines, each split on spaces.
fn ledger(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split(' ').map(str::to_string).collect())
        .collect()
}

/// The item instances of `task`, by their index.
fn items_of<'a>(instances: &'a [pb::Instance], task: &str) -> BTreeMap<u32, &'a pb::Instance> {
    let mut items = BTreeMap::new();
    for i in instances
        .iter()
        .filter(|i| i.task == task && i.shard_parent_id != 0)
    {
        assert!(
            items.insert(i.shard_index, i).is_none(),
            "two items of {task} with index {}",
            i.shard_index
        );
    }
    items
}

/// The instance of `task` that counts for the run (the parent of a mapped task).
fn task_of<'a>(instances: &'a [pb::Instance], task: &str) -> &'a pb::Instance {
    let mut found = instances
        .iter()
        .filter(|i| i.task == task && i.shard_parent_id == 0);
    let first = found
        .next()
        .unwrap_or_else(|| panic!("no instance of {task}"));
    assert!(found.next().is_none(), "two instances of {task}");
    first
}

async fn trigger(client: &TestClient, workflow: &str, params: &[(&str, &str)]) -> i64 {
    client
        .trigger(workflow, params, "")
        .await
        .expect("trigger")
        .run
        .expect("run")
        .id
}

async fn each_item_of_an_output_list_runs_once_and_the_join_after_all(backend: Backend) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: mapped
tasks:
  - name: list
    command: echo 'files=["a","b","c"]' >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    for_each: ${{tasks.list.outputs.files}}
    command: echo "copy $AX_ITEM $AX_ITEM_INDEX $AX_INSTANCE_ID $AX_ATTEMPT" >> {dir}/ledger
  - name: join
    upstream: copy
    command: echo "join - - $AX_INSTANCE_ID $AX_ATTEMPT" >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(&client, "mapped", &[]).await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");

    let instances = client.instances(run).await.expect("instances");
    let items = items_of(&instances, "copy");
    let parent = task_of(&instances, "copy");
    assert_eq!(parent.state(), S::Success);
    assert_eq!(items.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    for item in items.values() {
        assert_eq!(item.state(), S::Success, "item {item:?}");
        assert_eq!(item.shard_parent_id, parent.id);
        assert_eq!(item.shard_total, 3);
        assert_eq!(item.attempts.len(), 1, "item {} ran once", item.shard_index);
    }

    let lines = ledger(&cluster.dir().join("ledger"));
    let copies: Vec<&Vec<String>> = lines.iter().filter(|l| l[0] == "copy").collect();
    assert_eq!(copies.len(), 3, "one line per item: {lines:?}");
    let mut seen: Vec<(String, u32, i64)> = copies
        .iter()
        .map(|l| {
            (
                l[1].clone(),
                l[2].parse().expect("index"),
                l[3].parse().expect("id"),
            )
        })
        .collect();
    seen.sort();
    let expected: Vec<(String, u32, i64)> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(index, item)| (item.to_string(), index as u32, items[&(index as u32)].id))
        .collect();
    assert_eq!(
        seen, expected,
        "each item ran once, as its own instance, with its index"
    );
    assert_eq!(
        lines.last().map(|l| l[0].as_str()),
        Some("join"),
        "the join ran after every item: {lines:?}"
    );
    assert_eq!(lines.iter().filter(|l| l[0] == "join").count(), 1);
    let join = task_of(&instances, "join");
    let last_item_end = items
        .values()
        .map(|i| i.finished_at_ms)
        .max()
        .expect("items");
    assert!(
        join.started_at_ms >= last_item_end,
        "join started at {} before the last item ended at {last_item_end}",
        join.started_at_ms
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_param_list_maps_strings_as_they_are_and_other_elements_as_json(backend: Backend) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: by_param
tasks:
  - name: each
    for_each: ${{files}}
    command: printf '%s|%s\n' "$AX_ITEM_INDEX" "$AX_ITEM" >> {dir}/ledger
  - name: after
    upstream: each
    command: echo after >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(
        &client,
        "by_param",
        &[("files", r#"["x y", 7, {"k": "v"}, [1, 2]]"#)],
    )
    .await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let text = std::fs::read_to_string(cluster.dir().join("ledger")).expect("ledger");
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.pop(), Some("after"), "after ran last: {text}");
    lines.sort();
    assert_eq!(
        lines,
        vec!["0|x y", "1|7", r#"2|{"k":"v"}"#, "3|[1,2]"],
        "a string as it is, anything else as its JSON"
    );
    let instances = client.instances(run).await.expect("instances");
    assert_eq!(items_of(&instances, "each").len(), 4);
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn an_item_that_fails_once_is_retried_alone(backend: Backend) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    // Item b fails its first attempt: a marker per item says it has failed once already.
    let source = format!(
        r#"
name: flaky
tasks:
  - name: list
    command: echo 'files=["a","b","c"]' >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    retries: 1
    retry_backoff: 100ms
    for_each: ${{tasks.list.outputs.files}}
    command: echo "copy $AX_ITEM $AX_ITEM_INDEX $AX_ATTEMPT" >> {dir}/ledger; if [ "$AX_ITEM" = b ] && [ ! -e {dir}/failed-$AX_ITEM ]; then touch {dir}/failed-$AX_ITEM; exit 1; fi
  - name: join
    upstream: copy
    command: echo "join - - $AX_ATTEMPT" >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(&client, "flaky", &[]).await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");

    let lines = ledger(&cluster.dir().join("ledger"));
    let mut copies: Vec<String> = lines
        .iter()
        .filter(|l| l[0] == "copy")
        .map(|l| l[1..].join(" "))
        .collect();
    copies.sort();
    assert_eq!(
        copies,
        vec!["a 0 1", "b 1 1", "b 1 2", "c 2 1"],
        "only b ran again, as its attempt 2"
    );
    assert_eq!(lines.last().map(|l| l.join(" ")), Some("join - - 1".into()));
    let instances = client.instances(run).await.expect("instances");
    let items = items_of(&instances, "copy");
    let attempts: Vec<(u32, usize, S)> = items
        .values()
        .map(|i| (i.shard_index, i.attempts.len(), i.state()))
        .collect();
    assert_eq!(
        attempts,
        vec![(0, 1, S::Success), (1, 2, S::Success), (2, 1, S::Success)]
    );
    assert_eq!(items[&1].attempts[0].state(), S::Failed);
    let parent = task_of(&instances, "copy");
    assert_eq!(
        (parent.state(), parent.attempt),
        (S::Success, 1),
        "the task itself was not retried"
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn an_item_that_fails_for_good_fails_its_task_and_the_join_follows_its_rule(
    backend: Backend,
) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: broken
tasks:
  - name: list
    command: echo 'files=["a","b","c"]' >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    for_each: ${{tasks.list.outputs.files}}
    command: echo "copy $AX_ITEM" >> {dir}/ledger; [ "$AX_ITEM" != b ]
  - name: join
    upstream: copy
    command: echo join >> {dir}/ledger
  - name: cleanup
    upstream: copy
    trigger_rule: all_done
    command: echo cleanup >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(&client, "broken", &[]).await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");

    let instances = client.instances(run).await.expect("instances");
    let items = items_of(&instances, "copy");
    let states: Vec<S> = items.values().map(|i| i.state()).collect();
    assert_eq!(
        states,
        vec![S::Success, S::Failed, S::Success],
        "the other items still ran"
    );
    assert_eq!(task_of(&instances, "copy").state(), S::Failed);
    assert_eq!(task_of(&instances, "join").state(), S::UpstreamFailed);
    assert_eq!(task_of(&instances, "cleanup").state(), S::Success);
    let text = std::fs::read_to_string(cluster.dir().join("ledger")).expect("ledger");
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.contains(&"join"), "join never ran: {text}");
    assert_eq!(
        lines.last(),
        Some(&"cleanup"),
        "cleanup ran after every item: {text}"
    );
    assert_eq!(lines.iter().filter(|l| l.starts_with("copy")).count(), 3);
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_list_over_the_cap_fails_the_run_naming_the_cap_and_an_empty_list_is_skipped(
    backend: Backend,
) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: capped
tasks:
  - name: list
    command: echo "files=$AX_PARAM_files" >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    max_items: 3
    for_each: ${{tasks.list.outputs.files}}
    command: echo "copy $AX_ITEM" >> {dir}/ledger
  - name: join
    upstream: copy
    command: echo join >> {dir}/ledger
  - name: finally
    upstream: copy
    trigger_rule: all_done
    command: echo finally >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");

    let over = trigger(&client, "capped", &[("files", "[1,2,3,4]")]).await;
    let ended = client.wait_run(over).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");
    let instances = client.instances(over).await.expect("instances");
    assert!(
        items_of(&instances, "copy").is_empty(),
        "no item was created"
    );
    let copy = task_of(&instances, "copy");
    assert_eq!(copy.state(), S::Failed);
    let message = copy
        .attempts
        .last()
        .map(|a| a.message.clone())
        .unwrap_or_default();
    assert_eq!(
        message,
        "for_each: output files of task list has 4 items, more than the task's max_items 3",
        "{copy:?}"
    );
    assert_eq!(task_of(&instances, "join").state(), S::UpstreamFailed);
    let text = std::fs::read_to_string(cluster.dir().join("ledger")).unwrap_or_default();
    assert_eq!(text, "finally\n", "no item ran, and neither did join");
    std::fs::remove_file(cluster.dir().join("ledger")).expect("clear the ledger");

    let empty = trigger(&client, "capped", &[("files", "[]")]).await;
    let ended = client.wait_run(empty).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = client.instances(empty).await.expect("instances");
    assert!(items_of(&instances, "copy").is_empty());
    assert_eq!(task_of(&instances, "copy").state(), S::Skipped);
    let text = std::fs::read_to_string(cluster.dir().join("ledger")).unwrap_or_default();
    assert!(!text.contains("copy"), "no item ran: {text}");
    let join = task_of(&instances, "join").state();
    let finally = task_of(&instances, "finally").state();
    assert_eq!(
        (join, finally),
        (S::Skipped, S::Success),
        "a SKIPPED upstream skips an all_success task and not an all_done one"
    );
    assert_eq!(text, "finally\n");
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn concurrency_two_never_runs_more_than_two_items_at_once(backend: Backend) {
    let (cluster, client) = cluster(backend, 6).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: limited
tasks:
  - name: each
    for_each: [a, b, c, d, e, f]
    concurrency: 2
    command: echo "start $AX_ITEM $(date +%s%3N)" >> {dir}/ledger; sleep 0.5; echo "end $AX_ITEM $(date +%s%3N)" >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(&client, "limited", &[]).await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");

    // The ledger's order is the order the items wrote in (each line one O_APPEND write): an
    // item is running from its start line to its end line.
    let lines = ledger(&cluster.dir().join("ledger"));
    let mut running = 0i32;
    let mut most = 0i32;
    for line in &lines {
        match line[0].as_str() {
            "start" => running += 1,
            "end" => running -= 1,
            other => panic!("unexpected ledger line {other}"),
        }
        most = most.max(running);
    }
    assert_eq!(
        lines.len(),
        12,
        "every item started and ended once: {lines:?}"
    );
    assert!(most <= 2, "{most} items ran at once: {lines:?}");
    assert_eq!(
        most, 2,
        "two items ran at once: the limit is two, not one: {lines:?}"
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_manual_retry_of_a_failed_item_reruns_only_that_item(backend: Backend) {
    let (cluster, client) = cluster(backend, 4).await;
    let dir = cluster.dir().display().to_string();
    // Item b fails until the test creates `fixed`.
    let source = format!(
        r#"
name: retried
tasks:
  - name: list
    command: echo 'files=["a","b","c"]' >> "$AX_OUTPUT"
  - name: copy
    upstream: list
    for_each: ${{tasks.list.outputs.files}}
    command: echo "copy $AX_ITEM $AX_ITEM_INDEX $AX_ATTEMPT" >> {dir}/ledger; [ "$AX_ITEM" != b ] || [ -e {dir}/fixed ]
  - name: join
    upstream: copy
    command: echo "join - - $AX_ATTEMPT" >> {dir}/ledger
"#
    );
    client.apply(&source).await.expect("apply");
    let run = trigger(&client, "retried", &[]).await;
    let ended = client.wait_run(run).await.expect("ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");
    let instances = client.instances(run).await.expect("instances");
    let failed = items_of(&instances, "copy")[&1].clone();
    assert_eq!(failed.state(), S::Failed);
    assert_eq!(task_of(&instances, "join").state(), S::UpstreamFailed);

    std::fs::write(cluster.dir().join("fixed"), "").expect("fix b");
    let out = cluster
        .axctl(&["retry", &failed.id.to_string()])
        .expect("axctl");
    assert!(
        out.status.success(),
        "axctl retry of item {}: {}{}",
        failed.id,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ended = client.wait_run(run).await.expect("ends again");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");

    let lines = ledger(&cluster.dir().join("ledger"));
    let mut copies: Vec<String> = lines
        .iter()
        .filter(|l| l[0] == "copy")
        .map(|l| l[1..].join(" "))
        .collect();
    copies.sort();
    assert_eq!(
        copies,
        vec!["a 0 1", "b 1 1", "b 1 2", "c 2 1"],
        "only b ran again"
    );
    assert_eq!(
        lines.last().map(|l| l.join(" ")),
        Some("join - - 1".into()),
        "join ran once, after b's retry: {lines:?}"
    );
    let instances = client.instances(run).await.expect("instances");
    let items = items_of(&instances, "copy");
    assert_eq!(items.len(), 3, "no item was created again");
    assert_eq!(items[&1].id, failed.id);
    let attempts: Vec<(usize, S)> = items
        .values()
        .map(|i| (i.attempts.len(), i.state()))
        .collect();
    assert_eq!(
        attempts,
        vec![(1, S::Success), (2, S::Success), (1, S::Success)]
    );
    assert_eq!(task_of(&instances, "copy").state(), S::Success);
    assert_eq!(task_of(&instances, "join").state(), S::Success);
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}
