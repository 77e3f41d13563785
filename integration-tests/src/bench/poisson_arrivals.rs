//! W9: open-loop Poisson arrivals of one-task runs (`sleep 0.05`) at 200/s and then 500/s, two
//! minutes each. The arrival clock never waits for the system: every trigger is its own tokio
//! task started at its precomputed arrival time, so a slow scheduler shows up as latency rather
//! than as a lower offered rate. Queue → start is the attempt's started_at − the instance's
//! created_at; arrival → start also counts the time the trigger call itself took.
//!
//! On MySQL it then offers 500/s for a minute to three workers behind one node and behind three
//! nodes (triggers spread over the nodes), and reports each with its busiest node's CPU.
//!
//! With `--sweep` it instead steps the rate up, 30 s a step, until the queue → start p99 passes
//! 100 ms: the last rate under that is the knee. Each step reports what the processes and the
//! store did (CPU of the node, the worker and a local MySQL server; commits, fsyncs and row lock
//! waits on MySQL), which names what saturates. Then it offers twice the rate that crossed for a
//! minute and compares the p99 of the arrivals in its first and last 20 s: past the knee, a
//! latency that keeps growing while the offered rate is steady is a collapse; triggers the node
//! refuses as overloaded are counted apart from errors.
//!
//! With `--nodes N` it runs only the cluster comparison, behind one node and behind N; with
//! `--sweep --nodes N` it sweeps both setups instead and reports the ratio of their knees (more
//! nodes must not lower it).
//!
//! With `--overload RATE` it offers RATE for a minute to the sweep's setup (one node, one worker
//! of 64), typically twice the knee, with the node's bounds on waiting instances as the
//! harness was given them (`--max-waiting`, `--max-waiting-per-app`; the product's defaults
//! otherwise). Refusals for load are counted as such; the accepted triggers' queue → start p99
//! is held to 1 s; and the store must hold exactly the accepted runs.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sqlx::{Connection, Row};

use super::{
    Checks, Cluster, ClusterSpec, Env, Measurement, StoreChoice, Target, cpu_seconds, percentile,
    store_server_pid, trigger, wall_ms, workflow_yaml,
};

const WORKFLOW: &str = "w9-arrivals";
/// The sweep stops at the first step whose queue → start p99 passes this.
const KNEE_P99_MS: f64 = 100.0;
const SWEEP_STEP: Duration = Duration::from_secs(30);
const SWEEP_RATES: &[f64] = &[
    100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 800.0, 1000.0, 1250.0, 1500.0, 2000.0, 2500.0, 3000.0,
];

/// What one phase of arrivals did.
struct Phase {
    label: String,
    offered: f64,
    /// Queue → start of each run's instance, in arrival order.
    queue: Vec<f64>,
    arrival: Vec<f64>,
    /// Runs that ended per second, from the first arrival to the last run's end.
    completed_per_s: f64,
    /// Runs the node created.
    accepted: usize,
    /// Triggers refused with RESOURCE_EXHAUSTED (the node shedding load).
    shed: usize,
    busiest_node_cpu: f64,
    worker_cpu: f64,
    store_cpu: Option<f64>,
    store: Option<StoreActivity>,
    lag_max: f64,
    tail: Tail,
}

/// Where the slowest hundredth of a phase's instances (queue → start at or past the p99) spent
/// their time, split at the attempt's dispatch, and how they fall in time: a tail spread over
/// the whole phase is a steady cost, one in a few seconds is a stall.
#[derive(Debug, Default)]
struct Tail {
    /// Median created → dispatched (in the queue, or until the transaction that placed it).
    to_dispatch: f64,
    /// Median dispatched → started (the send and the worker's spawn).
    from_dispatch: f64,
    /// Distinct seconds of the phase its instances were created in.
    seconds: usize,
}

impl Tail {
    fn of(instances: &[ax_proto::v1::Instance], p99: f64) -> Tail {
        let slow: Vec<(&ax_proto::v1::Instance, i64)> = instances
            .iter()
            .filter(|i| (i.started_at_ms - i.created_at_ms) as f64 >= p99)
            .filter_map(|i| i.attempts.first().map(|a| (i, a.dispatched_at_ms)))
            .collect();
        if slow.is_empty() {
            return Tail::default();
        }
        let to: Vec<f64> = slow
            .iter()
            .map(|(i, dispatched)| (dispatched - i.created_at_ms) as f64)
            .collect();
        let from: Vec<f64> = slow
            .iter()
            .map(|(i, dispatched)| (i.started_at_ms - dispatched) as f64)
            .collect();
        let seconds: std::collections::BTreeSet<i64> =
            slow.iter().map(|(i, _)| i.created_at_ms / 1000).collect();
        Tail {
            to_dispatch: percentile(&to, 50.0),
            from_dispatch: percentile(&from, 50.0),
            seconds: seconds.len(),
        }
    }
}

