//! Fault tests with real processes: workers killed with SIGKILL, cut off from their scheduler
//! by a proxy, a scheduler killed and restarted, Redis stopped and started, a task over its
//! timeout, duplicate dispatches, and a busy worker whose heartbeats come late.
//!
//! Every test ends with `check_invariants` (`ax_integration_tests::fault_kit`), which reads the
//! attempt history from the control API and a side-effect file that every task appends to
//! (`instance attempt pid ms what`, where `what` is `start`, `tick` or `end`), and checks what
//! ax promises under every fault: every instance ended, no attempt started twice, no two
//! attempts of one instance overlapped, and no acknowledged log line was lost. Waits give up
//! after generous hang guards; nothing asserts on timing.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::client::summary;
use ax_integration_tests::fault_kit::*;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::{HANG_GUARD, Process, RedisChoice, WorkerSettings};
use ax_integration_tests::redis_server::RedisServer;
use ax_integration_tests::requirements::{MYSQL, REDIS_SERVER};
use ax_proto::v1 as pb;
use pb::InstanceState as S;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(fault_checker_catches_double_starts_overlaps_and_unknown_attempts),
        trial!(async(multi_thread = 2) fault_a_busy_worker_with_late_heartbeats_keeps_its_task),
        trial!(async(multi_thread = 2) fault_a_task_heartbeat_that_stops_on_a_live_worker_is_told_never_killed),
        trial!(async(multi_thread = 2) fault_a_task_over_its_timeout_is_killed_with_its_children_and_retried),
        trial!(async(multi_thread = 2) fault_kill_9_of_a_worker_with_20_running_tasks_retries_all_on_another).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_a_worker_cut_off_longer_than_the_lost_threshold_fences_itself),
        trial!(async(multi_thread = 2) fault_a_worker_cut_off_with_the_default_fence_setting_fences_before_its_task_is_retried),
        trial!(async(multi_thread = 2) fault_a_stream_cut_for_a_few_seconds_reattaches_and_finishes_once),
        trial!(async(multi_thread = 2) fault_redis_stopped_mid_run_and_started_again).requires(&MYSQL).requires(&REDIS_SERVER),
        trial!(async(multi_thread = 2) fault_kill_9_and_restart_of_the_scheduler_mid_run_on_mysql).requires(&MYSQL),
        trial!(async(multi_thread = 2) fault_duplicate_dispatch_messages_start_one_process),
    ]
}

