//! `axctl`: the ax command line. Every command drives a scheduler node over the gRPC
//! `ControlService`; `axctl dev` additionally hosts a scheduler and a worker in this process.

mod client;
mod commands;
mod error;
mod links;
mod lookup;
mod output;
mod overload;
mod view;
mod wait;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::client::Ctx;
use crate::commands::{
    apply, audit, backfill, cancel, cluster, dag, delete, dev, diff, get, import, logs, mark,
    pause, purge, rerun, resume, retry, secret, token, trigger, whoami, why, workers,
};
use crate::error::Exit;
use crate::output::Output;

const LONG_ABOUT: &str = "\
axctl drives an ax scheduler over its gRPC ControlService: apply workflow files, inspect workflows,
runs, instances and workers, trigger runs and follow them, read task logs, and run a scheduler plus
a worker in one process with `axctl dev`.

Data meant for pipes (tables, JSON, YAML, log lines, run ids) goes to stdout; progress, warnings
and errors go to stderr.

Exit codes:
    0    ok
    1    any other error
    2    usage error (bad flags or arguments, e.g. a malformed --param)
    3    not found (workflow, run, instance)
    4    invalid argument (e.g. a workflow file the server refused, printed as FILE:LINE: FIELD: message)
    5    server unreachable or unavailable
    6    failed precondition or conflict (e.g. cancelling a finished run)
    7    not authenticated (no valid token) or not allowed (the token's role or app)
    8    refused for load: the workflow's app or the cluster had as many instances waiting as
         its bound allows, and trigger or backfill was still refused after --retry-for
    10   a waited run ended FAILED
    11   a waited run ended CANCELLED
    12   `axctl diff`: applying would change something (0: nothing would)
    130  interrupted (Ctrl-C) before a waited run ended";

#[derive(Debug, Parser)]
#[command(name = "axctl", version, about = "The ax command line", long_about = LONG_ABOUT)]
struct Cli {
    /// Scheduler URL (any node of the cluster).
    #[arg(
        long,
        global = true,
        env = "AX_SERVER",
        default_value = "http://127.0.0.1:7070"
    )]
    server: String,

    /// Output format of the data written to stdout (ascii, dot and mermaid: `axctl dag` only).
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,

    /// Who is acting, recorded in the audit trail of applies, triggers, pauses and cancels.
    #[arg(long, global = true, default_value_t = client::default_actor())]
    actor: String,

    /// The token to call with (a node that asks for tokens refuses calls without one).
    #[arg(long, global = true, env = "AX_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// A file holding the token on its first line.
    #[arg(long, global = true, env = "AX_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<std::path::PathBuf>,

    /// The CA that signed the nodes' certificates (PEM); implies TLS. Without it, an
    /// https:// --server is checked against the system's roots.
    #[arg(long, global = true, env = "AX_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,

    /// Write text that tasks and callers control (log lines, names, params, messages, audit
    /// details) as it is. By default the characters a terminal acts on (escape sequences,
    /// carriage returns, bidirectional controls) are shown escaped, as \u001b: on a terminal,
    /// in table cells and after `axctl logs --streams` or `--timestamps` prefixes.
    #[arg(long, global = true)]
    raw: bool,

    /// Show every time in UTC. By default tables show times in this machine's zone with their
    /// offset, and `why` and a workflow's next fires in the workflow's zone.
    #[arg(long, global = true, env = "AX_UTC", value_parser = clap::builder::FalseyValueParser::new())]
    utc: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply (create or update) a workflow from a file, or every workflow file of a folder in
    /// one transaction (all or nothing); --prune --app APP deletes the app's workflows the
    /// folder does not declare; --dry-run checks only.
    Apply(apply::Args),
    /// Show what `apply` would change: workflows created, changed (a diff of the file),
    /// unchanged and, with --prune, deleted. Exit code 12 when something would change.
    Diff(diff::Args),
    /// Delete a workflow (`delete workflow NAME`); its runs are kept as history.
    Delete(delete::Args),
    /// Write workflow files from another scheduler's definitions (`import crontab FILE`).
    Import(import::Args),
    /// Show workflows, runs, instances (kubectl-like: `get runs`, `get run ID`).
    #[command(visible_alias = "list")]
    Get(get::Args),
    /// Start a run of a workflow now, optionally waiting for it to end.
    Trigger(trigger::Args),
    /// Print the log lines of an instance's attempt, optionally following them.
    Logs(logs::Args),
    /// List the workers known to the scheduler cluster.
    Workers(workers::Args),
    /// List the scheduler nodes (leases, clock offsets from the store), the workers on each,
    /// every node's and worker's release, and the release of the store's schema.
    Cluster(cluster::Args),
    /// Pause a workflow's schedule: no new cron runs until it is resumed.
    Pause(pause::Args),
    /// Resume a paused workflow's schedule.
    Resume(resume::Args),
    /// Cancel a run or a single instance.
    Cancel(cancel::Args),
    /// Retry one failed, timed-out or cancelled instance as a new attempt.
    Retry(retry::Args),
    /// Mark an instance SUCCESS or FAILED without running it (a reason is required).
    Mark(mark::Args),
    /// Wait for a run to end; the exit code is its outcome (0, 10 failed, 11 cancelled).
    Wait(commands::wait::Args),
    /// Rerun the failed part of a run, or a task and everything below it, as new attempts.
    Rerun(rerun::Args),
    /// Run a scheduler and a worker in this process (SQLite store, no Redis).
    Dev(dev::Args),
    /// Print a workflow's task graph (-o ascii|dot|mermaid|json), with a run's states.
    Dag(dag::Args),
    /// Explain why a workflow's tasks did or did not run around a time. A span of slots
    /// dropped together (misfired, paused) is one decision at its first slot.
    Why(why::Args),
    /// List the audit trail: who applied, triggered, cancelled, paused what, and from where.
    Audit(audit::Args),
    /// Create one run per cron slot of a past range, in order (a slot that has a run is kept).
    Backfill(backfill::Args),
    /// Delete ended runs older than an age, with their instances, attempts, logs and decisions
    /// (admin); --dry-run counts them.
    Purge(purge::Args),
    /// Set, list and delete the secrets workflows name in a task's env (admin): an app's
    /// (--app) or global ones.
    Secret(secret::Args),
    /// Create, list and revoke API tokens (admin): a role, an app scope, an expiry; a worker
    /// token names the worker ids it may register. A token is shown once, at creation.
    Token(token::Args),
    /// Show the token the node sees for this call, its role and app.
    Whoami(whoami::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    output::set_raw(cli.raw);
    output::set_utc(cli.utc);
    // `axctl dev` logs at info while it serves; with `--run` the run's own output is the show.
    init_tracing(matches!(&cli.command, Command::Dev(args) if args.run.is_none()));
    if matches!(cli.output, Output::Ascii | Output::Dot | Output::Mermaid)
        && !matches!(cli.command, Command::Dag(_))
    {
        eprintln!("error: -o ascii, dot and mermaid are formats of `axctl dag` only");
        return ExitCode::from(Exit::Usage as u8);
    }
    let token = match (cli.token, &cli.token_file) {
        (Some(token), _) => Some(token),
        (None, Some(path)) => match ax_proto::client::read_token_file(path) {
            Ok(token) => Some(token),
            Err(err) => {
                eprintln!("error: --token-file: {err}");
                return ExitCode::from(Exit::Usage as u8);
            }
        },
        (None, None) => None,
    };
    let ctx = Ctx {
        server: client::normalize_server(&cli.server),
        output: cli.output,
        actor: cli.actor,
        auth: ax_proto::client::ClientAuth {
            token,
            tls_ca: cli.tls_ca,
            tls_identity: None,
        },
    };
    let result = match cli.command {
        Command::Apply(args) => apply::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Diff(args) => diff::run(&ctx, args).await,
        Command::Delete(args) => delete::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Import(args) => import::run(args).map(|()| Exit::Ok),
        Command::Get(args) => get::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Trigger(args) => trigger::run(&ctx, args).await,
        Command::Logs(args) => logs::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Workers(args) => workers::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Cluster(args) => cluster::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Pause(args) => pause::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Resume(args) => resume::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Cancel(args) => cancel::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Retry(args) => retry::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Mark(args) => mark::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Wait(args) => commands::wait::run(&ctx, args).await,
        Command::Rerun(args) => rerun::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Dev(args) => dev::run(&ctx, args).await,
        Command::Dag(args) => dag::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Why(args) => why::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Audit(args) => audit::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Backfill(args) => backfill::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Purge(args) => purge::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Secret(args) => secret::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Token(args) => token::run(&ctx, args).await.map(|()| Exit::Ok),
        Command::Whoami(args) => whoami::run(&ctx, args).await.map(|()| Exit::Ok),
    };
    let exit = match result {
        Ok(exit) => exit,
        Err(err) => error::report(&err),
    };
    ExitCode::from(exit as u8)
}

/// Library logs go to stderr. They are quiet for ordinary commands, whose own messages say what
/// matters, and at `info` for a serving `axctl dev`, where they are the embedded scheduler's and
/// worker's log.
fn init_tracing(dev: bool) {
    let default = if dev { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
