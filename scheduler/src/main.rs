//! `ax-scheduler`: one scheduler node.

use anyhow::Context;
use ax_scheduler::config::Args;
use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let options = Args::parse().into_options()?;
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
