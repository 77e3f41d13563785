//! W1: 10,000 independent `true` tasks in one workflow, triggered at once; one scheduler and one
//! worker of capacity 64. Throughput is the harness's clock from trigger to the run's end;
//! queue → start is each attempt's started_at − its instance's created_at (when it became
//! WAITING), from the API; dispatch → start is its part after the scheduler handed the attempt
//! to the worker.
//!
//! W1H is the one-worker pass with every task asking to survive a worker restart
//! (`survive_worker_restart: true`): each attempt then costs a holder process, and the figure
//! beside W1's in the same invocation is that cost.
//!
//! On MySQL it then runs the same tasks on three workers of capacity 22 behind one node and
//! behind three nodes, in the same invocation, and reports both rates, their ratio and each
//! node's CPU, which says whether the nodes or the store are the ceiling.

use std::time::{Duration, Instant};

use super::{
    Checks, ClusterSpec, Env, Measurement, StoreChoice, Target, cpu_seconds, percentile,
    store_server_pid, workflow_yaml,
};

/// One W1 pass on a cluster.
struct Pass {
    tasks_per_s: f64,
    queue_to_start: Vec<f64>,
    dispatch_to_start: Vec<f64>,
    /// Each node's CPU over the pass, in cores.
    node_cpu: Vec<f64>,
    /// The workers' CPU (without their tasks) and a local MySQL server's, in cores.
    worker_cpu: f64,
    store_cpu: Option<f64>,
}

async fn pass(
    env: &Env,
    spec: &ClusterSpec,
    tasks: usize,
    held: bool,
    checks: &mut Checks,
) -> anyhow::Result<Pass> {
    let mut cluster = env.start(spec).await?;
    let spec: Vec<(String, String, Vec<String>)> = (0..tasks)
        .map(|i| (format!("t{i:05}"), "true".to_string(), Vec::new()))
        .collect();
    let mut yaml = workflow_yaml("w1-independent", None, &spec);
    if held {
        yaml = yaml.replace(
            "    command: \"true\"\n",
            "    command: \"true\"\n    survive_worker_restart: true\n",
        );
    }
    cluster.apply(&yaml).await?;

    let pids = cluster.scheduler_pids();
    let cpu_before: Vec<f64> = pids
        .iter()
        .map(|pid| cpu_seconds(*pid))
        .collect::<Result<_, _>>()?;
    let workers = cluster.worker_pids();
    let workers_before: Vec<f64> = workers
        .iter()
        .map(|pid| cpu_seconds(*pid))
        .collect::<Result<_, _>>()?;
    let store_pid = matches!(env.store, StoreChoice::MySql(_))
        .then(store_server_pid)
        .flatten();
    let store_before = store_pid.map(cpu_seconds).transpose()?;
    let started = Instant::now();
    let run = cluster.trigger("w1-independent").await?;
    cluster
        .wait_run(run.id, Duration::from_secs(600), Duration::from_millis(25))
        .await?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut node_cpu = Vec::with_capacity(pids.len());
    for (pid, before) in pids.iter().zip(cpu_before) {
        node_cpu.push((cpu_seconds(*pid)? - before) / elapsed);
    }
    let mut worker_cpu = 0.0;
    for (pid, before) in workers.iter().zip(workers_before) {
        worker_cpu += (cpu_seconds(*pid)? - before) / elapsed;
    }
    let store_cpu = match (store_pid, store_before) {
        (Some(pid), Some(before)) => Some((cpu_seconds(pid)? - before) / elapsed),
        _ => None,
    };

    let instances = cluster
        .verify_runs(&[run.id], tasks, true, true, checks)
        .await?;
    let queue_to_start = instances
        .iter()
        .filter_map(|i| {
            i.attempts
                .first()
                .map(|a| (a.started_at_ms - i.created_at_ms) as f64)
        })
        .collect();
    // The part of it after the scheduler handed the attempt to the worker: delivery and spawn,
    // without the wait for a free slot.
    let dispatch_to_start = instances
        .iter()
        .filter_map(|i| {
            i.attempts
                .first()
                .map(|a| (a.started_at_ms - a.dispatched_at_ms) as f64)
        })
        .collect();
    cluster.shutdown().await?;
    Ok(Pass {
        tasks_per_s: tasks as f64 / elapsed,
        queue_to_start,
        dispatch_to_start,
        node_cpu,
        worker_cpu,
        store_cpu,
    })
}

