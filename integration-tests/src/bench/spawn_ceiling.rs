//! S0: the spawn ceiling. `true` spawned from a tokio program with 64 in flight; no ax at all.
//! W1's tasks/s is judged against this number measured in the same invocation.
//!
//! A second figure spawns with the worker's own code (`ax_worker::spawn`: `/bin/sh -c true` in
//! its own process group, with a parent-death signal, its output piped and read to the end):
//! the ceiling of the worker's spawn path, with no scheduler, store or stream.

use std::process::Stdio;
use std::time::Instant;

use ax_worker::spawn::TaskCommand;
use futures::StreamExt;

use super::{Checks, Env, Measurement};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let total: usize = if env.quick { 500 } else { 20_000 };
    let started = Instant::now();
    let outcomes: Vec<std::io::Result<std::process::ExitStatus>> = futures::stream::iter(0..total)
        .map(|_| async {
            tokio::process::Command::new("true")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let failed = outcomes
        .iter()
        .filter(|o| !matches!(o, Ok(status) if status.success()))
        .count();
    let plain = total as f64 / elapsed;

    let started = Instant::now();
    let worker_way: Vec<std::io::Result<std::process::ExitStatus>> =
        futures::stream::iter(0..total)
            .map(|_| async {
                let mut command = TaskCommand::new("/bin/sh");
                command.arg("-c").arg("true");
                let (_, _, status) = command.spawn()?.output().await?;
                Ok(status)
            })
            .buffer_unordered(64)
            .collect()
            .await;
    let worker_elapsed = started.elapsed().as_secs_f64();
    let worker_failed = worker_way
        .iter()
        .filter(|o| !matches!(o, Ok(status) if status.success()))
        .count();

    let mut checks = Checks::default();
    checks.add(
        "every spawn of true exited 0",
        failed == 0,
        format!("{failed} of {total} failed"),
    );
    checks.add(
        "every worker-style spawn of sh -c true exited 0",
        worker_failed == 0,
        format!("{worker_failed} of {total} failed"),
    );
    let mut m = Measurement::default();
    m.figure("spawns/s (64 in flight)", "1/s", plain, None);
    m.figure(
        "spawns/s the worker's way (sh -c, group, death signal, pipes)",
        "1/s",
        total as f64 / worker_elapsed,
        None,
    );
    m.checks = checks.0;
    Ok(m)
}
