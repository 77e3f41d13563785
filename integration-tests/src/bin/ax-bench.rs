//! `ax-bench`: the benchmark harness. Starts real `ax-scheduler` and `ax-worker` processes
//! against a chosen store, runs the workloads S0, W1–W12 and U1 (BENCHMARKS.md) through the public
//! gRPC API, and prints one table (median, min, max, target, pass/miss) and optionally JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ax_integration_tests::bench::report::{self, BenchReport, WorkloadReport};
use ax_integration_tests::bench::{self, Env, StoreChoice, Target};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "ax-bench",
    about = "Benchmarks ax with real processes (see BENCHMARKS.md)"
)]
struct Args {
    /// Workloads to run: S0, W1 … W12, U1, comma separated, or all.
    #[arg(long, default_value = "all")]
    workload: String,
    /// Runs of each workload; the table shows their median, min and max.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// sqlite (a fresh file per run, the default), sqlite://DIR, or mysql://USER@HOST:PORT
    /// (a database of its own is created and dropped per run).
    #[arg(long)]
    store: Option<String>,
    /// Redis for start locks and dedup markers (in-process guards without it).
    #[arg(long)]
    redis: Option<String>,
    /// Small sizes that finish in seconds: a smoke test of the harness, not a benchmark.
    #[arg(long)]
    quick: bool,
    /// W9 only: step the arrival rate up (30 s a step) until queue -> start p99 passes 100 ms,
    /// then hold twice that rate for a minute (the knee, and what happens past it).
    #[arg(long)]
    sweep: bool,
    /// W9 only: offer this many triggers a second for a minute to one node and one worker of
    /// 64 (the sweep's setup), e.g. twice the knee; report the accepted triggers' queue -> start
    /// and count the ones refused for load (as refusals, not errors).
    #[arg(long, value_name = "RATE", conflicts_with = "sweep")]
    overload: Option<f64>,
    /// W9 only: compare 3 workers of 22 behind one node with the same workers behind N nodes
    /// (triggers spread over the nodes) and nothing else: at 500/s for a minute each, or with
    /// `--sweep` each setup's knee.
    #[arg(long, value_name = "N", conflicts_with = "overload")]
    nodes: Option<usize>,
    /// The schedulers' --max-waiting (instances waiting in the cluster before API triggers are
    /// refused; 0: no bound). Unset: the product's default.
    #[arg(long, value_name = "N")]
    max_waiting: Option<u64>,
    /// The schedulers' --max-waiting-per-app (0: no bound). Unset: the product's default.
    #[arg(long, value_name = "N")]
    max_waiting_per_app: Option<u64>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where ax-scheduler and ax-worker are (default: the directory of this executable, i.e.
    /// target/release for a release build).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Keep the scratch directory (stores and process logs) and the MySQL databases instead of
    /// deleting them.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("ax-bench: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// Returns whether every workload completed with all correctness checks passing (speed misses
/// do not fail the run; "not yet supported" workloads do not either).
async fn run(args: Args) -> anyhow::Result<bool> {
    let workloads = bench::parse_workloads(&args.workload)?;
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("locating the harness's directory")?
            .to_path_buf(),
    };
    for name in ["ax-scheduler", "ax-worker"] {
        anyhow::ensure!(
            bin_dir.join(name).exists(),
            "{} not found in {}; build with `cargo build --release --bins` or pass --bin-dir",
            name,
            bin_dir.display()
        );
    }
    let scratch = tempfile::Builder::new().prefix("ax-bench-").tempdir()?;
    let store = StoreChoice::parse(args.store.as_deref(), scratch.path())?;
    store.check_reachable().await?;
    if let Some(url) = &args.redis {
        let client = redis::Client::open(url.as_str()).with_context(|| format!("--redis {url}"))?;
        let mut conn = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| anyhow::anyhow!("cannot reach Redis at {url}: no answer within 5 s"))?
        .with_context(|| format!("cannot reach Redis at {url}"))?;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot reach Redis at {url}"))?;
    }
    let backend = format!(
        "{}{}",
        store.backend(),
        if args.redis.is_some() { "+redis" } else { "" }
    );
    let mut env = Env::new(
        bin_dir,
        store,
        args.redis.clone(),
        args.quick,
        scratch.path().to_path_buf(),
    );
    env.sweep = args.sweep;
    env.overload = args.overload;
    env.nodes = args.nodes;
    if let Some(n) = args.max_waiting {
        env.scheduler_args
            .extend(["--max-waiting".to_string(), n.to_string()]);
    }
    if let Some(n) = args.max_waiting_per_app {
        env.scheduler_args
            .extend(["--max-waiting-per-app".to_string(), n.to_string()]);
    }
    let started_at_ms = bench::wall_ms();
    let mut reports: Vec<WorkloadReport> = Vec::new();
    for workload in workloads {
        let mut runs = Vec::with_capacity(args.runs);
        for n in 1..=args.runs {
            eprintln!(
                "ax-bench: {workload} on {backend}, run {n} of {}",
                args.runs
            );
            let outcome = bench::run_workload(workload, &env).await;
            // With --keep the MySQL databases stay too, for reading a run's rows afterwards.
            if !args.keep
                && let Err(err) = env.drop_databases().await
            {
                eprintln!("ax-bench: dropping the run's database failed: {err:#}");
            }
            match &outcome {
                Ok(m) => {
                    for f in &m.figures {
                        eprintln!(
                            "ax-bench:   {} = {} {}",
                            f.name,
                            report::number(f.value),
                            f.unit
                        );
                    }
                    for c in m.checks.iter().filter(|c| !c.ok) {
                        eprintln!("ax-bench:   CHECK FAILED {}: {}", c.name, c.detail);
                    }
                    if let Some(reason) = &m.unsupported {
                        eprintln!("ax-bench:   not yet supported: {reason}");
                    }
                }
                Err(err) => eprintln!("ax-bench:   error: {err:#}"),
            }
            let unsupported = matches!(&outcome, Ok(m) if m.unsupported.is_some());
            runs.push(outcome);
            // Waiting out a missing feature once is enough.
            if unsupported {
                break;
            }
        }
        reports.push(report::aggregate(workload, &backend, runs));
    }
    add_spawn_ratio(&mut reports);
    add_fan_out_ratio(&mut reports, args.quick);
    add_held_ratio(&mut reports);

