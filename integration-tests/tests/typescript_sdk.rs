//! The TypeScript SDK (`sdk/typescript`) against real `ax-scheduler` processes on loopback, on
//! both backends.
//!
//! `typescript_sdk_suite` runs the SDK's `node --test` suite (`sdk/typescript/test`, built to
//! `dist/test`) with the node of `AX_TEST_NODE` against a scheduler on a fresh store: the suite's
//! client applies and triggers workflows that its TypeScript worker runs, and it runs the orders
//! example as its README says. (On SQLite it also runs the suite's files that need no scheduler:
//! the worker against a fake scheduler, the function runner, the units.) Then this test checks
//! the store's side on its own, through the scheduler's API: the ETL example's run succeeded with
//! every task on the TypeScript worker, the idempotency key still returns the suite's run, the
//! logs are what the task printed, a failing task's exit code, a cancelled and a timed-out task's
//! processes gone (the scheduler's timeout grace is 10 minutes, so the TIMEOUT can only be the
//! worker's), and the task functions' results.
//!
//! `typescript_worker_reattaches_after_a_scheduler_kill9` runs the SDK's worker as a process
//! (`node dist/src/cli.js`), kills the scheduler with SIGKILL while a task runs and prints, keeps
//! it down past the dead-worker threshold (the refused connections keep the worker from fencing)
//! while the task prints more, and starts it again on the same store: the task keeps running,
//! the worker re-attaches it, and it ends SUCCESS in its one attempt with every line stored
//! once, in order.
//!
//! `typescript_workers_tasks_die_with_it` kills the worker with SIGKILL while its task runs: its
//! guardian kills the task's process group, and the scheduler, hearing no more from the worker,
//! judges it dead and ends the attempt as lost (FAILED, the run FAILED: no retries).
//!
//! `typescript_workers_move_between_nodes_and_fail_over` (MySQL, two nodes) has two TypeScript
//! workers spread by MoveElsewhere, then kills the node one of them is on while its task runs:
//! the worker goes to the other node and the task ends SUCCESS in its one attempt.
//!
//! `typescript_worker_fences_itself_when_cut_off_from_a_live_scheduler` blackholes a proxy
//! between the worker and a live scheduler: the worker kills its task by itself (SELF-FENCING in
//! worker.proto).
//!
//! Without AX_TEST_NODE they are ignored, saying why, except under CI=true, where they fail.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ax_integration_tests::fault_kit::{pid_alive, wait_pids_gone};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, Process, ProcessCluster, SchedulerSettings};
use ax_integration_tests::proxy::TcpProxy;
use ax_integration_tests::requirements::{MYSQL, NODE};
use ax_integration_tests::{Backend, on_every_backend};
use ax_proto::v1 as pb;
use serde_json::Value;

/// How long the whole node suite may take. A hang guard, not a measurement.
const SUITE_GUARD: Duration = Duration::from_secs(420);

/// The worker id the suite's worker registers under (`sdk/typescript/test/scheduler.test.ts`).
const SUITE_WORKER: &str = "ts-sdk-worker";

fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests lives in the repository")
        .join("sdk/typescript")
}

/// The node of AX_TEST_NODE (every test here requires [`NODE`]), checked to be 20 or later and
/// to find the built SDK.
fn node() -> PathBuf {
    let node = PathBuf::from(std::env::var_os("AX_TEST_NODE").expect("AX_TEST_NODE"));
    let version = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("AX_TEST_NODE={} cannot run: {e}", node.display()));
    let text = String::from_utf8_lossy(&version.stdout);
    let major: u32 = text
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 20,
        "AX_TEST_NODE={} is node {}, the SDK needs 20 or later",
        node.display(),
        text.trim()
    );
    for built in [
        "dist/src/cli.js",
        "dist/test/scheduler.test.js",
        "src/gen/ax/v1/worker_pb.ts",
    ] {
        assert!(
            sdk_dir().join(built).exists(),
            "sdk/typescript is not built ({built} is missing): run `npm ci && npm run build` in {}",
            sdk_dir().display()
        );
    }
    node
}

