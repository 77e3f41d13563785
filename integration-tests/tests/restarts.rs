//! Restarts without casualties: a scheduler or worker restart never kills, re-runs or
//! double-starts a healthy task. Real processes on MariaDB with Redis (SQLite where the backend
//! does not matter), short heartbeats so the windows are short, and every test ends with the
//! ledger checks of `fault_kit::check_invariants`: no attempt number had two processes, no two
//! attempts of an instance overlapped, nothing that succeeded ran again, every instance ended.
//!
//! - the scheduler killed with -9 and kept down past the dead-worker threshold and past the
//!   workers' fence time, then restarted: nothing is killed, nothing runs twice, and the
//!   reports of attempts that ended meanwhile are stored;
//! - a dispatch accepted and started whose Started report never reached the store, on a worker
//!   that then dies and comes back under its id: the attempt number is not dispatched again;
//! - a worker killed with -9 and restarted under its id within the dead-worker threshold: what
//!   it ran is ended at once and retried, with a decision saying why;
//! - a worker that ignores `Dispatch.timeout_ms`: the scheduler times the attempt out itself,
//!   has it killed, and runs the retry only once the old process ended;
//! - a cancelled attempt keeps the exit its worker reports afterwards;
//! - the test worker written from the proto alone runs a workflow as `ax-worker` does.

use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::client::summary;
use ax_integration_tests::fault_kit::*;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, RedisChoice, WorkerSettings};
use ax_integration_tests::proto_worker::{ProtoWorker, ProtoWorkerOptions};
use ax_integration_tests::requirements::{MYSQL, REDIS};
use ax_proto::v1 as pb;
use pb::InstanceState as S;
use pb::scheduler_message::Body as FromScheduler;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) fault_scheduler_killed_and_down_past_the_dead_threshold_kills_and_reruns_nothing).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_started_attempt_whose_report_died_with_the_scheduler_is_never_dispatched_again).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_worker_restarted_under_its_id_has_its_running_attempt_ended_at_once).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_worker_that_ignores_timeouts_has_the_attempt_timed_out_by_the_scheduler).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_cancelled_attempt_records_the_exit_its_worker_reports).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) a_worker_written_from_the_proto_alone_runs_a_workflow_with_its_context),
    ]
}

/// 300 ms heartbeats, dead after 4 missed (1.2 s): a worker fences after 0.9 s cut off from a
/// live node.
fn short_heartbeats(backend: Backend, redis: RedisChoice) -> Scenario {
    Scenario::new(backend)
        .redis(redis)
        .heartbeats("300ms")
        .task_heartbeats("1s")
        .dead_after(4)
}

fn capacity(capacity: u32) -> WorkerSettings {
    WorkerSettings {
        capacity: Some(capacity),
        ..WorkerSettings::default()
    }
}

// ---------------------------------------------------------------------------------------------
// 1 and 6. The scheduler down for longer than the dead-worker threshold and the fence time.

