//! End to end: a scheduler on loopback gRPC, a real store, real workers running real shell
//! commands. Every scenario runs against SQLite, and against MySQL when `AX_TEST_MYSQL_URL` is set
//! (always under CI).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::on_every_backend;
use ax_integration_tests::process::{pid_from_file, process_alive, wait_gone};
use ax_integration_tests::{Backend, Cluster, TestClient};
use ax_proto::v1 as pb;
use ax_scheduler::Strategy;

/// A hang guard, not a timing assertion.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    [
        vec![trial!(max_overlap_counts_concurrent_spans)],
        on_every_backend!(
            example_etl_runs_every_task_and_keeps_its_logs,
            a_failed_task_leaves_its_downstream_unrun,
            a_per_second_cron_schedule_fires_on_time,
            two_workers_share_forty_tasks_within_capacity,
            a_repeated_idempotency_key_creates_one_run,
            a_trigger_answers_with_the_run_s_counts_as_created,
            bad_input_is_refused_and_changes_nothing,
            a_failed_attempt_is_retried_and_each_attempt_keeps_its_logs,
            cancelling_a_run_kills_its_process_and_starts_nothing_more,
            following_logs_streams_lines_until_the_attempt_ends,
            rerun_of_the_failed_part_and_retry_of_an_instance_through_axctl,
            failures_are_announced_to_the_alert_channels,
            a_ten_megabyte_line_and_binary_output_are_stored_split_and_replaced,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

async fn cluster(backend: Backend, workers: &[(&str, u32)]) -> (Cluster, TestClient) {
    cluster_with(backend, workers, Strategy::LeastRunning).await
}

async fn cluster_with(
    backend: Backend,
    workers: &[(&str, u32)],
    strategy: Strategy,
) -> (Cluster, TestClient) {
    let mut builder = Cluster::builder(backend).redis().strategy(strategy);
    for (id, capacity) in workers {
        builder = builder.worker(id, *capacity);
    }
    let cluster = builder.start().await.expect("cluster starts");
    let client = cluster.client().await.expect("client");
    (cluster, client)
}

fn state_of(instance: &pb::Instance) -> pb::InstanceState {
    pb::InstanceState::try_from(instance.state).expect("known state")
}

async fn example_etl_runs_every_task_and_keeps_its_logs(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 4)]).await;
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/etl.yaml"))
            .expect("example file");
    // Keep the example's files inside the test's scratch dir.
    let source = source.replace(
        "/tmp/ax-etl",
        &cluster.dir().join("etl").display().to_string(),
    );
    let applied = client.apply(&source).await.expect("apply");
    assert_eq!(applied.outcome, pb::ApplyOutcome::Created as i32);
    let workflow = applied.workflow.expect("workflow");
    assert_eq!(workflow.tasks.len(), 5);
    assert_eq!(
        workflow.next_fires_ms.len(),
        5,
        "a cron workflow shows its next fires"
    );

    let (run, finished) = client
        .run_to_end("daily-sales-etl")
        .await
        .expect("run ends");
    assert_eq!(finished.state, pb::RunState::Success as i32, "{finished:?}");

    let instances = client.instances(run.id).await.expect("instances");
    let mut by_task: BTreeMap<String, pb::Instance> = instances
        .into_iter()
        .map(|instance| (instance.task.clone(), instance))
        .collect();
    assert_eq!(by_task.len(), 5);
    for instance in by_task.values() {
        assert_eq!(
            state_of(instance),
            pb::InstanceState::Success,
            "{}",
            instance.task
        );
        assert_eq!(instance.worker_id, "w1");
        assert_eq!(instance.exit_code, Some(0));
        assert_eq!(instance.attempts.len(), 1);
    }
    // The fan-in started only after both extracts ended.
    let clean = by_task.remove("clean").expect("clean");
    for upstream in ["extract_orders", "extract_refunds"] {
        let upstream = &by_task[upstream];
        assert!(
            clean.started_at_ms >= upstream.finished_at_ms,
            "clean started before {}",
            upstream.task
        );
    }

    // Both streams, each in its order, through the API. The two pipes are read concurrently,
    // so the order *between* stdout and stderr is the order of arrival, not of writing.
    let refunds = &by_task["extract_refunds"];
    let lines = client.logs(refunds.id).await.expect("logs");
    let of_stream = |stream: pb::LogStream| -> Vec<&str> {
        lines
            .iter()
            .filter(|line| line.stream == stream as i32)
            .map(|line| line.text.as_str())
            .collect()
    };
    assert_eq!(of_stream(pb::LogStream::Stdout), vec!["extracting refunds"]);
    assert_eq!(
        of_stream(pb::LogStream::Stderr),
        vec!["1 refund is older than 30 days and was skipped"]
    );
    assert_eq!(
        lines.iter().map(|line| line.seq).collect::<Vec<_>>(),
        vec![1, 2]
    );
    let orders = &by_task["extract_orders"];
    let order_lines: Vec<String> = client
        .logs(orders.id)
        .await
        .expect("logs")
        .into_iter()
        .map(|line| line.text)
        .collect();
    assert_eq!(
        order_lines,
        vec![
            format!("extracting orders for run {}", run.id),
            "wrote 5 orders".into()
        ]
    );
    let report = &by_task["report"];
    let report_lines = client.logs(report.id).await.expect("logs");
    assert_eq!(report_lines.len(), 1);
    assert_eq!(
        report_lines[0].text,
        format!("daily revenue report for run {}: 1560", run.id)
    );

    // …and through the real axctl binary.
    let output = cluster
        .axctl(&["logs", &refunds.id.to_string()])
        .expect("axctl logs");
    assert!(
        output.status.success(),
        "axctl logs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let expected: String = lines
        .iter()
        .map(|line| format!("{}\n", line.text))
        .collect();
    assert_eq!(stdout, expected, "axctl prints the stored lines in order");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_failed_task_leaves_its_downstream_unrun(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 4)]).await;
    let marker = cluster.dir().join("after_ran");
    let source = format!(
        r#"
name: breaks
tasks:
  - name: broken
    command: echo about to fail; exit 3
  - name: after
    upstream: [broken]
    command: touch {marker}
  - name: other_branch
    command: echo fine
"#,
        marker = marker.display()
    );
    client.apply(&source).await.expect("apply");
    let (run, finished) = client.run_to_end("breaks").await.expect("run ends");
    assert_eq!(finished.state, pb::RunState::Failed as i32);
    let counts = finished.counts.expect("counts");
    assert_eq!(
        (
            counts.failed,
            counts.success,
            counts.upstream_failed,
            counts.not_created
        ),
        (1, 1, 1, 0)
    );

    let instances = client.instances(run.id).await.expect("instances");
    let broken = instances
        .iter()
        .find(|i| i.task == "broken")
        .expect("broken");
    assert_eq!(state_of(broken), pb::InstanceState::Failed);
    assert_eq!(broken.exit_code, Some(3));
    assert_eq!(broken.attempts[0].exit_code, Some(3));
    let after = instances
        .iter()
        .find(|i| i.task == "after")
        .expect("the downstream's verdict is kept");
    assert_eq!(state_of(after), pb::InstanceState::UpstreamFailed);
    assert!(after.attempts.is_empty(), "it never had an attempt");
    assert!(!marker.exists(), "downstream of a failure ran");
    let other = instances
        .iter()
        .find(|i| i.task == "other_branch")
        .expect("other branch");
    assert_eq!(state_of(other), pb::InstanceState::Success);
    cluster.shutdown().await.expect("shutdown");
}

