//! A worker killed with -9 and started again under its id: nothing that ended is forgotten.
//! Real processes on MariaDB with Redis; every test ends with the ledger checks of
//! `fault_kit::check_invariants` (no attempt started twice, no overlap, nothing that succeeded
//! ran again, every line stored once).
//!
//! - the chaos case: the scheduler is killed, tasks run to their end while it is down,
//!   then the worker is killed too; both come back and every end is the one the process had
//!   (SUCCESS on attempt 1), with every line, where it used to be `lost: worker … registered
//!   without it`;
//! - a worker killed the moment its tasks' ends were sent, before or after the scheduler
//!   acknowledged them: each end is stored once, nothing is retried.
//!
//! And with `survive_worker_restart: true`, the task's process outlives the worker:
//! - killed while its tasks run (twice, the second time as the restarted worker replays their
//!   lines): the tasks run on, the worker takes them back, every line is stored once;
//! - killed as its held tasks end, with the scheduler down: every end is the process's own;
//! - a timeout and a cancel reach a task taken back;
//! - a worker stopped with SIGQUIT (an upgrade) ends once its other tasks did, and its next
//!   process takes the held ones back;
//! - a worker that stays away past the fence delay: the holder kills the task before the node
//!   counts the worker dead, and the retry never overlaps it.

use std::time::Duration;

use ax_integration_tests::Backend;
use ax_integration_tests::client::summary;
use ax_integration_tests::fault_kit::*;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::RedisChoice;
use ax_integration_tests::requirements::{MYSQL, REDIS};
use ax_proto::v1 as pb;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) fault_ends_of_a_worker_killed_while_the_scheduler_was_down_are_reported_when_it_returns).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_worker_killed_as_it_reports_ends_reports_each_once_after_its_restart).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_held_tasks_run_on_through_worker_kills_and_lose_no_line).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_held_tasks_that_end_while_worker_and_scheduler_are_down_keep_their_ends).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_timeout_and_a_cancel_reach_held_tasks_taken_back).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) fault_a_held_task_whose_worker_stays_away_fences_itself_before_its_retry).requires(&MYSQL).requires(&REDIS),
        trial!(async(multi_thread = 2) a_worker_stopped_with_sigquit_drains_the_others_and_hands_held_tasks_over).requires(&MYSQL).requires(&REDIS),
    ]
}

/// 300 ms heartbeats, dead after 40 missed (12 s): the worker comes back well within it.
fn scenario() -> Scenario {
    Scenario::new(Backend::MySql)
        .redis(RedisChoice::FromEnv)
        .heartbeats("300ms")
        .task_heartbeats("1s")
        .dead_after(40)
        .worker("w1")
}

fn every_attempt_first_and_succeeded(instances: &[pb::Instance]) {
    for instance in instances {
        assert_eq!(
            (instance.state(), instance.attempt),
            (pb::InstanceState::Success, 1),
            "an end was lost or retried:\n{}",
            summary(instances)
        );
    }
}

