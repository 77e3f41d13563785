//! Trigger rules, SKIPPED and handlers end to end, through real workers and the real `axctl`:
//! a failure runs its `one_failed` and `all_done` tasks and the `on_failure` list (told the
//! outcome), a branch that does not run is skipped down to a `none_failed` join, `axctl why`
//! names the upstream and the rule for every task that did not run, and a bad rule is refused
//! at apply with its line. Every scenario runs on SQLite, and on MySQL when `AX_TEST_MYSQL_URL`
//! is set.

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        a_failure_runs_its_handlers_and_a_skip_reaches_the_join,
        a_bad_trigger_rule_or_handler_edge_is_refused_with_its_line,
        the_examples_end_as_their_comments_say,
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

async fn a_failure_runs_its_handlers_and_a_skip_reaches_the_join(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: nightly
tasks:
  - name: extract
    command: echo extract >> {dir}/ran
  - name: check
    upstream: extract
    command: exit 3
  - name: publish
    upstream: check
    command: echo publish >> {dir}/ran
  - name: alert
    upstream: check
    trigger_rule: one_failed
    command: echo alert >> {dir}/ran
  - name: retry_path
    upstream: extract
    trigger_rule: one_failed
    command: echo retry_path >> {dir}/ran
  - name: after_retry
    upstream: retry_path
    command: echo after_retry >> {dir}/ran
  - name: join
    upstream: [extract, after_retry]
    trigger_rule: none_failed
    command: echo join >> {dir}/ran
  - name: cleanup
    upstream: [publish, alert, join]
    trigger_rule: all_done
    command: echo cleanup >> {dir}/ran
on_failure:
  - name: page
    command: echo "page $AX_RUN_STATE $AX_FAILED_TASKS" >> {dir}/ran
on_success:
  - name: celebrate
    command: echo celebrate >> {dir}/ran
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("nightly", 0).await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(
        ended.state,
        pb::RunState::Failed as i32,
        "a handled failure fails the run"
    );

    let mut ran: Vec<String> = std::fs::read_to_string(cluster.dir().join("ran"))
        .expect("ledger")
        .lines()
        .map(str::to_string)
        .collect();
    // `page` runs last, after every task of the graph ended.
    assert_eq!(ran.last().map(String::as_str), Some("page FAILED check"));
    ran.sort();
    assert_eq!(
        ran,
        ["alert", "cleanup", "extract", "join", "page FAILED check"],
        "each task that ran, once; publish, retry_path, after_retry and celebrate did not"
    );

    let statuses: Vec<(String, String)> = client
        .list_instances(run.id)
        .await
        .expect("instances")
        .tasks
        .into_iter()
        .map(|t| (t.task, t.status))
        .collect();
    let expected = [
        ("extract", "success"),
        ("check", "failed"),
        ("publish", "upstream_failed"),
        ("alert", "success"),
        ("retry_path", "skipped"),
        ("after_retry", "skipped"),
        ("join", "success"),
        ("cleanup", "success"),
        ("page", "success"),
        ("celebrate", "pending"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(t, s)| (t.to_string(), s.to_string()))
        .collect();
    assert_eq!(statuses, expected);

    let out = cluster.axctl(&["why", "nightly"]).expect("axctl");
    let why = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for line in [
        "will not run: upstream check was FAILED and trigger_rule is all_success",
        "skipped: no upstream failed and trigger_rule is one_failed",
        "skipped: upstream retry_path was SKIPPED and trigger_rule is all_success",
    ] {
        assert!(why.contains(line), "`{line}` in:\n{why}");
    }
    let out = cluster
        .axctl(&["get", "run", &run.id.to_string()])
        .expect("axctl");
    let shown = text(&out.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.contains("after_retry") && l.contains("SKIPPED")),
        "{shown}"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn a_bad_trigger_rule_or_handler_edge_is_refused_with_its_line(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let cases = [
        (
            "name: typo\ntasks:\n  - {name: a, command: x}\n  - name: b\n    upstream: a\n    trigger_rule: one_sucess\n    command: y\n",
            "typo.yaml:6: tasks[1].trigger_rule: unknown trigger rule \"one_sucess\": expected all_success, all_done, one_failed, one_success, none_failed or always",
        ),
        (
            "name: edge\ntasks:\n  - {name: a, command: x}\non_failure:\n  - {name: page, command: y, upstream: a}\n",
            "edge.yaml:5: on_failure[0].upstream[0]: task \"a\" is in tasks, not in on_failure: upstreams are tasks of the same list",
        ),
    ];
    for (source, expected) in cases {
        let name = expected.split(':').next().expect("file name");
        let path = cluster.dir().join(name);
        std::fs::write(&path, source).expect("file");
        let out = cluster
            .axctl(&["apply", "-f", &path.display().to_string()])
            .expect("axctl");
        assert!(!out.status.success(), "{name} was applied");
        assert!(
            text(&out.stderr).contains(expected),
            "`{expected}` in:\n{}",
            text(&out.stderr)
        );
    }
    let out = cluster.axctl(&["get", "workflows"]).expect("axctl");
    let listed = text(&out.stdout);
    assert!(
        !listed.contains("typo") && !listed.contains("edge"),
        "nothing was stored:\n{listed}"
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}

/// `examples/flaky-sync.yaml`, `examples/nightly-report.yaml` and `examples/copy-files.yaml`,
/// which the README's tour uses, do what their comments say.
async fn the_examples_end_as_their_comments_say(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let example = |name: &str| {
        std::fs::read_to_string(format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR")))
            .expect("example")
    };
    let states = |instances: &[pb::Instance]| -> Vec<(String, i32)> {
        instances
            .iter()
            .map(|i| (i.task.clone(), i.state))
            .collect()
    };
    use pb::InstanceState as S;

    client
        .apply(&example("flaky-sync.yaml"))
        .await
        .expect("apply");
    let run = client.trigger_run("flaky-sync").await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    let instances = client.instances(run.id).await.expect("instances");
    let pull = instances.iter().find(|i| i.task == "pull").expect("pull");
    assert_eq!(pull.attempts.len(), 2, "failed once, then succeeded");
    assert_eq!(
        pull.attempts[1].outputs.get("records").map(String::as_str),
        Some("42")
    );
    let push = instances.iter().find(|i| i.task == "push").expect("push");
    let lines: Vec<String> = client
        .logs(push.id)
        .await
        .expect("logs")
        .into_iter()
        .map(|l| l.text)
        .collect();
    assert_eq!(
        lines,
        ["pushing 42 records (also in $AX_UPSTREAM_PULL_records=42)"]
    );

    client
        .apply(&example("nightly-report.yaml"))
        .await
        .expect("apply");
    let good = client
        .trigger("nightly-report", &[], "")
        .await
        .expect("trigger");
    let good = good.run.expect("run");
    let ended = client.wait_run(good.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    let mut got = states(&client.instances(good.id).await.expect("instances"));
    got.sort();
    let mut want = vec![
        ("alert".to_string(), S::Skipped as i32),
        ("archive".to_string(), S::Skipped as i32),
        ("check".to_string(), S::Success as i32),
        ("cleanup".to_string(), S::Success as i32),
        ("extract".to_string(), S::Success as i32),
        ("publish".to_string(), S::Success as i32),
    ];
    want.sort();
    assert_eq!(got, want);

    let bad = client
        .trigger("nightly-report", &[("fail", "1")], "")
        .await
        .expect("trigger");
    let bad = bad.run.expect("run");
    let ended = client.wait_run(bad.id).await.expect("ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32);
    let mut got = states(&client.instances(bad.id).await.expect("instances"));
    got.sort();
    let mut want = vec![
        ("alert".to_string(), S::Success as i32),
        ("archive".to_string(), S::Skipped as i32),
        ("check".to_string(), S::Failed as i32),
        ("cleanup".to_string(), S::Success as i32),
        ("extract".to_string(), S::Success as i32),
        ("page".to_string(), S::Success as i32),
        ("publish".to_string(), S::UpstreamFailed as i32),
    ];
    want.sort();
    assert_eq!(got, want);

    client
        .apply(&example("copy-files.yaml"))
        .await
        .expect("apply");
    let (_, ended) = client.run_to_end("copy-files").await.expect("run");
    assert_eq!(ended.state, pb::RunState::Failed as i32, "broken.csv fails");
    let mut control = client.control();
    let grouped = control
        .list_instances(pb::ListInstancesRequest {
            run_id: ended.id,
            group_items: true,
            ..Default::default()
        })
        .await
        .expect("grouped")
        .into_inner();
    let mut got = states(&grouped.instances);
    got.sort();
    assert_eq!(
        got,
        vec![
            ("copy".to_string(), S::Failed as i32),
            ("count".to_string(), S::Success as i32),
            ("list".to_string(), S::Success as i32),
        ],
        "the items are left out, their task's instance stays"
    );
    let copy = grouped
        .tasks
        .iter()
        .find(|t| t.task == "copy")
        .expect("copy");
    let items = copy.items.as_ref().expect("copy's items are counted");
    assert_eq!(items.total, 4);
    assert_eq!(items.states.get("SUCCESS"), Some(&3));
    assert_eq!(items.states.get("FAILED"), Some(&1));
    let failed: Vec<Option<&str>> = items
        .first_failures
        .iter()
        .map(|i| i.item.as_deref())
        .collect();
    assert_eq!(failed, vec![Some("broken.csv")]);
    let page = control
        .list_instances(pb::ListInstancesRequest {
            run_id: ended.id,
            items_of: copy.instance_id,
            limit: 2,
            ..Default::default()
        })
        .await
        .expect("items")
        .into_inner();
    let listed: Vec<(u32, Option<&str>)> = page
        .instances
        .iter()
        .map(|i| (i.shard_index, i.item.as_deref()))
        .collect();
    assert_eq!(
        listed,
        vec![(0, Some("orders.csv")), (1, Some("users.csv"))]
    );
    assert_eq!(page.next_items_from, 2);
    let lines: Vec<String> = client
        .logs(page.instances[1].id)
        .await
        .expect("logs")
        .into_iter()
        .map(|l| l.text)
        .collect();
    assert_eq!(lines, ["copying users.csv (item 1)"]);
    let too_many = control
        .list_instances(pb::ListInstancesRequest {
            run_id: ended.id,
            items_of: copy.instance_id,
            limit: 5_000,
            ..Default::default()
        })
        .await
        .expect_err("a page holds at most 1,000 items");
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument);
    assert!(too_many.message().contains("limit 5000"), "{too_many:?}");
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}
