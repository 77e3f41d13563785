//! `ax-flood`: measures a node under a connection flood, as an attacker on its network would
//! make one (BENCHMARKS.md, connection limits). For each scenario it starts a real
//! `ax-scheduler` under an open-file limit (`prlimit --nofile`) with a real `ax-worker`, opens
//! more connections than the limit that send nothing (or one byte, or finish a TLS handshake
//! and say nothing), and reports: how long new clients' first calls take under the flood, how
//! long a restarted worker takes to register, the node's open files, when the node had closed
//! every flooding connection, and the CPU the node used meanwhile.
//!
//! `cargo build --release -p ax-scheduler -p ax-worker -p ax-integration-tests --bins` then
//! `target/release/ax-flood`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ax_integration_tests::fault_kit::plain;
use ax_integration_tests::flood::{CpuMeter, Flood, open_files};
use ax_integration_tests::process::{Process, free_port};
use ax_proto::client::ClientAuth;
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "ax-flood",
    about = "Measures a node under a flood of silent connections"
)]
struct Args {
    /// The node's open-file limit.
    #[arg(long, default_value_t = 1024)]
    open_files: u32,
    /// Silent connections per scenario (more than the open-file limit).
    #[arg(long, default_value_t = 1100)]
    connections: usize,
    /// TLS sessions that finish their handshake and say nothing, in the TLS scenario.
    #[arg(long, default_value_t = 100)]
    tls_sessions: usize,
    /// New clients timed under each flood, one a second.
    #[arg(long, default_value_t = 5)]
    probes: usize,
    /// Where ax-scheduler and ax-worker are (default: this executable's directory).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Extra flags for the node, e.g. "--first-request-timeout=5s".
    #[arg(long, allow_hyphen_values = true)]
    node_flag: Vec<String>,
    /// Scenarios to run: idle, one-byte, tls (comma separated; default all).
    #[arg(long, value_delimiter = ',', default_value = "idle,one-byte,tls")]
    scenario: Vec<String>,
    /// Keep each scenario's directory (store and process logs) and print where.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Idle,
    OneByte,
    Tls,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Idle => "idle TCP",
            Scenario::OneByte => "one byte",
            Scenario::Tls => "TLS handshake, then silence",
        }
    }
}

struct Outcome {
    opened: usize,
    failed: usize,
    first_calls_ms: Vec<f64>,
    worker_registered_s: Option<f64>,
    open_files_peak: usize,
    closed: usize,
    closed_after_s: f64,
    cpu_percent: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("locating ax-flood's directory")?
            .to_path_buf(),
    };
    for name in ["ax-scheduler", "ax-worker"] {
        if !bin_dir.join(name).exists() {
            bail!("{name} not found in {}", bin_dir.display());
        }
    }
    println!(
        "open-file limit {}, {} silent connections a scenario, {} TLS sessions",
        args.open_files, args.connections, args.tls_sessions
    );
    println!(
        "| scenario | opened | new client's first call (median / max) | restarted worker registered | node's open files (peak) | flood closed by the node | node CPU |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut scenarios = Vec::new();
    for name in &args.scenario {
        scenarios.push(match name.as_str() {
            "idle" => Scenario::Idle,
            "one-byte" => Scenario::OneByte,
            "tls" => Scenario::Tls,
            other => bail!("unknown scenario {other:?}: idle, one-byte or tls"),
        });
    }
    for scenario in scenarios {
        let outcome = measure(&args, &bin_dir, scenario)
            .await
            .with_context(|| format!("scenario {}", scenario.name()))?;
        let mut calls = outcome.first_calls_ms.clone();
        calls.sort_by(f64::total_cmp);
        let calls = if calls.len() == args.probes && !calls.is_empty() {
            format!(
                "{:.0} ms / {:.0} ms",
                calls[calls.len() / 2],
                calls[calls.len() - 1]
            )
        } else {
            format!("{} of {} answered within 10 s", calls.len(), args.probes)
        };
        println!(
            "| {} | {}{} | {} | {} | {} | {} of {} after {:.1} s | {:.1} % |",
            scenario.name(),
            outcome.opened,
            if outcome.failed > 0 {
                format!(" ({} failed)", outcome.failed)
            } else {
                String::new()
            },
            calls,
            outcome
                .worker_registered_s
                .map_or("not within 30 s".to_string(), |s| format!("{s:.2} s")),
            outcome.open_files_peak,
            outcome.closed,
            outcome.opened,
            outcome.closed_after_s,
            outcome.cpu_percent
        );
    }
    Ok(())
}

fn tls_files(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()])?;
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
}