async fn fault_ends_of_a_worker_killed_while_the_scheduler_was_down_are_reported_when_it_returns() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    let command = script(&dir, "short", &effects, &numbered_lines(3, "0.3"));
    let tasks: Vec<(String, String)> = (1..=5)
        .map(|i| (format!("t{i}"), command.clone()))
        .collect();
    let run_id = apply_and_trigger(&client, &workflow("short", "", &tasks)).await;
    let notes = wait_notes(&effects, "five starts", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 5
    })
    .await;
    let pids = started_pids(&notes, |_| true);

    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("SIGKILL the scheduler");
    // The five run to their end while no node is up, and the worker reaps them.
    wait_notes(&effects, "five ends", |notes| {
        notes.iter().filter(|n| n.what == "end").count() == 5
    })
    .await;
    let left = wait_pids_gone(&pids, Duration::from_secs(10)).await;
    assert!(left.is_empty(), "tasks still running: {left:?}");
    // The worker has its ends kept on disk a sync after it reaped them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(3)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 5);
    every_attempt_first_and_succeeded(&instances);
    let log = plain(&cluster.worker("w1").expect("worker").log_text());
    assert!(
        log.contains(
            "the ends journal holds ends an earlier worker process did not see acknowledged"
        ),
        "the restarted worker did not take the ends back:\n{log}"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_a_worker_killed_as_it_reports_ends_reports_each_once_after_its_restart() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    // Ten tasks that end one after another, 50 ms apart; the worker dies just after the first
    // ends, while the others' ends are being sent and acknowledged.
    let tasks: Vec<(String, String)> = (1..=10)
        .map(|i| {
            let body = format!("echo \"line 1\"\nsleep {:.2}", 0.5 + 0.05 * f64::from(i));
            (
                format!("t{i:02}"),
                script(&dir, &format!("t{i:02}"), &effects, &body),
            )
        })
        .collect();
    let run_id = apply_and_trigger(
        &client,
        &workflow(
            "staggered",
            "defaults: { retries: 2, retry_backoff: 100ms }",
            &tasks,
        ),
    )
    .await;
    wait_notes(&effects, "ten starts", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 10
    })
    .await;
    wait_notes(&effects, "five ends", |notes| {
        notes.iter().filter(|n| n.what == "end").count() >= 5
    })
    .await;
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    // A task still running when the worker died dies with it and runs again (attempt 2); one
    // whose process had ended and been reaped keeps its end.
    let notes = read_notes(&effects);
    let ended_first: Vec<i64> = notes
        .iter()
        .filter(|n| n.what == "end" && n.attempt == 1)
        .map(|n| n.instance)
        .collect();
    assert!(ended_first.len() >= 5, "{}", summary(&instances));
    for instance in &instances {
        let first = attempt(instance, 1);
        if ended_first.contains(&instance.id) && first.state() != pb::InstanceState::Success {
            // The one window a worker can lose: killed between reaping the process and keeping
            // its end, a few milliseconds; the test kills it after the fifth `end` note, so at
            // most the tasks that wrote theirs in that instant.
            assert!(
                first.message.contains("registered without it"),
                "{}",
                summary(&instances)
            );
        }
    }
    let kept = instances
        .iter()
        .filter(|i| {
            ended_first.contains(&i.id) && attempt(i, 1).state() == pb::InstanceState::Success
        })
        .count();
    assert!(
        kept + 1 >= ended_first.len(),
        "ends of processes that exited were lost:\n{}",
        summary(&instances)
    );
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    cluster.shutdown().await.expect("clean shutdown");
}

