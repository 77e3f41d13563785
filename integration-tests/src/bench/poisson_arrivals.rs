//! W9: open-loop Poisson arrivals of one-task runs (`sleep 0.05`) at 200/s and then 500/s, two
//! minutes each. The arrival clock never waits for the system: every trigger is its own tokio
//! task started at its precomputed arrival time, so a slow scheduler shows up as latency rather
//! than as a lower offered rate. Queue → start is the attempt's started_at − the instance's
//! created_at; arrival → start also counts the time the trigger call itself took.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::{
    Checks, ClusterSpec, Env, Measurement, Target, cpu_seconds, percentile, trigger, wall_ms,
    workflow_yaml,
};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let phases: Vec<(f64, Duration, f64)> = if env.quick {
        vec![(20.0, Duration::from_secs(5), 20.0)]
    } else {
        vec![
            (200.0, Duration::from_secs(120), 20.0),
            (500.0, Duration::from_secs(120), 50.0),
        ]
    };
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    let scheduler = cluster.scheduler_pid()?;
    cluster
        .apply(&workflow_yaml(
            "w9-arrivals",
            None,
            &[("nap".into(), "sleep 0.05".into(), Vec::new())],
        ))
        .await?;
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for (rate, duration, p99_target) in phases {
        let label = format!("@{rate:.0}/s");
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

        let cpu_before = cpu_seconds(scheduler)?;
        let start = Instant::now();
        let start_wall = wall_ms();
        let mut lag_max = 0.0f64;
        let mut calls = Vec::with_capacity(arrivals.len());
        for at in &arrivals {
            let due = start + Duration::from_secs_f64(*at);
            tokio::time::sleep_until(due.into()).await;
            lag_max = lag_max.max(due.elapsed().as_secs_f64() * 1000.0);
            let mut control = cluster.control();
            let arrival_ms = start_wall + (*at * 1000.0) as i64;
            calls.push(tokio::spawn(async move {
                (arrival_ms, trigger(&mut control, "w9-arrivals").await)
            }));
        }
        let window = start.elapsed().as_secs_f64();
        let cpu = (cpu_seconds(scheduler)? - cpu_before) / window;

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
        let instances = cluster
            .verify_runs(&runs, 1, true, true, &mut checks)
            .await?;
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
            Some(Target::AtMost(p99_target)),
        );
        m.figure(
            &format!("{label} arrival -> start p99"),
            "ms",
            percentile(&arrival, 99.0),
            None,
        );
        m.figure(
            &format!("{label} scheduler CPU"),
            "% of a core",
            cpu * 100.0,
            (rate <= 200.0).then_some(Target::AtMost(50.0)),
        );
        m.figure(
            &format!("{label} harness arrival lag max"),
            "ms",
            lag_max,
            None,
        );
    }
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
