//! End to end with real processes: the built `ax-scheduler`, `ax-worker` and `axctl` binaries,
//! talking over real TCP, with signals, exit codes and JSON output checked the way a user or a
//! script would see them. Each test has its own temporary directory, store and port; every
//! child is killed when a test fails, and its log is printed.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{CtlOutput, HANG_GUARD, ProcessCluster};
use ax_integration_tests::requirements::{MYSQL, REDIS};
use serde_json::Value;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) real_binaries_run_the_example_on_mysql_and_redis)
            .requires(&MYSQL)
            .requires(&REDIS),
        trial!(async(multi_thread = 2) real_binaries_run_the_example_on_sqlite),
        trial!(async(multi_thread = 2) a_failing_run_exits_10_and_keeps_the_downstream_unrun),
        trial!(async(multi_thread = 2) a_bad_workflow_file_is_refused_with_file_line_and_field_and_nothing_is_stored),
        trial!(async(multi_thread = 2) sigterm_on_a_worker_lets_its_running_task_finish),
        trial!(async(multi_thread = 2) sigterm_on_the_scheduler_exits_cleanly_and_a_restart_keeps_everything),
        trial!(async(multi_thread = 2) unknown_ids_exit_3_and_an_unreachable_server_exits_5),
        trial!(async(multi_thread = 2) health_and_reflection_are_served),
        trial!(async(multi_thread = 2) fault_a_cron_slot_missed_during_scheduler_downtime_fires_once_on_restart),
    ]
}

/// The example workflow, with its data directory moved into the test's scratch directory.
fn example_in(dir: &Path) -> std::path::PathBuf {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/etl.yaml"))
            .expect("example file");
    assert!(
        source.contains("/tmp/ax-etl"),
        "the example's data path moved"
    );
    let source = source.replace("/tmp/ax-etl", &dir.join("etl").display().to_string());
    let path = dir.join("etl.yaml");
    std::fs::write(&path, source).expect("write the example");
    path
}

/// The stdout of a successful `-o json` command, parsed.
fn json(output: &CtlOutput) -> Value {
    assert_eq!(output.code, Some(0), "{output}");
    serde_json::from_str(&output.stdout)
        .unwrap_or_else(|err| panic!("stdout is not JSON ({err}):\n{output}"))
}

fn str_field<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field]
        .as_str()
        .unwrap_or_else(|| panic!("no string {field:?} in {value}"))
}

fn int_field(value: &Value, field: &str) -> i64 {
    value[field]
        .as_i64()
        .unwrap_or_else(|| panic!("no integer {field:?} in {value}"))
}

fn instances(run: &Value) -> &Vec<Value> {
    run["instances"]
        .as_array()
        .unwrap_or_else(|| panic!("no instances in {run}"))
}

fn instance_of<'a>(run: &'a Value, task: &str) -> &'a Value {
    instances(run)
        .iter()
        .find(|i| str_field(i, "task") == task)
        .unwrap_or_else(|| panic!("no instance of {task} in {run}"))
}

