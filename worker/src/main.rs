//! The `ax-worker` binary: parses flags, sets up tracing, and runs the worker until a signal.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use ax_worker::WorkerOptions;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Runs ax tasks dispatched by a scheduler cluster.
#[derive(Debug, Parser)]
#[command(name = "ax-worker", version)]
struct Args {
    /// Scheduler endpoint (http://host:port); repeat it or separate with commas. List every
    /// node, or a host name that resolves to all of them: a name counts as each of its
    /// addresses (resolved again at every pass over the list). The worker starts at the address
    /// its id hashes to and goes round the list when a stream breaks.
    #[arg(
        long = "scheduler",
        env = "AX_SCHEDULER",
        value_delimiter = ',',
        required = true
    )]
    schedulers: Vec<String>,
    /// Worker id; defaults to <hostname>-<pid>. Give a stable one (it must be unique among live
    /// workers): a worker restarted under its id has what its previous process ran retried at
    /// once, not after the dead-worker threshold.
    #[arg(long)]
    id: Option<String>,
    /// A label the scheduler can match tasks against, as key=value; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Attempts run at once.
    #[arg(long, default_value_t = 20)]
    capacity: u32,
    /// Worker heartbeat interval, e.g. 5s or 500ms.
    #[arg(long, default_value = "5s", value_parser = ax_core::duration::parse)]
    heartbeat_interval: Duration,
    /// Per-attempt heartbeat interval.
    #[arg(long, default_value = "30s", value_parser = ax_core::duration::parse)]
    task_heartbeat_interval: Duration,
    /// Time between SIGTERM and SIGKILL when an attempt is killed.
    #[arg(long, default_value = "5s", value_parser = ax_core::duration::parse)]
    kill_grace: Duration,
    /// Kill running attempts when no scheduler was reachable for this long ("off" disables).
    #[arg(long, default_value = "10s", value_parser = parse_optional_duration)]
    self_fence_after: OptionalDuration,
    /// How long an attempt's end is kept and resent on every new stream when the scheduler does
    /// not acknowledge it (it is dropped at once when acknowledged).
    #[arg(long, default_value = "1h", value_parser = ax_core::duration::parse)]
    finished_retention: Duration,
    /// Directory of what the worker keeps on disk and takes back when it restarts under the same
    /// id: ends not yet acknowledged (`ends/`), log lines past the memory bound, each running
    /// attempt's $AX_OUTPUT file (`outputs/`). It must outlive the worker process (under
    /// systemd, its StateDirectory; not a private temp dir). Defaults to
    /// <temp dir>/ax-worker-<id>.
    #[arg(long, alias = "spill-dir")]
    state_dir: Option<PathBuf>,
    /// MiB of unacknowledged log lines the state directory may hold; past it, tasks whose lines
    /// would go there are paused on their output until the scheduler catches up.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    max_spill_mib: u64,
    /// The worker's token (a worker token), for nodes that ask for one. Prefer --token-file: the
    /// worker overwrites a token given here or in AX_TOKEN in its own memory at start, so that
    /// /proc/<pid>/cmdline and /proc/<pid>/environ do not show it, but the shell or unit that
    /// started it may still hold it.
    #[arg(long, env = "AX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the token on its first line, read again at every connection. Give it mode
    /// 0600: a task running as the worker's user can read it (see --task-user).
    #[arg(long, env = "AX_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Run tasks as this account (USER or USER:GROUP, names or numbers), with its groups and
    /// HOME, USER and LOGNAME set for it, instead of the worker's own: then a task cannot read
    /// the worker's token file, state directory or /proc entries. The worker must run as root.
    #[arg(long, value_name = "USER[:GROUP]")]
    task_user: Option<String>,
    /// The CA that signed the nodes' certificates (PEM); implies TLS. Without it, https://
    /// endpoints are checked against the system's roots.
    #[arg(long, env = "AX_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This worker's certificate (PEM), for nodes that require one: it must name the worker's
    /// --id as a DNS name.
    #[arg(long, env = "AX_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "AX_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Export traces over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318: a span per
    /// attempt's process, a child of the attempt's span in its run's trace. Off without it.
    #[arg(long, env = "AX_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

/// A duration that may be switched off; clap would read `Option<Duration>` as an optional flag.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OptionalDuration(Option<Duration>);

fn parse_optional_duration(text: &str) -> Result<OptionalDuration, String> {
    match text.trim() {
        "off" | "none" | "0" => Ok(OptionalDuration(None)),
        other => ax_core::duration::parse(other)
            .map(|duration| OptionalDuration(Some(duration)))
            .map_err(|err| err.to_string()),
    }
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected key=value, got {text:?}")),
    }
}