async fn a_per_second_cron_schedule_fires_on_time(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 4)]).await;
    let source = r#"
name: every-second
schedule:
  cron: "* * * * * *"
tasks:
  - name: tick
    command: echo tick
"#;
    client.apply(source).await.expect("apply");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    client.pause("every-second").await.expect("pause");
    let runs = client.runs("every-second").await.expect("runs");
    assert!(runs.len() >= 2, "only {} fires in 3.5 s", runs.len());
    let mut logical: Vec<i64> = runs.iter().map(|run| run.logical_time_ms).collect();
    logical.sort();
    for pair in logical.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1_000,
            "fires are one second apart: {logical:?}"
        );
    }
    for run in &runs {
        assert_eq!(run.trigger, pb::TriggerKind::Cron as i32);
        assert_eq!(run.logical_time_ms % 1_000, 0, "fires on the second");
        // A generous bound that catches a fire a whole slot late, not a timing measurement.
        let lateness = run.created_at_ms - run.logical_time_ms;
        assert!(
            (0..900).contains(&lateness),
            "run {} created {lateness} ms after its second",
            run.id
        );
    }
    for run in &runs {
        let ended = client.wait_run(run.id).await.expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn two_workers_share_forty_tasks_within_capacity(backend: Backend) {
    let workers = [("w1", 8), ("w2", 8)];
    let (cluster, client) = cluster_with(backend, &workers, Strategy::RoundRobin).await;
    let mut source = String::from("name: forty\ntasks:\n");
    for i in 0..40 {
        source.push_str(&format!("  - name: t{i:02}\n    command: sleep 0.2\n"));
    }
    client.apply(&source).await.expect("apply");
    let (run, finished) = client.run_to_end("forty").await.expect("run ends");
    assert_eq!(finished.state, pb::RunState::Success as i32);

    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(instances.len(), 40);
    let mut per_worker: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for instance in &instances {
        let attempt = instance.attempts.last().expect("attempt");
        per_worker
            .entry(attempt.worker_id.clone())
            .or_default()
            .push((attempt.started_at_ms, attempt.finished_at_ms));
    }
    assert_eq!(
        per_worker.keys().cloned().collect::<Vec<_>>(),
        vec!["w1", "w2"],
        "both workers got work"
    );
    for (worker, spans) in &per_worker {
        // Round robin alternates between the two whenever both have a free slot.
        assert!(spans.len() >= 12, "{worker} ran only {} of 40", spans.len());
        assert!(
            max_overlap(spans) <= 8,
            "{worker} ran more than its capacity at once"
        );
    }
    cluster.shutdown().await.expect("shutdown");
}

/// The most intervals that overlap at any instant.
fn max_overlap(spans: &[(i64, i64)]) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for &(start, end) in spans {
        events.push((start, 1));
        events.push((end, -1));
    }
    // Ends sort before starts at the same instant.
    events.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        max = max.max(now);
    }
    max as usize
}

