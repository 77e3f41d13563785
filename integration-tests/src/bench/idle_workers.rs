//! W5: 1,000 simulated workers, each with its own connection and `WorkerService.Connect` stream,
//! registered and sending a worker heartbeat every 5 s, with nothing to run. The scheduler's CPU
//! share is the delta of its utime + stime (/proc/PID/stat) over the idle window; its RSS is read
//! from /proc/PID/status at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use ax_proto::v1 as pb;
use ax_proto::v1::worker_service_client::WorkerServiceClient;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::{Checks, ClusterSpec, Env, Measurement, Target, cpu_seconds, memory_mib, wall_ms};

const HEARTBEAT: Duration = Duration::from_secs(5);

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let (count, window) = if env.quick {
        (50usize, Duration::from_secs(5))
    } else {
        (1_000usize, Duration::from_secs(60))
    };
    let cluster = env
        .start(&ClusterSpec {
            workers: Vec::new(),
            heartbeat: None,
            nodes: 1,
        })
        .await?;
    let scheduler = cluster.scheduler_pid()?;
    let cancel = CancellationToken::new();
    let dropped = Arc::new(AtomicUsize::new(0));
    let endpoint = cluster.endpoint.clone();
    let connected: Vec<anyhow::Result<tokio::task::JoinHandle<()>>> =
        futures::stream::iter(0..count)
            .map(|n| {
                simulate_worker(
                    endpoint.clone(),
                    format!("sim-{n:04}"),
                    n as u64,
                    cancel.clone(),
                    dropped.clone(),
                )
            })
            .buffer_unordered(50)
            .collect()
            .await;
    let mut handles = Vec::with_capacity(count);
    for handle in connected {
        handles.push(handle?);
    }
    cluster
        .wait_for_workers(count, Duration::from_secs(120))
        .await?;
    // Let registration's store writes finish before the idle window opens.
    tokio::time::sleep(if env.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    })
    .await;

    let cpu_before = cpu_seconds(scheduler)?;
    let window_started = std::time::Instant::now();
    tokio::time::sleep(window).await;
    let cpu = (cpu_seconds(scheduler)? - cpu_before) / window_started.elapsed().as_secs_f64();
    let rss = memory_mib(scheduler, "VmRSS")?;
    let hwm = memory_mib(scheduler, "VmHWM")?;
    let live = cluster.live_workers().await?.len();

    let mut checks = Checks::default();
    checks.add(
        "every simulated worker stayed live (no stream dropped)",
        live == count && dropped.load(Ordering::Relaxed) == 0,
        format!(
            "{live} of {count} live, {} streams ended by the scheduler",
            dropped.load(Ordering::Relaxed)
        ),
    );
    cancel.cancel();
    for handle in handles {
        let _ = handle.await;
    }
    cluster.check_nothing_running(&mut checks).await?;

    let mut m = Measurement::default();
    m.figure("simulated workers", "", count as f64, None);
    m.figure(
        "scheduler CPU, idle",
        "% of a core",
        cpu * 100.0,
        Some(Target::AtMost(5.0)),
    );
    m.figure("scheduler RSS", "MiB", rss, Some(Target::AtMost(200.0)));
    m.figure("scheduler peak RSS", "MiB", hwm, None);
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}

/// Opens one worker stream, registers, and keeps heartbeating until `cancel`.
async fn simulate_worker(
    endpoint: String,
    id: String,
    seed: u64,
    cancel: CancellationToken,
    dropped: Arc<AtomicUsize>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    // Each simulated worker has its own HTTP/2 connection, as separate processes would.
    let channel = Channel::from_shared(endpoint)?.connect().await?;
    let mut client = WorkerServiceClient::new(channel);
    let (sender, receiver) = mpsc::channel(8);
    let register = pb::WorkerMessage {
        body: Some(pb::worker_message::Body::Register(pb::Register {
            protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
            worker_id: id.clone(),
            version: "ax-bench-sim".into(),
            labels: Default::default(),
            capacity: 1,
            started_at_ms: wall_ms(),
            hostname: "ax-bench".into(),
            running: Vec::new(),
            finished: Vec::new(),
            incarnation: String::new(),
        })),
    };
    sender.send(register).await?;
    let mut inbound = client
        .connect(ReceiverStream::new(receiver))
        .await
        .with_context(|| format!("{id}: Connect"))?
        .into_inner();
    match inbound.message().await? {
        Some(pb::SchedulerMessage {
            body: Some(pb::scheduler_message::Body::Registered(_)),
        }) => {}
        other => bail!("{id}: expected Registered, got {other:?}"),
    }
    // Spread the heartbeats over the interval, as workers started at different times would.
    let offset =
        rand::rngs::StdRng::seed_from_u64(seed).random_range(0..HEARTBEAT.as_millis() as u64);
    Ok(tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_millis(offset),
            HEARTBEAT,
        );
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticks.tick() => {
                    let heartbeat = pb::WorkerMessage {
                        body: Some(pb::worker_message::Body::Heartbeat(pb::WorkerHeartbeat {
                            sent_at_ms: wall_ms(),
                            running: 0,
                            capacity: 1,
                            draining: false,
                        })),
                    };
                    if sender.send(heartbeat).await.is_err() {
                        dropped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(pb::SchedulerMessage { body: Some(pb::scheduler_message::Body::Dispatch(dispatch)) })) => {
                        // Nothing should be dispatched in an idle cluster; refuse it politely.
                        let rejected = pb::WorkerMessage {
                            body: Some(pb::worker_message::Body::Rejected(pb::DispatchRejected {
                                instance_id: dispatch.instance_id,
                                attempt: dispatch.attempt,
                                reason: "simulated worker".into(),
                                duplicate: false,
                            })),
                        };
                        let _ = sender.send(rejected).await;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                },
            }
        }
    }))
}