/// A fresh client's first call (connect, then ListWorkflows); its time, or `None` after 10 s.
async fn first_call(endpoint: &str, auth: &ClientAuth) -> Option<Duration> {
    let started = Instant::now();
    let call = async {
        let channel = auth.endpoint(endpoint, None).ok()?.connect().await.ok()?;
        ControlServiceClient::new(channel)
            .list_workflows(pb::ListWorkflowsRequest::default())
            .await
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .ok()
        .flatten()
        .map(|_| started.elapsed())
}

fn registrations(node: &Process) -> usize {
    plain(&node.log_text())
        .matches("worker connected worker=w1")
        .count()
}

async fn measure(args: &Args, bin_dir: &Path, scenario: Scenario) -> anyhow::Result<Outcome> {
    let scratch = tempfile::Builder::new().prefix("ax-flood-").tempdir()?;
    let dir = scratch.path();
    let port = free_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let tls = scenario == Scenario::Tls;
    let mut node_args: Vec<String> = vec![
        format!("--nofile={}", args.open_files),
        "--".into(),
        bin_dir.join("ax-scheduler").display().to_string(),
        "--listen".into(),
        addr.to_string(),
        "--store".into(),
        format!("sqlite://{}", dir.join("ax.db").display()),
        "--heartbeat-interval".into(),
        "500ms".into(),
    ];
    node_args.extend(args.node_flag.iter().cloned());
    let mut auth = ClientAuth::default();
    let mut worker_args: Vec<String> = vec![
        "--id".into(),
        "w1".into(),
        "--heartbeat-interval".into(),
        "500ms".into(),
    ];
    let (endpoint, ca) = if tls {
        let (ca, cert, key) = tls_files(dir)?;
        node_args.extend([
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
        ]);
        auth.tls_ca = Some(ca.clone());
        worker_args.extend(["--tls-ca".into(), ca.display().to_string()]);
        (format!("https://localhost:{port}"), Some(ca))
    } else {
        (format!("http://{addr}"), None)
    };
    worker_args.extend(["--scheduler".into(), endpoint.clone()]);
    let node = Process::spawn(
        "ax-scheduler",
        Path::new("prlimit"),
        &node_args,
        dir,
        dir.join("scheduler.log"),
    )?;
    let ready = Instant::now();
    while first_call(&endpoint, &auth).await.is_none() {
        if ready.elapsed() > Duration::from_secs(60) {
            bail!("the node never answered:\n{}", node.log_text());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = node.pid().context("the node exited")?;
    let worker_bin = bin_dir.join("ax-worker");
    let mut worker = Process::spawn("w1", &worker_bin, &worker_args, dir, dir.join("w1.log"))?;
    while registrations(&node) < 1 {
        if ready.elapsed() > Duration::from_secs(60) {
            bail!("w1 never registered:\n{}", worker.log_text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let cpu = CpuMeter::start(pid)?;
    let flooded = Instant::now();
    let mut flood = Flood::new();
    match scenario {
        Scenario::Idle => flood.open_plain(addr, args.connections, b"").await,
        Scenario::OneByte => flood.open_plain(addr, args.connections, b"P").await,
        Scenario::Tls => {
            let ca = ca.as_deref().context("the TLS scenario has a CA")?;
            flood
                .open_tls_silent(addr, args.tls_sessions, ca, "localhost")
                .await?;
            flood.open_plain(addr, args.connections, b"").await;
        }
    }
    let mut open_files_peak = open_files(pid)?;
    let mut first_calls_ms = Vec::new();
    for _ in 0..args.probes {
        if let Some(took) = first_call(&endpoint, &auth).await {
            first_calls_ms.push(took.as_secs_f64() * 1000.0);
        }
        open_files_peak = open_files_peak.max(open_files(pid)?);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    worker.kill().await?;
    let restarted = Instant::now();
    let _worker = Process::spawn("w1", &worker_bin, &worker_args, dir, dir.join("w1-2.log"))?;
    let mut worker_registered_s = None;
    while restarted.elapsed() < Duration::from_secs(30) {
        if registrations(&node) >= 2 {
            worker_registered_s = Some(restarted.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = flood.len();
    let failed = flood.failed;
    let closed = flood.closed_within(Duration::from_secs(60)).await;
    let closed_after_s = flooded.elapsed().as_secs_f64();
    let cpu_percent = cpu.percent()?;
    drop(node);
    if args.keep {
        eprintln!("{}: kept in {}", scenario.name(), scratch.keep().display());
    }
    Ok(Outcome {
        opened,
        failed,
        first_calls_ms,
        worker_registered_s,
        open_files_peak,
        closed,
        closed_after_s,
        cpu_percent,
    })
}