async fn a_repeated_idempotency_key_creates_one_run(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 4)]).await;
    let source = r#"
name: keyed
tasks:
  - name: greet
    command: echo "hello $AX_PARAM_customer"
"#;
    client.apply(source).await.expect("apply");
    let first = client
        .trigger("keyed", &[("customer", "acme")], "order-42")
        .await
        .expect("trigger");
    let second = client
        .trigger("keyed", &[("customer", "acme")], "order-42")
        .await
        .expect("trigger");
    assert!(first.created);
    assert!(!second.created);
    let first_run = first.run.expect("run");
    assert_eq!(first_run.id, second.run.expect("run").id);
    let other = client
        .trigger("keyed", &[("customer", "zeta")], "order-43")
        .await
        .expect("trigger");
    assert!(other.created);

    let runs = client.runs("keyed").await.expect("runs");
    assert_eq!(runs.len(), 2);
    client.wait_run(first_run.id).await.expect("run ends");
    let instance = &client.instances(first_run.id).await.expect("instances")[0];
    let lines = client.logs(instance.id).await.expect("logs");
    assert_eq!(
        lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
        vec!["hello acme"]
    );
    cluster.shutdown().await.expect("shutdown");
}

/// The trigger's answer carries the run's counts as created (from the spec, not a read): the
/// same as the store's once read back, for a started run, a queued one and a repeated key.
async fn a_trigger_answers_with_the_run_s_counts_as_created(backend: Backend) {
    // No worker: the runs stay as created.
    let (cluster, client) = cluster(backend, &[]).await;
    let source = r#"
name: diamond
schedule:
  max_active_runs: 1
tasks:
  - name: a
    command: "true"
  - name: x
    command: "true"
  - name: b
    command: "true"
    upstream: [a]
  - name: c
    command: "true"
    upstream: [a, x]
"#;
    client.apply(source).await.expect("apply");
    let mut answers = Vec::new();
    for key in ["first", "second", "first"] {
        answers.push(client.trigger("diamond", &[], key).await.expect("trigger"));
    }
    let created: Vec<bool> = answers.iter().map(|a| a.created).collect();
    assert_eq!(created, [true, true, false]);
    for answer in &answers {
        let run = answer.run.as_ref().expect("run");
        let stored = client.get_run(run.id).await.expect("get run");
        assert_eq!(run.state, stored.state);
        assert_eq!(run.counts, stored.counts, "run {}", run.id);
    }
    let counts = |i: usize| {
        answers[i]
            .run
            .as_ref()
            .and_then(|r| r.counts)
            .expect("counts")
    };
    assert_eq!(
        (counts(0).waiting, counts(0).not_created),
        (2, 2),
        "a and x wait"
    );
    assert_eq!(
        (counts(1).waiting, counts(1).not_created),
        (0, 4),
        "queued: nothing yet"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn bad_input_is_refused_and_changes_nothing(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    client
        .apply("name: good\ntasks:\n  - name: a\n    command: 'true'\n")
        .await
        .expect("apply");
    let mut control = client.control();
    let before = control
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner();

    let cases = [
        (
            "name: bad\ntasks:\n  - name: a\n    command: x\n    colour: red\n",
            "test.yaml:5: tasks[0].colour",
        ),
        (
            "name: bad\ntasks:\n  - name: a\n    command: x\n    upstream: [nope]\n",
            "test.yaml:5: tasks[0].upstream[0]",
        ),
        (
            "name: bad\ntasks:\n  - name: a\n    command: x\n    upstream: [b]\n  - name: b\n    command: x\n    upstream: [a]\n",
            "a → b → a",
        ),
        (
            "name: bad\nschedule:\n  cron: \"0 0 30 2 *\"\ntasks:\n  - name: a\n    command: x\n",
            "test.yaml:3: schedule.cron",
        ),
        (
            "name: bad\nschedule:\n  cron: \"* * * * *\"\n  timezone: Mars/Olympus\ntasks:\n  - name: a\n    command: x\n",
            "schedule.timezone",
        ),
        (
            "name: good\ntasks:\n  - name: a\n    command: x\n  - name: a\n    command: y\n",
            "test.yaml:5: tasks[1].name",
        ),
    ];
    for (source, expected) in cases {
        let status = client.apply(source).await.expect_err("refused");
        let status = status.downcast::<tonic::Status>().expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{source}");
        assert!(
            status.message().contains(expected),
            "{:?} does not name {expected:?}",
            status.message()
        );
    }

    let not_found = [
        control
            .trigger_workflow(pb::TriggerWorkflowRequest {
                name: "nope".into(),
                ..Default::default()
            })
            .await
            .err(),
        control
            .get_run(pb::GetRunRequest { id: 987_654 })
            .await
            .err(),
        control
            .get_instance(pb::GetInstanceRequest { id: 987_654 })
            .await
            .err(),
        control
            .get_workflow(pb::GetWorkflowRequest {
                name: "nope".into(),
            })
            .await
            .err(),
    ];
    for status in not_found {
        let status = status.expect("refused");
        assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
        assert!(
            status.message().contains("not found"),
            "{}",
            status.message()
        );
    }
    let bad_param = control
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: "good".into(),
            params: [("bad-name".to_string(), "x".to_string())].into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(bad_param.code(), tonic::Code::InvalidArgument);
    assert!(
        bad_param.message().contains("bad-name"),
        "{}",
        bad_param.message()
    );
    let bad_id = control
        .get_run(pb::GetRunRequest { id: -1 })
        .await
        .expect_err("refused");
    assert_eq!(bad_id.code(), tonic::Code::InvalidArgument);

    let after = control
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(before, after, "a refused apply changed the store");
    let runs = control
        .list_runs(pb::ListRunsRequest::default())
        .await
        .expect("runs")
        .into_inner()
        .runs;
    assert!(runs.is_empty(), "a refused trigger created a run");
    let names: HashSet<&str> = after.workflows.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, HashSet::from(["good"]));
    cluster.shutdown().await.expect("shutdown");
}

async fn a_failed_attempt_is_retried_and_each_attempt_keeps_its_logs(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    let source = r#"
name: flaky
tasks:
  - name: flaky
    retries: 2
    retry_backoff: 100ms
    command: |
      echo "attempt $AX_ATTEMPT"
      if [ "$AX_ATTEMPT" -lt 2 ]; then echo "not yet" >&2; exit 1; fi
"#;
    client.apply(source).await.expect("apply");
    let (run, finished) = client.run_to_end("flaky").await.expect("run ends");
    assert_eq!(finished.state, pb::RunState::Success as i32);
    let instance = client.instances(run.id).await.expect("instances").remove(0);
    assert_eq!(instance.attempt, 2);
    let attempts: Vec<(u32, i32, Option<i32>)> = instance
        .attempts
        .iter()
        .map(|a| (a.attempt, a.state, a.exit_code))
        .collect();
    assert_eq!(
        attempts,
        vec![
            (1, pb::InstanceState::Failed as i32, Some(1)),
            (2, pb::InstanceState::Success as i32, Some(0))
        ]
    );
    let first_end = instance.attempts[0].finished_at_ms;
    let second_start = instance.attempts[1].started_at_ms;
    assert!(
        second_start >= first_end + 50,
        "the retry waited for its backoff (jitter keeps at least half)"
    );

    let mut control = client.control();
    for (attempt, expected) in [(1, vec!["attempt 1", "not yet"]), (2, vec!["attempt 2"])] {
        let request = pb::GetLogsRequest {
            instance_id: instance.id,
            attempt,
            follow: false,
            after_seq: 0,
            ..Default::default()
        };
        let mut stream = control.get_logs(request).await.expect("logs").into_inner();
        let mut texts = Vec::new();
        while let Some(chunk) = stream.message().await.expect("chunk") {
            assert_eq!(chunk.attempt, attempt);
            texts.extend(chunk.lines.into_iter().map(|line| line.text));
        }
        texts.sort();
        assert_eq!(texts, expected, "logs of attempt {attempt}");
    }
    let no_such = pb::GetLogsRequest {
        instance_id: instance.id,
        attempt: 3,
        follow: false,
        after_seq: 0,
        ..Default::default()
    };
    let status = control.get_logs(no_such).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    cluster.shutdown().await.expect("shutdown");
}

async fn cancelling_a_run_kills_its_process_and_starts_nothing_more(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    let pid_file = cluster.dir().join("pid");
    let source = format!(
        r#"
name: long
tasks:
  - name: long
    command: echo $$ > {pid}; exec sleep 60
  - name: after
    upstream: [long]
    command: echo never
"#,
        pid = pid_file.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("long").await.expect("trigger");
    client
        .wait_instance(run.id, "long", pb::InstanceState::Running)
        .await
        .expect("the instance reaches the state");
    let pid = pid_from_file(&pid_file, Duration::from_secs(20)).await;
    assert!(process_alive(pid));

    let cancelled = client.cancel_run(run.id, "test").await.expect("cancel");
    assert_eq!(cancelled.state, pb::RunState::Cancelled as i32);
    // The cancelled task's process is killed.
    wait_gone(pid, Duration::from_secs(20)).await;
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(
        instances.len(),
        1,
        "the downstream of a cancelled task was created"
    );
    assert_eq!(instances[0].state, pb::InstanceState::Cancelled as i32);
    let again = client
        .cancel_run(run.id, "")
        .await
        .expect("cancelling twice is harmless");
    assert_eq!(again.state, pb::RunState::Cancelled as i32);
    cluster.shutdown().await.expect("shutdown");
}

async fn following_logs_streams_lines_until_the_attempt_ends(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    let source = r#"
name: chatty
tasks:
  - name: chatty
    command: for i in 1 2 3 4 5; do echo "line $i"; sleep 0.2; done
"#;
    client.apply(source).await.expect("apply");
    let run = client.trigger_run("chatty").await.expect("trigger");
    let instance = client
        .wait_instance(run.id, "chatty", pb::InstanceState::Running)
        .await
        .expect("the instance reaches the state");
    let mut control = client.control();
    let request = pb::GetLogsRequest {
        instance_id: instance.id,
        attempt: 0,
        follow: true,
        after_seq: 0,
        ..Default::default()
    };
    let mut stream = control
        .get_logs(request)
        .await
        .expect("follow")
        .into_inner();
    let mut texts = Vec::new();
    let mut chunks = 0;
    let follow = async {
        while let Some(chunk) = stream.message().await.expect("chunk") {
            chunks += 1;
            texts.extend(chunk.lines.into_iter().map(|line| (line.seq, line.text)));
        }
    };
    tokio::time::timeout(RUN_TIMEOUT, follow)
        .await
        .expect("the follow ends when the attempt does");
    let expected: Vec<(u64, String)> = (1..=5).map(|i| (i, format!("line {i}"))).collect();
    assert_eq!(texts, expected);
    assert!(
        chunks >= 2,
        "lines arrived while the task ran, not all at the end"
    );
    let ended = client.wait_run(run.id).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    cluster.shutdown().await.expect("shutdown");
}

async fn rerun_of_the_failed_part_and_retry_of_an_instance_through_axctl(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    let ready = cluster.dir().join("ready");
    let source = format!(
        r#"
name: needs-data
tasks:
  - name: load
    command: test -f {ready} || {{ echo "no data yet" >&2; exit 2; }}
  - name: publish
    upstream: [load]
    command: echo published
"#,
        ready = ready.display()
    );
    client.apply(&source).await.expect("apply");
    let (run, failed) = client.run_to_end("needs-data").await.expect("run ends");
    assert_eq!(failed.state, pb::RunState::Failed as i32);

    // Nothing to retry in a successful instance; an unknown id is not found.
    let output = cluster.axctl(&["retry", "987654"]).expect("axctl");
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    std::fs::write(&ready, "").expect("marker");
    let output = cluster
        .axctl(&["rerun", &run.id.to_string(), "--failed"])
        .expect("axctl rerun");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rerun = client.wait_run(run.id).await.expect("rerun ends");
    assert_eq!(rerun.state, pb::RunState::Success as i32, "{rerun:?}");
    let instances = client.instances(run.id).await.expect("instances");
    let load = instances.iter().find(|i| i.task == "load").expect("load");
    let history: Vec<(u32, i32)> = load.attempts.iter().map(|a| (a.attempt, a.state)).collect();
    assert_eq!(
        history,
        vec![
            (1, pb::InstanceState::Failed as i32),
            (2, pb::InstanceState::Success as i32)
        ]
    );
    assert!(
        instances
            .iter()
            .any(|i| i.task == "publish" && i.state == pb::InstanceState::Success as i32)
    );

    let output = cluster
        .axctl(&["rerun", &run.id.to_string(), "--failed"])
        .expect("axctl rerun");
    assert_eq!(
        output.status.code(),
        Some(6),
        "nothing failed is left to rerun"
    );
    let output = cluster
        .axctl(&["retry", &load.id.to_string()])
        .expect("axctl retry");
    assert_eq!(
        output.status.code(),
        Some(6),
        "a successful instance is not retried"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("SUCCESS"));

    // A single instance, retried by hand after it failed.
    std::fs::remove_file(&ready).expect("marker");
    let second = client.trigger_run("needs-data").await.expect("trigger");
    client.wait_run(second.id).await.expect("run ends");
    let load = client
        .instances(second.id)
        .await
        .expect("instances")
        .remove(0);
    std::fs::write(&ready, "").expect("marker");
    let output = cluster
        .axctl(&["retry", &load.id.to_string()])
        .expect("axctl retry");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let done = client.wait_run(second.id).await.expect("run ends");
    assert_eq!(done.state, pb::RunState::Success as i32);
    cluster.shutdown().await.expect("shutdown");
}

async fn failures_are_announced_to_the_alert_channels(backend: Backend) {
    use ax_scheduler::alerts::{ChannelConfig, ChannelFormat};
    let receiver = ax_integration_tests::WebhookReceiver::start()
        .await
        .expect("receiver");
    let channel = ChannelConfig::new("ops", ChannelFormat::Webhook, receiver.url.clone());
    let cluster = Cluster::builder(backend)
        .worker("w1", 2)
        .alert_channel(channel)
        .start()
        .await;
    let cluster = cluster.expect("cluster starts");
    let client = cluster.client().await.expect("client");
    let source = r#"
name: alerting
tasks:
  - name: doomed
    retries: 1
    retry_backoff: 100ms
    command: echo "attempt $AX_ATTEMPT"; exit 4
"#;
    client.apply(source).await.expect("apply");
    let (run, ended) = client.run_to_end("alerting").await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Failed as i32);

    let wanted = ["instance_failed", "retries_exhausted", "run_failed"];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let alerts = loop {
        let alerts: Vec<serde_json::Value> = receiver
            .bodies()
            .iter()
            .map(|body| serde_json::from_str(body).expect("json body"))
            .collect();
        let kinds: HashSet<String> = alerts
            .iter()
            .filter_map(|alert| alert["kind"].as_str().map(str::to_string))
            .collect();
        if wanted.iter().all(|kind| kinds.contains(*kind)) {
            break alerts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alerts received: {alerts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for alert in &alerts {
        assert_eq!(alert["version"], 1);
        assert_eq!(alert["workflow"], "alerting");
        assert_eq!(alert["run_id"], run.id);
    }
    let exhausted = alerts
        .iter()
        .find(|a| a["kind"] == "retries_exhausted")
        .expect("exhausted");
    assert_eq!(exhausted["task"], "doomed");
    assert_eq!(exhausted["attempt"], 2);
    assert_eq!(
        alerts
            .iter()
            .filter(|a| a["kind"] == "instance_failed")
            .count(),
        1,
        "a failed attempt that is retried raises no failure alert"
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn a_ten_megabyte_line_and_binary_output_are_stored_split_and_replaced(backend: Backend) {
    let (cluster, client) = cluster(backend, &[("w1", 2)]).await;
    let source = r#"
name: noisy
tasks:
  - name: noisy
    command: |
      head -c 10485760 /dev/zero | tr '\000' x; echo
      head -c 65536 /dev/urandom; echo
      printf 'caf\303\251 \377\376 end\n'
      echo done
"#;
    client.apply(source).await.expect("apply");
    let run = client.trigger_run("noisy").await.expect("trigger");
    let ended = client.wait_run(run.id).await.expect("run ends");
    assert_eq!(ended.state, pb::RunState::Success as i32);
    let instance = client.instances(run.id).await.expect("instances").remove(0);
    let lines = client.logs(instance.id).await.expect("logs");
    assert_eq!(
        lines.len() as u64,
        instance.attempts[0].log_lines,
        "every line produced is stored"
    );
    assert!(
        lines
            .iter()
            .enumerate()
            .all(|(i, line)| line.seq == i as u64 + 1),
        "numbered in order"
    );
    // The 10 MiB line arrives split into bounded pieces that add up to all of it.
    let pieces: Vec<&pb::StoredLogLine> = lines
        .iter()
        .take_while(|line| !line.text.is_empty() && line.text.bytes().all(|b| b == b'x'))
        .collect();
    assert!(
        pieces.len() >= 10_485_760 / (1 << 20),
        "a 10 MiB line was stored as {} pieces",
        pieces.len()
    );
    assert!(
        pieces.iter().all(|line| line.text.len() <= 1 << 20),
        "a piece exceeds the line limit"
    );
    assert_eq!(
        pieces.iter().map(|line| line.text.len()).sum::<usize>(),
        10_485_760
    );
    // Invalid UTF-8 is replaced, valid multi-byte text is kept.
    assert!(
        lines
            .iter()
            .any(|line| line.text == "café \u{fffd}\u{fffd} end"),
        "mixed bytes line"
    );
    assert_eq!(lines.last().expect("lines").text, "done");
    cluster.shutdown().await.expect("shutdown");
}

fn max_overlap_counts_concurrent_spans() {
    assert_eq!(max_overlap(&[(0, 10), (5, 15), (10, 20)]), 2);
    assert_eq!(max_overlap(&[(0, 1), (1, 2)]), 1);
    assert_eq!(max_overlap(&[]), 0);
}
