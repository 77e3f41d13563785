//! W6: kill -9 of a worker running 20 `sleep 30` tasks while a second worker is idle. The figure
//! is the time from the SIGKILL until all 20 instances are RUNNING on the survivor; the checks
//! come from the attempt history (every attempt started at most once, the killed worker's
//! attempts never finished as SUCCESS beside a retry) and from /proc (the killed worker's task
//! processes were gone by the time their retries started, so two attempts never ran at once).
//!
//! Lost-worker detection may not exist in the scheduler under test: when the tasks do not move
//! within a timeout, the workload reports "not yet supported" and cancels the run instead of
//! hanging.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ax_proto::v1 as pb;

use super::{Checks, ClusterSpec, Env, Measurement, Target, workflow_yaml};
use crate::fault_kit::pid_alive as process_alive;

const VICTIM: &str = "bench-victim";
const SURVIVOR: &str = "bench-survivor";

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    // Quick mode shortens the heartbeat so a lost worker is detected in seconds, not 20 s.
    let (tasks, sleep, heartbeat, give_up) = if env.quick {
        (4usize, 6u32, Some("500ms"), Duration::from_secs(15))
    } else {
        (20usize, 30u32, None, Duration::from_secs(90))
    };
    let mut cluster = env
        .start(&ClusterSpec {
            workers: vec![(VICTIM.into(), tasks as u32)],
            heartbeat,
            nodes: 1,
        })
        .await?;
    let spec: Vec<(String, String, Vec<String>)> = (0..tasks)
        .map(|i| (format!("s{i:02}"), format!("sleep {sleep}"), Vec::new()))
        .collect();
    // A lost attempt counts as a failed one: one retry lets the instance run again elsewhere.
    let yaml = workflow_yaml("w6-failover", None, &spec).replacen(
        "tasks:\n",
        "defaults:\n  retries: 1\n  retry_backoff: 100ms\ntasks:\n",
        1,
    );
    cluster.apply(&yaml).await?;
    let run = cluster.trigger("w6-failover").await?;
    let running = wait_until(&cluster, run.id, Duration::from_secs(60), |instances| {
        instances.len() == tasks
            && instances
                .iter()
                .all(|i| i.state == pb::InstanceState::Running as i32 && i.worker_id == VICTIM)
    })
    .await?;
    anyhow::ensure!(
        running.is_some(),
        "the {tasks} tasks never all ran on {VICTIM}"
    );

    // The pids of the victim's task processes, to see whether they outlive it.
    let mut victim_pids: BTreeMap<i64, u32> = BTreeMap::new();
    for instance in cluster.list_instances(run.id).await? {
        let full = cluster
            .control()
            .get_instance(pb::GetInstanceRequest { id: instance.id })
            .await?
            .into_inner();
        if let Some(attempt) = full.attempts.iter().find(|a| a.worker_id == VICTIM) {
            victim_pids.insert(instance.id, attempt.pid);
        }
    }
    let mut m_notes = Vec::new();
    cluster.add_worker(SURVIVOR, tasks as u32)?;
    cluster.wait_for_workers(2, Duration::from_secs(30)).await?;

    let killed = Instant::now();
    cluster.kill_worker(VICTIM).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let orphans_after_kill = victim_pids
        .values()
        .filter(|pid| process_alive(**pid))
        .count();
    m_notes.push(format!(
        "1 s after kill -9 of the worker, {orphans_after_kill} of its {} task processes were still \
         running (a killed worker cannot fence its children)",
        victim_pids.len()
    ));
    let moved = wait_until(&cluster, run.id, give_up, |instances| {
        instances
            .iter()
            .all(|i| i.state == pb::InstanceState::Running as i32 && i.worker_id == SURVIVOR)
    })
    .await?;
    let mut m = Measurement {
        notes: m_notes,
        ..Measurement::default()
    };
    let mut checks = Checks::default();
    let orphans_alive = victim_pids
        .values()
        .filter(|pid| process_alive(**pid))
        .count();
    match moved {
        Some(at) => {
            m.figure(
                "kill -9 -> all running elsewhere",
                "s",
                at.duration_since(killed).as_secs_f64(),
                Some(Target::AtMost(25.0)),
            );
            checks.add(
                "the killed worker's task processes were gone when the retries started",
                orphans_alive == 0,
                format!(
                    "{orphans_alive} of {} `sleep` processes of the killed worker were still alive \
                     while their instances ran again on {SURVIVOR} (two attempts at once)",
                    victim_pids.len()
                ),
            );
            cluster
                .wait_run(
                    run.id,
                    Duration::from_secs(u64::from(sleep) + 60),
                    Duration::from_millis(200),
                )
                .await?;
            let instances = cluster
                .verify_runs(&[run.id], tasks, true, false, &mut checks)
                .await?;
            let mut bad = 0usize;
            for instance in &instances {
                let on_survivor = instance
                    .attempts
                    .iter()
                    .filter(|a| a.worker_id == SURVIVOR && a.started_at_ms > 0)
                    .count();
                let victim_success = instance
                    .attempts
                    .iter()
                    .any(|a| a.worker_id == VICTIM && a.state == pb::InstanceState::Success as i32);
                if on_survivor != 1 || victim_success || instance.attempts.len() > 2 {
                    bad += 1;
                }
            }
            checks.add(
                "each instance: the lost attempt, then exactly one attempt started on the survivor",
                bad == 0,
                format!("{bad} instances with another history"),
            );
        }
        None => {
            m.unsupported = Some(format!(
                "after kill -9 of {VICTIM} its {tasks} tasks did not run again on {SURVIVOR} within \
                 {give_up:?} (lost-worker detection)"
            ));
            // The run may have ended by itself meanwhile; cancelling an ended run is refused.
            let _ = cluster
                .control()
                .cancel_run(pb::CancelRunRequest {
                    id: run.id,
                    actor: "ax-bench".into(),
                    reason: "W6 gave up waiting for lost-worker detection".into(),
                })
                .await;
            cluster
                .wait_run(run.id, Duration::from_secs(30), Duration::from_millis(100))
                .await?;
        }
    }
    // The victim's children were orphaned by SIGKILL; do not leave them to the next workload.
    for pid in victim_pids.values() {
        if process_alive(*pid) && is_sleep(*pid) {
            // SAFETY: kill(2) of a process we just verified is one of the victim's `sleep`s.
            unsafe {
                libc::kill(*pid as i32, libc::SIGKILL);
            }
        }
    }
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}

fn is_sleep(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmd| String::from_utf8_lossy(&cmd).contains("sleep"))
        .unwrap_or(false)
}

/// Polls the run's instances until `done` holds (returns when) or `timeout` passes (`None`).
async fn wait_until(
    cluster: &super::Cluster,
    run: i64,
    timeout: Duration,
    done: impl Fn(&[pb::Instance]) -> bool,
) -> anyhow::Result<Option<Instant>> {
    let deadline = Instant::now() + timeout;
    loop {
        let instances = cluster.list_instances(run).await?;
        if done(&instances) {
            return Ok(Some(Instant::now()));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
