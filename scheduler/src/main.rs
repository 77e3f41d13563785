//! `ax-scheduler`: one scheduler node.

use anyhow::Context;
use ax_scheduler::config::Args;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let options = Args::parse().into_options()?;
    // Logging and the trace exporter come first, off the runtime: the exporter's HTTP client
    // has a runtime of its own.
    let telemetry =
        ax_scheduler::telemetry::install(options.otlp_endpoint.as_deref(), "ax-scheduler")?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let served = runtime.block_on(serve(options));
    drop(runtime);
    // The spans of the last runs go out before the process exits.
    telemetry.shutdown();
    served
}

async fn serve(options: ax_scheduler::SchedulerOptions) -> anyhow::Result<()> {
    let scheduler = ax_scheduler::start(options)
        .await
        .context("starting the scheduler")?;
    tracing::info!(addr = %scheduler.local_addr(), "serving");
    shutdown_signal().await;
    tracing::info!("shutting down: draining reports and logs");
    scheduler.shutdown().await
}

async fn shutdown_signal() {
    let mut terminate = match tokio::signal::unix::signal(
        tokio::signal::unix::SignalKind::terminate(),
    ) {
        Ok(signal) => signal,
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGTERM; only Ctrl-C stops the scheduler");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
