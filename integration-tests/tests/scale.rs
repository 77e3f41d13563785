//! Scale: a 10,000-task workflow (100 layers of 100 tasks, each depending on 2–3 tasks of the
//! layer before) is applied through the API, and a layered run of real `true` processes ends
//! with every instance SUCCESS. Every scenario runs on SQLite, and on MySQL when
//! `AX_TEST_MYSQL_URL` is set. The apply time is printed, never asserted.

use std::time::{Duration, Instant};

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::workflows::layered;
use ax_integration_tests::{Backend, Cluster};
use ax_proto::v1 as pb;

/// A hang guard for the run, not a timing assertion.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// The layers of the run test: the first 20 of the same shape (2,000 tasks, a few seconds). All
/// 100 (10,000 `true` processes through two workers) take minutes in a debug build on a small
/// machine, more when both backends' runs share it as `cargo test` runs them: too slow for CI.
/// `AX_SCALE_RUN_LAYERS=100` runs the whole 10,000. The apply test always applies all 10,000.
const RUN_LAYERS: usize = 20;

fn run_layers() -> usize {
    match std::env::var("AX_SCALE_RUN_LAYERS") {
        Ok(text) => text
            .parse()
            .ok()
            .filter(|layers| (1..=100).contains(layers))
            .expect("AX_SCALE_RUN_LAYERS is a number of layers from 1 to 100"),
        Err(_) => RUN_LAYERS,
    }
}

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        ten_thousand_tasks_apply_in_one_request,
        a_wide_layered_run_ends_with_every_instance_success,
        a_workflow_file_at_the_size_limit_applies_and_one_byte_more_is_refused,
    )
}

/// The server's limit on a workflow file (`MAX_SOURCE_BYTES` in the control API).
const MAX_SOURCE_BYTES: usize = 4 << 20;

async fn ten_thousand_tasks_apply_in_one_request(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let source = layered("wide", 100, 100);
    let started = Instant::now();
    let applied = client.apply(&source).await.expect("apply");
    eprintln!(
        "{backend:?}: applied 10,000 tasks ({} bytes of YAML) in {:?}",
        source.len(),
        started.elapsed()
    );
    assert_eq!(applied.outcome, pb::ApplyOutcome::Created as i32);
    let workflow = applied.workflow.expect("workflow");
    assert_eq!(workflow.tasks.len(), 10_000);
    let last = workflow
        .tasks
        .iter()
        .find(|t| t.name == "l99_98")
        .expect("last layer task");
    let mut ups = last.upstream.clone();
    ups.sort();
    assert_eq!(ups, ["l98_49", "l98_98", "l98_99"]);

    // The same file again changes nothing; one more edge makes a new version.
    let started = Instant::now();
    let again = client.apply(&source).await.expect("apply again");
    eprintln!(
        "{backend:?}: re-applied the unchanged file in {:?}",
        started.elapsed()
    );
    assert_eq!(again.outcome, pb::ApplyOutcome::Unchanged as i32);
    let changed = source.replacen(
        "    upstream: [l98_0, l98_99]\n",
        "    upstream: [l98_0, l98_50, l98_99]\n",
        1,
    );
    assert!(changed != source, "the edit found its line");
    let started = Instant::now();
    let updated = client.apply(&changed).await.expect("apply a new version");
    eprintln!("{backend:?}: applied version 2 in {:?}", started.elapsed());
    assert_eq!(updated.outcome, pb::ApplyOutcome::Updated as i32);
    assert_eq!(updated.workflow.expect("workflow").version, 2);

    // A cycle closing over the whole depth is refused with the cycle spelled out.
    let cyclic = source.replacen(
        "  - name: l0_0\n    command: 'true'\n",
        "  - name: l0_0\n    command: 'true'\n    upstream: [l99_0]\n",
        1,
    );
    let refused = client
        .apply(&cyclic.replacen("name: wide", "name: cyclic", 1))
        .await
        .expect_err("a cycle is refused");
    let message = format!("{refused:#}");
    assert!(message.contains("l0_0 → l1_0"), "{message}");
    assert!(message.contains("l99_0 → l0_0"), "{message}");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_wide_layered_run_ends_with_every_instance_success(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .redis()
        .worker("w1", 50)
        .worker("w2", 50)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let layers = run_layers();
    let tasks = layers * 100;
    client
        .apply(&layered("wide-run", layers, 100))
        .await
        .expect("apply");
    let started = Instant::now();
    let run = client.trigger_run("wide-run").await.expect("trigger");
    let ended = client
        .wait_run_within(run.id, RUN_TIMEOUT)
        .await
        .expect("run ends");
    eprintln!(
        "{backend:?}: {tasks} tasks in {layers} layers ran in {:?}",
        started.elapsed()
    );
    assert_eq!(ended.state, pb::RunState::Success as i32, "{ended:?}");
    let counts = ended.counts.expect("counts");
    assert_eq!(counts.success as usize, tasks, "{counts:?}");
    assert_eq!(counts.not_created, 0, "{counts:?}");

    let instances = client
        .list_instances(run.id)
        .await
        .expect("instances")
        .instances;
    assert_eq!(instances.len(), tasks);
    for instance in &instances {
        assert_eq!(
            instance.state,
            pb::InstanceState::Success as i32,
            "{}",
            instance.task
        );
    }
    cluster.shutdown().await.expect("shutdown");
}

/// `source` padded with a trailing comment to exactly `len` bytes.
fn padded(source: &str, len: usize) -> String {
    let mut padded = source.to_string();
    padded.push_str("# ");
    let fill = len - padded.len() - 1;
    padded.push_str(&"x".repeat(fill));
    padded.push('\n');
    assert_eq!(padded.len(), len);
    padded
}

async fn a_workflow_file_at_the_size_limit_applies_and_one_byte_more_is_refused(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    // At the limit: the request is larger than tonic's default 4 MiB, and so is the answer
    // (the source and 10,000 tasks); both must pass.
    let source = padded(&layered("big", 100, 100), MAX_SOURCE_BYTES);
    let applied = client.apply(&source).await.expect("apply at the limit");
    assert_eq!(applied.outcome, pb::ApplyOutcome::Created as i32);
    let workflow = applied.workflow.expect("workflow");
    assert_eq!(workflow.tasks.len(), 10_000);
    assert_eq!(workflow.source.len(), MAX_SOURCE_BYTES);

    // One byte more is refused by the API's own check, naming the file and the limit.
    let over = padded(&layered("too-big", 100, 100), MAX_SOURCE_BYTES + 1);
    let status = client
        .apply(&over)
        .await
        .expect_err("over the limit")
        .downcast::<tonic::Status>()
        .expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("test.yaml")
            && status
                .message()
                .contains(&format!("the limit is {MAX_SOURCE_BYTES}")),
        "{}",
        status.message()
    );
    let names: Vec<String> = client
        .control()
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .workflows
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(names, ["big"], "nothing of the refused file was stored");
    cluster.shutdown().await.expect("shutdown");
}