impl Phase {
    fn p(&self, q: f64) -> f64 {
        percentile(&self.queue, q)
    }

    /// The p99 of the arrivals of the phase's first and last third.
    fn p99_of_first_and_last_third(&self) -> (f64, f64) {
        let n = self.queue.len();
        if n == 0 {
            return (0.0, 0.0);
        }
        let third = (n / 3).max(1);
        (
            percentile(&self.queue[..third], 99.0),
            percentile(&self.queue[n - third..], 99.0),
        )
    }

    fn report(&self, m: &mut Measurement, p99_target: Option<f64>, cpu_target: bool) {
        let label = &self.label;
        m.figure(&format!("{label} offered rate"), "1/s", self.offered, None);
        m.figure(
            &format!("{label} runs ended per second"),
            "1/s",
            self.completed_per_s,
            None,
        );
        m.figure(
            &format!("{label} queue -> start p50"),
            "ms",
            self.p(50.0),
            None,
        );
        m.figure(
            &format!("{label} queue -> start p99"),
            "ms",
            self.p(99.0),
            p99_target.map(Target::AtMost),
        );
        m.figure(
            &format!("{label} tail (>= p99): created -> dispatched p50"),
            "ms",
            self.tail.to_dispatch,
            None,
        );
        m.figure(
            &format!("{label} tail (>= p99): dispatched -> started p50"),
            "ms",
            self.tail.from_dispatch,
            None,
        );
        m.figure(
            &format!("{label} tail (>= p99): seconds it was created in"),
            "",
            self.tail.seconds as f64,
            None,
        );
        m.figure(
            &format!("{label} arrival -> start p99"),
            "ms",
            percentile(&self.arrival, 99.0),
            None,
        );
        m.figure(
            &format!("{label} busiest node CPU"),
            "% of a core",
            self.busiest_node_cpu * 100.0,
            cpu_target.then_some(Target::AtMost(50.0)),
        );
        m.figure(
            &format!("{label} worker CPU"),
            "% of a core",
            self.worker_cpu * 100.0,
            None,
        );
        if let Some(cpu) = self.store_cpu {
            m.figure(
                &format!("{label} store server CPU"),
                "% of a core",
                cpu * 100.0,
                None,
            );
        }
        if let Some(store) = &self.store {
            m.figure(
                &format!("{label} store commits"),
                "1/s",
                store.commits,
                None,
            );
            m.figure(&format!("{label} store fsyncs"), "1/s", store.fsyncs, None);
            m.figure(
                &format!("{label} store row lock waits"),
                "1/s",
                store.lock_waits,
                None,
            );
        }
        if self.shed > 0 {
            m.figure(
                &format!("{label} triggers refused as overloaded"),
                "",
                self.shed as f64,
                None,
            );
        }
        m.figure(
            &format!("{label} harness arrival lag max"),
            "ms",
            self.lag_max,
            None,
        );
    }
}

/// What a MySQL server did over a phase, per second (server-wide counters).
struct StoreActivity {
    commits: f64,
    fsyncs: f64,
    lock_waits: f64,
}

async fn store_counters(server: &str) -> anyhow::Result<[f64; 3]> {
    let mut conn = sqlx::MySqlConnection::connect(server).await?;
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN \
         ('Handler_commit', 'Innodb_data_fsyncs', 'Innodb_row_lock_waits')",
    )
    .fetch_all(&mut conn)
    .await?;
    let _ = conn.close().await;
    let mut counters = [0.0; 3];
    for row in rows {
        let name: String = row.try_get(0)?;
        let value: String = row.try_get(1)?;
        let slot = match name.as_str() {
            "Handler_commit" => 0,
            "Innodb_data_fsyncs" => 1,
            _ => 2,
        };
        counters[slot] = value.parse().unwrap_or(0.0);
    }
    Ok(counters)
}

