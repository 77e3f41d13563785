//! Outputs end to end, through a real worker and the real `axctl`: a task writes `$AX_OUTPUT`,
//! the task below it gets the values in its command (`${tasks.T.outputs.K}`) and environment
//! (`AX_UPSTREAM_<T>_<K>`), `axctl get instance` shows them, and a file past the limit fails its
//! attempt with a clear error instead of passing on a truncated value. On SQLite, and on MySQL
//! when `AX_TEST_MYSQL_URL` is set.

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(a_task_passes_values_to_the_task_below_and_too_much_is_refused)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn a_task_passes_values_to_the_task_below_and_too_much_is_refused(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .redis()
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let dir = cluster.dir().display().to_string();
    let source = format!(
        r#"
name: passes
tasks:
  - name: extract
    command: printf 'rows=3\nreport<<EOF\nline one\nline two\nEOF\n' >> "$AX_OUTPUT"
  - name: load
    upstream: extract
    env:
      ROWS: ${{tasks.extract.outputs.rows}}
    command: echo "arg=${{tasks.extract.outputs.rows}} env=$ROWS upstream=$AX_UPSTREAM_EXTRACT_rows" >> {dir}/ledger; printf '%s\n' "$AX_UPSTREAM_EXTRACT_report" >> {dir}/ledger
  - name: too_much
    command: head -c 70000 /dev/zero | tr '\0' x | sed 's/^/blob=/' >> "$AX_OUTPUT"
"#
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_at("passes", 0).await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("ends");
    assert_eq!(
        ended.state,
        pb::RunState::Failed as i32,
        "too_much fails the run"
    );
    let ledger = std::fs::read_to_string(cluster.dir().join("ledger")).expect("ledger");
    assert_eq!(ledger, "arg=3 env=3 upstream=3\nline one\nline two\n");

    let instances = client.instances(run.id).await.expect("instances");
    let of = |task: &str| {
        instances
            .iter()
            .find(|i| i.task == task)
            .unwrap_or_else(|| panic!("{task}"))
    };
    let extract = of("extract");
    assert_eq!(
        extract.attempts[0]
            .outputs
            .get("report")
            .map(String::as_str),
        Some("line one\nline two")
    );
    let too_much = of("too_much");
    assert_eq!(too_much.state, pb::InstanceState::Failed as i32);
    assert_eq!(
        too_much.attempts[0].message,
        "outputs refused: $AX_OUTPUT holds 70005 bytes, more than the 65536 an attempt may pass on"
    );
    assert!(too_much.attempts[0].outputs.is_empty());

    let out = cluster
        .axctl(&["get", "instance", &extract.id.to_string()])
        .expect("axctl");
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        shown.contains("Outputs (attempt 1):\n  report=line one\nline two\n  rows=3\n"),
        "{shown}"
    );
    drop(client);
    cluster.shutdown().await.expect("shutdown");
}
