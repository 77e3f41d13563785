//! The Python SDK (`sdk/python`) against a real `ax-scheduler` process on loopback.
//!
//! `python_sdk_suite` runs the SDK's pytest suite (`sdk/python/tests`) with the interpreter of
//! `AX_TEST_PYTHON` (the venv `.ci/run` makes, with the SDK installed) against a scheduler on a
//! fresh store: the suite's client applies and triggers workflows that its Python worker runs.
//! Then this test checks the store's side on its own, through the scheduler's API: the ETL
//! example's run succeeded with every task on the Python worker, the idempotency key still
//! returns the suite's run, the logs are what the task printed, a failing task's exit code, a
//! cancelled and a timed-out task's processes gone (the scheduler's timeout grace is 10 minutes,
//! so the TIMEOUT can only be the worker's), and the Python functions' results.
//!
//! `python_worker_reattaches_after_a_scheduler_kill9` runs the SDK's worker as a process
//! (`python -m ax_sdk`), kills the scheduler with SIGKILL while a task runs and prints,
//! keeps it down past the dead-worker threshold (the refused connections keep the worker from
//! fencing), and starts it again on the same store: the task keeps running, the worker
//! re-attaches it, and it ends SUCCESS in its one attempt with every line stored once, in order.
//!
//! `python_worker_fences_itself_when_cut_off_from_a_live_scheduler` blackholes a proxy between
//! the worker and a live scheduler: the worker kills its task by itself (SELF-FENCING in
//! worker.proto). `python_workers_move_between_nodes_and_fail_over` (MySQL, two nodes) has two
//! Python workers spread by MoveElsewhere, then kills the node one of them is on while its task
//! runs: the worker goes to the other node and the task ends SUCCESS in its one attempt.
//! `python_workers_tasks_die_with_it` kills the worker with SIGKILL: its guardian kills the
//! task's process group.
//!
//! `python_client_waits_out_a_refusal_for_load` gives a scheduler process a bound of 2 waiting
//! instances per app and no worker: the SDK's client triggers twice, and its third trigger is
//! refused for load, tried again (each wait logged) and finally raised with the bound, while
//! the store holds exactly the two runs.
//!
//! Without AX_TEST_PYTHON they are ignored, saying why, except under CI=true, where they fail.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ax_integration_tests::fault_kit::{pid_alive, wait_pids_gone};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, Process, ProcessCluster, SchedulerSettings};
use ax_integration_tests::proxy::TcpProxy;
use ax_integration_tests::requirements::{MYSQL, PYTHON};
use ax_integration_tests::{Backend, on_every_backend};
use ax_proto::v1 as pb;
use serde_json::Value;

/// How long the whole pytest suite may take. A hang guard, not a measurement.
const SUITE_GUARD: Duration = Duration::from_secs(300);

/// The worker id the suite's Python worker registers under (`sdk/python/tests/conftest.py`).
const SUITE_WORKER: &str = "py-sdk-worker";

/// The interpreter of AX_TEST_PYTHON (every test here requires [`PYTHON`]), checked to import
/// the SDK.
fn python() -> PathBuf {
    let python = PathBuf::from(std::env::var_os("AX_TEST_PYTHON").expect("AX_TEST_PYTHON"));
    let check = std::process::Command::new(&python)
        .args(["-c", "import ax_sdk, pytest"])
        .output()
        .unwrap_or_else(|e| panic!("AX_TEST_PYTHON={} cannot run: {e}", python.display()));
    assert!(
        check.status.success(),
        "AX_TEST_PYTHON={} cannot import ax_sdk and pytest (install them: pip install \
         -r .ci/requirements.txt && pip install --no-build-isolation ./sdk/python):\n{}",
        python.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    python
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests lives in the repository")
        .to_path_buf()
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
            trial!(async(multi_thread = 4) python_worker_reattaches_after_a_scheduler_kill9).requires(&PYTHON),
            trial!(async(multi_thread = 4) python_worker_fences_itself_when_cut_off_from_a_live_scheduler).requires(&PYTHON),
            trial!(async(multi_thread = 4) python_workers_move_between_nodes_and_fail_over).requires(&PYTHON).requires(&MYSQL),
            trial!(async(multi_thread = 4) python_workers_tasks_die_with_it).requires(&PYTHON),
            trial!(async(multi_thread = 4) python_client_waits_out_a_refusal_for_load).requires(&PYTHON),
        ],
        on_every_backend!(requires(&PYTHON); python_sdk_suite),
    ]
    .into_iter()
    .flatten()
    .collect()
}

