//! `axctl dev`: a scheduler and a worker in this one process, on a SQLite file, with no MySQL or
//! Redis. With `--run FILE` it applies the file, triggers it, follows the run and prints the logs.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::Context;
use ax_proto::v1::{Instance, ListInstancesRequest};
use ax_scheduler::SchedulerOptions;
use ax_worker::WorkerOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::client::Ctx;
use crate::commands::{apply, logs, trigger};
use crate::error::Exit;
use crate::output;
use crate::view::instance_state;
use crate::wait;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the SQLite store (ax.db) lives; created when missing.
    #[arg(long, default_value = ".ax")]
    pub data_dir: PathBuf,

    /// gRPC listen address of the embedded scheduler (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// How many attempts the embedded worker runs at once (the worker's default when unset).
    #[arg(long)]
    pub capacity: Option<u32>,

    /// Apply this workflow file, trigger it, wait for the run and print its logs.
    #[arg(long, value_name = "FILE")]
    pub run: Option<PathBuf>,

    /// With --run: shut down once the run ended, exiting 0, 10 (FAILED) or 11 (CANCELLED).
    #[arg(long, requires = "run")]
    pub exit: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<Exit> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create data dir {}", args.data_dir.display()))?;
    let options = SchedulerOptions {
        listen: args.listen,
        store_url: format!("sqlite://{}/ax.db", args.data_dir.display()),
        ..SchedulerOptions::default()
    };
    let scheduler = ax_scheduler::start(options)
        .await
        .context("cannot start the embedded scheduler")?;
    let url = format!("http://{}", client_addr(scheduler.local_addr()));
    eprintln!("scheduler listening on {url}");
    eprintln!("web UI and JSON API (/api/v1) at {url}/");
    eprintln!("data dir {}", args.data_dir.display());
    eprintln!("to use it from another shell:\n  export AX_SERVER={url}");

    let shutdown = CancellationToken::new();
    let defaults = WorkerOptions::default();
    let worker_options = WorkerOptions {
        endpoints: vec![url.clone()],
        worker_id: "dev-worker".into(),
        capacity: args.capacity.unwrap_or(defaults.capacity),
        ..defaults
    };
    let mut worker = Worker {
        handle: Some(tokio::spawn(ax_worker::run(
            worker_options,
            shutdown.clone(),
        ))),
    };
    // The dev node is plaintext on loopback and asks for no token, whatever the environment
    // says for other nodes.
    let dev_ctx = Ctx {
        server: url,
        auth: Default::default(),
        ..ctx.clone()
    };

    let outcome = serve(&dev_ctx, &args, &mut worker).await;

    // Graceful in every case: the worker stops taking work and lets running attempts finish and
    // report, then the scheduler stops accepting, drains and flushes logs.
    eprintln!("shutting down: draining the worker");
    shutdown.cancel();
    if let Some(handle) = worker.handle.take() {
        match handle.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                eprintln!("warning: the embedded worker stopped with an error: {err:#}")
            }
            Err(err) => eprintln!("warning: the embedded worker panicked: {err}"),
        }
    }
    scheduler
        .shutdown()
        .await
        .context("the embedded scheduler did not shut down cleanly")?;
    outcome
}