/// One phase of arrivals at `rate` on `cluster`; its figures are named `{prefix}@{rate}/s …`.
async fn phase(
    env: &Env,
    cluster: &mut Cluster,
    prefix: &str,
    rate: f64,
    duration: Duration,
    rng: &mut rand::rngs::StdRng,
    checks: &mut Checks,
) -> anyhow::Result<Phase> {
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
    let nodes = cluster.scheduler_pids();
    let workers = cluster.worker_pids();
    let server = match &env.store {
        StoreChoice::MySql(server) => Some(server.clone()),
        StoreChoice::Sqlite(_) => None,
    };
    let store_pid = server.as_ref().and_then(|_| store_server_pid());
    let cpu_of = |pids: &[u32]| -> anyhow::Result<Vec<f64>> {
        pids.iter().map(|pid| cpu_seconds(*pid)).collect()
    };
    let (nodes_before, workers_before) = (cpu_of(&nodes)?, cpu_of(&workers)?);
    let store_before = store_pid.map(cpu_seconds).transpose()?;
    let counters_before = match &server {
        Some(server) => Some(store_counters(server).await?),
        None => None,
    };
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
            (arrival_ms, trigger(&mut control, WORKFLOW).await)
        }));
    }
    let window = start.elapsed().as_secs_f64();
    let busiest_node_cpu = cpu_of(&nodes)?
        .iter()
        .zip(&nodes_before)
        .map(|(after, before)| (after - before) / window)
        .fold(0.0, f64::max);
    let worker_cpu = cpu_of(&workers)?
        .iter()
        .zip(&workers_before)
        .map(|(after, before)| (after - before) / window)
        .sum();
    let store_cpu = match (store_pid, store_before) {
        (Some(pid), Some(before)) => Some((cpu_seconds(pid)? - before) / window),
        _ => None,
    };
    let store = match (&server, counters_before) {
        (Some(server), Some(before)) => {
            let after = store_counters(server).await?;
            let per_s = |i: usize| (after[i] - before[i]) / window;
            Some(StoreActivity {
                commits: per_s(0),
                fsyncs: per_s(1),
                lock_waits: per_s(2),
            })
        }
        _ => None,
    };

    let mut runs = Vec::with_capacity(calls.len());
    let mut arrival_of = std::collections::HashMap::new();
    let (mut errors, mut shed) = (0usize, 0usize);
    let mut first_error = None;
    for call in calls {
        match call.await? {
            (arrival, Ok(run)) => {
                arrival_of.insert(run.id, arrival);
                runs.push(run.id);
            }
            (_, Err(err)) => {
                let overloaded = err
                    .downcast_ref::<tonic::Status>()
                    .is_some_and(|status| status.code() == tonic::Code::ResourceExhausted);
                if overloaded {
                    shed += 1;
                } else {
                    errors += 1;
                    first_error.get_or_insert_with(|| format!("{err:#}"));
                }
            }
        }
    }
    cluster.runs.extend(runs.iter().copied());
    checks.add(
        "every trigger was accepted or refused as overloaded",
        errors == 0,
        format!(
            "{errors} of {} triggers failed {label}: {}",
            arrivals.len(),
            first_error.unwrap_or_default()
        ),
    );
    cluster.wait_runs(&runs, Duration::from_secs(600)).await?;
    let mut instances = cluster.verify_runs(&runs, 1, true, true, checks).await?;
    instances.sort_by_key(|i| arrival_of.get(&i.run_id).copied().unwrap_or(i64::MAX));
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
    let last_end = instances
        .iter()
        .map(|i| i.finished_at_ms)
        .max()
        .unwrap_or(start_wall);
    let completed_per_s = instances.len() as f64 / ((last_end - start_wall).max(1) as f64 / 1000.0);
    let tail = Tail::of(&instances, percentile(&queue, 99.0));
    Ok(Phase {
        label,
        offered: arrivals.len() as f64 / duration.as_secs_f64(),
        accepted: runs.len(),
        queue,
        arrival,
        completed_per_s,
        shed,
        busiest_node_cpu,
        worker_cpu,
        store_cpu,
        store,
        lag_max,
        tail,
    })
}