/// The suite's record of what it did (`facts.json`).
struct Facts(Value);

impl Facts {
    fn read(path: &Path) -> Facts {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("the suite wrote no {}: {e}", path.display()));
        Facts(serde_json::from_str(&text).expect("facts.json is JSON"))
    }

    fn id(&self, section: &str, key: &str) -> i64 {
        self.0[section][key]
            .as_i64()
            .unwrap_or_else(|| panic!("facts.json has no {section}.{key}: {}", self.0))
    }

    fn strings(&self, section: &str, key: &str) -> Vec<String> {
        self.0[section][key]
            .as_array()
            .unwrap_or_else(|| panic!("facts.json has no {section}.{key}: {}", self.0))
            .iter()
            .map(|v| v.as_str().expect("a string").to_string())
            .collect()
    }

    fn pids(&self, section: &str) -> Vec<u32> {
        self.0[section]["pids"]
            .as_array()
            .unwrap_or_else(|| panic!("facts.json has no {section}.pids: {}", self.0))
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|p| u32::try_from(p).ok())
                    .expect("a pid")
            })
            .collect()
    }
}

fn texts(lines: &[pb::StoredLogLine], stream: pb::LogStream) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.stream() == stream)
        .map(|l| l.text.clone())
        .collect()
}

pub(crate) fn tests() -> Vec<Test> {
    [
        vec![
            trial!(async(multi_thread = 4) typescript_worker_fences_itself_when_cut_off_from_a_live_scheduler)
                .requires(&NODE),
            trial!(async(multi_thread = 4) typescript_workers_move_between_nodes_and_fail_over)
                .requires(&NODE)
                .requires(&MYSQL),
        ],
        on_every_backend!(requires(&NODE);
            typescript_sdk_suite,
            typescript_worker_reattaches_after_a_scheduler_kill9,
            typescript_workers_tasks_die_with_it,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The suite's test files: the scheduler tests, and on SQLite the others too (they need no
/// scheduler, so once is enough).
fn suite_files(backend: Backend) -> Vec<String> {
    let dir = sdk_dir().join("dist/test");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".test.js"))
        .filter(|name| backend == Backend::Sqlite || name == "scheduler.test.js")
        .map(|name| format!("dist/test/{name}"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|f| f == "dist/test/scheduler.test.js"),
        "no scheduler tests in {}: {files:?}",
        dir.display()
    );
    files
}

/// The number on the node test runner's summary line `# NAME N`.
fn summary_count(stdout: &str, name: &str) -> Option<u64> {
    stdout.lines().find_map(|line| {
        line.strip_prefix(&format!("# {name} "))?
            .trim()
            .parse()
            .ok()
    })
}

async fn typescript_sdk_suite(backend: Backend) {
    let node = node();
    // The SDK is released with ax: package.json carries the workspace's version (and
    // src/version.ts, which the worker sends in Register, package.json's: a unit test checks).
    let package: Value = serde_json::from_str(
        &std::fs::read_to_string(sdk_dir().join("package.json")).expect("package.json"),
    )
    .expect("package.json is JSON");
    assert_eq!(
        package["version"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "sdk/typescript/package.json's version is not the workspace's"
    );
    let settings = SchedulerSettings {
        // Only the worker can time the task out within the test's guards.
        timeout_grace: Some("10m".into()),
        ..SchedulerSettings::default()
    };
    let cluster = ProcessCluster::start_with(backend, settings)
        .await
        .expect("a scheduler starts");
    let out = cluster.dir().join("typescript-out");
    let mut suite = tokio::process::Command::new(&node);
    suite
        .args(["--test", "--test-concurrency=1"])
        .args(suite_files(backend))
        .current_dir(sdk_dir())
        .env("AX_TEST_SCHEDULER", cluster.endpoint())
        .env("AX_TEST_OUT", &out)
        .env_remove("AX_TOKEN")
        .env_remove("AX_TOKEN_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SUITE_GUARD, suite.output())
        .await
        .expect("the node suite ends within its guard")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = format!(
        "--- node --test stdout\n{stdout}--- node --test stderr\n{}--- the suite worker's log\n{}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(out.join("worker.log")).unwrap_or_default()
    );
    assert!(output.status.success(), "the SDK's suite failed:\n{report}");
    assert_eq!(summary_count(&stdout, "fail"), Some(0), "{report}");
    assert_eq!(
        summary_count(&stdout, "skipped"),
        Some(0),
        "the suite skipped tests although it had a scheduler:\n{report}"
    );
    assert!(
        summary_count(&stdout, "pass").is_some_and(|n| n >= 14),
        "{report}"
    );
    let facts = Facts::read(&out.join("facts.json"));
    let client = cluster.client().await.expect("a client");

    // The ETL example: every task on the TypeScript worker, once.
    let etl = client
        .get_run(facts.id("etl", "run_id"))
        .await
        .expect("the ETL run");
    assert_eq!(etl.state(), pb::RunState::Success, "{etl:?}");
    let instances = client.instances(etl.id).await.expect("instances");
    assert_eq!(instances.len(), 5);
    for instance in &instances {
        assert_eq!(instance.state(), pb::InstanceState::Success, "{instance:?}");
        assert_eq!(instance.worker_id, SUITE_WORKER, "{instance:?}");
        assert_eq!(instance.attempts.len(), 1, "{instance:?}");
    }
    let report_lines = client
        .logs(facts.id("etl", "report_instance"))
        .await
        .expect("logs");
    assert_eq!(
        texts(&report_lines, pb::LogStream::Stdout),
        [format!("daily revenue report for run {}: 1560", etl.id)]
    );

    // The idempotency key returns the suite's run; the logs are what the task printed.
    let again = client
        .trigger("ts-params", &[("region", "cn")], "ts-sdk-key-1")
        .await
        .expect("trigger");
    assert!(!again.created);
    let params_run = again.run.expect("a run");
    assert_eq!(params_run.id, facts.id("params", "run_id"));
    assert_eq!(params_run.state(), pb::RunState::Success);
    let lines = client
        .logs(facts.id("params", "instance_id"))
        .await
        .expect("logs");
    assert_eq!(
        texts(&lines, pb::LogStream::Stdout),
        facts.strings("params", "stdout")
    );
    assert_eq!(
        texts(&lines, pb::LogStream::Stderr),
        facts.strings("params", "stderr")
    );
    let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, (1..=lines.len() as u64).collect::<Vec<_>>());

    // A failing task's exit code.
    let failing = get_instance(&client, facts.id("failing", "instance_id")).await;
    assert_eq!(failing.state(), pb::InstanceState::Failed);
    assert_eq!(failing.exit_code, Some(3));
    assert_eq!(failing.worker_id, SUITE_WORKER);

    // A cancel and a timeout killed their process groups.
    let cancelled = get_instance(&client, facts.id("cancel", "instance_id")).await;
    assert_eq!(cancelled.state(), pb::InstanceState::Cancelled);
    let timed_out = get_instance(&client, facts.id("timeout", "instance_id")).await;
    assert_eq!(timed_out.state(), pb::InstanceState::Timeout);
    let attempt = timed_out.attempts.last().expect("an attempt");
    assert_eq!(attempt.worker_id, SUITE_WORKER);
    assert_eq!(attempt.signal, Some(libc::SIGKILL), "{attempt:?}");
    for section in ["cancel", "timeout"] {
        let pids = facts.pids(section);
        assert_eq!(pids.len(), 2);
        let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
        assert!(
            alive.is_empty(),
            "{section}: processes still alive: {alive:?}"
        );
    }

    // Task functions.
    let greet = get_instance(&client, facts.id("functions", "greet_instance")).await;
    assert_eq!(greet.state(), pb::InstanceState::Success);
    assert_eq!(greet.worker_id, SUITE_WORKER);
    let greet_lines = client.logs(greet.id).await.expect("logs");
    assert_eq!(
        texts(&greet_lines, pb::LogStream::Stdout),
        facts.strings("functions", "greet_lines")
    );
    let code = get_instance(&client, facts.id("functions", "exit_code_instance")).await;
    assert_eq!(code.exit_code, Some(4));
    let cancelled = get_instance(&client, facts.id("function_cancel", "instance_id")).await;
    assert_eq!(cancelled.state(), pb::InstanceState::Cancelled);
    for pid in facts.pids("function_cancel") {
        assert!(
            !pid_alive(pid),
            "the cancelled function's process {pid} is alive"
        );
    }

    // The orders example's runs, as the store has them.
    let runs = client.runs("orders-daily-ts").await.expect("runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    for run in &runs {
        assert_eq!(run.state(), pb::RunState::Success, "{run:?}");
        let instances = client.instances(run.id).await.expect("instances");
        let total = instances
            .iter()
            .find(|i| i.task == "total")
            .expect("a total task");
        assert_eq!(total.worker_id, "ts-orders");
        let outputs = &total.attempts.last().expect("an attempt").outputs;
        let currency = &run.params["currency"];
        assert!(
            outputs["return"].contains(&format!("\"currency\":\"{currency}\"")),
            "{outputs:?}"
        );
    }

    cluster.shutdown().await.expect("a clean shutdown");
}

async fn get_instance(client: &ax_integration_tests::TestClient, id: i64) -> pb::Instance {
    client
        .control()
        .get_instance(pb::GetInstanceRequest { id })
        .await
        .unwrap_or_else(|e| panic!("instance {id}: {e}"))
        .into_inner()
}

/// A process whose log is printed when the test panics.
struct Logged(Process);

impl Drop for Logged {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "===== {}\n{}===== end of {}",
                self.0.name(),
                self.0.log_text(),
                self.0.name()
            );
        }
    }
}