/// Polls `axctl workers -o json` until `id` is LIVE.
async fn wait_worker_live(cluster: &ProcessCluster, id: &str) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let output = cluster
            .axctl(&["workers", "-o", "json"])
            .await
            .expect("axctl");
        if output.code == Some(0) {
            let workers: Value = serde_json::from_str(&output.stdout).expect("workers JSON");
            let live = workers
                .as_array()
                .is_some_and(|all| all.iter().any(|w| w["id"] == id && w["state"] == "LIVE"));
            if live {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker {id} not LIVE after {HANG_GUARD:?}; last answer:\n{output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `axctl get run ID -o json` until `done` holds for it, and returns it.
async fn wait_run(cluster: &ProcessCluster, id: i64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let id = id.to_string();
    loop {
        let run = json(
            &cluster
                .axctl(&["get", "run", &id, "-o", "json"])
                .await
                .expect("axctl"),
        );
        if done(&run) {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {id} not as expected after {HANG_GUARD:?}: {run:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `axctl apply -f FILE`, checked to succeed with `outcome` ("created", "unchanged", …).
async fn apply(cluster: &ProcessCluster, file: &str, outcome: &str) {
    let output = cluster.axctl(&["apply", "-f", file]).await.expect("axctl");
    assert_eq!(output.code, Some(0), "{output}");
    assert!(output.stdout.contains(outcome), "not {outcome}:\n{output}");
}

/// `axctl trigger NAME --wait -o json`: the finished run, and the exit code.
async fn trigger_and_wait(cluster: &ProcessCluster, workflow: &str) -> (Option<i32>, Value) {
    let output = cluster
        .axctl(&["trigger", workflow, "--wait", "-o", "json"])
        .await
        .expect("axctl");
    let run = serde_json::from_str(&output.stdout)
        .unwrap_or_else(|err| panic!("stdout is not JSON ({err}):\n{output}"));
    (output.code, run)
}

/// `axctl trigger NAME`, which prints the new run's bare id.
async fn trigger(cluster: &ProcessCluster, workflow: &str) -> i64 {
    let output = cluster.axctl(&["trigger", workflow]).await.expect("axctl");
    assert_eq!(output.code, Some(0), "{output}");
    output
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|err| panic!("not a run id ({err}):\n{output}"))
}

async fn started(backend: Backend, redis: bool, workers: &[&str]) -> ProcessCluster {
    let mut cluster = ProcessCluster::start(backend, redis)
        .await
        .expect("the scheduler process starts");
    for id in workers {
        cluster.start_worker(id).expect("the worker process starts");
    }
    for id in workers {
        wait_worker_live(&cluster, id).await;
    }
    cluster
}

async fn real_binaries_run_the_example_on_mysql_and_redis() {
    run_the_example(Backend::MySql, true).await;
}

async fn real_binaries_run_the_example_on_sqlite() {
    run_the_example(Backend::Sqlite, false).await;
}

async fn run_the_example(backend: Backend, redis: bool) {
    let cluster = started(backend, redis, &["w1"]).await;
    let file = example_in(cluster.dir());
    let file = file.to_str().expect("utf-8 path");
    apply(&cluster, file, "created").await;

    let (code, run) = trigger_and_wait(&cluster, "daily-sales-etl").await;
    assert_eq!(code, Some(0), "{run:#}");
    assert_eq!(str_field(&run, "state"), "SUCCESS", "{run:#}");
    let run_id = int_field(&run, "id");

    let runs = json(
        &cluster
            .axctl(&["get", "runs", "-o", "json"])
            .await
            .expect("axctl"),
    );
    let runs = runs.as_array().expect("a list of runs");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(int_field(&runs[0], "id"), run_id);
    assert_eq!(str_field(&runs[0], "state"), "SUCCESS");
    assert_eq!(str_field(&runs[0], "workflow"), "daily-sales-etl");

    let run = json(
        &cluster
            .axctl(&["get", "run", &run_id.to_string(), "-o", "json"])
            .await
            .expect("axctl"),
    );
    let tasks: BTreeSet<&str> = instances(&run)
        .iter()
        .map(|i| str_field(i, "task"))
        .collect();
    assert_eq!(
        tasks,
        BTreeSet::from([
            "aggregate",
            "clean",
            "extract_orders",
            "extract_refunds",
            "report"
        ])
    );
    for instance in instances(&run) {
        assert_eq!(str_field(instance, "state"), "SUCCESS", "{instance:#}");
        assert_eq!(str_field(instance, "worker_id"), "w1", "{instance:#}");
        assert_eq!(instance["exit_code"], 0, "{instance:#}");
    }
    // The tasks really ran, in the test's own directory.
    let revenue = cluster
        .dir()
        .join("etl")
        .join(run_id.to_string())
        .join("revenue.txt");
    assert_eq!(
        std::fs::read_to_string(&revenue).expect("the aggregate's file"),
        "1560\n"
    );

    let report = int_field(instance_of(&run, "report"), "id").to_string();
    let logs = cluster.axctl(&["logs", &report]).await.expect("axctl");
    assert_eq!(logs.code, Some(0), "{logs}");
    assert_eq!(
        logs.stdout,
        format!("daily revenue report for run {run_id}: 1560\n"),
        "{logs}"
    );

    apply(&cluster, file, "unchanged").await;
    cluster.shutdown().await.expect("clean shutdown");
}

async fn a_failing_run_exits_10_and_keeps_the_downstream_unrun() {
    let cluster = started(Backend::Sqlite, false, &["w1"]).await;
    let marker = cluster.dir().join("downstream-ran");
    let file = cluster.dir().join("breaks.yaml");
    std::fs::write(
        &file,
        format!(
            "name: breaks\ntasks:\n  - name: broken\n    command: echo about to fail; exit 3\n  \
             - name: after\n    upstream: [broken]\n    command: touch {}\n",
            marker.display()
        ),
    )
    .expect("write workflow");
    apply(&cluster, file.to_str().expect("utf-8 path"), "created").await;

    let (code, run) = trigger_and_wait(&cluster, "breaks").await;
    assert_eq!(code, Some(10), "a failed run exits 10: {run:#}");
    assert_eq!(str_field(&run, "state"), "FAILED", "{run:#}");

    let run = json(
        &cluster
            .axctl(&[
                "get",
                "run",
                &int_field(&run, "id").to_string(),
                "-o",
                "json",
            ])
            .await
            .expect("axctl"),
    );
    assert_eq!(
        str_field(instance_of(&run, "after"), "state"),
        "UPSTREAM_FAILED",
        "the downstream of a failure is kept as not run: {run:#}"
    );
    assert!(!marker.exists(), "the downstream of a failure ran");

    let broken = int_field(instance_of(&run, "broken"), "id").to_string();
    let broken = json(
        &cluster
            .axctl(&["get", "instance", &broken, "-o", "json"])
            .await
            .expect("axctl"),
    );
    assert_eq!(str_field(&broken, "state"), "FAILED", "{broken:#}");
    assert_eq!(broken["exit_code"], 3, "{broken:#}");
    let attempts = broken["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{broken:#}");
    assert_eq!(attempts[0]["exit_code"], 3, "{broken:#}");
    cluster.shutdown().await.expect("clean shutdown");
}

async fn a_bad_workflow_file_is_refused_with_file_line_and_field_and_nothing_is_stored() {
    let cluster = started(Backend::Sqlite, false, &[]).await;
    std::fs::create_dir(cluster.dir().join("bad")).expect("mkdir");
    let absolute = |name: &str| cluster.dir().join(name).display().to_string();
    // Relative paths are relative to axctl's working directory, the test's directory; the error
    // must name the file exactly as the user gave it.
    let cases = [
        (
            "bad/unknown-field.yaml".to_string(),
            "name: bad\ntasks:\n  - name: a\n    command: x\n    colour: red\n",
            "5: tasks[0].colour",
        ),
        (
            "./bad/cycle.yaml".to_string(),
            "name: bad\ntasks:\n  - name: a\n    command: x\n    upstream: [b]\n  - name: b\n    command: x\n    upstream: [a]\n",
            "3: tasks[0]",
        ),
        (
            absolute("bad/unknown-upstream.yaml"),
            "name: bad\ntasks:\n  - name: a\n    command: x\n    upstream: [nope]\n",
            "5: tasks[0].upstream[0]",
        ),
        (
            "bad/never-fires.yaml".to_string(),
            "name: bad\nschedule:\n  cron: \"0 0 30 2 *\"\ntasks:\n  - name: a\n    command: x\n",
            "3: schedule.cron",
        ),
        (
            "bad/time-zone.yaml".to_string(),
            "name: bad\nschedule:\n  cron: \"* * * * *\"\n  timezone: Mars/Olympus\ntasks:\n  - name: a\n    command: x\n",
            "4: schedule.timezone",
        ),
    ];
    for (file, source, location) in &cases {
        let path = if Path::new(file).is_absolute() {
            Path::new(file).to_path_buf()
        } else {
            cluster.dir().join(file)
        };
        std::fs::write(&path, source).expect("write workflow");
        let output = cluster.axctl(&["apply", "-f", file]).await.expect("axctl");
        assert_eq!(output.code, Some(4), "{output}");
        let expected = format!("{file}:{location}");
        assert!(
            output.stderr.contains(&expected),
            "stderr does not name {expected:?}:\n{output}"
        );
    }
    let cycle = &cluster
        .axctl(&["apply", "-f", "./bad/cycle.yaml"])
        .await
        .expect("axctl");
    assert!(
        cycle.stderr.contains("a → b → a"),
        "the cycle is spelled out:\n{cycle}"
    );

    let workflows = json(
        &cluster
            .axctl(&["get", "workflows", "-o", "json"])
            .await
            .expect("axctl"),
    );
    assert_eq!(workflows, Value::Array(vec![]), "a refused file was stored");
    cluster.shutdown().await.expect("clean shutdown");
}

async fn sigterm_on_a_worker_lets_its_running_task_finish() {
    let mut cluster = started(Backend::Sqlite, false, &["w1"]).await;
    let file = cluster.dir().join("slow.yaml");
    std::fs::write(
        &file,
        "name: slow\ntasks:\n  - name: nap\n    command: sleep 2; echo done\n",
    )
    .expect("write workflow");
    apply(&cluster, file.to_str().expect("utf-8 path"), "created").await;
    let run_id = trigger(&cluster, "slow").await;
    wait_run(&cluster, run_id, |run| {
        instances(run)
            .iter()
            .any(|i| i["task"] == "nap" && i["state"] == "RUNNING")
    })
    .await;

    let worker = cluster.worker("w1").expect("worker");
    worker.terminate().expect("SIGTERM the worker");
    let status = worker
        .wait_exit(HANG_GUARD)
        .await
        .expect("the worker exits");
    assert!(status.success(), "the draining worker exited with {status}");

    let run = wait_run(&cluster, run_id, |run| run["state"] != "RUNNING").await;
    assert_eq!(str_field(&run, "state"), "SUCCESS", "{run:#}");
    let nap = instance_of(&run, "nap");
    assert_eq!(str_field(nap, "state"), "SUCCESS", "{nap:#}");
    assert_eq!(nap["exit_code"], 0, "{nap:#}");
    let logs = cluster
        .axctl(&["logs", &int_field(nap, "id").to_string()])
        .await
        .expect("axctl");
    assert_eq!(logs.code, Some(0), "{logs}");
    assert_eq!(logs.stdout, "done\n", "{logs}");
    cluster.shutdown().await.expect("clean shutdown");
}

async fn sigterm_on_the_scheduler_exits_cleanly_and_a_restart_keeps_everything() {
    let mut cluster = started(Backend::Sqlite, false, &["w1"]).await;
    let file = cluster.dir().join("short.yaml");
    std::fs::write(
        &file,
        "name: short\ntasks:\n  - name: hello\n    command: echo hello; echo bye >&2\n  \
         - name: world\n    upstream: [hello]\n    command: echo world\n",
    )
    .expect("write workflow");
    apply(&cluster, file.to_str().expect("utf-8 path"), "created").await;
    let (code, first) = trigger_and_wait(&cluster, "short").await;
    assert_eq!(code, Some(0), "{first:#}");
    let first_id = int_field(&first, "id");
    let before = json(
        &cluster
            .axctl(&["get", "run", &first_id.to_string(), "-o", "json"])
            .await
            .expect("axctl"),
    );
    let hello = int_field(instance_of(&before, "hello"), "id").to_string();
    let logs_before = cluster.axctl(&["logs", &hello]).await.expect("axctl");
    assert_eq!(logs_before.code, Some(0), "{logs_before}");

    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.terminate().expect("SIGTERM the scheduler");
    // The verdict on the exit is asserted at the end, so that a scheduler that hangs is killed
    // and the restart is still checked: one run of the test reports both.
    let unclean_exit = match scheduler.wait_exit(HANG_GUARD).await {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!("the scheduler exited with {status} after SIGTERM")),
        Err(err) => {
            scheduler.kill().await.expect("kill the hung scheduler");
            Some(format!("{err:#} after SIGTERM"))
        }
    };

    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");
    let runs = json(
        &cluster
            .axctl(&["get", "runs", "-o", "json"])
            .await
            .expect("axctl"),
    );
    let runs = runs.as_array().expect("a list of runs");
    assert_eq!(runs.len(), 1, "{runs:#?}");
    assert_eq!(int_field(&runs[0], "id"), first_id);
    assert_eq!(str_field(&runs[0], "state"), "SUCCESS");
    let after = json(
        &cluster
            .axctl(&["get", "run", &first_id.to_string(), "-o", "json"])
            .await
            .expect("axctl"),
    );
    assert_eq!(after, before, "the restart changed the stored run");
    let logs_after = cluster.axctl(&["logs", &hello]).await.expect("axctl");
    assert_eq!(logs_after.code, Some(0), "{logs_after}");
    assert_eq!(logs_after.stdout, logs_before.stdout);
    let mut lines: Vec<&str> = logs_after.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["bye", "hello"], "{logs_after}");

    // The worker finds the restarted node by itself.
    wait_worker_live(&cluster, "w1").await;
    let (code, second) = trigger_and_wait(&cluster, "short").await;
    assert_eq!(code, Some(0), "{second:#}");
    assert_eq!(str_field(&second, "state"), "SUCCESS", "{second:#}");
    assert_ne!(int_field(&second, "id"), first_id);
    if let Some(failure) = unclean_exit {
        panic!("{failure}");
    }
    cluster.shutdown().await.expect("clean shutdown");
}

async fn unknown_ids_exit_3_and_an_unreachable_server_exits_5() {
    let cluster = started(Backend::Sqlite, false, &[]).await;
    let missing = cluster
        .axctl(&["get", "run", "999999"])
        .await
        .expect("axctl");
    assert_eq!(missing.code, Some(3), "{missing}");
    assert!(missing.stderr.contains("not found"), "{missing}");
    assert!(missing.stdout.is_empty(), "{missing}");

    // Port 1 is privileged and never served here: the connection is refused.
    let unreachable = cluster
        .axctl(&["--server", "http://127.0.0.1:1", "workers"])
        .await
        .expect("axctl");
    assert_eq!(unreachable.code, Some(5), "{unreachable}");
    assert!(unreachable.stdout.is_empty(), "{unreachable}");
    cluster.shutdown().await.expect("clean shutdown");
}

async fn health_and_reflection_are_served() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let cluster = started(Backend::Sqlite, false, &[]).await;
    let channel = tonic::transport::Channel::from_shared(cluster.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "ax.v1.ControlService", "ax.v1.WorkerService"] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|status| panic!("health of {service:?}: {status}"))
            .into_inner();
        assert_eq!(
            response.status(),
            ServingStatus::Serving,
            "health of {service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = tokio::time::timeout(HANG_GUARD, responses.message())
        .await
        .expect("a reflection answer in time")
        .expect("reflection stream")
        .expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("not a service list: {response:?}");
    };
    let services: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "ax.v1.WorkerService",
        "ax.v1.ControlService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.contains(expected),
            "{expected} missing from {services:?}"
        );
    }
    cluster.shutdown().await.expect("clean shutdown");
}

