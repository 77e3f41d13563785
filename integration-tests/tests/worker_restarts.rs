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