/// The checker itself: clean histories pass, and each kind of violation is caught. Without
/// this, a checker that never complains would make every fault test pass.
fn fault_checker_catches_double_starts_overlaps_and_unknown_attempts() {
    let attempt = |number: u32, state: S, pid: u32| pb::Attempt {
        attempt: number,
        state: state as i32,
        pid,
        ..pb::Attempt::default()
    };
    let instance = |state: S, attempts: Vec<pb::Attempt>| pb::Instance {
        id: 1,
        task: "t".into(),
        state: state as i32,
        attempt: attempts.len() as u32,
        attempts,
        ..pb::Instance::default()
    };
    let notes = |text: &str| -> Vec<Note> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("effects");
        std::fs::write(&path, text).expect("write");
        read_notes(&path)
    };
    let retried = instance(
        S::Success,
        vec![attempt(1, S::Failed, 10), attempt(2, S::Success, 20)],
    );

    let clean = notes("1 1 10 100 start\n1 1 10 150 tick\n1 2 20 200 start\n1 2 20 250 end\n");
    assert_eq!(
        violations(std::slice::from_ref(&retried), &clean),
        Vec::<String>::new()
    );

    let cases = [
        // Attempt 1 still ticking after attempt 2 started.
        (
            "1 1 10 100 start\n1 2 20 200 start\n1 1 10 210 tick\n1 2 20 250 end\n",
            "was alive",
        ),
        // Attempt 2 started twice.
        (
            "1 1 10 100 start\n1 2 20 200 start\n1 2 21 201 start\n1 2 20 250 end\n",
            "started 2 times",
        ),
        // Attempt 1's last sign of life is later by the clock than attempt 2's start.
        (
            "1 1 10 300 start\n1 2 20 200 start\n1 2 20 250 end\n",
            "before the earlier attempt",
        ),
        // A process of an attempt the store does not know.
        (
            "1 1 10 100 start\n1 2 20 200 start\n1 2 20 250 end\n1 3 30 300 start\n",
            "does not know",
        ),
        // The successful attempt never reached its end.
        (
            "1 1 10 100 start\n1 2 20 200 start\n",
            "without reaching its end",
        ),
        // The stored pid is not the pid that ran.
        (
            "1 1 10 100 start\n1 2 22 200 start\n1 2 22 250 end\n",
            "stored with pid",
        ),
    ];
    for (text, expected) in cases {
        let found = violations(std::slice::from_ref(&retried), &notes(text));
        assert!(
            found.iter().any(|v| v.contains(expected)),
            "{expected:?} not caught in {text:?}: {found:?}"
        );
    }
    let unfinished = instance(S::Running, vec![attempt(1, S::Running, 10)]);
    let found = violations(&[unfinished], &notes("1 1 10 100 start\n"));
    assert!(
        found.iter().any(|v| v.contains("not terminal")),
        "{found:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. A busy worker with late heartbeats.

async fn fault_a_busy_worker_with_late_heartbeats_keeps_its_task() {
    // Task heartbeats every 2 s on both sides, so the backstop's grace (1.5 × 2 s) is close to
    // a heartbeat interval: a batched or late heartbeat must not condemn
    // a task running past half its timeout on a busy worker.
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::Sqlite)
        .heartbeats("300ms")
        .task_heartbeats("2s")
        .dead_after(4)
        .worker_settings(WorkerSettings {
            capacity: Some(16),
            ..WorkerSettings::default()
        })
        .worker("busy")
        .start()
        .await;
    let busy = script(
        &dir,
        "busy",
        &effects,
        "i=0\nwhile [ $i -lt 8 ]; do note tick; sleep 0.4; i=$((i + 1)); done",
    );
    // Runs 3 s by the clock (past 50% of its 4 s timeout), printing numbered lines.
    let slow = script(
        &dir,
        "slow",
        &effects,
        "end=$(( $(date +%s%3N) + 3000 ))\ni=1\nwhile [ $(date +%s%3N) -lt $end ]; do echo \"line $i\"; note tick; i=$((i + 1)); sleep 0.25; done",
    );
    let mut tasks: Vec<(String, String)> = (1..=15)
        .map(|i| (format!("busy{i}"), busy.clone()))
        .collect();
    tasks.push(("slow".into(), slow));
    let mut yaml = workflow(
        "incident",
        "defaults: { retries: 1, retry_backoff: 100ms }",
        &tasks,
    );
    // Only the slow task has the 4 s timeout.
    yaml = yaml.replace("  - name: slow\n", "  - name: slow\n    timeout: 4s\n");
    let run_id = apply_and_trigger(&client, &yaml).await;

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    for instance in &instances {
        assert_eq!(instance.state(), S::Success, "{}", summary(&instances));
        assert_eq!(
            instance.attempts.len(),
            1,
            "dispatched twice: {}",
            summary(&instances)
        );
    }
    // The slow task's numbered lines are all there, whatever their number.
    let slow = instances.iter().find(|i| i.task == "slow").expect("slow");
    let stored = client.attempt_logs(slow.id, 1).await.expect("logs");
    assert!(!stored.is_empty(), "the slow task stored no line");
    for (n, line) in stored.iter().enumerate() {
        assert_eq!(line.seq, n as u64 + 1);
        assert_eq!(line.text, format!("line {}", n + 1));
    }
    assert!(
        !plain(&cluster.scheduler_logs()).contains("backstop timeout"),
        "the backstop declared a timeout:\n{}",
        cluster.scheduler_logs()
    );
    cluster.shutdown().await.expect("clean shutdown");
}

