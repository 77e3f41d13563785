//! `ax-scheduler`: one scheduler node.

use anyhow::Context;
use ax_scheduler::config::{Args, Command, TokenCommand};

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    let command = args.command.take();
    let options = args.into_options()?;
    if let Some(Command::Token(TokenCommand::Create {
        name,
        role,
        app,
        worker_id,
        label,
        expires,
    })) = command
    {
        let (app, worker) = token_scope(role, app, &worker_id, &label)?;
        let request = ax_scheduler::auth::tokens::TokenRequest {
            name,
            role,
            app,
            lifetime_ms: expires,
            created_by: "store".into(),
            worker,
        };
        // No logging: stdout carries the token alone, for `… > admin.token`.
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        return runtime.block_on(create_token(&options.store_url, request));
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
    request: ax_scheduler::auth::tokens::TokenRequest,
) -> anyhow::Result<()> {
    let store = ax_store::open(store_url)
        .await
        .with_context(|| format!("opening the store at {}", ax_scheduler::redact(store_url)))?;
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

/// The app scope and the worker scope of a token from the flags: `--app` once for a person's
/// token; `--worker-id` (required), `--app` and `--label` for a worker token.
fn token_scope(
    role: ax_core::access::Role,
    apps: Vec<String>,
    worker_ids: &[String],
    labels: &[String],
) -> anyhow::Result<(Option<String>, Option<ax_core::worker_scope::WorkerScope>)> {
    if role == ax_core::access::Role::Worker {
        let scope = ax_core::worker_scope::WorkerScope::parse(worker_ids, &apps, labels)
            .map_err(anyhow::Error::msg)?;
        return Ok((None, Some(scope)));
    }
    if !worker_ids.is_empty() || !labels.is_empty() {
        anyhow::bail!("--worker-id and --label are for worker tokens (--role worker)");
    }
    if apps.len() > 1 {
        anyhow::bail!(
            "a {role} token is scoped to one app at most (several --app are for worker tokens)"
        );
    }
    Ok((apps.into_iter().next(), None))
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