/// Starts the SDK's worker (`node dist/src/cli.js`) as worker `id` of `schedulers`
/// (comma-separated), serving the suite's task functions, with the sandbox's short heartbeat and
/// a short kill grace.
fn typescript_worker(
    node: &Path,
    dir: &Path,
    id: &str,
    schedulers: &str,
    extra: &[&str],
) -> Logged {
    let sdk = sdk_dir();
    let mut args: Vec<String> = vec![
        sdk.join("dist/src/cli.js").display().to_string(),
        "--scheduler".into(),
        schedulers.into(),
        "--id".into(),
        id.into(),
        "--heartbeat-interval".into(),
        "500ms".into(),
        "--kill-grace".into(),
        "1s".into(),
        "--module".into(),
        sdk.join("dist/test/fn_tasks.js").display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Logged(
        Process::spawn(
            &format!("typescript worker {id}"),
            node,
            &args,
            dir,
            dir.join(format!("typescript-worker-{id}.log")),
        )
        .expect("the TypeScript worker starts"),
    )
}

/// Reads the pid a task wrote to `path`, once it is there.
async fn read_pid(path: &Path) -> u32 {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        if let Ok(pid) = std::fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .parse()
        {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pid in {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `path` exists, under the hang guard.
async fn wait_file(path: &Path) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} did not appear within {HANG_GUARD:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the worker's log says it registered `count` times.
async fn wait_registrations(worker: &Logged, count: usize) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while worker.0.log_text().matches("registered with").count() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the TypeScript worker did not register {count} times:\n{}",
            worker.0.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn typescript_worker_reattaches_after_a_scheduler_kill9(backend: Backend) {
    let node = node();
    let mut cluster = ProcessCluster::start(backend, false)
        .await
        .expect("a scheduler starts");
    let gates = cluster.dir().join("gates");
    std::fs::create_dir_all(&gates).expect("gates dir");
    let mut worker = typescript_worker(
        &node,
        cluster.dir(),
        "ts-reattach",
        &cluster.endpoint(),
        &[],
    );
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("ts-reattach", HANG_GUARD)
        .await
        .expect("the TypeScript worker registers");

    let source = format!(
        r#"
name: ts-reattach
tasks:
  - name: long
    env: {{GATES: "{gates}"}}
    command: |
      echo $$ > "$GATES/pid"
      for i in 1 2 3 4 5; do echo "before $i"; done
      while [ ! -e "$GATES/one" ]; do sleep 0.05; done
      for i in 1 2 3 4 5; do echo "during $i"; done
      touch "$GATES/during-printed"
      while [ ! -e "$GATES/two" ]; do sleep 0.05; done
      for i in 1 2 3 4 5; do echo "after $i"; done
"#,
        gates = gates.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("ts-reattach").await.expect("trigger");
    let instance = client
        .wait_instance(run.id, "long", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    let pid = read_pid(&gates.join("pid")).await;
    // The first lines are stored before the scheduler dies.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while client.logs(instance.id).await.expect("logs").len() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first lines were not stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    cluster
        .kill_node(0)
        .await
        .expect("kill -9 of the scheduler");
    // Lines printed while no scheduler is up wait in the worker.
    std::fs::write(gates.join("one"), b"").expect("gate one");
    wait_file(&gates.join("during-printed")).await;
    // Down for longer than the worker's dead-after threshold (4 heartbeats of 500 ms; the worker
    // fences at 3/4 of it): only the refused connections tell the worker that no node is up to
    // judge it, and keep it from fencing its task.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        pid_alive(pid),
        "the task died while the scheduler was down:\n{}",
        worker.0.log_text()
    );
    assert!(
        worker
            .0
            .log_text()
            .contains("(connection refused: is a scheduler running there?); trying again"),
        "the worker did not say that nothing listens:\n{}",
        worker.0.log_text()
    );
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler starts again");

    // The worker registers again on the new process, with the attempt still running.
    wait_registrations(&worker, 2).await;
    let client = cluster.client().await.expect("a client of the new process");
    let still = get_instance(&client, instance.id).await;
    assert_eq!(still.state(), pb::InstanceState::Running, "{still:?}");
    assert_eq!(still.attempt, instance.attempt);
    assert!(pid_alive(pid), "the task died across the restart");

    std::fs::write(gates.join("two"), b"").expect("gate two");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let done = get_instance(&client, instance.id).await;
    assert_eq!(done.state(), pb::InstanceState::Success);
    assert_eq!(done.attempts.len(), 1, "one attempt, re-attached: {done:?}");
    assert_eq!(done.worker_id, "ts-reattach");
    assert_eq!(done.attempts[0].pid, pid);
    let lines = client.logs(instance.id).await.expect("logs");
    let expected: Vec<String> = ["before", "during", "after"]
        .iter()
        .flat_map(|phase| (1..=5).map(move |i| format!("{phase} {i}")))
        .collect();
    assert_eq!(texts(&lines, pb::LogStream::Stdout), expected);
    let seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, (1..=15).collect::<Vec<u64>>());
    assert_eq!(done.attempts[0].log_lines, 15);

    // A task function of --module, after the reconnect.
    client
        .apply(
            "name: ts-cli-function\ntasks:\n  - name: f\n    argv: [ax-node, exit_with, \"0\"]\n",
        )
        .await
        .expect("apply");
    let run = client
        .trigger_run("ts-cli-function")
        .await
        .expect("trigger");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(instances.len(), 1, "{instances:?}");
    let function = &instances[0];
    assert_eq!(function.worker_id, "ts-reattach");
    let lines = client.logs(function.id).await.expect("logs");
    assert_eq!(texts(&lines, pb::LogStream::Stdout), ["exiting with 0"]);

    // SIGTERM drains the worker: nothing runs, so it exits at once and cleanly.
    worker.0.terminate().expect("SIGTERM");
    let status = worker
        .0
        .wait_exit(HANG_GUARD)
        .await
        .expect("the worker exits");
    assert!(
        status.success(),
        "the TypeScript worker exited with {status}"
    );
    assert!(
        wait_pids_gone(&[pid], HANG_GUARD).await.is_empty(),
        "the task outlived its run"
    );
    cluster.shutdown().await.expect("a clean shutdown");
}

async fn typescript_workers_tasks_die_with_it(backend: Backend) {
    let node = node();
    let cluster = ProcessCluster::start(backend, false)
        .await
        .expect("a scheduler starts");
    let mut worker = typescript_worker(&node, cluster.dir(), "ts-doomed", &cluster.endpoint(), &[]);
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("ts-doomed", HANG_GUARD)
        .await
        .expect("the TypeScript worker registers");
    let pids = cluster.dir().join("doomed");
    std::fs::create_dir_all(&pids).expect("pids dir");
    // A shell task and a task function, each with a process of its own in its group.
    let source = format!(
        r#"
name: ts-doomed
tasks:
  - name: sleeps
    env: {{PIDS: "{pids}"}}
    command: |
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      wait
  - name: function
    argv: [ax-node, sleeper, "{pids}/function"]
"#,
        pids = pids.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("ts-doomed").await.expect("trigger");
    for task in ["sleeps", "function"] {
        client
            .wait_instance(run.id, task, pb::InstanceState::Running)
            .await
            .expect("the tasks run");
    }
    let task = [
        read_pid(&pids.join("leader")).await,
        read_pid(&pids.join("child")).await,
        read_pid(&pids.join("function")).await,
    ];
    worker
        .0
        .kill()
        .await
        .expect("kill -9 of the TypeScript worker");
    let survivors = wait_pids_gone(&task, HANG_GUARD).await;
    assert!(
        survivors.is_empty(),
        "the tasks outlived their worker: {survivors:?}\n{}",
        worker.0.log_text()
    );

    // The scheduler hears no more from the worker, judges it dead, and the attempts are lost.
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");
    let workers = client.workers().await.expect("workers");
    let doomed = workers
        .iter()
        .find(|w| w.id == "ts-doomed")
        .expect("the worker's row");
    assert_eq!(doomed.state(), pb::WorkerState::Dead, "{doomed:?}");
    for instance in client.instances(run.id).await.expect("instances") {
        assert_eq!(instance.state(), pb::InstanceState::Failed, "{instance:?}");
        assert_eq!(instance.attempts.len(), 1, "{instance:?}");
        let attempt = &instance.attempts[0];
        assert_eq!(attempt.worker_id, "ts-doomed");
        assert_eq!(
            attempt.message, "lost: worker ts-doomed is dead",
            "{attempt:?}"
        );
        assert_eq!(attempt.exit_code, None, "no end was reported: {attempt:?}");
    }
    cluster.shutdown().await.expect("a clean shutdown");
}

async fn typescript_worker_fences_itself_when_cut_off_from_a_live_scheduler() {
    let node = node();
    let cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a scheduler starts");
    let target = format!("127.0.0.1:{}", cluster.port())
        .parse()
        .expect("an address");
    let proxy = TcpProxy::start(target).await.expect("a proxy");
    let worker = typescript_worker(&node, cluster.dir(), "ts-fenced", &proxy.url(), &[]);
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("ts-fenced", HANG_GUARD)
        .await
        .expect("the TypeScript worker registers");
    let pids = cluster.dir().join("fenced");
    std::fs::create_dir_all(&pids).expect("pids dir");
    let source = format!(
        r#"
name: ts-fenced
tasks:
  - name: sleeps
    env: {{PIDS: "{pids}"}}
    command: |
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      wait
"#,
        pids = pids.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("ts-fenced").await.expect("trigger");
    client
        .wait_instance(run.id, "sleeps", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    let task = [
        read_pid(&pids.join("leader")).await,
        read_pid(&pids.join("child")).await,
    ];

    // Packets vanish both ways and connections hang: no refusal tells the worker that the
    // scheduler is down, and the scheduler, alive, will count the worker dead. The worker must
    // kill its task by itself, before it hears from a scheduler again.
    proxy.blackhole();
    let survivors = wait_pids_gone(&task, HANG_GUARD).await;
    assert!(
        survivors.is_empty(),
        "the cut-off worker left its task running: {survivors:?}\n{}",
        worker.0.log_text()
    );
    assert!(
        worker.0.log_text().contains("fencing attempt"),
        "{}",
        worker.0.log_text()
    );

    proxy.heal();
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Failed, "{ended:?}");
    drop(worker);
    cluster.shutdown().await.expect("a clean shutdown");
}

/// Two scheduler nodes on MySQL: two TypeScript workers that could reach only `n1` are spread by
/// MoveElsewhere once `n2` is up, and a kill -9 of the node a worker is on moves it to the other
/// node with its task still running, re-attached there.
async fn typescript_workers_move_between_nodes_and_fail_over() {
    let node = node();
    let settings = SchedulerSettings {
        nodes: 2,
        ..SchedulerSettings::default()
    };
    let mut cluster = ProcessCluster::start_with(Backend::MySql, settings)
        .await
        .expect("two scheduler nodes start");
    cluster.stop_node(1).await.expect("n2 stops");
    let both = format!("{},{}", cluster.node_endpoint(0), cluster.node_endpoint(1));
    let workers = [
        typescript_worker(&node, cluster.dir(), "ts-a", &both, &["--label", "who=a"]),
        typescript_worker(&node, cluster.dir(), "ts-b", &both, &["--label", "who=b"]),
    ];
    let client = cluster.client().await.expect("a client of n1");
    for id in ["ts-a", "ts-b"] {
        client
            .wait_worker_live(id, HANG_GUARD)
            .await
            .expect("the TypeScript workers register with n1");
    }
    cluster.start_node(1).await.expect("n2 starts again");

    // n1 holds both workers, n2 none: n1 asks one to move, and it goes to n2.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let nodes = loop {
        let listed = client.workers().await.expect("workers");
        let nodes: Vec<(String, String)> = listed
            .iter()
            .filter(|w| w.state() == pb::WorkerState::Live)
            .map(|w| (w.id.clone(), w.scheduler_node.clone()))
            .collect();
        if nodes.len() == 2 && nodes[0].1 != nodes[1].1 {
            break nodes;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workers were not spread over the nodes: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let moved = workers
        .iter()
        .filter(|w| w.0.log_text().contains("asked to move"))
        .count();
    assert_eq!(moved, 1, "one worker moved: {nodes:?}");

    // A task on worker a, and a kill -9 of the node worker a is on.
    let gates = cluster.dir().join("gates");
    std::fs::create_dir_all(&gates).expect("gates dir");
    let source = format!(
        r#"
name: ts-failover
tasks:
  - name: long
    labels: {{who: a}}
    env: {{GATES: "{gates}"}}
    command: |
      echo $$ > "$GATES/pid"
      echo "before"
      while [ ! -e "$GATES/go" ]; do sleep 0.05; done
      echo "after"
"#,
        gates = gates.display()
    );
    client.apply(&source).await.expect("apply");
    let run = client.trigger_run("ts-failover").await.expect("trigger");
    let instance = client
        .wait_instance(run.id, "long", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    let pid = read_pid(&gates.join("pid")).await;
    let node_of_a = &nodes.iter().find(|(id, _)| id == "ts-a").expect("ts-a").1;
    let (doomed, survivor) = if node_of_a == cluster.node_id(0) {
        (0, 1)
    } else {
        (1, 0)
    };
    let registered_before = workers[0].0.log_text().matches("registered with").count();
    cluster
        .kill_node(doomed)
        .await
        .expect("kill -9 of a's node");
    let client = cluster
        .node_client(survivor)
        .await
        .expect("a client of the surviving node");
    wait_registrations(&workers[0], registered_before + 1).await;
    assert!(pid_alive(pid), "the task died with the node");
    std::fs::write(gates.join("go"), b"").expect("gate");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let done = get_instance(&client, instance.id).await;
    assert_eq!(done.attempts.len(), 1, "one attempt, re-attached: {done:?}");
    assert_eq!(done.worker_id, "ts-a");
    let lines = client.logs(instance.id).await.expect("logs");
    assert_eq!(
        texts(&lines, pb::LogStream::Stdout),
        ["before".to_string(), "after".to_string()]
    );
    drop(workers);
    cluster.shutdown().await.expect("a clean shutdown");
}