/// W1H: W1's one-worker pass, every task held (see the module's doc).
pub async fn run_held(env: &Env) -> anyhow::Result<Measurement> {
    let tasks = tasks(env.quick);
    let mut checks = Checks::default();
    let held = pass(env, &ClusterSpec::one_worker(64), tasks, true, &mut checks).await?;
    let mut m = Measurement::default();
    m.figure(
        "tasks/s trigger -> all SUCCESS",
        "1/s",
        held.tasks_per_s,
        None,
    );
    m.figure(
        "dispatch -> start p50",
        "ms",
        percentile(&held.dispatch_to_start, 50.0),
        None,
    );
    m.figure(
        "worker CPU (without its tasks)",
        "% of a core",
        held.worker_cpu * 100.0,
        None,
    );
    m.checks = checks.0;
    Ok(m)
}

/// Tasks of the one-worker pass (W12 maps over as many items, to compare with it).
pub fn tasks(quick: bool) -> usize {
    if quick { 200 } else { 10_000 }
}

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let tasks = tasks(env.quick);
    let mut checks = Checks::default();
    let single = pass(env, &ClusterSpec::one_worker(64), tasks, false, &mut checks).await?;

    let mut m = Measurement::default();
    m.figure(
        "tasks/s trigger -> all SUCCESS",
        "1/s",
        single.tasks_per_s,
        Some(Target::AtLeast(1_500.0)),
    );
    m.figure(
        "queue -> start p50",
        "ms",
        percentile(&single.queue_to_start, 50.0),
        None,
    );
    m.figure(
        "queue -> start p99",
        "ms",
        percentile(&single.queue_to_start, 99.0),
        Some(Target::AtMost(100.0)),
    );
    m.figure(
        "dispatch -> start p50",
        "ms",
        percentile(&single.dispatch_to_start, 50.0),
        None,
    );
    m.figure(
        "dispatch -> start p99",
        "ms",
        percentile(&single.dispatch_to_start, 99.0),
        None,
    );
    m.figure(
        "scheduler CPU",
        "% of a core",
        single.node_cpu.iter().sum::<f64>() * 100.0,
        None,
    );
    m.figure(
        "worker CPU (without its tasks)",
        "% of a core",
        single.worker_cpu * 100.0,
        None,
    );
    if let Some(cpu) = single.store_cpu {
        m.figure("store server CPU", "% of a core", cpu * 100.0, None);
    }

    if matches!(env.store, StoreChoice::MySql(_)) {
        let one = pass(
            env,
            &ClusterSpec::nodes(1, 3, 22),
            tasks,
            false,
            &mut checks,
        )
        .await?;
        let three = pass(
            env,
            &ClusterSpec::nodes(3, 3, 22),
            tasks,
            false,
            &mut checks,
        )
        .await?;
        for (label, result) in [("1 node", &one), ("3 nodes", &three)] {
            m.figure(
                &format!("3 workers, {label}: tasks/s"),
                "1/s",
                result.tasks_per_s,
                None,
            );
            m.figure(
                &format!("3 workers, {label}: queue -> start p99"),
                "ms",
                percentile(&result.queue_to_start, 99.0),
                None,
            );
            let busiest = result.node_cpu.iter().copied().fold(0.0, f64::max);
            m.figure(
                &format!("3 workers, {label}: busiest node CPU"),
                "% of a core",
                busiest * 100.0,
                None,
            );
        }
        m.figure(
            "3 workers: 3 nodes / 1 node",
            "x",
            three.tasks_per_s / one.tasks_per_s,
            None,
        );
    }
    m.checks = checks.0;
    Ok(m)
}