/// `workflow`, every task asking to survive a worker restart.
fn held_workflow(name: &str, header: &str, tasks: &[(String, String)]) -> String {
    workflow(name, header, tasks)
        .lines()
        .flat_map(|line| {
            let held = line.starts_with("    command: ");
            std::iter::once(line.to_string())
                .chain(held.then(|| "    survive_worker_restart: true".to_string()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn all_alive(pids: &[u32]) -> bool {
    pids.iter().all(|pid| pid_alive(*pid))
}

async fn fault_held_tasks_run_on_through_worker_kills_and_lose_no_line() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    let command = script(&dir, "chatty", &effects, &numbered_lines(12, "0.25"));
    let tasks: Vec<(String, String)> = (1..=4)
        .map(|i| (format!("t{i}"), command.clone()))
        .collect();
    let run_id = apply_and_trigger(&client, &held_workflow("held", "", &tasks)).await;
    let notes = wait_notes(&effects, "four starts and some lines", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 4
            && notes.iter().filter(|n| n.what == "tick").count() >= 8
    })
    .await;
    let pids = started_pids(&notes, |_| true);

    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(all_alive(&pids), "a held task died with its worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");
    // Killed again while it takes them back and resends their lines.
    tokio::time::sleep(Duration::from_millis(150)).await;
    cluster
        .kill_worker("w1")
        .await
        .expect("SIGKILL the worker again");
    assert!(all_alive(&pids), "a held task died with its worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker a third time");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(12)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    every_attempt_first_and_succeeded(&instances);
    let log = plain(&cluster.worker("w1").expect("worker").log_text());
    assert!(
        log.contains("taking back a held attempt an earlier worker process started"),
        "{log}"
    );
    cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_held_tasks_that_end_while_worker_and_scheduler_are_down_keep_their_ends() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    let tasks: Vec<(String, String)> = (1..=6)
        .map(|i| {
            let body = format!(
                "{}\nsleep {:.1}",
                numbered_lines(3, "0.1"),
                0.6 + 0.1 * f64::from(i)
            );
            (
                format!("t{i}"),
                script(&dir, &format!("t{i}"), &effects, &body),
            )
        })
        .collect();
    let run_id = apply_and_trigger(&client, &held_workflow("ending", "", &tasks)).await;
    let notes = wait_notes(&effects, "six starts", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 6
    })
    .await;
    let pids = started_pids(&notes, |_| true);
    let mut scheduler = cluster.take_scheduler().expect("scheduler");
    scheduler.kill().await.expect("SIGKILL the scheduler");
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    // The tasks end with neither a worker nor a scheduler up; only their holders see it.
    wait_notes(&effects, "six ends", |notes| {
        notes.iter().filter(|n| n.what == "end").count() == 6
    })
    .await;
    let left = wait_pids_gone(&pids, Duration::from_secs(10)).await;
    assert!(left.is_empty(), "tasks still running: {left:?}");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster
        .start_scheduler()
        .await
        .expect("the scheduler restarts");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(3)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    assert_eq!(instances.len(), 6);
    every_attempt_first_and_succeeded(&instances);
    cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_a_timeout_and_a_cancel_reach_held_tasks_taken_back() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    let sleeper = script(&dir, "sleeper", &effects, "echo \"line 1\"\nsleep 60");
    let timed = held_workflow("timed", "", &[("slow".into(), sleeper.clone())]).replace(
        "    survive_worker_restart: true",
        "    survive_worker_restart: true\n    timeout: 3s",
    );
    let cancelled = held_workflow("cancelled", "", &[("slow".into(), sleeper)]);
    let timed_run = apply_and_trigger(&client, &timed).await;
    let cancelled_run = apply_and_trigger(&client, &cancelled).await;
    let notes = wait_notes(&effects, "two starts", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 2
    })
    .await;
    let pids = started_pids(&notes, |_| true);
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(all_alive(&pids), "a held task died with its worker");
    client
        .cancel_run(cancelled_run, "taken back, then cancelled")
        .await
        .expect("cancel");

    for run_id in [timed_run, cancelled_run] {
        client.wait_run(run_id).await.expect("the run ends");
    }
    let instances = check_invariants_of_runs(
        &client,
        &[timed_run, cancelled_run],
        &effects,
        Lines::Unchecked,
    )
    .await;
    let states: Vec<(pb::InstanceState, u32)> = instances
        .iter()
        .map(|instance| (instance.state(), instance.attempt))
        .collect();
    assert_eq!(
        states,
        [
            (pb::InstanceState::Timeout, 1),
            (pb::InstanceState::Cancelled, 1)
        ],
        "{}",
        summary(&instances)
    );
    let left = wait_pids_gone(&pids, Duration::from_secs(15)).await;
    assert!(
        left.is_empty(),
        "a held task outlived its timeout or cancel: {left:?}"
    );
    // The attempts keep what the process reported: a signal, not a success.
    for run_id in [timed_run, cancelled_run] {
        let instances = client.instances(run_id).await.expect("instances");
        let first = attempt(&instances[0], 1);
        assert!(
            first.signal.is_some() || first.exit_code.is_some_and(|c| c != 0),
            "{first:?}"
        );
    }
    cluster.shutdown().await.expect("clean shutdown");
}

async fn fault_a_held_task_whose_worker_stays_away_fences_itself_before_its_retry() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = Scenario::new(Backend::MySql)
        .redis(RedisChoice::FromEnv)
        .heartbeats("300ms")
        .task_heartbeats("1s")
        .dead_after(10)
        .worker("w1")
        .start()
        .await;
    // Dead after 3 s: the holder fences at 3/4 of it from the worker's last contact.
    let command = script(&dir, "long", &effects, "echo \"line 1\"\nsleep 60");
    let run_id = apply_and_trigger(
        &client,
        &held_workflow(
            "away",
            "defaults: { retries: 1, retry_backoff: 100ms }",
            &[("long".into(), command)],
        ),
    )
    .await;
    let notes = wait_notes(&effects, "a start", |notes| {
        notes.iter().any(|n| n.what == "start")
    })
    .await;
    let pids = started_pids(&notes, |_| true);
    cluster.kill_worker("w1").await.expect("SIGKILL the worker");
    let left = wait_pids_gone(&pids, Duration::from_secs(20)).await;
    assert!(
        left.is_empty(),
        "the held task did not fence itself: {left:?}"
    );
    // The worker comes back after the node counted it dead: the retry runs, the first attempt
    // keeps the end its holder recorded.
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");
    wait_notes(&effects, "the retry's start", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 2
    })
    .await;
    client.cancel_run(run_id, "enough").await.expect("cancel");
    client.wait_run(run_id).await.expect("the run ends");
    // check_invariants proves that the retry never overlapped the fenced first attempt.
    let instances = check_invariants(&client, run_id, &effects, Lines::Unchecked).await;
    assert_eq!(instances[0].attempt, 2, "{}", summary(&instances));
    cluster.shutdown().await.expect("clean shutdown");
}