async fn python_sdk_suite(backend: Backend) {
    let python = python();
    let settings = SchedulerSettings {
        // Only the worker can time the task out within the test's guards.
        timeout_grace: Some("10m".into()),
        ..SchedulerSettings::default()
    };
    let cluster = ProcessCluster::start_with(backend, settings)
        .await
        .expect("a scheduler starts");
    let out = cluster.dir().join("python-out");
    let mut suite = tokio::process::Command::new(&python);
    suite
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "tests"])
        .current_dir(repo_root().join("sdk/python"))
        .env("AX_TEST_SCHEDULER", cluster.endpoint())
        .env("AX_TEST_OUT", &out)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SUITE_GUARD, suite.output())
        .await
        .expect("the pytest suite ends within its guard")
        .expect("pytest runs");
    let report = format!(
        "--- pytest stdout\n{}--- pytest stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the SDK's suite failed:\n{report}");
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("SKIPPED"),
        "the suite skipped tests although it had a scheduler:\n{report}"
    );
    let facts = Facts::read(&out.join("facts.json"));
    let client = cluster.client().await.expect("a client");

    // The ETL example: every task on the Python worker.
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
        .trigger("py-params", &[("region", "cn")], "py-sdk-key-1")
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

    // Python functions.
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

/// Starts `python -m ax_sdk` as worker `id` of `schedulers` (comma-separated), with the
/// sandbox's short heartbeat and a short kill grace.
fn python_worker(python: &Path, dir: &Path, id: &str, schedulers: &str, extra: &[&str]) -> Logged {
    let mut args: Vec<String> = [
        "-m",
        "ax_sdk",
        "--scheduler",
        schedulers,
        "--id",
        id,
        "--heartbeat-interval",
        "500ms",
        "--kill-grace",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Logged(
        Process::spawn(
            &format!("python worker {id}"),
            python,
            &args,
            dir,
            dir.join(format!("python-worker-{id}.log")),
        )
        .expect("the Python worker starts"),
    )
}

/// Reads the pid a task wrote to `path`, once it is there.
async fn read_pid(path: &Path) -> u32 {
    wait_file(path).await;
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

async fn python_worker_reattaches_after_a_scheduler_kill9() {
    let python = python();
    let mut cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a scheduler starts");
    let gates = cluster.dir().join("gates");
    std::fs::create_dir_all(&gates).expect("gates dir");
    // The command line serves the test functions of a module too.
    let functions = repo_root().join("sdk/python/tests/fn_tasks.py");
    let functions = functions.to_str().expect("a UTF-8 path");
    let mut worker = python_worker(
        &python,
        cluster.dir(),
        "py-reattach",
        &cluster.endpoint(),
        &["--module", functions],
    );
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("py-reattach", HANG_GUARD)
        .await
        .expect("the Python worker registers");

    let source = format!(
        r#"
name: py-reattach
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
    let run = client.trigger_run("py-reattach").await.expect("trigger");
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
    assert!(pid_alive(pid), "the task died while the scheduler was down");
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler starts again");

    // The worker registers again on the new process, with the attempt still running.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while worker.0.log_text().matches("registered with").count() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Python worker did not register again:\n{}",
            worker.0.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    assert_eq!(done.worker_id, "py-reattach");
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

    // A Python function of --module, after the reconnect.
    client
        .apply(
            "name: py-cli-function\ntasks:\n  - name: f\n    argv: [ax-python, exit_with, \"0\"]\n",
        )
        .await
        .expect("apply");
    let run = client
        .trigger_run("py-cli-function")
        .await
        .expect("trigger");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let instances = client.instances(run.id).await.expect("instances");
    assert_eq!(instances.len(), 1, "{instances:?}");
    let function = &instances[0];
    assert_eq!(function.worker_id, "py-reattach");
    let lines = client.logs(function.id).await.expect("logs");
    assert_eq!(texts(&lines, pb::LogStream::Stdout), ["exiting with 0"]);

    // SIGTERM drains the worker: nothing runs, so it exits at once and cleanly.
    worker.0.terminate().expect("SIGTERM");
    let status = worker
        .0
        .wait_exit(HANG_GUARD)
        .await
        .expect("the worker exits");
    assert!(status.success(), "the Python worker exited with {status}");
    assert!(
        wait_pids_gone(&[pid], HANG_GUARD).await.is_empty(),
        "the task outlived its run"
    );
    cluster.shutdown().await.expect("a clean shutdown");
}

async fn python_worker_fences_itself_when_cut_off_from_a_live_scheduler() {
    let python = python();
    let cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a scheduler starts");
    let target = format!("127.0.0.1:{}", cluster.port())
        .parse()
        .expect("an address");
    let proxy = TcpProxy::start(target).await.expect("a proxy");
    let worker = python_worker(&python, cluster.dir(), "py-fenced", &proxy.url(), &[]);
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("py-fenced", HANG_GUARD)
        .await
        .expect("the Python worker registers");
    let pids = cluster.dir().join("fenced");
    std::fs::create_dir_all(&pids).expect("pids dir");
    let source = format!(
        r#"
name: py-fenced
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
    let run = client.trigger_run("py-fenced").await.expect("trigger");
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

/// Two scheduler nodes on MySQL: two Python workers that could reach only `n1` are spread by
/// MoveElsewhere once `n2` is up, and a kill -9 of the node a worker is on moves it to the
/// other node with its task still running, re-attached there.
async fn python_workers_move_between_nodes_and_fail_over() {
    let python = python();
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
        python_worker(&python, cluster.dir(), "py-a", &both, &["--label", "who=a"]),
        python_worker(&python, cluster.dir(), "py-b", &both, &["--label", "who=b"]),
    ];
    let client = cluster.client().await.expect("a client of n1");
    for id in ["py-a", "py-b"] {
        client
            .wait_worker_live(id, HANG_GUARD)
            .await
            .expect("the Python workers register with n1");
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
name: py-failover
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
    let run = client.trigger_run("py-failover").await.expect("trigger");
    let instance = client
        .wait_instance(run.id, "long", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    let pid = read_pid(&gates.join("pid")).await;
    let node_of_a = &nodes.iter().find(|(id, _)| id == "py-a").expect("py-a").1;
    let (doomed, survivor) = if node_of_a == cluster.node_id(0) {
        (0, 1)
    } else {
        (1, 0)
    };
    cluster
        .kill_node(doomed)
        .await
        .expect("kill -9 of a's node");
    let client = cluster
        .node_client(survivor)
        .await
        .expect("a client of the surviving node");
    let registered_before = workers[0].0.log_text().matches("registered with").count();
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while workers[0].0.log_text().matches("registered with").count() == registered_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker a did not register with the other node:\n{}",
            workers[0].0.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pid_alive(pid), "the task died with the node");
    std::fs::write(gates.join("go"), b"").expect("gate");
    let ended = client.wait_run(run.id).await.expect("the run ends");
    assert_eq!(ended.state(), pb::RunState::Success, "{ended:?}");
    let done = get_instance(&client, instance.id).await;
    assert_eq!(done.attempts.len(), 1, "one attempt, re-attached: {done:?}");
    assert_eq!(done.worker_id, "py-a");
    let lines = client.logs(instance.id).await.expect("logs");
    assert_eq!(
        texts(&lines, pb::LogStream::Stdout),
        ["before".to_string(), "after".to_string()]
    );
    drop(workers);
    cluster.shutdown().await.expect("a clean shutdown");
}

/// A Python worker killed with SIGKILL cannot clean up: its guardian kills the process groups of
/// its tasks, so nothing it ran survives it (worker.proto: a task should die with its worker).
/// The SDK's client against a real scheduler at its bound on waiting instances.
const REFUSED_FOR_LOAD: &str = r#"
import logging, sys, time
from ax_sdk import AxError, Client
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
client = Client(sys.argv[1], retry_for=2.5)
client.apply(source="name: py-burst\napp: py\ntasks:\n  - name: t\n    command: 'true'\n")
time.sleep(0.7)  # past the node's first reading of the queue
for _ in range(2):
    print("accepted", client.trigger("py-burst").run.id, flush=True)
try:
    client.trigger("py-burst")
    print("not refused")
except AxError as error:
    o = error.overloaded
    print("refused", error.code.name, o.bound, o.app, o.waiting, o.limit, error.refusals)
"#;

async fn python_client_waits_out_a_refusal_for_load() {
    let python = python();
    let settings = SchedulerSettings {
        extra_args: vec!["--max-waiting-per-app".into(), "2".into()],
        ..SchedulerSettings::default()
    };
    let cluster = ProcessCluster::start_with(Backend::Sqlite, settings)
        .await
        .expect("a scheduler starts");
    let output = tokio::time::timeout(
        SUITE_GUARD,
        tokio::process::Command::new(&python)
            .args(["-c", REFUSED_FOR_LOAD, &cluster.endpoint()])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the script ends within its guard")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    let accepted: Vec<i64> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("accepted ")?.parse().ok())
        .collect();
    assert_eq!(accepted.len(), 2, "{stdout}");
    let refused = stdout
        .lines()
        .find_map(|line| line.strip_prefix("refused "))
        .unwrap_or_else(|| panic!("not refused: {stdout}{stderr}"));
    let fields: Vec<&str> = refused.split(' ').collect();
    assert_eq!(
        fields[..5],
        ["RESOURCE_EXHAUSTED", "app", "py", "2", "2"],
        "{stdout}"
    );
    let refusals: usize = fields[5].parse().expect("refusals");
    assert!(refusals >= 2, "{stdout}");
    let waits = stderr
        .lines()
        .filter(|line| line.starts_with("ax_sdk TriggerWorkflow refused for load"))
        .count();
    assert_eq!(waits, refusals - 1, "{stderr}");
    let client = cluster.client().await.expect("a client");
    let mut stored: Vec<i64> = client
        .runs("py-burst")
        .await
        .expect("runs")
        .iter()
        .map(|run| run.id)
        .collect();
    stored.sort_unstable();
    assert_eq!(stored, accepted, "nothing refused was created");
    cluster.shutdown().await.expect("shutdown");
}

async fn python_workers_tasks_die_with_it() {
    let python = python();
    let cluster = ProcessCluster::start(Backend::Sqlite, false)
        .await
        .expect("a scheduler starts");
    let mut worker = python_worker(
        &python,
        cluster.dir(),
        "py-doomed",
        &cluster.endpoint(),
        &[],
    );
    let client = cluster.client().await.expect("a client");
    client
        .wait_worker_live("py-doomed", HANG_GUARD)
        .await
        .expect("the Python worker registers");
    let pids = cluster.dir().join("doomed");
    std::fs::create_dir_all(&pids).expect("pids dir");
    let source = format!(
        r#"
name: py-doomed
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
    let run = client.trigger_run("py-doomed").await.expect("trigger");
    client
        .wait_instance(run.id, "sleeps", pb::InstanceState::Running)
        .await
        .expect("the task runs");
    let task = [
        read_pid(&pids.join("leader")).await,
        read_pid(&pids.join("child")).await,
    ];
    worker.0.kill().await.expect("kill -9 of the Python worker");
    let survivors = wait_pids_gone(&task, HANG_GUARD).await;
    assert!(
        survivors.is_empty(),
        "the task outlived its worker: {survivors:?}"
    );
    cluster.shutdown().await.expect("a clean shutdown");
}