/// A task heartbeat that stops while its worker keeps heartbeating: the node records a
/// `stalled` decision once and leaves the attempt running to its end.
async fn fault_a_task_heartbeat_that_stops_on_a_live_worker_is_told_never_killed() {
    // The node expects a task heartbeat every second (silent after 1.5 s); the worker sends
    // one every 30 s, so a 4 s task is silent for most of its run while its worker lives.
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::Sqlite)
        .heartbeats("300ms")
        .task_heartbeats("1s")
        .dead_after(4)
        .worker_with(
            "quiet",
            WorkerSettings {
                heartbeat_interval: Some("300ms".into()),
                task_heartbeat_interval: Some("30s".into()),
                ..WorkerSettings::default()
            },
        )
        .start()
        .await;
    let quiet = script(
        &dir,
        "quiet",
        &effects,
        "i=0\nwhile [ $i -lt 16 ]; do note tick; sleep 0.25; i=$((i + 1)); done",
    );
    let yaml = workflow(
        "quiet-task",
        "defaults: { retries: 1, retry_backoff: 100ms }",
        &[("quiet".to_string(), quiet)],
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].attempts.len(), 1, "{}", summary(&instances));

    let why = cluster
        .axctl(&["why", "quiet-task"])
        .await
        .expect("axctl why");
    assert_eq!(
        why.stdout
            .matches("while worker quiet is alive; the attempt keeps running")
            .count(),
        1,
        "one stalled decision, once:\n{why}"
    );
    assert!(why.stdout.contains("stalled"), "{why}");
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 2. Timeout: the whole process group dies, and the retry runs.

