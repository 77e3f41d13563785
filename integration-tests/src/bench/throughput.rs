//! W1: 10,000 independent `true` tasks in one workflow, triggered at once; one scheduler and one
//! worker of capacity 64. Throughput is the harness's clock from trigger to the run's end;
//! queue → start is each attempt's started_at − its instance's created_at (when it became
//! WAITING), from the API; dispatch → start is its part after the scheduler handed the attempt
//! to the worker.

use std::time::{Duration, Instant};

use super::{Checks, ClusterSpec, Env, Measurement, Target, percentile, workflow_yaml};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let tasks: usize = if env.quick { 200 } else { 10_000 };
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    let spec: Vec<(String, String, Vec<String>)> = (0..tasks)
        .map(|i| (format!("t{i:05}"), "true".to_string(), Vec::new()))
        .collect();
    cluster
        .apply(&workflow_yaml("w1-independent", None, &spec))
        .await?;

    let started = Instant::now();
    let run = cluster.trigger("w1-independent").await?;
    cluster
        .wait_run(run.id, Duration::from_secs(600), Duration::from_millis(25))
        .await?;
    let elapsed = started.elapsed().as_secs_f64();

    let mut checks = Checks::default();
    let instances = cluster
        .verify_runs(&[run.id], tasks, true, true, &mut checks)
        .await?;
    let queue_to_start: Vec<f64> = instances
        .iter()
        .filter_map(|i| {
            i.attempts
                .first()
                .map(|a| (a.started_at_ms - i.created_at_ms) as f64)
        })
        .collect();
    // The part of it after the scheduler handed the attempt to the worker: delivery and spawn,
    // without the wait for a free slot.
    let dispatch_to_start: Vec<f64> = instances
        .iter()
        .filter_map(|i| {
            i.attempts
                .first()
                .map(|a| (a.started_at_ms - a.dispatched_at_ms) as f64)
        })
        .collect();

    let mut m = Measurement::default();
    m.figure(
        "tasks/s trigger -> all SUCCESS",
        "1/s",
        tasks as f64 / elapsed,
        Some(Target::AtLeast(1_500.0)),
    );
    m.figure(
        "queue -> start p50",
        "ms",
        percentile(&queue_to_start, 50.0),
        None,
    );
    m.figure(
        "queue -> start p99",
        "ms",
        percentile(&queue_to_start, 99.0),
        Some(Target::AtMost(100.0)),
    );
    m.figure(
        "dispatch -> start p50",
        "ms",
        percentile(&dispatch_to_start, 50.0),
        None,
    );
    m.figure(
        "dispatch -> start p99",
        "ms",
        percentile(&dispatch_to_start, 99.0),
        None,
    );
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