fn main() -> anyhow::Result<()> {
    // A held attempt's holder is this program too (see `ax_worker::held`): before anything
    // else, since it has no flags and no token.
    let arguments: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if arguments
        .first()
        .is_some_and(|first| first == ax_worker::held::HOLD_COMMAND)
    {
        std::process::exit(ax_worker::held::holder::main(arguments));
    }
    // SAFETY: the first thing the process does: no other thread exists yet.
    let environment_token = unsafe { ax_worker::credentials::take_environment_token() }
        .filter(|token| !token.trim().is_empty());
    let mut args = Args::parse();
    // SAFETY: still one thread, and clap has taken its copy of the arguments.
    let arguments_scrubbed =
        args.token.is_none() || unsafe { ax_worker::credentials::scrub_token_argument() };
    if environment_token.is_some() && args.token_file.is_some() {
        anyhow::bail!("AX_TOKEN and --token-file (or AX_TOKEN_FILE) both give a token: give one");
    }
    args.token = args.token.or(environment_token);
    // Logging and the trace exporter come first, off the runtime: the exporter's HTTP client
    // has a runtime of its own.
    let endpoint = args.otlp_endpoint.clone().filter(|e| !e.is_empty());
    if let Some(endpoint) = &endpoint {
        ax_worker::telemetry::traces_url(endpoint)?;
    }
    let telemetry = ax_worker::telemetry::install(endpoint.as_deref())?;
    ax_worker::credentials::forbid_inspection();
    if !arguments_scrubbed {
        tracing::warn!(
            "cannot find this process's arguments in /proc/self/stat: the --token value stays \
             visible in /proc/<pid>/cmdline to every user of this host; use --token-file"
        );
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let ran = runtime.block_on(run(args));
    drop(runtime);
    // The spans of the last attempts go out before the process exits.
    telemetry.shutdown();
    ran
}

async fn run(args: Args) -> anyhow::Result<()> {
    let schedulers: Vec<String> = args
        .schedulers
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let worker_id = args.id.unwrap_or_else(|| {
        format!(
            "{}-{}",
            ax_proto::hostname().unwrap_or_default(),
            std::process::id()
        )
    });
    if let Some(path) = &args.token_file {
        // Read again at every connection; a file that cannot be read now is a setup error.
        ax_proto::client::read_token_file(path).context("--token-file")?;
    }
    let task_user = args
        .task_user
        .as_deref()
        .map(ax_worker::task_user::TaskUser::resolve)
        .transpose()?;
    if task_user.is_some() {
        ax_worker::task_user::TaskUser::check_worker_can_switch()?;
    }
    let options = WorkerOptions {
        endpoints: schedulers,
        worker_id,
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        capacity: args.capacity,
        heartbeat_interval: args.heartbeat_interval,
        task_heartbeat_interval: args.task_heartbeat_interval,
        kill_grace: args.kill_grace,
        self_fence_after: args.self_fence_after.0,
        finished_retention: args.finished_retention,
        state_dir: args.state_dir,
        max_spilled_log_bytes: args.max_spill_mib.saturating_mul(1 << 20),
        auth: ax_proto::client::ClientAuth {
            token: args.token,
            tls_ca: args.tls_ca,
            tls_identity: args.tls_cert.zip(args.tls_key),
        },
        token_file: args.token_file,
        task_user,
        ..WorkerOptions::default()
    };

    let shutdown = CancellationToken::new();
    let hand_over = options.hand_over.clone();
    let mut terminate =
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut quit = signal(SignalKind::quit()).context("installing the SIGQUIT handler")?;
    let worker = tokio::spawn(ax_worker::run(options, shutdown.clone()));
    tokio::pin!(worker);
    let mut signals = 0;
    loop {
        tokio::select! {
            result = &mut worker => return result.context("the worker task panicked")?,
            _ = terminate.recv() => signals += 1,
            _ = interrupt.recv() => signals += 1,
            _ = quit.recv() => {
                tracing::info!("SIGQUIT: draining, and handing the held attempts still running to the next process under this id");
                hand_over.cancel();
                shutdown.cancel();
                continue;
            }
        }
        if signals == 1 {
            tracing::info!("signal received: draining (send another to exit at once)");
            shutdown.cancel();
        } else {
            // Running tasks die with us through their parent-death signal.
            tracing::warn!("second signal: exiting without waiting for running attempts");
            std::process::exit(130);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The duration flags read the one grammar (`ax_core::duration`); `--self-fence-after`
    /// may also be off.
    #[test]
    fn durations_parse_humanely() {
        let kill_grace = |text: &str| {
            Args::try_parse_from(["ax-worker", "--scheduler", "x", "--kill-grace", text])
                .map(|args| args.kill_grace)
                .map_err(|err| err.to_string())
        };
        assert_eq!(kill_grace("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(kill_grace("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(kill_grace("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(kill_grace("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(kill_grace("7"), Ok(Duration::from_secs(7)));
        assert_eq!(kill_grace("1h30m"), Ok(Duration::from_secs(5400)));
        let err = kill_grace("5 parsecs").unwrap_err();
        assert!(err.contains("invalid duration \"5 parsecs\""), "{err}");
        assert!(kill_grace("s").is_err());
        for off in ["off", "none", "0"] {
            assert_eq!(parse_optional_duration(off), Ok(OptionalDuration(None)));
        }
        assert_eq!(
            parse_optional_duration("10s"),
            Ok(OptionalDuration(Some(Duration::from_secs(10))))
        );
        assert!(parse_optional_duration("soon").is_err());
    }

    #[test]
    fn flags_parse_with_comma_lists_and_labels() {
        let args = Args::try_parse_from([
            "ax-worker",
            "--scheduler",
            "http://a:1,http://b:2",
            "--scheduler",
            "http://c:3",
            "--label",
            "gpu=true",
            "--heartbeat-interval",
            "500ms",
            "--spill-dir",
            "/var/tmp/ax",
            "--max-spill-mib",
            "256",
        ])
        .expect("valid flags");
        assert_eq!(args.schedulers, ["http://a:1", "http://b:2", "http://c:3"]);
        assert_eq!(args.labels, [("gpu".to_string(), "true".to_string())]);
        assert_eq!(args.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(args.capacity, 20);
        assert_eq!(args.state_dir, Some(PathBuf::from("/var/tmp/ax")));
        assert_eq!(args.max_spill_mib, 256);
        assert_eq!(
            args.self_fence_after,
            OptionalDuration(Some(Duration::from_secs(10)))
        );
        assert!(
            Args::try_parse_from(["ax-worker", "--scheduler", "x", "--label", "novalue"]).is_err()
        );
        let zero = Args::try_parse_from(["ax-worker", "--scheduler", "x", "--max-spill-mib", "0"]);
        assert!(zero.is_err_and(|error| error.to_string().contains("--max-spill-mib")));
    }
}