async fn a_worker_stopped_with_sigquit_drains_the_others_and_hands_held_tasks_over() {
    let Scene {
        mut cluster,
        client,
        effects,
        dir,
        worker,
        ..
    } = scenario().start().await;
    let held = script(&dir, "held", &effects, &numbered_lines(12, "0.3"));
    let plain = script(&dir, "plain", &effects, &numbered_lines(12, "0.08"));
    let yaml = held_workflow("upgrade", "", &[("held".into(), held)])
        + "\n"
        + &workflow("x", "", &[("plain".into(), plain)])
            .split_once("tasks:\n")
            .map(|(_, tasks)| tasks.to_string())
            .unwrap_or_default();
    let run_id = apply_and_trigger(&client, &yaml).await;
    let notes = wait_notes(&effects, "two starts", |notes| {
        notes.iter().filter(|n| n.what == "start").count() == 2
    })
    .await;
    let pids = started_pids(&notes, |_| true);
    let worker_pid = cluster.worker_pid("w1").expect("the worker's pid");
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(i32::try_from(worker_pid).expect("a pid"), libc::SIGQUIT) };
    let gone = wait_pids_gone(&[worker_pid], Duration::from_secs(20)).await;
    assert!(gone.is_empty(), "the worker did not stop on SIGQUIT");
    cluster.kill_worker("w1").await.expect("reap the worker");
    let notes = read_notes(&effects);
    let ended: Vec<u32> = notes
        .iter()
        .filter(|n| n.what == "end")
        .map(|n| n.pid)
        .collect();
    assert_eq!(
        ended.len(),
        1,
        "the plain task was drained, the held one not: {notes:?}"
    );
    let held_pid = pids
        .iter()
        .copied()
        .find(|pid| !ended.contains(pid))
        .expect("the held task's pid");
    assert!(pid_alive(held_pid), "the held task died with its worker");
    cluster
        .start_worker_with("w1", &worker)
        .expect("worker again");

    let run = client.wait_run(run_id).await.expect("the run ends");
    let instances = check_invariants(&client, run_id, &effects, Lines::Exactly(12)).await;
    assert_eq!(
        run.state(),
        pb::RunState::Success,
        "{}",
        summary(&instances)
    );
    every_attempt_first_and_succeeded(&instances);
    cluster.shutdown().await.expect("clean shutdown");
}
