//! Conditions end to end, through real workers and the real `axctl`: a task's `if:` reads an
//! upstream's output written to `$AX_OUTPUT` and a run's param; the branch whose condition is
//! false is SKIPPED (never started, as the ledger the tasks append to shows) and `axctl why`
//! shows the expression with the values it read; a type error is refused at apply with
//! `file:line:column`. Every scenario runs on SQLite, and on MySQL when `AX_TEST_MYSQL_URL` is
//! set.

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        a_branch_runs_on_an_output_and_a_param_and_why_shows_the_values,
        a_condition_comparing_a_string_with_a_number_is_refused_at_its_column,
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

async fn a_branch_runs_on_an_output_and_a_param_and_why_shows_the_values(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: branchy
tasks:
  - name: extract
    command: echo extract >> {dir}/ran; echo rows=$AX_PARAM_rows >> "$AX_OUTPUT"
  - name: load
    upstream: extract
    if: int(tasks.extract.outputs.rows) > 0
    command: echo load ${{tasks.extract.outputs.rows}} >> {dir}/ran
  - name: report_empty
    upstream: extract
    if: tasks.extract.outputs.rows == '0'
    command: echo report_empty >> {dir}/ran
  - name: publish
    upstream: load
    if: "!has(params.dry_run)"
    command: echo publish >> {dir}/ran
"#
    );
    client.apply(&source).await.expect("apply");

    let rows = client
        .trigger("branchy", &[("rows", "12")], "")
        .await
        .expect("trigger")
        .run
        .expect("run");
    let ended = client.wait_run(rows.id).await.expect("ends");
    assert_eq!(
        ended.state,
        pb::RunState::Success as i32,
        "a run with rows succeeds: {ended:?}"
    );
    let empty = client
        .trigger("branchy", &[("rows", "0")], "")
        .await
        .expect("trigger")
        .run
        .expect("run");
    let ended = client.wait_run(empty.id).await.expect("ends");
    assert_eq!(
        ended.state,
        pb::RunState::Success as i32,
        "a run whose false branch is skipped succeeds"
    );

    let ran = std::fs::read_to_string(cluster.dir().join("ran")).expect("ledger");
    let ran: Vec<&str> = ran.lines().collect();
    assert_eq!(
        ran,
        ["extract", "load 12", "publish", "extract", "report_empty"],
        "each branch ran where its condition held, and nothing else started"
    );
    let states: Vec<(String, i32)> = client
        .instances(empty.id)
        .await
        .expect("instances")
        .into_iter()
        .map(|i| (i.task, i.state))
        .collect();
    use pb::InstanceState as S;
    for (task, state) in [
        ("load", S::Skipped),
        ("publish", S::Skipped),
        ("report_empty", S::Success),
    ] {
        assert!(
            states.contains(&(task.to_string(), state as i32)),
            "{task} {state:?} in {states:?}"
        );
    }

    // `why` explains the latest run: the empty one.
    let out = cluster.axctl(&["why", "branchy"]).expect("axctl");
    let why = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for line in [
        "skipped: if: int(tasks.extract.outputs.rows) > 0 is false \
         (tasks.extract.outputs.rows = \"0\")",
        "skipped: upstream load was SKIPPED and trigger_rule is all_success",
    ] {
        assert!(why.contains(line), "`{line}` in:\n{why}");
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn a_condition_comparing_a_string_with_a_number_is_refused_at_its_column(backend: Backend) {
    let (cluster, client) = cluster(backend).await;
    let path = cluster.dir().join("typed.yaml");
    std::fs::write(
        &path,
        "name: typed\ntasks:\n  - {name: extract, command: x}\n  - name: load\n    upstream: extract\n    command: y\n    if: tasks.extract.outputs.rows > 0\n",
    )
    .expect("file");
    let out = cluster
        .axctl(&["apply", "-f", &path.display().to_string()])
        .expect("axctl");
    assert!(!out.status.success(), "typed.yaml was applied");
    let expected = "typed.yaml:7:36: tasks[1].if: compares a string with an int; outputs and \
                    params are strings: convert with int(...) or double(...)";
    assert!(
        text(&out.stderr).contains(expected),
        "`{expected}` in:\n{}",
        text(&out.stderr)
    );
    let out = cluster.axctl(&["get", "workflows"]).expect("axctl");
    assert!(
        !text(&out.stdout).contains("typed"),
        "nothing was stored:\n{}",
        text(&out.stdout)
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}