/// A cluster of `spec` with the workflow every arrival triggers: one task, `sleep 0.05`.
async fn start(env: &Env, spec: &ClusterSpec) -> anyhow::Result<Cluster> {
    let cluster = env.start(spec).await?;
    let workflow = workflow_yaml(
        WORKFLOW,
        None,
        &[("nap".into(), "sleep 0.05".into(), Vec::new())],
    );
    cluster.apply(&workflow).await?;
    Ok(cluster)
}

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    if env.sweep {
        return match env.nodes {
            Some(nodes) => sweep_cluster(env, nodes).await,
            None => sweep(env).await,
        };
    }
    if let Some(rate) = env.overload {
        return overload(env, rate).await;
    }
    let phases: Vec<(f64, Duration, f64)> = if env.quick {
        vec![(20.0, Duration::from_secs(5), 20.0)]
    } else {
        vec![
            (200.0, Duration::from_secs(120), 20.0),
            (500.0, Duration::from_secs(120), 50.0),
        ]
    };
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    if env.nodes.is_none() {
        let mut cluster = start(env, &ClusterSpec::one_worker(64)).await?;
        for (rate, duration, p99_target) in phases {
            let measured =
                phase(env, &mut cluster, "", rate, duration, &mut rng, &mut checks).await?;
            measured.report(&mut m, Some(p99_target), rate <= 200.0);
        }
        cluster.shutdown().await?;
    }

    // On MySQL: the same arrivals at the higher rate on three workers behind one node, then
    // behind three nodes (or `--nodes`; triggers spread over the nodes).
    if matches!(env.store, StoreChoice::MySql(_)) {
        let many = env.nodes.unwrap_or(3);
        let (rate, duration) = if env.quick {
            (20.0, Duration::from_secs(5))
        } else {
            (500.0, Duration::from_secs(60))
        };
        for nodes in [1, many] {
            let prefix = setup_label(nodes);
            let mut cluster = start(env, &ClusterSpec::nodes(nodes, 3, 22)).await?;
            let measured = phase(
                env,
                &mut cluster,
                &prefix,
                rate,
                duration,
                &mut rng,
                &mut checks,
            )
            .await?;
            measured.report(&mut m, None, false);
            cluster.shutdown().await?;
        }
    }
    m.checks = checks.0;
    Ok(m)
}

/// Steps the rate up until the p99 passes `KNEE_P99_MS`, then offers twice that rate for a
/// minute to see what happens past the knee.
async fn sweep(env: &Env) -> anyhow::Result<Measurement> {
    let overload = if env.quick {
        Duration::from_secs(6)
    } else {
        Duration::from_secs(60)
    };
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut cluster = start(env, &ClusterSpec::one_worker(64)).await?;
    let (knee, crossed) = Steps::of(env)
        .climb(env, &mut cluster, "sweep ", &mut rng, &mut m, &mut checks)
        .await?;
    m.figure(
        "knee: highest rate with queue -> start p99 <= 100 ms",
        "1/s",
        knee.unwrap_or(0.0),
        None,
    );
    if let Some(rate) = crossed {
        let past = phase(
            env,
            &mut cluster,
            "past the knee ",
            2.0 * rate,
            overload,
            &mut rng,
            &mut checks,
        )
        .await?;
        past.report(&mut m, None, false);
        // The arrivals of the first and last third of the phase (20 s of a minute).
        let (first, last) = past.p99_of_first_and_last_third();
        m.figure(
            "past the knee: queue -> start p99, first 20 s",
            "ms",
            first,
            None,
        );
        m.figure(
            "past the knee: queue -> start p99, last 20 s",
            "ms",
            last,
            None,
        );
    } else {
        m.notes.push(format!(
            "the p99 stayed under {KNEE_P99_MS} ms up to the highest rate offered"
        ));
    }
    cluster.shutdown().await?;
    m.checks = checks.0;
    Ok(m)
}

/// The rates a sweep offers, each for `step`.
struct Steps<'a> {
    rates: &'a [f64],
    step: Duration,
}

impl Steps<'_> {
    fn of(env: &Env) -> Steps<'static> {
        if env.quick {
            Steps {
                rates: &[20.0, 40.0],
                step: Duration::from_secs(3),
            }
        } else {
            Steps {
                rates: SWEEP_RATES,
                step: SWEEP_STEP,
            }
        }
    }

    /// Offers each rate in turn until the p99 passes `KNEE_P99_MS`: (the highest rate that
    /// kept under it, the rate that crossed it).
    async fn climb(
        &self,
        env: &Env,
        cluster: &mut Cluster,
        label: &str,
        rng: &mut rand::rngs::StdRng,
        m: &mut Measurement,
        checks: &mut Checks,
    ) -> anyhow::Result<(Option<f64>, Option<f64>)> {
        let mut knee = None;
        for &rate in self.rates {
            let measured = phase(env, cluster, label, rate, self.step, rng, checks).await?;
            measured.report(m, None, false);
            if measured.p(99.0) > KNEE_P99_MS {
                return Ok((knee, Some(rate)));
            }
            knee = Some(rate);
        }
        Ok((knee, None))
    }
}

