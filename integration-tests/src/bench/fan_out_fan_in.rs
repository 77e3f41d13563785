//! W3: fan-out / fan-in 1 → 1,000 → 1 of `true` tasks. Total wall time by the harness's clock
//! (trigger → run ended); the join is the sink's started_at − the last parent's finished_at,
//! also split at the sink's dispatch.

use std::time::{Duration, Instant};

use super::{Checks, ClusterSpec, Env, Measurement, Target, workflow_yaml};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let width: usize = if env.quick { 50 } else { 1_000 };
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    let parents: Vec<String> = (0..width).map(|i| format!("p{i:04}")).collect();
    let mut spec: Vec<(String, String, Vec<String>)> =
        vec![("source".into(), "true".into(), Vec::new())];
    spec.extend(
        parents
            .iter()
            .map(|p| (p.clone(), "true".to_string(), vec!["source".to_string()])),
    );
    spec.push(("sink".into(), "true".into(), parents.clone()));
    cluster.apply(&workflow_yaml("w3-fan", None, &spec)).await?;

    let started = Instant::now();
    let run = cluster.trigger("w3-fan").await?;
    cluster
        .wait_run(run.id, Duration::from_secs(300), Duration::from_millis(10))
        .await?;
    let wall = started.elapsed().as_secs_f64();

    let mut checks = Checks::default();
    let instances = cluster
        .verify_runs(&[run.id], width + 2, true, true, &mut checks)
        .await?;
    let last_parent_end = instances
        .iter()
        .filter(|i| i.task.starts_with('p'))
        .map(|i| i.finished_at_ms)
        .max()
        .unwrap_or(0);
    let sink = instances.iter().find(|i| i.task == "sink");
    let sink_start = sink.map(|i| i.started_at_ms).unwrap_or(0);
    // The sink's attempt is dispatched in the transaction that stores the last parent's end:
    // before it, the end's way to the node (the worker's report, the node's queue of report
    // batches); after it, the transaction, its commit, the send and the worker's spawn.
    let sink_dispatch = sink
        .and_then(|i| i.attempts.first())
        .map(|a| a.dispatched_at_ms)
        .unwrap_or(0);
    let mut m = Measurement::default();
    m.figure("total wall time", "s", wall, Some(Target::AtMost(1.5)));
    m.figure(
        "join: last parent end -> sink start",
        "ms",
        (sink_start - last_parent_end) as f64,
        Some(Target::AtMost(10.0)),
    );
    m.figure(
        "join, to the sink's dispatch (end reported, queued)",
        "ms",
        (sink_dispatch - last_parent_end) as f64,
        None,
    );
    m.figure(
        "join, from the sink's dispatch (stored, sent, spawned)",
        "ms",
        (sink_start - sink_dispatch) as f64,
        None,
    );
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