/// The worker task, taken once it has been awaited so it is never polled after completion.
struct Worker {
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Worker {
    /// Resolves when the worker ends on its own, which in dev mode is always a failure.
    async fn stopped(&mut self) -> anyhow::Error {
        let Some(handle) = self.handle.as_mut() else {
            return std::future::pending().await;
        };
        let result = handle.await;
        self.handle = None;
        match result {
            Ok(Ok(())) => anyhow::anyhow!("the embedded worker stopped unexpectedly"),
            Ok(Err(err)) => err.context("the embedded worker stopped"),
            Err(err) => anyhow::anyhow!("the embedded worker panicked: {err}"),
        }
    }
}

async fn serve(ctx: &Ctx, args: &Args, worker: &mut Worker) -> anyhow::Result<Exit> {
    let mut exit = Exit::Ok;
    if let Some(file) = &args.run {
        let mut stdout = std::io::stdout();
        tokio::select! {
            result = run_file(ctx, file, &mut stdout) => exit = result?,
            err = worker.stopped() => return Err(err),
            _ = tokio::signal::ctrl_c() => return Ok(Exit::Interrupted),
        }
        if args.exit {
            return Ok(exit);
        }
    }
    eprintln!("serving; press Ctrl-C to stop");
    tokio::select! {
        err = worker.stopped() => Err(err),
        _ = tokio::signal::ctrl_c() => Ok(exit),
    }
}

/// A wildcard listen address is not something to connect to; the loopback of the same family is.
fn client_addr(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// Apply, trigger, wait, then print every instance's log under a header. Returns the exit code
/// the run's outcome calls for.
pub async fn run_file(ctx: &Ctx, file: &Path, out: &mut impl Write) -> anyhow::Result<Exit> {
    let source = apply::read_source(file)?;
    let mut client = ctx.connect().await?;
    let applied = apply::apply_source(ctx, &mut client, file, source, false).await?;
    let name = applied
        .workflow
        .map(|w| w.name)
        .context("the server answered the apply without a workflow")?;
    let (run, _) = trigger::trigger(
        ctx,
        &mut client,
        &name,
        HashMap::new(),
        None,
        std::time::Duration::ZERO,
    )
    .await?;
    let run = wait::wait_for_run(ctx, &mut client, run.id).await?;
    let mut instances = client
        .list_instances(ListInstancesRequest {
            run_id: run.id,
            attempts: false,
            ..Default::default()
        })
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner()
        .instances;
    instances.sort_by_key(|i| (i.created_at_ms, i.id));
    for instance in &instances {
        writeln!(out, "{}", output::escape(&log_header(instance)))?;
        let format = logs::Format::default().escaping(std::io::stdout().is_terminal());
        logs::copy_logs(ctx, &mut client, instance.id, 0, false, format, out).await?;
    }
    out.flush()?;
    Ok(wait::exit_for(run.state))
}

/// `── extract (instance 12, SUCCESS, exit 0) ──`
fn log_header(instance: &Instance) -> String {
    let exit = instance
        .exit_code
        .map_or_else(|| "no exit code".to_string(), |code| format!("exit {code}"));
    format!(
        "── {} (instance {}, {}, {exit}) ──",
        super::get::task_label(instance),
        instance.id,
        instance_state(instance.state)
    )
}

#[cfg(test)]
#[allow(dead_code)]
#[path = "../../tests/fake/mod.rs"]
mod fake;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Output;
    use ax_proto::v1 as pb;

    #[tokio::test]
    async fn run_file_applies_triggers_waits_and_prints_logs_per_task() {
        let fake = fake::Fake::default();
        fake.with(|s| {
            s.run_script = (2, pb::RunState::Failed);
            s.instances = vec![
                fake::instance(2, 100, "load", pb::InstanceState::Failed, Some(3)),
                fake::instance(1, 100, "extract", pb::InstanceState::Success, Some(0)),
            ];
            s.logs.insert(1, fake::lines(&["extracting", "done"]));
            s.logs.insert(2, fake::lines(&["loading", "boom"]));
        });
        let server = fake.clone().start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("wf.yaml");
        std::fs::write(&file, "name: etl\n").unwrap();
        let ctx = Ctx {
            server,
            output: Output::Table,
            actor: "tester@host".into(),
            auth: Default::default(),
        };
        let mut out = Vec::new();
        let exit = run_file(&ctx, &file, &mut out).await.unwrap();
        assert_eq!(exit, Exit::RunFailed);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "── extract (instance 1, SUCCESS, exit 0) ──\nextracting\ndone\n\
             ── load (instance 2, FAILED, exit 3) ──\nloading\nboom\n"
        );
        let calls = fake.calls();
        assert_eq!(calls.first().map(String::as_str), Some("ApplyWorkflow"));
        assert!(calls.contains(&"TriggerWorkflow".to_string()), "{calls:?}");
        assert_eq!(fake.with(|s| s.triggers[0].name.clone()), "etl");
    }

    #[test]
    fn wildcard_listen_addresses_are_reached_over_loopback() {
        let addr: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        assert_eq!(client_addr(addr).to_string(), "127.0.0.1:7070");
        let addr: SocketAddr = "10.1.2.3:7070".parse().unwrap();
        assert_eq!(client_addr(addr), addr);
    }
}