/// Cron slots that fall while the scheduler is down fire once when it comes back (the default
/// misfire policy), not once per missed slot and not never.
async fn fault_a_cron_slot_missed_during_scheduler_downtime_fires_once_on_restart() {
    let mut cluster = started(Backend::Sqlite, false, &["w1"]).await;
    let file = cluster.dir().join("every2s.yaml");
    std::fs::write(
        &file,
        "name: every2s\nschedule:\n  cron: \"*/2 * * * * *\"\ntasks:\n  - name: tick\n    command: echo tick\n",
    )
    .expect("write workflow");
    apply(&cluster, file.to_str().expect("utf-8 path"), "created").await;
    let client = cluster.client().await.expect("client");
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while client.runs("every2s").await.expect("runs").is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the schedule never fired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("kill -9 the scheduler");
    let down_at = now_ms();
    // Three slots or more pass while it is down.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let up_at = now_ms();
    cluster
        .start_scheduler()
        .await
        .expect("restart the scheduler");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    // A client of the restarted node.
    let client = cluster.client().await.expect("client");
    client.pause("every2s").await.expect("pause");

    let all = client.runs("every2s").await.expect("runs");
    let logical: Vec<i64> = all.iter().map(|run| run.logical_time_ms).collect();
    let distinct: BTreeSet<i64> = logical.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        logical.len(),
        "a slot fired twice: {logical:?}"
    );
    let missed: Vec<i64> = logical
        .iter()
        .copied()
        .filter(|t| *t > down_at + 100 && *t < up_at - 100)
        .collect();
    assert!(
        missed.len() <= 1,
        "the slots missed while down fire once: {logical:?} (down {down_at}, up {up_at})"
    );
    // fire_once: the downtime's backlog (three slots or more) fires once, at its latest slot
    // (`ax_core::firing`), so the first fire after the kill is at least two slots after it, and
    // every later fire follows on its slot.
    let mut after_kill: Vec<i64> = logical
        .iter()
        .copied()
        .filter(|t| *t > down_at + 100)
        .collect();
    after_kill.sort();
    assert!(
        after_kill
            .first()
            .is_some_and(|first| *first > down_at + 4_000),
        "the backlog collapsed into its latest slot: {logical:?} (down {down_at}, up {up_at})"
    );
    assert!(
        after_kill.windows(2).all(|pair| pair[1] - pair[0] == 2_000),
        "after the backlog's fire every slot fires: {after_kill:?}"
    );
    let after: Vec<i64> = logical.iter().copied().filter(|t| *t >= up_at).collect();
    assert!(
        !after.is_empty(),
        "the schedule goes on after the restart: {logical:?}"
    );
    assert!(
        after.iter().all(|t| t % 2_000 == 0),
        "later fires are on their slots: {after:?}"
    );
    cluster.shutdown().await.expect("shutdown");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