    println!("{}", report::table(&reports));
    for r in &reports {
        for note in &r.notes {
            println!("{} note: {note}", r.workload);
        }
        for failed in &r.failed_checks {
            println!(
                "{} run {}: CHECK FAILED {}: {}",
                r.workload, failed.run, failed.check.name, failed.check.detail
            );
        }
        for err in &r.errors {
            println!("{} error: {err}", r.workload);
        }
    }
    let all_correct = reports
        .iter()
        .all(|r| r.correctness_ok || r.status == "unsupported");
    let summary = BenchReport {
        quick: args.quick,
        backend,
        redis: args.redis.is_some(),
        started_at_ms,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        workloads: reports,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.keep {
        let kept = scratch.keep();
        eprintln!(
            "ax-bench: stores and process logs kept in {}",
            kept.display()
        );
    }
    Ok(all_correct)
}

/// W1's target is relative to the spawn ceiling measured in the same invocation: add W1's
/// tasks/s divided by S0's median spawns/s when both ran.
fn add_spawn_ratio(reports: &mut [WorkloadReport]) {
    let Some(ceiling) = reports
        .iter()
        .find(|r| r.workload == "S0")
        .and_then(|r| r.figures.first())
        .map(|f| f.median)
        .filter(|c| *c > 0.0)
    else {
        return;
    };
    let worker_ceiling = reports
        .iter()
        .find(|r| r.workload == "S0")
        .and_then(|r| r.figures.get(1))
        .map(|f| f.median)
        .filter(|c| *c > 0.0);
    let Some(w1) = reports.iter_mut().find(|r| r.workload == "W1") else {
        return;
    };
    let Some(rate) = w1.figures.iter().find(|f| f.name.starts_with("tasks/s")) else {
        return;
    };
    let ratios = rate.values.iter().map(|v| v / ceiling).collect();
    let summary = report::summarize(
        "tasks/s / S0 spawns/s",
        "x",
        ratios,
        Some(Target::AtLeast(0.8)),
    );
    let worker_way = worker_ceiling.map(|ceiling| {
        let ratios = rate.values.iter().map(|v| v / ceiling).collect();
        report::summarize("tasks/s / S0 worker-way spawns/s", "x", ratios, None)
    });
    w1.figures.insert(1, summary);
    if let Some(summary) = worker_way {
        w1.figures.insert(2, summary);
    }
}

/// W1's median tasks/s in this invocation, when it ran and did something.
fn w1_median_rate(reports: &[WorkloadReport]) -> Option<f64> {
    reports
        .iter()
        .find(|r| r.workload == "W1")
        .and_then(|r| r.figures.iter().find(|f| f.name.starts_with("tasks/s")))
        .map(|f| f.median)
        .filter(|rate| *rate > 0.0)
}

/// W1H against W1 in the same invocation: what holding every task costs.
fn add_held_ratio(reports: &mut [WorkloadReport]) {
    let Some(rate) = w1_median_rate(reports) else {
        return;
    };
    let Some(held) = reports.iter_mut().find(|r| r.workload == "W1H") else {
        return;
    };
    let Some(held_rate) = held.figures.iter().find(|f| f.name.starts_with("tasks/s")) else {
        return;
    };
    let ratios = held_rate.values.iter().map(|v| v / rate).collect();
    let summary = report::summarize("tasks/s / W1 tasks/s", "x", ratios, None);
    held.figures.insert(1, summary);
}

/// W12's target is relative to W1 in the same invocation: W12's trigger -> sink end divided by
/// the time W1's median rate takes for as many tasks as W12 has items.
fn add_fan_out_ratio(reports: &mut [WorkloadReport], quick: bool) {
    let Some(rate) = w1_median_rate(reports) else {
        return;
    };
    let w1_seconds = bench::mapped_fan_out::items(quick) as f64 / rate;
    let Some(w12) = reports.iter_mut().find(|r| r.workload == "W12") else {
        return;
    };
    let Some(total) = w12.figures.iter().find(|f| f.name == "trigger -> sink end") else {
        return;
    };
    let ratios = total.values.iter().map(|v| v / w1_seconds).collect();
    let summary = report::summarize(
        "trigger -> sink end / W1's time for as many tasks",
        "x",
        ratios,
        Some(Target::AtMost(1.2)),
    );
    w12.figures.insert(1, summary);
}
