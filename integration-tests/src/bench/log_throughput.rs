//! W4: one task printing 1,000,000 lines of 100 bytes (`seq -f '%0100.0f' 1 N`, so line n is n,
//! zero-padded: order can be checked line by line). Throughput is lines / (trigger → every line
//! read back through GetLogs, the API `axctl logs` uses). The task's wall time (attempt
//! finished_at − started_at) is compared with the same command writing to /dev/null, and the
//! peak RSS (VmHWM) of the worker and the scheduler is read from /proc.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Checks, ClusterSpec, Env, Measurement, Target, memory_mib, workflow_yaml};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let lines: usize = if env.quick { 20_000 } else { 1_000_000 };
    let command = format!("seq -f '%0100.0f' 1 {lines}");

    // The same command with nowhere to write: the floor for the task's wall time.
    let baseline_started = Instant::now();
    let status = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{command} > /dev/null"))
        .status()
        .await?;
    let baseline = baseline_started.elapsed().as_secs_f64();
    anyhow::ensure!(status.success(), "the baseline command failed: {status}");

    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    let scheduler = cluster.scheduler_pid()?;
    let worker = cluster.worker_pid("bench-w1")?;
    let scheduler_before = memory_mib(scheduler, "VmRSS")?;
    let worker_before = memory_mib(worker, "VmRSS")?;
    cluster
        .apply(&workflow_yaml(
            "w4-chatty",
            None,
            &[("print".into(), command.clone(), Vec::new())],
        ))
        .await?;

    let started = Instant::now();
    let run = cluster.trigger("w4-chatty").await?;
    cluster
        .wait_run(run.id, Duration::from_secs(600), Duration::from_millis(20))
        .await?;
    let ended = started.elapsed().as_secs_f64();
    // Peaks before anything is read back, so serving GetLogs does not count as holding logs.
    let scheduler_peak_at_end = memory_mib(scheduler, "VmHWM")?;
    let worker_peak = memory_mib(worker, "VmHWM")?;
    let instance = cluster
        .list_instances(run.id)
        .await?
        .into_iter()
        .next()
        .context("the run has no instance")?;
    let stored = cluster.logs(instance.id, 0).await?;
    let readable = started.elapsed().as_secs_f64();
    let scheduler_peak = memory_mib(scheduler, "VmHWM")?;
    // Reading everything again separates the cost of reading from any wait for storage.
    let reread_started = Instant::now();
    let reread = cluster.logs(instance.id, 0).await?.len();
    let reread_secs = reread_started.elapsed().as_secs_f64();

    let mut checks = Checks::default();
    let misplaced = stored
        .iter()
        .enumerate()
        .filter(|(n, line)| line.seq != *n as u64 + 1 || line.text != format!("{:0100}", n + 1))
        .count();
    checks.add(
        "every line stored once, in order (0 lost)",
        stored.len() == lines && misplaced == 0,
        format!(
            "{} of {lines} lines read back, {misplaced} out of place or altered",
            stored.len()
        ),
    );
    checks.add(
        "a second read returns every line again",
        reread == lines,
        format!("{reread} of {lines} lines on the second read"),
    );
    let instances = cluster
        .verify_runs(&[run.id], 1, true, true, &mut checks)
        .await?;
    let task_wall = instances
        .first()
        .and_then(|i| i.attempts.first())
        .map(|a| (a.finished_at_ms - a.started_at_ms) as f64 / 1000.0)
        .unwrap_or(0.0);

    let mut m = Measurement::default();
    m.figure(
        "lines/s trigger -> all readable",
        "1/s",
        lines as f64 / readable,
        Some(Target::AtLeast(500_000.0)),
    );
    m.figure("trigger -> run ended", "s", ended, None);
    m.figure("read back through GetLogs", "s", readable - ended, None);
    m.figure("second full read through GetLogs", "s", reread_secs, None);
    m.figure("task wall time", "s", task_wall, None);
    m.figure("same command to /dev/null", "s", baseline, None);
    m.figure(
        "slowdown vs /dev/null",
        "x",
        task_wall / baseline.max(0.001),
        Some(Target::AtMost(2.0)),
    );
    m.figure("worker peak RSS", "MiB", worker_peak, None);
    m.figure(
        "worker RSS growth",
        "MiB",
        worker_peak - worker_before,
        Some(Target::AtMost(64.0)),
    );
    m.figure(
        "scheduler peak RSS at run end",
        "MiB",
        scheduler_peak_at_end,
        None,
    );
    m.figure(
        "scheduler RSS growth at run end",
        "MiB",
        scheduler_peak_at_end - scheduler_before,
        Some(Target::AtMost(64.0)),
    );
    m.figure(
        "scheduler peak RSS after read back",
        "MiB",
        scheduler_peak,
        None,
    );
    m.notes.push(format!(
        "RSS growth target: the task writes {} MiB of log text; growth <= 64 MiB shows it is \
         back-pressured and streamed, not held",
        lines * 101 / (1 << 20)
    ));
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