/// A figure's prefix for three workers of 22 behind `nodes` nodes.
fn setup_label(nodes: usize) -> String {
    let plural = if nodes == 1 { "" } else { "s" };
    format!("3 workers, {nodes} node{plural} ")
}

/// `--sweep --nodes N`: the knee of three workers of 22 behind one node, then behind `nodes`
/// nodes (triggers spread over them), and the ratio of the two.
async fn sweep_cluster(env: &Env, nodes: usize) -> anyhow::Result<Measurement> {
    anyhow::ensure!(
        matches!(env.store, StoreChoice::MySql(_)),
        "W9 --sweep --nodes needs a MySQL store (--store mysql://…)"
    );
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let steps = Steps::of(env);
    let mut knees = Vec::new();
    for n in [1, nodes] {
        let label = setup_label(n);
        let mut cluster = start(env, &ClusterSpec::nodes(n, 3, 22)).await?;
        let (knee, _) = steps
            .climb(
                env,
                &mut cluster,
                &format!("{label}sweep "),
                &mut rng,
                &mut m,
                &mut checks,
            )
            .await?;
        cluster.shutdown().await?;
        let knee = knee.unwrap_or(0.0);
        m.figure(
            &format!("{label}knee: highest rate with queue -> start p99 <= 100 ms"),
            "1/s",
            knee,
            None,
        );
        knees.push(knee);
    }
    if knees[0] > 0.0 {
        m.figure(
            &format!("knee with {nodes} nodes / with 1 node"),
            "",
            knees[1] / knees[0],
            Some(Target::AtLeast(1.0)),
        );
    }
    m.checks = checks.0;
    Ok(m)
}

/// Offers `rate` for a minute (6 s in quick mode) to one node and one worker of 64, the sweep's
/// setup: the accepted triggers' latency under the node's bounds on waiting instances, and the
/// refusals counted as refusals.
async fn overload(env: &Env, rate: f64) -> anyhow::Result<Measurement> {
    let duration = if env.quick {
        Duration::from_secs(6)
    } else {
        Duration::from_secs(60)
    };
    let mut m = Measurement::default();
    let mut checks = Checks::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut cluster = start(env, &ClusterSpec::one_worker(64)).await?;
    let measured = phase(
        env,
        &mut cluster,
        "overload ",
        rate,
        duration,
        &mut rng,
        &mut checks,
    )
    .await?;
    measured.report(&mut m, Some(1_000.0), false);
    m.figure(
        "overload: triggers accepted",
        "",
        measured.accepted as f64,
        None,
    );
    m.figure(
        "overload: triggers refused for load",
        "",
        measured.shed as f64,
        None,
    );
    let (first, last) = measured.p99_of_first_and_last_third();
    m.figure(
        "overload: accepted queue -> start p99, first third",
        "ms",
        first,
        None,
    );
    m.figure(
        "overload: accepted queue -> start p99, last third",
        "ms",
        last,
        None,
    );
    // Counted, not lost: the store holds the accepted runs and nothing else.
    let stored = stored_runs(&mut cluster).await?;
    checks.add(
        "the store holds exactly the accepted runs",
        stored == measured.accepted,
        format!(
            "{stored} runs stored, {} triggers accepted",
            measured.accepted
        ),
    );
    cluster.shutdown().await?;
    m.checks = checks.0;
    Ok(m)
}

/// The runs of the arrivals' workflow in the store, paged through `ListRuns`.
async fn stored_runs(cluster: &mut Cluster) -> anyhow::Result<usize> {
    let mut stored = 0;
    let mut before = 0;
    loop {
        let page = cluster
            .control
            .list_runs(ax_proto::v1::ListRunsRequest {
                workflow: WORKFLOW.into(),
                limit: 1_000,
                before_id: before,
                ..Default::default()
            })
            .await?
            .into_inner();
        stored += page.runs.len();
        if page.next_before_id == 0 {
            return Ok(stored);
        }
        before = page.next_before_id;
    }
}
