//! W10, the seed's load test: three scheduler nodes on MySQL, ten workers of capacity 20 given
//! every node, and 5,000 runs of a 10-task ETL-shaped DAG (an extract fanning out to four
//! cleaners, a join, then a chain of four) — 50,000 tasks, each printing 20 lines — triggered
//! open-loop over 60 s and spread over the nodes. Figures: completion after the last trigger
//! (target: within 30 s, i.e. it keeps up), queue → start p50/p99, the advance per hop (an
//! instance's creation − its last upstream's end) p99, each node's CPU, log lines stored per
//! second; the checks: every task SUCCESS once and every line stored.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{
    Checks, ClusterSpec, Env, Measurement, StoreChoice, Target, connect, cpu_seconds, percentile,
    trigger, wall_ms, workflow_yaml,
};

/// The DAG: (task, upstream tasks).
const TASKS: [(&str, &[&str]); 10] = [
    ("extract", &[]),
    ("clean_a", &["extract"]),
    ("clean_b", &["extract"]),
    ("clean_c", &["extract"]),
    ("clean_d", &["extract"]),
    ("join", &["clean_a", "clean_b", "clean_c", "clean_d"]),
    ("enrich", &["join"]),
    ("load", &["enrich"]),
    ("verify", &["load"]),
    ("report", &["verify"]),
];
const LINES_PER_TASK: u64 = 20;

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let mut m = Measurement::default();
    if !matches!(env.store, StoreChoice::MySql(_)) {
        m.unsupported = Some("W10 runs three scheduler nodes, which needs MySQL (--store)".into());
        return Ok(m);
    }
    let (runs_total, window) = if env.quick {
        (50usize, Duration::from_secs(5))
    } else {
        (5_000usize, Duration::from_secs(60))
    };
    let mut cluster = env.start(&ClusterSpec::nodes(3, 10, 20)).await?;
    let spec: Vec<(String, String, Vec<String>)> = TASKS
        .iter()
        .map(|(task, upstream)| {
            (
                task.to_string(),
                format!("seq -f 'line %g' {LINES_PER_TASK}"),
                upstream.iter().map(|u| u.to_string()).collect(),
            )
        })
        .collect();
    cluster
        .apply(&workflow_yaml("w10-etl", None, &spec))
        .await?;
    let mut controls = Vec::new();
    for endpoint in &cluster.endpoints {
        controls.push(connect(endpoint).await?);
    }

    let pids = cluster.scheduler_pids();
    let cpu_before: Vec<f64> = pids
        .iter()
        .map(|pid| cpu_seconds(*pid))
        .collect::<Result<_, _>>()?;
    let gap = window.as_secs_f64() / runs_total as f64;
    let start = Instant::now();
    let first_trigger_ms = wall_ms();
    let mut calls = Vec::with_capacity(runs_total);
    for n in 0..runs_total {
        let due = start + Duration::from_secs_f64(gap * n as f64);
        tokio::time::sleep_until(due.into()).await;
        let mut control = controls[n % controls.len()].clone();
        calls.push(tokio::spawn(async move {
            trigger(&mut control, "w10-etl").await
        }));
    }
    let mut runs = Vec::with_capacity(runs_total);
    let mut errors = 0usize;
    for call in calls {
        match call.await? {
            Ok(run) => runs.push(run.id),
            Err(_) => errors += 1,
        }
    }
    let last_trigger_ms = wall_ms();
    let triggered_over = (last_trigger_ms - first_trigger_ms) as f64 / 1000.0;
    let mut checks = Checks::default();
    checks.add(
        "every trigger was accepted",
        errors == 0,
        format!("{errors} of {runs_total} triggers failed"),
    );
    cluster.runs.extend(runs.iter().copied());
    let ended = cluster.wait_runs(&runs, Duration::from_secs(1_200)).await?;
    // From the store's end times, so the harness's polling adds nothing to the figure.
    let last_end_ms = ended
        .iter()
        .map(|run| run.finished_at_ms)
        .max()
        .unwrap_or(0);
    let after_last = (last_end_ms - last_trigger_ms) as f64 / 1000.0;
    let elapsed = start.elapsed().as_secs_f64();
    let span = (last_end_ms - first_trigger_ms) as f64 / 1000.0;
    let mut node_cpu = Vec::with_capacity(pids.len());
    for (pid, before) in pids.iter().zip(cpu_before) {
        node_cpu.push((cpu_seconds(*pid)? - before) / elapsed);
    }

    let instances = cluster
        .verify_runs(&runs, TASKS.len(), true, true, &mut checks)
        .await?;
    let lines: u64 = instances
        .iter()
        .filter_map(|i| i.attempts.last().map(|a| a.log_lines))
        .sum();
    let expected_lines = runs.len() as u64 * TASKS.len() as u64 * LINES_PER_TASK;
    checks.add(
        "every line of every task stored",
        lines == expected_lines,
        format!("{lines} of {expected_lines} lines"),
    );
    let queue: Vec<f64> = instances
        .iter()
        .filter_map(|i| {
            i.attempts
                .first()
                .map(|a| (a.started_at_ms - i.created_at_ms) as f64)
        })
        .collect();
    // The advance: from the last upstream's end to the downstream instance's creation.
    let mut by_run: HashMap<i64, HashMap<&str, &ax_proto::v1::Instance>> = HashMap::new();
    for instance in &instances {
        by_run
            .entry(instance.run_id)
            .or_default()
            .insert(instance.task.as_str(), instance);
    }
    let mut hops = Vec::new();
    for tasks in by_run.values() {
        for (task, upstream) in TASKS.iter().filter(|(_, up)| !up.is_empty()) {
            let ended = upstream
                .iter()
                .filter_map(|u| tasks.get(u))
                .filter_map(|u| u.attempts.last().map(|a| a.finished_at_ms))
                .max();
            if let (Some(instance), Some(ended)) = (tasks.get(task), ended) {
                hops.push((instance.created_at_ms - ended) as f64);
            }
        }
    }

    m.figure(
        "completion after the last trigger",
        "s",
        after_last,
        Some(Target::AtMost(30.0)),
    );
    m.figure(
        "tasks/s over the whole test",
        "1/s",
        instances.len() as f64 / span,
        None,
    );
    m.figure("queue -> start p50", "ms", percentile(&queue, 50.0), None);
    m.figure("queue -> start p99", "ms", percentile(&queue, 99.0), None);
    m.figure("advance per hop p99", "ms", percentile(&hops, 99.0), None);
    for (n, cpu) in node_cpu.iter().enumerate() {
        m.figure(
            &format!("node {} CPU", n + 1),
            "% of a core",
            cpu * 100.0,
            None,
        );
    }
    m.figure("log lines stored/s", "1/s", lines as f64 / span, None);
    m.figure("runs triggered over", "s", triggered_over, None);
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
