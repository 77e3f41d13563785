//! W2: a linear chain of 100 `true` tasks. Per-hop latency = the next instance's started_at −
//! the previous instance's finished_at, from the API (millisecond timestamps).

use std::time::{Duration, Instant};

use super::{
    Checks, Cluster, ClusterSpec, Env, Measurement, Target, mean, percentile, workflow_yaml,
};

pub fn chain_length(env: &Env) -> usize {
    if env.quick { 10 } else { 100 }
}

/// Applies a chain workflow `t000 → t001 → …` named `name`.
pub async fn apply_chain(cluster: &Cluster, name: &str, length: usize) -> anyhow::Result<()> {
    let spec: Vec<(String, String, Vec<String>)> = (0..length)
        .map(|i| {
            let upstream = if i == 0 {
                Vec::new()
            } else {
                vec![format!("t{:03}", i - 1)]
            };
            (format!("t{i:03}"), "true".to_string(), upstream)
        })
        .collect();
    cluster.apply(&workflow_yaml(name, None, &spec)).await?;
    Ok(())
}

/// One chain run: its per-hop latencies (ms) and the harness's trigger → end time (s).
pub struct ChainRun {
    pub hops: Vec<f64>,
    pub wall: f64,
}

/// Triggers the chain, waits for it and checks it; the hops come from the API's timestamps.
pub async fn run_chain(
    cluster: &mut Cluster,
    name: &str,
    length: usize,
    checks: &mut Checks,
) -> anyhow::Result<ChainRun> {
    let started = Instant::now();
    let run = cluster.trigger(name).await?;
    cluster
        .wait_run(run.id, Duration::from_secs(300), Duration::from_millis(10))
        .await?;
    let wall = started.elapsed().as_secs_f64();
    let mut instances = cluster
        .verify_runs(&[run.id], length, true, true, checks)
        .await?;
    instances.sort_by(|a, b| a.task.cmp(&b.task));
    let hops = instances
        .windows(2)
        .map(|pair| (pair[1].started_at_ms - pair[0].finished_at_ms) as f64)
        .collect();
    Ok(ChainRun { hops, wall })
}

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let length = chain_length(env);
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    apply_chain(&cluster, "w2-chain", length).await?;
    let mut checks = Checks::default();
    let chain = run_chain(&mut cluster, "w2-chain", length, &mut checks).await?;
    let mut m = Measurement::default();
    m.figure(
        "per-hop latency median",
        "ms",
        percentile(&chain.hops, 50.0),
        Some(Target::AtMost(4.0)),
    );
    m.figure(
        "per-hop latency p99",
        "ms",
        percentile(&chain.hops, 99.0),
        Some(Target::AtMost(20.0)),
    );
    m.figure("per-hop latency mean", "ms", mean(&chain.hops), None);
    m.figure("chain trigger -> end", "s", chain.wall, None);
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
