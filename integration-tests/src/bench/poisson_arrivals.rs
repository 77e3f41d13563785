//! W9: open-loop Poisson arrivals of one-task runs (`sleep 0.05`) at 200/s and then 500/s, two
//! minutes each. The arrival clock never waits for the system: every trigger is its own tokio
//! task started at its precomputed arrival time, so a slow scheduler shows up as latency rather
//! than as a lower offered rate. Queue → start is the attempt's started_at − the instance's
//! created_at; arrival → start also counts the time the trigger call itself took.
//!
//! On MySQL it then offers 500/s for a minute to three workers behind one node and behind three
//! nodes (triggers spread over the nodes), and reports each with its busiest node's CPU.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::{
    Checks, Cluster, ClusterSpec, Env, Measurement, StoreChoice, Target, cpu_seconds, percentile,
    trigger, wall_ms, workflow_yaml,
};

/// One phase of arrivals at `rate` on `cluster`; its figures are named `{prefix}@{rate}/s …`.
#[allow(clippy::too_many_arguments)]
async fn phase(
    cluster: &mut Cluster,
    prefix: &str,
    rate: f64,
    duration: Duration,
    p99_target: Option<f64>,
    rng: &mut rand::rngs::StdRng,
    checks: &mut Checks,
    m: &mut Measurement,
) -> anyhow::Result<()> {
    let label = format!("{prefix}@{rate:.0}/s");
    let mut arrivals = Vec::new();
    let mut t = 0.0f64;
    loop {
        // Exponential gaps: 1 − U is in (0, 1], so the logarithm is finite.
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if t >= duration.as_secs_f64() {
            break;
        }
        arrivals.push(t);
    }
    // Triggers go to every node in turn, as clients behind a load balancer would.
    let mut controls = Vec::new();
    for endpoint in &cluster.endpoints {
        controls.push(super::connect(endpoint).await?);
    }
    let pids = cluster.scheduler_pids();
    let cpu_before: Vec<f64> = pids
        .iter()
        .map(|pid| cpu_seconds(*pid))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let start_wall = wall_ms();
    let mut lag_max = 0.0f64;
    let mut calls = Vec::with_capacity(arrivals.len());
    for (n, at) in arrivals.iter().enumerate() {
        let due = start + Duration::from_secs_f64(*at);
        tokio::time::sleep_until(due.into()).await;
        lag_max = lag_max.max(due.elapsed().as_secs_f64() * 1000.0);
        let mut control = controls[n % controls.len()].clone();
        let arrival_ms = start_wall + (*at * 1000.0) as i64;
        calls.push(tokio::spawn(async move {
            (arrival_ms, trigger(&mut control, "w9-arrivals").await)
        }));
    }
    let window = start.elapsed().as_secs_f64();
    let mut cpu = Vec::with_capacity(pids.len());
    for (pid, before) in pids.iter().zip(cpu_before) {
        cpu.push((cpu_seconds(*pid)? - before) / window);
    }

    let mut runs = Vec::with_capacity(calls.len());
    let mut arrival_of = std::collections::HashMap::new();
    let mut errors = 0usize;
    for call in calls {
        match call.await? {
            (arrival, Ok(run)) => {
                arrival_of.insert(run.id, arrival);
                runs.push(run.id);
            }
            (_, Err(_)) => errors += 1,
        }
    }
    cluster.runs.extend(runs.iter().copied());
    checks.add(
        "every trigger was accepted",
        errors == 0,
        format!("{errors} of {} triggers failed {label}", arrivals.len()),
    );
    cluster.wait_runs(&runs, Duration::from_secs(600)).await?;
    let instances = cluster.verify_runs(&runs, 1, true, true, checks).await?;
    let queue: Vec<f64> = instances
        .iter()
        .map(|i| (i.started_at_ms - i.created_at_ms) as f64)
        .collect();
    let arrival: Vec<f64> = instances
        .iter()
        .filter_map(|i| {
            arrival_of
                .get(&i.run_id)
                .map(|a| (i.started_at_ms - a) as f64)
        })
        .collect();
    m.figure(
        &format!("{label} offered rate"),
        "1/s",
        arrivals.len() as f64 / duration.as_secs_f64(),
        None,
    );
    m.figure(
        &format!("{label} queue -> start p50"),
        "ms",
        percentile(&queue, 50.0),
        None,
    );
    m.figure(
        &format!("{label} queue -> start p99"),
        "ms",
        percentile(&queue, 99.0),
        p99_target.map(Target::AtMost),
    );
    m.figure(
        &format!("{label} arrival -> start p99"),
        "ms",
        percentile(&arrival, 99.0),
        None,
    );
    let busiest = cpu.iter().copied().fold(0.0, f64::max);
    m.figure(
        &format!("{label} busiest node CPU"),
        "% of a core",
        busiest * 100.0,
        (rate <= 200.0 && prefix.is_empty()).then_some(Target::AtMost(50.0)),
    );
    m.figure(
        &format!("{label} harness arrival lag max"),
        "ms",
        lag_max,
        None,
    );
    Ok(())
}

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let phases: Vec<(f64, Duration, f64)> = if env.quick {
        vec![(20.0, Duration::from_secs(5), 20.0)]
    } else {
        vec![
            (200.0, Duration::from_secs(120), 20.0),
            (500.0, Duration::from_secs(120), 50.0),
        ]
    };
    let workflow = workflow_yaml(
        "w9-arrivals",
        None,
        &[("nap".into(), "sleep 0.05".into(), Vec::new())],
    );
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    cluster.apply(&workflow).await?;
    for (rate, duration, p99_target) in phases {
        phase(
            &mut cluster,
            "",
            rate,
            duration,
            Some(p99_target),
            &mut rng,
            &mut checks,
            &mut m,
        )
        .await?;
    }
    cluster.shutdown().await?;

    // On MySQL: the same arrivals at the higher rate on three workers behind one node, then
    // behind three nodes (triggers spread over the nodes).
    if matches!(env.store, StoreChoice::MySql(_)) {
        let (rate, duration) = if env.quick {
            (20.0, Duration::from_secs(5))
        } else {
            (500.0, Duration::from_secs(60))
        };
        for (nodes, prefix) in [(1, "3 workers, 1 node "), (3, "3 workers, 3 nodes ")] {
            let mut cluster = env.start(&ClusterSpec::nodes(nodes, 3, 22)).await?;
            cluster.apply(&workflow).await?;
            phase(
                &mut cluster,
                prefix,
                rate,
                duration,
                None,
                &mut rng,
                &mut checks,
                &mut m,
            )
            .await?;
            cluster.shutdown().await?;
        }
    }
    m.checks = checks.0;
    Ok(m)
}