async fn fault_scheduler_killed_and_down_past_the_dead_threshold_kills_and_reruns_nothing() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        ..
    } = short_heartbeats(Backend::MySql, RedisChoice::FromEnv)
        .worker_settings(capacity(6))
        .worker("w1")
        .worker("w2")
        .start()
        .await;
    // Each task prints 10 lines over about 3 s; 12 of 30 run at once, so the outage finds some
    // running through it, some ending during it (their reports unstored), some not started.
    let command = script(&dir, "steady", &effects, &numbered_lines(10, "0.3"));
    let tasks: Vec<(String, String)> = (1..=30)
        .map(|i| (format!("t{i:02}"), command.clone()))
        .collect();
    let run_id = apply_and_trigger(
        &client,
        &workflow(
            "steady",
            "defaults: { retries: 3, retry_backoff: 100ms }",
            &tasks,
        ),
    )
    .await;
    client
        .wait_instances(run_id, "12 running", |all| {
            all.iter().filter(|i| i.state() == S::Running).count() >= 12
        })
        .await
        .expect("the run's instances");

    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("SIGKILL the scheduler");
    // Down for 4 s: more than three times the dead threshold (1.2 s), four times the workers'
    // fence time (0.9 s), and longer than every running task has left.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ended_while_down = {
        let notes = read_notes(&effects);
        notes.iter().filter(|n| n.what == "end").count()
    };
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(10)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 30);
    let again: Vec<&pb::Instance> = instances.iter().filter(|i| i.attempt != 1).collect();
    assert!(
        again.is_empty(),
        "attempts killed or run again after the restart:\n{}",
        summary(&instances)
    );
    for id in ["w1", "w2"] {
        let log = plain(&cluster.worker(id).expect("worker").log_text());
        assert!(
            !log.contains("self-fencing running attempts"),
            "worker {id} fenced while no node was up:\n{log}"
        );
    }
    assert!(
        ended_while_down > 0,
        "no attempt ended while the scheduler was down; the test proves less than it says"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 2. A dispatch accepted and started, its Started report lost with the scheduler.

async fn fault_a_started_attempt_whose_report_died_with_the_scheduler_is_never_dispatched_again() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        ..
    } = short_heartbeats(Backend::MySql, RedisChoice::FromEnv)
        .start()
        .await;
    let command = script(&dir, "once", &effects, &numbered_lines(5, "0.2"));
    client
        .apply(&workflow("once", "", &[("only".to_string(), command)]))
        .await
        .expect("apply");
    // The worker accepts and starts the attempt, but its Started report never reaches the
    // store: it withholds it, as if the scheduler had died with it in flight.
    let mut options = ProtoWorkerOptions::new("ghost", &cluster.endpoint());
    options.withhold_started = true;
    let first = ProtoWorker::start(options.clone()).await.expect("worker");
    client
        .wait_worker_live("ghost", HANG_GUARD)
        .await
        .expect("live");
    let run_id = client.trigger_run("once").await.expect("trigger").id;
    wait_notes(&effects, "started", |notes| {
        notes.iter().any(|n| n.what == "start")
    })
    .await;

    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("SIGKILL the scheduler");
    // The worker dies too; its process dies with it.
    first.die();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");
    // It comes back under its id, a new process that has nothing, and behaves from now on.
    options.withhold_started = false;
    let second = ProtoWorker::start(options).await.expect("worker again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(5)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let only = &instances[0];
    assert_eq!(only.attempt, 2, "{}", summary(&instances));
    let withdrawn = attempt(only, 1);
    assert_eq!(withdrawn.state(), S::Failed, "{}", summary(&instances));
    assert!(
        withdrawn.message.starts_with("withdrawn: "),
        "{}",
        summary(&instances)
    );
    let starts_of_one = read_notes(&effects)
        .iter()
        .filter(|n| n.attempt == 1 && n.what == "start")
        .count();
    assert_eq!(starts_of_one, 1, "attempt 1 started more than once");
    drop(second);
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 3. A worker restarted under its id within the dead-worker threshold.

async fn fault_a_worker_restarted_under_its_id_has_its_running_attempt_ended_at_once() {
    // Dead only after 10 minutes of silence: without the registration check the attempt would
    // stay RUNNING far past the hang guard.
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = Scenario::new(Backend::MySql)
        .redis(RedisChoice::FromEnv)
        .heartbeats("500ms")
        .dead_after(1200)
        .worker("w1")
        .start()
        .await;
    // Attempt 1 runs until it is killed; attempt 2 ends at once.
    let command = script(
        &dir,
        "stuck",
        &effects,
        "if [ \"$AX_ATTEMPT\" = 1 ]; then\n  while :; do note tick; sleep 0.1; done\nfi",
    );
    let run_id = apply_and_trigger(
        &client,
        &workflow(
            "stuck",
            "defaults: { retries: 1 }",
            &[("only".to_string(), command)],
        ),
    )
    .await;
    client
        .wait_instances(run_id, "running", |all| {
            all.iter().any(|i| i.state() == S::Running)
        })
        .await
        .expect("the run's instances");
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let lost = attempt(&instances[0], 1);
    assert_eq!(lost.state(), S::Failed);
    assert_eq!(
        lost.message,
        "lost: worker w1 registered without it",
        "{}",
        summary(&instances)
    );
    assert_eq!(attempt(&instances[0], 2).state(), S::Success);
    // The decision says why the task ran again.
    let why = cluster.axctl(&["why", "stuck"]).await.expect("axctl why");
    assert!(
        why.stdout.contains("lost") && why.stdout.contains("registered without it"),
        "{why}"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 4. A worker that ignores Dispatch.timeout_ms.

async fn fault_a_worker_that_ignores_timeouts_has_the_attempt_timed_out_by_the_scheduler() {
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::MySql)
        .redis(RedisChoice::FromEnv)
        .heartbeats("300ms")
        .timeout_grace("1s")
        .start()
        .await;
    let mut options = ProtoWorkerOptions::new("lax", &cluster.endpoint());
    options.enforce_timeouts = false;
    let worker = ProtoWorker::start(options).await.expect("worker");
    client
        .wait_worker_live("lax", HANG_GUARD)
        .await
        .expect("live");
    // Attempt 1 would run for 30 s and succeed; attempt 2 ends at once.
    let command = script(
        &dir,
        "slow",
        &effects,
        "if [ \"$AX_ATTEMPT\" = 1 ]; then\n  i=0; while [ $i -lt 300 ]; do note tick; sleep 0.1; i=$((i + 1)); done\nfi",
    );
    let run_id = apply_and_trigger(
        &client,
        &workflow(
            "slow",
            "defaults: { timeout: 2s, retries: 1 }",
            &[("only".to_string(), command)],
        ),
    )
    .await;

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let timed_out = attempt(&instances[0], 1);
    assert_eq!(timed_out.state(), S::Timeout, "{}", summary(&instances));
    assert!(
        timed_out.message.starts_with("timed out: "),
        "{}",
        summary(&instances)
    );
    // Told to kill it; the process's end was recorded when the worker reported it.
    let cancels = worker
        .received()
        .into_iter()
        .filter(|m| matches!(&m.body, Some(FromScheduler::Cancel(c)) if c.attempt == 1))
        .count();
    assert!(cancels >= 1, "the worker was never told to kill attempt 1");
    // The worker's report of how the killed process ended may come after the retry's success
    // ended the run: it is waited for, then it must say SIGTERM.
    let until = tokio::time::Instant::now() + HANG_GUARD;
    let timed_out = loop {
        let instance = client
            .control()
            .get_instance(pb::GetInstanceRequest {
                id: instances[0].id,
            })
            .await
            .expect("get instance")
            .into_inner();
        let first = attempt(&instance, 1).clone();
        if first.signal.is_some() || tokio::time::Instant::now() >= until {
            break first;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(timed_out.state(), S::Timeout, "{timed_out:?}");
    assert_eq!(timed_out.signal, Some(libc::SIGTERM), "{timed_out:?}");
    assert_eq!(attempt(&instances[0], 2).state(), S::Success);
    drop(worker);
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 5. A cancel, then the worker's report of how the process ended.

async fn fault_a_cancelled_attempt_records_the_exit_its_worker_reports() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        ..
    } = short_heartbeats(Backend::MySql, RedisChoice::FromEnv)
        .worker_settings(capacity(2))
        .worker("w1")
        .start()
        .await;
    let command = script(&dir, "long", &effects, &numbered_lines(600, "0.1"));
    let run_id = apply_and_trigger(
        &client,
        &workflow("long", "", &[("only".to_string(), command)]),
    )
    .await;
    wait_notes(&effects, "ticking", |notes| {
        notes.iter().filter(|n| n.what == "tick").count() >= 5
    })
    .await;
    let cancel = cluster
        .axctl(&["cancel", "run", &run_id.to_string()])
        .await
        .expect("axctl cancel");
    assert_eq!(cancel.code, Some(0), "{cancel}");

    // The worker reports the attempt's end after the cancel; the attempt keeps it.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    let instance = loop {
        let instances = client.instances(run_id).await.expect("instances");
        let first = instances[0].clone();
        if attempt(&first, 1).log_lines > 0 {
            break first;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancelled attempt never got its ending:\n{}",
            summary(&instances)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(instance.state(), S::Cancelled);
    let ended = attempt(&instance, 1);
    assert_eq!(ended.state(), S::Cancelled);
    assert_eq!(ended.signal, Some(libc::SIGTERM), "{ended:?}");
    let stored = client.attempt_logs(instance.id, 1).await.expect("logs");
    assert_eq!(ended.log_lines, stored.len() as u64, "{ended:?}");
    let worker_log = plain(&cluster.worker("w1").expect("worker").log_text());
    assert!(
        !worker_log.contains("scheduler refused a report"),
        "the worker's report after the cancel was refused:\n{worker_log}"
    );
    check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 7. The proto is the contract: a worker written from it alone runs a workflow.

async fn a_worker_written_from_the_proto_alone_runs_a_workflow_with_its_context() {
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = short_heartbeats(Backend::Sqlite, RedisChoice::None)
        .start()
        .await;
    let worker = ProtoWorker::start(ProtoWorkerOptions::new("second", &cluster.endpoint()))
        .await
        .expect("worker");
    client
        .wait_worker_live("second", HANG_GUARD)
        .await
        .expect("live");
    let show = "echo \"run=$AX_RUN_ID instance=$AX_INSTANCE_ID attempt=$AX_ATTEMPT workflow=$AX_WORKFLOW task=$AX_TASK time=$AX_LOGICAL_TIME\"";
    let first = script(&dir, "first", &effects, show);
    let second = script(&dir, "second", &effects, &format!("{show}\nexit 3"));
    let yaml = format!(
        "name: contract\ndefaults: {{ retries: 1, timeout: 1m }}\ntasks:\n  - name: a\n    command: \"{}\"\n  - name: b\n    upstream: [a]\n    command: \"{}\"\n",
        first.replace('"', "\\\""),
        second.replace('"', "\\\""),
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(run.state(), pb::RunState::Failed, "{}", summary(&instances));
    let a = instances.iter().find(|i| i.task == "a").expect("a ran");
    let b = instances.iter().find(|i| i.task == "b").expect("b ran");
    assert_eq!(a.state(), S::Success);
    assert_eq!(
        (b.state(), b.attempt),
        (S::Failed, 2),
        "{}",
        summary(&instances)
    );
    assert_eq!(attempt(b, 2).exit_code, Some(3));
    let lines = client.attempt_logs(a.id, 1).await.expect("logs");
    let context = lines.first().map(|l| l.text.clone()).unwrap_or_default();
    let time = chrono_like_utc(&context);
    assert_eq!(
        context,
        format!(
            "run={run_id} instance={} attempt=1 workflow=contract task=a time={time}",
            a.id
        )
    );
    assert!(time.ends_with('Z') && time.len() >= 20, "{context}");
    let lines = client.attempt_logs(b.id, 2).await.expect("logs");
    assert!(
        lines
            .iter()
            .any(|l| l.text.contains("attempt=2 workflow=contract task=b")),
        "{lines:?}"
    );
    drop(worker);
    cluster.shutdown().await.expect("clean shutdown");
}

/// The `time=` value of a context line.
fn chrono_like_utc(line: &str) -> String {
    line.rsplit_once("time=")
        .map(|(_, time)| time.to_string())
        .unwrap_or_default()
}