async fn fault_a_task_over_its_timeout_is_killed_with_its_children_and_retried() {
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::Sqlite)
        .heartbeats("300ms")
        .task_heartbeats("500ms")
        .worker_settings(WorkerSettings {
            kill_grace: Some("500ms".into()),
            ..WorkerSettings::default()
        })
        .worker("w1")
        .start()
        .await;
    let body = format!(
        "if [ \"$AX_ATTEMPT\" = 1 ]; then\n  sleep 30 &\n  echo $! > '{}/grandchild-'$AX_INSTANCE_ID\n  while :; do note tick; sleep 0.1; done\nfi\n{}",
        dir.display(),
        numbered_lines(3, "0.01")
    );
    let command = script(&dir, "overrun", &effects, &body);
    let yaml = workflow(
        "overrun",
        "defaults: { timeout: 1s, retries: 1, retry_backoff: 100ms }",
        &[("overrun".into(), command)],
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    let run = client.wait_run(run_id).await.expect("the run ends");

    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(3)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let instance = &instances[0];
    assert_eq!(instance.attempts.len(), 2, "{}", summary(&instances));
    assert_eq!(attempt(instance, 1).state(), S::Timeout, "{instance:#?}");
    assert_eq!(attempt(instance, 2).state(), S::Success, "{instance:#?}");

    let notes = read_notes(&effects);
    let shell = started_pids(&notes, |n| n.attempt == 1);
    let grandchildren = grandchild_pids(&dir);
    assert_eq!(
        grandchildren.len(),
        1,
        "the first attempt recorded its grandchild"
    );
    let survivors = wait_pids_gone(&[shell, grandchildren.clone()].concat(), HANG_GUARD).await;
    kill_pids(&survivors);
    assert!(
        survivors.is_empty(),
        "processes of the timed-out attempt survived: {survivors:?} (shell and grandchild {grandchildren:?})"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 3. SIGKILL of a worker with 20 running tasks.

async fn fault_kill_9_of_a_worker_with_20_running_tasks_retries_all_on_another() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = Scenario::new(Backend::MySql)
        .heartbeats("300ms")
        .task_heartbeats("500ms")
        .dead_after(4)
        .worker_settings(WorkerSettings {
            capacity: Some(20),
            kill_grace: Some("500ms".into()),
            ..WorkerSettings::default()
        })
        .worker("a")
        .start()
        .await;
    let body = format!(
        "if [ \"$AX_ATTEMPT\" = 1 ]; then\n  sleep 30 &\n  echo $! > '{}/grandchild-'$AX_INSTANCE_ID\n  while :; do note tick; sleep 0.5; done\nfi\n{}",
        dir.display(),
        numbered_lines(3, "0.01")
    );
    let command = script(&dir, "long", &effects, &body);
    let tasks: Vec<(String, String)> = (1..=20)
        .map(|i| (format!("t{i:02}"), command.clone()))
        .collect();
    let yaml = workflow(
        "twenty",
        "defaults: { retries: 1, retry_backoff: 100ms }",
        &tasks,
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    client
        .wait_instances(run_id, "20 running on a", |all| {
            all.len() == 20 && running_on(all, "a") == 20
        })
        .await
        .expect("the run's instances");
    // Every shell and grandchild has announced itself.
    wait_notes(&effects, "20 started", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 20
    })
    .await;
    wait_notes(&effects, "20 grandchildren", |_| {
        grandchild_pids(&dir).len() == 20
    })
    .await;
    cluster
        .start_live_worker("b", &worker)
        .await
        .expect("worker b");

    cluster.kill_worker("a").await.expect("SIGKILL worker a");
    let notes = read_notes(&effects);
    let shells = started_pids(&notes, |n| n.attempt == 1);
    assert_eq!(shells.len(), 20);
    let grandchildren = grandchild_pids(&dir);
    // The parent-death signal reaches the shells within a few seconds (a hang guard).
    let shell_survivors = wait_pids_gone(&shells, Duration::from_secs(10)).await;

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(3)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    for instance in &instances {
        assert_eq!(instance.attempts.len(), 2, "{}", summary(&instances));
        let first = attempt(instance, 1);
        let second = attempt(instance, 2);
        assert_eq!(first.worker_id, "a", "{instance:#?}");
        assert_ne!(first.state(), S::Success, "{instance:#?}");
        assert_eq!(second.worker_id, "b", "{instance:#?}");
        assert_eq!(second.state(), S::Success, "{instance:#?}");
    }
    kill_pids(&shell_survivors);
    assert!(
        shell_survivors.is_empty(),
        "shells of the killed worker survived it: {shell_survivors:?}"
    );
    // The grandchildren (`sleep 30 &` in each task) are in the attempts' process groups, which
    // nobody killed: the worker died with SIGKILL. Checked last, so that the rest is reported.
    let grandchild_survivors = wait_pids_gone(&grandchildren, Duration::from_secs(5)).await;
    kill_pids(&grandchild_survivors);
    assert!(
        grandchild_survivors.is_empty(),
        "{} of 20 grandchildren of the SIGKILLed worker's tasks survived it while the retries ran: {grandchild_survivors:?}",
        grandchild_survivors.len()
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 4. A worker cut off longer than the dead threshold fences itself.

async fn fault_a_worker_cut_off_longer_than_the_lost_threshold_fences_itself() {
    // Dead after 8 × 300 ms = 2.4 s; the worker fences after 800 ms and kills within 300 ms.
    cut_off_worker_fences_itself(8, Some("800ms")).await;
}

/// The same partition with the worker's default `--self-fence-after` (10 s), longer than this
/// scheduler's dead threshold (10 × 300 ms = 3 s): the worker must learn the threshold from
/// Registered (`worker_dead_after_ms`) and fence before it, or the retry runs beside its task.
async fn fault_a_worker_cut_off_with_the_default_fence_setting_fences_before_its_task_is_retried() {
    cut_off_worker_fences_itself(10, None).await;
}

/// Worker a, behind a proxy, runs a task that never ends on its own; the proxy cuts a off until
/// the retry has run on worker b (connected directly). a must have killed its task before the
/// retry started, report that it fenced, come back after the partition heals, and have its late
/// report about attempt 1 refused.
async fn cut_off_worker_fences_itself(dead_after_missed: u32, self_fence_after: Option<&str>) {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        proxy,
    } = Scenario::new(Backend::Sqlite)
        .heartbeats("300ms")
        .task_heartbeats("500ms")
        .dead_after(dead_after_missed)
        .worker_settings(WorkerSettings {
            kill_grace: Some("300ms".into()),
            self_fence_after: self_fence_after.map(String::from),
            ..WorkerSettings::default()
        })
        .worker_through_proxy("a")
        .start()
        .await;
    let proxy = proxy.expect("the proxy in front of the scheduler");
    let body = format!(
        "if [ \"$AX_ATTEMPT\" = 1 ]; then\n  while :; do note tick; sleep 0.1; done\nfi\n{}",
        numbered_lines(3, "0.01")
    );
    let command = script(&dir, "fenced", &effects, &body);
    let yaml = workflow(
        "fenced",
        "defaults: { retries: 1, retry_backoff: 100ms }",
        &[("fenced".into(), command)],
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    client
        .wait_instances(run_id, "running on a", |all| running_on(all, "a") == 1)
        .await
        .expect("the run's instances");
    let notes = wait_notes(&effects, "ticking", |n| n.len() >= 3).await;
    let pid = started_pids(&notes, |n| n.attempt == 1)[0];
    cluster
        .start_live_worker("b", &worker)
        .await
        .expect("worker b");

    // The partition lasts until the retry has run to completion on b.
    proxy.cut();
    let run = client.wait_run(run_id).await.expect("the run ends");
    let survivors = wait_pids_gone(&[pid], HANG_GUARD).await;
    kill_pids(&survivors);
    assert!(
        survivors.is_empty(),
        "the cut-off worker did not fence its task (pid {pid})"
    );
    proxy.heal();
    // a comes back, and whatever it reports late about attempt 1 must change nothing.
    let worker_a_back = {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if plain(&cluster.scheduler_logs())
                .lines()
                .filter(|l| l.contains("worker connected") && l.contains("worker=a"))
                .count()
                >= 2
            {
                break true;
            }
            if tokio::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(
        worker_a_back,
        "worker a did not reconnect after the partition healed"
    );
    client
        .wait_worker_live("a", HANG_GUARD)
        .await
        .expect("a live again");
    let instance_id = client.instances(run_id).await.expect("instances")[0].id;
    let refused = {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            let log = plain(&cluster.scheduler_logs());
            if log.lines().any(|l| {
                l.contains("report refused") && l.contains(&format!("instance={instance_id} "))
            }) {
                break true;
            }
            if tokio::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(3)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let instance = &instances[0];
    assert_eq!(instance.attempts.len(), 2, "{}", summary(&instances));
    assert_eq!(attempt(instance, 1).worker_id, "a");
    assert_eq!(attempt(instance, 1).state(), S::Failed, "{instance:#?}");
    assert_eq!(attempt(instance, 2).worker_id, "b");
    assert_eq!(attempt(instance, 2).state(), S::Success, "{instance:#?}");
    let worker_log = plain(&cluster.worker("a").expect("a").log_text());
    assert!(
        worker_log.contains("self-fencing"),
        "worker a does not say it fenced:\n{worker_log}"
    );
    assert!(
        refused,
        "no refusal of worker a's late report for attempt 1 in the scheduler log"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 5. A short cut: the stream re-attaches and the attempt finishes once.

async fn fault_a_stream_cut_for_a_few_seconds_reattaches_and_finishes_once() {
    // Dead after 10 × 500 ms = 5 s; the cut lasts about 1 s; the worker fences only after 4 s.
    let Scene {
        cluster,
        client,
        effects,
        dir,
        proxy,
        ..
    } = Scenario::new(Backend::Sqlite)
        .heartbeats("500ms")
        .task_heartbeats("1s")
        .dead_after(10)
        .worker_settings(WorkerSettings {
            self_fence_after: Some("4s".into()),
            ..WorkerSettings::default()
        })
        .worker_through_proxy("a")
        .start()
        .await;
    let proxy = proxy.expect("the proxy in front of the scheduler");
    let command = script(&dir, "chatty", &effects, &numbered_lines(40, "0.1"));
    let yaml = workflow(
        "chatty",
        "defaults: { retries: 1, retry_backoff: 100ms }",
        &[("chatty".into(), command)],
    );
    let run_id = apply_and_trigger(&client, &yaml).await;
    wait_notes(&effects, "a few lines in", |n| {
        n.iter().filter(|n| n.what == "tick").count() >= 8
    })
    .await;
    let connections_before = proxy.forwarded();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still_running = read_notes(&effects).iter().all(|n| n.what != "end");
    proxy.heal();

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(40)).await;
    assert!(
        still_running,
        "the task ended during the cut; the test proves nothing"
    );
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    let instance = &instances[0];
    assert_eq!(instance.attempts.len(), 1, "{}", summary(&instances));
    assert!(
        proxy.forwarded() > connections_before,
        "the worker never reconnected through the proxy"
    );
    assert!(
        proxy.refused() > 0 || proxy.forwarded() > connections_before,
        "nothing went through the cut"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 6. Redis stopped in the middle of a run, then started again.

async fn fault_redis_stopped_mid_run_and_started_again() {
    let redis_dir = tempfile::tempdir().expect("tempdir");
    let mut redis = RedisServer::start(redis_dir.path())
        .await
        .expect("a private redis-server");
    let _dump = DumpOnPanic(vec![redis_dir.path().to_path_buf()]);
    let Scene {
        cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::MySql)
        .redis(RedisChoice::Url(redis.url()))
        .heartbeats("300ms")
        .worker_settings(WorkerSettings {
            capacity: Some(6),
            ..WorkerSettings::default()
        })
        .worker("w1")
        .start()
        .await;
    let command = script(&dir, "steady", &effects, &numbered_lines(5, "0.15"));
    let tasks: Vec<(String, String)> = (1..=30)
        .map(|i| (format!("t{i:02}"), command.clone()))
        .collect();
    let yaml = workflow("steady", "", &tasks);
    let run_id = apply_and_trigger(&client, &yaml).await;

    client
        .wait_instances(run_id, "a quarter done", |all| {
            all.iter().filter(|i| i.state() == S::Success).count() >= 7
        })
        .await
        .expect("the run's instances");
    redis.stop().await.expect("stop redis");
    // Let the run go on without Redis for a while: wait for progress rather than for time.
    let done_without_redis = client
        .instances(run_id)
        .await
        .expect("instances")
        .iter()
        .filter(|i| i.state() == S::Success)
        .count();
    client
        .wait_instances(run_id, "progress without redis", |all| {
            all.iter().filter(|i| i.state() == S::Success).count()
                >= (done_without_redis + 6).min(30)
        })
        .await
        .expect("the run's instances");
    redis.restart().await.expect("start redis again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(5)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 30);
    for instance in &instances {
        assert_eq!(instance.state(), S::Success, "{}", summary(&instances));
    }
    let log = plain(&cluster.scheduler_logs());
    assert!(
        log.contains("redis unreachable"),
        "the scheduler did not say it lost Redis:\n{log}"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

/// Prints the logs in some directories when a test panics (those a [`ProcessCluster`] does not
/// know, such as a private Redis's).
struct DumpOnPanic(Vec<PathBuf>);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for dir in &self.0 {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                    eprintln!("===== {}\n{text}===== end", entry.path().display());
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 7. SIGKILL of the scheduler mid-run, and a restart on the same port and store.

async fn fault_kill_9_and_restart_of_the_scheduler_mid_run_on_mysql() {
    // A generous dead threshold (16 × 500 ms = 8 s) so the restart is shorter than it; the
    // worker fences only after 5 s without a scheduler.
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        ..
    } = Scenario::new(Backend::MySql)
        .heartbeats("500ms")
        .task_heartbeats("2s")
        .dead_after(16)
        .worker_settings(WorkerSettings {
            capacity: Some(16),
            self_fence_after: Some("5s".into()),
            ..WorkerSettings::default()
        })
        .worker("w1")
        .start()
        .await;
    let command = script(&dir, "fan", &effects, &numbered_lines(5, "0.05"));
    let tasks: Vec<(String, String)> = (1..=200)
        .map(|i| (format!("t{i:03}"), command.clone()))
        .collect();
    let yaml = workflow(
        "fanout",
        "defaults: { retries: 2, retry_backoff: 100ms }",
        &tasks,
    );
    let run_id = apply_and_trigger(&client, &yaml).await;

    client
        .wait_instances(run_id, "a quarter done", |all| {
            all.len() == 200 && all.iter().filter(|i| i.state() == S::Success).count() >= 50
        })
        .await
        .expect("the run's instances");
    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("SIGKILL the scheduler");
    let running_at_kill = read_notes(&effects);
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(5)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 200, "instances lost");
    let runs = client.runs("fanout").await.expect("list runs");
    assert_eq!(
        runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![run_id],
        "runs lost or doubled"
    );
    for instance in &instances {
        assert_eq!(instance.state(), S::Success, "{}", summary(&instances));
    }
    let retried = instances.iter().filter(|i| i.attempts.len() > 1).count();
    let log = plain(&cluster.scheduler_logs());
    let reattached = log
        .lines()
        .filter(|l| l.contains("worker connected") && l.contains("worker=w1"))
        .count();
    assert!(
        reattached >= 2,
        "the worker did not reconnect to the restarted node:\n{log}"
    );
    let in_flight = {
        let ended: BTreeSet<(i64, u32)> = running_at_kill
            .iter()
            .filter(|n| n.what == "end")
            .map(|n| (n.instance, n.attempt))
            .collect();
        running_at_kill
            .iter()
            .filter(|n| n.what == "start" && !ended.contains(&(n.instance, n.attempt)))
            .count()
    };
    eprintln!(
        "scheduler kill: {in_flight} attempts were running at the kill; {retried} of 200 instances needed another attempt"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

// ---------------------------------------------------------------------------------------------
// 8. Duplicate Dispatch messages against a real worker process.

mod fake {
    use super::*;
    use ax_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
    use ax_proto::v1::{
        LogAck, ProtocolVersion, Registered, SchedulerMessage, WorkerMessage, scheduler_message,
        worker_message::Body,
    };
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
    use tonic::{Request, Response, Status, Streaming};

    type Outbound = mpsc::Sender<Result<SchedulerMessage, Status>>;

    #[derive(Default)]
    pub struct State {
        pub received: Mutex<Vec<WorkerMessage>>,
        pub connection: Mutex<Option<Outbound>>,
    }

    #[derive(Clone)]
    struct Service(Arc<State>);

    #[tonic::async_trait]
    impl WorkerService for Service {
        type ConnectStream = ReceiverStream<Result<SchedulerMessage, Status>>;

        async fn connect(
            &self,
            request: Request<Streaming<WorkerMessage>>,
        ) -> Result<Response<Self::ConnectStream>, Status> {
            let mut inbound = request.into_inner();
            let (tx, rx) = mpsc::channel(1024);
            let state = Arc::clone(&self.0);
            tokio::spawn(async move {
                let Ok(Some(first)) = inbound.message().await else {
                    return;
                };
                state.received.lock().unwrap().push(first);
                let registered = Registered {
                    protocol: ProtocolVersion::ProtocolVersion1 as i32,
                    scheduler_node: "fake".into(),
                    heartbeat_interval_ms: 300,
                    task_heartbeat_interval_ms: 500,
                    stale: Vec::new(),
                    worker_dead_after_ms: 0,
                };
                let welcome = SchedulerMessage {
                    body: Some(scheduler_message::Body::Registered(registered)),
                };
                if tx.send(Ok(welcome)).await.is_err() {
                    return;
                }
                *state.connection.lock().unwrap() = Some(tx.clone());
                while let Ok(Some(message)) = inbound.message().await {
                    if let Some(Body::Logs(batch)) = &message.body {
                        let ack = LogAck {
                            instance_id: batch.instance_id,
                            attempt: batch.attempt,
                            seq: batch.first_seq + batch.line_count() as u64 - 1,
                        };
                        let _ = tx
                            .send(Ok(SchedulerMessage {
                                body: Some(scheduler_message::Body::LogAck(ack)),
                            }))
                            .await;
                    }
                    state.received.lock().unwrap().push(message);
                }
            });
            Ok(Response::new(ReceiverStream::new(rx)))
        }
    }

    /// A fake scheduler node on loopback; returns its url and what it shares with the test.
    pub async fn start() -> (String, Arc<State>, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(State::default());
        let service = WorkerServiceServer::new(Service(Arc::clone(&state)));
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        (url, state, server)
    }
}

/// Prints a process's log when the test panics.
struct LogOnPanic<'a>(&'a Process);

impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("===== {}\n{}===== end", self.0.name(), self.0.log_text());
        }
    }
}

/// Polls what the fake scheduler received until `probe` finds what it looks for.
async fn wait_received(
    state: &fake::State,
    what: &str,
    probe: impl Fn(&[ax_proto::v1::WorkerMessage]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let messages = state.received.lock().unwrap().clone();
        if probe(&messages) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} after {HANG_GUARD:?}: {messages:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn fault_duplicate_dispatch_messages_start_one_process() {
    use ax_proto::v1::{Dispatch, SchedulerMessage, scheduler_message, worker_message::Body};

    let (url, state, server) = fake::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let effects = dir.path().join("effects");
    let command = script(dir.path(), "once", &effects, &numbered_lines(3, "0.3"));
    // A state directory of its own: the default one (under the machine's temp directory, by
    // worker id) keeps the ends journal of an earlier run of this test, whose worker ran this
    // very attempt, and this worker would refuse it as a duplicate from the start.
    let state_dir = dir.path().join("state");
    let args: Vec<String> = [
        "--scheduler",
        &url,
        "--id",
        "dup",
        "--state-dir",
        state_dir.to_str().expect("a UTF-8 temp path"),
        "--heartbeat-interval",
        "300ms",
        "--task-heartbeat-interval",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut worker = Process::spawn(
        "ax-worker dup",
        &ax_integration_tests::binary("ax-worker").expect("built"),
        &args,
        dir.path(),
        dir.path().join("worker.log"),
    )
    .expect("the worker starts");
    let _log = LogOnPanic(&worker);

    let received = |state: &fake::State| state.received.lock().unwrap().clone();
    let connection = {
        let deadline = tokio::time::Instant::now() + HANG_GUARD;
        loop {
            if let Some(tx) = state.connection.lock().unwrap().clone() {
                break tx;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the worker never registered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // As a scheduler sends it: the attempt's context in the environment.
    let env = [("AX_INSTANCE_ID", "7"), ("AX_ATTEMPT", "1")];
    let dispatch = Dispatch {
        instance_id: 7,
        attempt: 1,
        run_id: 3,
        workflow: "dup".into(),
        task: "once".into(),
        command,
        env: env.map(|(k, v)| (k.to_string(), v.to_string())).into(),
        ..Dispatch::default()
    };
    let send = |dispatch: Dispatch| {
        let connection = connection.clone();
        async move {
            connection
                .send(Ok(SchedulerMessage {
                    body: Some(scheduler_message::Body::Dispatch(dispatch)),
                }))
                .await
                .expect("the worker's stream is open");
        }
    };
    // Twice back to back, as a retransmission would.
    send(dispatch.clone()).await;
    send(dispatch.clone()).await;
    let is_finished = |m: &ax_proto::v1::WorkerMessage| matches!(&m.body, Some(Body::Finished(f)) if f.instance_id == 7 && f.attempt == 1);
    wait_received(&state, "finished report", |all| all.iter().any(is_finished)).await;
    // Once more after it ended: the worker remembers what it ran.
    send(dispatch).await;
    let rejected = |all: &[ax_proto::v1::WorkerMessage]| -> Vec<ax_proto::v1::DispatchRejected> {
        all.iter()
            .filter_map(|m| match &m.body {
                Some(Body::Rejected(r)) => Some(r.clone()),
                _ => None,
            })
            .collect()
    };
    wait_received(&state, "second rejection", |all| rejected(all).len() >= 2).await;

    let all = received(&state);
    let accepted = all
        .iter()
        .filter(
            |m| matches!(&m.body, Some(Body::Accepted(a)) if a.instance_id == 7 && a.attempt == 1),
        )
        .count();
    let started = all
        .iter()
        .filter(
            |m| matches!(&m.body, Some(Body::Started(s)) if s.instance_id == 7 && s.attempt == 1),
        )
        .count();
    let finished = all.iter().filter(|m| is_finished(m)).count();
    let rejections = rejected(&all);
    assert_eq!(accepted, 1, "{all:#?}");
    assert_eq!(started, 1, "{all:#?}");
    assert_eq!(finished, 1, "{all:#?}");
    assert_eq!(rejections.len(), 2, "{all:#?}");
    for rejection in &rejections {
        assert_eq!((rejection.instance_id, rejection.attempt), (7, 1));
        assert!(rejection.duplicate, "not marked duplicate: {rejection:?}");
    }
    let notes = read_notes(&effects);
    let starts = notes.iter().filter(|n| n.what == "start").count();
    assert_eq!(
        starts, 1,
        "the attempt's process started {starts} times: {notes:?}"
    );
    assert_eq!(
        notes.iter().map(|n| n.pid).collect::<BTreeSet<_>>().len(),
        1,
        "{notes:?}"
    );

    drop(_log);
    worker.terminate().expect("SIGTERM the worker");
    let status = worker
        .wait_exit(HANG_GUARD)
        .await
        .expect("the worker exits");
    assert!(status.success(), "the worker exited with {status}");
    server.abort();
}
