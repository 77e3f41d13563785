//! `ax-scheduler`: one scheduler node.

use anyhow::Context;
use ax_scheduler::config::{Args, Command, TokenCommand};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let command = args.command.take();
    let options = args.into_options()?;
    if let Some(Command::Token(TokenCommand::Create {
        name,
        role,
        app,
        expires,
    })) = command
    {
        // No logging: stdout carries the token alone, for `… > admin.token`.
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        return runtime.block_on(create_token(&options.store_url, name, role, app, expires));
    }
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

/// `ax-scheduler token create`: a token made on the store directly (whoever holds the store's
/// credentials holds everything already), printed once on stdout.
async fn create_token(
    store_url: &str,
    name: String,
    role: ax_core::access::Role,
    app: Option<String>,
    lifetime_ms: Option<i64>,
) -> anyhow::Result<()> {
    let store = ax_store::open(store_url)
        .await
        .with_context(|| format!("opening the store at {}", ax_scheduler::redact(store_url)))?;
    let request = ax_scheduler::auth::tokens::TokenRequest {
        name,
        role,
        app,
        lifetime_ms,
        created_by: "store".into(),
    };
    let now = chrono::Utc::now().timestamp_millis();
    let (token, stored) = ax_scheduler::auth::tokens::create(store.as_ref(), request, now)
        .await
        .context("creating the token")?;
    eprintln!(
        "token {:?} ({}) created; it is shown once: keep it now",
        stored.name, stored.role
    );
    println!("{token}");
    Ok(())
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
