//! The ax scheduler node: decides what runs now (cron + dependencies), dispatches it to workers
//! over their streams, and records every transition in the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ax_proto::v1::control_service_server::ControlServiceServer;
use ax_proto::v1::worker_service_server::WorkerServiceServer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::grpc::control::ControlApi;
use crate::grpc::worker::WorkerApi;
use crate::guards::{Guards, LocalGuards, RedisGuards};
use crate::membership::{Member, Membership};

pub use auth::AuthMode;
pub use ax_core::placement::Strategy;

/// Everything a scheduler node needs to start. `Default` is the embedded single-node setup.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// gRPC listen address (port 0 picks a free port; see [`RunningScheduler::local_addr`]).
    pub listen: SocketAddr,
    /// `sqlite://PATH` (embedded default) or `mysql://USER:PASS@HOST:PORT/DB`.
    pub store_url: String,
    /// With Redis, dispatch dedup markers and start locks go through it; else in-process.
    pub redis_url: Option<String>,
    /// Prefix of this cluster's Redis keys (several clusters may share one Redis).
    pub redis_namespace: String,
    /// This node's name in the cluster (worker records, leases, logs).
    pub node_id: String,
    /// The address workers and clients reach this node at, as its lease says (default: the
    /// listen address).
    pub advertise: Option<String>,
    /// How long this node's lease lasts without a renewal; it is renewed every fifth of it.
    pub node_lease: Duration,
    /// How often (with jitter) the node compares its share of the workers with the other live
    /// nodes' and, holding too many, asks one worker to move; `None` never asks.
    pub spread_interval: Option<Duration>,
    /// A clock offset from the database's past this is logged as an error.
    pub max_clock_offset: Duration,
    pub strategy: Strategy,
    /// Expected worker heartbeat interval (layer 1).
    pub heartbeat_interval: Duration,
    /// Expected task heartbeat interval (layer 2).
    pub task_heartbeat_interval: Duration,
    /// A worker silent for this many heartbeat intervals is dead.
    pub dead_after_missed_heartbeats: u32,
    /// How long past a task's timeout the node waits for the worker's own TIMEOUT report before
    /// it records TIMEOUT itself and tells the worker to kill the attempt. It covers the
    /// worker's kill (SIGTERM, then SIGKILL after its `--kill-grace`, 5 s by default) and the
    /// report's way back.
    pub timeout_grace: Duration,
    /// How long the log writer waits to fill a batch.
    pub log_flush_interval: Duration,
    /// Where failures are announced (webhooks); none by default.
    pub alerts: Vec<alerts::ChannelConfig>,
    /// The most runs one `BackfillWorkflow` may create (a request's own max is capped by it).
    pub max_backfill_runs: u32,
    /// How long ended runs are kept when their workflow sets no `retention` (the cluster's
    /// default); `None` keeps them forever (the default: history is deleted only when someone
    /// asked for it).
    pub retention: Option<Duration>,
    /// How often the purger looks for runs past their retention (one node of the cluster
    /// purges at a time: `retention.rs`).
    pub purge_interval: Duration,
    /// How long audit rows are kept; `None` keeps them forever. 365 days by default: failed
    /// authentications alone can write many rows.
    pub audit_retention: Option<Duration>,
    /// Cluster-wide limits of task pools (`pool:` in workflow files): instances of the pool's
    /// tasks dispatched or running at once. A pool not listed has no limit. Every node of a
    /// cluster must be given the same limits.
    pub pools: std::collections::BTreeMap<String, u32>,
    /// Whether callers need a token (`auth::AuthMode`); off by default, which is safe only on
    /// a loopback address (see [`check_exposure`]).
    pub auth: AuthMode,
    /// Failed authentications an address may make within a minute before it is refused for a
    /// minute, valid token or not.
    pub auth_failures_per_address: u32,
    /// TLS on the port; plaintext without it.
    pub tls: Option<tls::TlsFiles>,
    /// Serve a non-loopback address without TLS or without authentication.
    pub insecure: bool,
    /// Seals and opens secrets; without it, secrets cannot be set or used.
    pub secret_key: Option<secrets::SecretKey>,
    /// The ops listener's address: plaintext and unauthenticated, it serves only `GET /metrics`
    /// and the gRPC health service (probes, Prometheus). None by default.
    pub ops_listen: Option<SocketAddr>,
    /// Where the binary exports traces (OTLP over HTTP, e.g. http://127.0.0.1:4318); none by
    /// default. The binary installs the exporter ([`telemetry::install`]) before it starts the
    /// node, which then emits its spans there.
    pub otlp_endpoint: Option<String>,
    /// Where a proxy or a DNS name serves this node to browsers (`https://ax.example.com`, or
    /// a bare host name): requests naming another host are refused, and these URLs' origins
    /// count as the node's own (`ax_core::cross_site`).
    pub public_urls: Vec<String>,
    /// The limits every connection to the node's port and ops listener is held to.
    pub connections: connections::ConnectionLimits,
    /// The bounds on WAITING instances, per app and in total, past which API triggers and
    /// backfills are refused (`admission.rs`); `Bounds::DEFAULT` unless set.
    pub admission: ax_core::admission::Bounds,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            store_url: "sqlite://.ax/ax.db".into(),
            redis_url: None,
            redis_namespace: "ax".into(),
            node_id: "node-1".into(),
            advertise: None,
            node_lease: Duration::from_secs(10),
            spread_interval: Some(Duration::from_secs(10)),
            max_clock_offset: Duration::from_secs(1),
            strategy: Strategy::LeastRunning,
            heartbeat_interval: Duration::from_secs(5),
            task_heartbeat_interval: Duration::from_secs(30),
            dead_after_missed_heartbeats: 4,
            timeout_grace: Duration::from_secs(15),
            log_flush_interval: Duration::from_millis(20),
            alerts: Vec::new(),
            max_backfill_runs: 1_000,
            retention: None,
            purge_interval: Duration::from_secs(600),
            audit_retention: Some(Duration::from_secs(365 * 86_400)),
            pools: std::collections::BTreeMap::new(),
            auth: AuthMode::Off,
            auth_failures_per_address: auth::FAILURES_PER_ADDRESS,
            tls: None,
            insecure: false,
            secret_key: None,
            ops_listen: None,
            otlp_endpoint: None,
            public_urls: Vec::new(),
            connections: connections::ConnectionLimits::default(),
            admission: ax_core::admission::Bounds::DEFAULT,
        }
    }
}

/// A started scheduler node. Dropping it does not stop it; call [`RunningScheduler::shutdown`].
pub struct RunningScheduler {
    local_addr: SocketAddr,
    ops_addr: Option<SocketAddr>,
    shutdown: shutdown::Shutdown,
}

impl RunningScheduler {
    /// The address the gRPC server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address the ops listener listens on, when it has one.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops_addr
    }

    /// Stops accepting, ends the worker streams, drains the report and log queues into the
    /// store, gives up the lease, and returns (the order and its reasons: `shutdown.rs`).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.shutdown.run().await;
        Ok(())
    }
}

/// Refuses a setup that would let anyone who reaches the port run commands on every worker:
/// a non-loopback address without TLS or without authentication, unless `insecure` says the
/// operator means it.
pub fn check_exposure(options: &SchedulerOptions) -> anyhow::Result<()> {
    if options.listen.ip().is_loopback() || options.insecure {
        return Ok(());
    }
    let mut missing = Vec::new();
    if options.tls.is_none() {
        missing.push("TLS (--tls-cert and --tls-key)");
    }
    if options.auth == AuthMode::Off {
        missing.push("token authentication (--auth tokens)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to listen on {} without {}: anyone who reaches this port could define shell \
         commands and have every worker run them. Give the missing settings, listen on a \
         loopback address, or pass --insecure if the network itself is trusted",
        options.listen,
        missing.join(" and ")
    )
}

/// Opens the store, runs migrations, binds the listener and starts serving.
pub async fn start(options: SchedulerOptions) -> anyhow::Result<RunningScheduler> {
    check_exposure(&options)?;
    let tls = match &options.tls {
        Some(files) => Some(tls::ServerTls::load(files.clone()).context("loading TLS files")?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The database drops a silent node's session (and its transaction's row locks) after the
    // silence that makes the node dead to the cluster, its lease: a worker moving off a node cut
    // off in the middle of a transaction on its row is recorded on its new node by then.
    let store_options = ax_store::StoreOptions {
        silent_client_timeout: options.node_lease,
        ..ax_store::StoreOptions::default()
    };
    let store = ax_store::open_with(&options.store_url, &store_options)
        .await
        .with_context(|| format!("opening the store at {}", redact(&options.store_url)))?;
    let worker_dead_after = options.heartbeat_interval * options.dead_after_missed_heartbeats;
    if store.backend() == ax_store::Backend::MySql && worker_dead_after <= options.node_lease {
        tracing::warn!(
            worker_dead_after_ms = worker_dead_after.as_millis() as u64,
            node_lease_ms = options.node_lease.as_millis() as u64,
            "the dead-worker threshold is not longer than the node lease: a worker moving off a \
             node cut off from the store may be judged dead before its new node can record it, \
             and what it finished meanwhile would run again"
        );
    }
    let cut_off_after = membership::cut_off_after(worker_dead_after);
    let cut_off_when_stalled =
        membership::cut_off_when_stalled(cut_off_after, store.commit_stall());
    if !membership::cut_off_leaves_time_to_move(cut_off_when_stalled, worker_dead_after) {
        tracing::warn!(
            cut_off_when_stalled_ms = cut_off_when_stalled.as_millis() as u64,
            worker_dead_after_ms = worker_dead_after.as_millis() as u64,
            "the database cluster may stall commits for longer than half the dead-worker \
             threshold (evs.suspect_timeout): a node cut off from it would close its workers' \
             streams too late for them to move before their fence; raise \
             --dead-after-missed-heartbeats or lower evs.suspect_timeout"
        );
    }
    if options.auth == AuthMode::Tokens {
        warn_of_broad_worker_tokens(store.as_ref()).await;
    }
    let guards: Arc<dyn Guards> = match &options.redis_url {
        Some(url) => Arc::new(
            RedisGuards::connect(url, &options.redis_namespace)
                .with_context(|| format!("redis url {}", redact(url)))?,
        ),
        None => Arc::new(LocalGuards::new()),
    };
    let alerter = alerts::Alerter::new(options.alerts.clone()).context("alert channels")?;
    // The lease is claimed before the port is bound: while a restarted node waits out its old
    // lease, workers find the port refusing, not accepting and hanging (a refusal proves no
    // node is judging them; see the worker's fence). A port the OS picks is known only after
    // the bind, so such a node (tests) binds first.
    let member = |address: String| Member {
        node_id: options.node_id.clone(),
        address: options.advertise.clone().unwrap_or(address),
        lease: options.node_lease,
        max_clock_offset: options.max_clock_offset,
        pools: membership::pools_text(&options.pools),
        worker_dead_after,
        cut_off_after,
        cut_off_when_stalled,
    };
    let bind = || async {
        connections::bind(options.listen).with_context(|| format!("binding {}", options.listen))
    };
    let (listener, membership) = if options.listen.port() == 0 {
        let listener = bind().await?;
        let address = format!("{scheme}://{}", listener.local_addr()?);
        let membership = Membership::join(store.clone(), member(address)).await?;
        (listener, membership)
    } else {
        let address = format!("{scheme}://{}", options.listen);
        let membership = Membership::join(store.clone(), member(address)).await?;
        match bind().await {
            Ok(listener) => (listener, membership),
            Err(err) => {
                membership.leave().await;
                return Err(err);
            }
        }
    };
    let local_addr = listener.local_addr()?;

    tracing::info!(
        addr = %local_addr,
        store = %redact(&options.store_url),
        guards = guards.kind(),
        node = %options.node_id,
        strategy = %options.strategy,
        auth = ?options.auth,
        tls = tls.is_some(),
        "scheduler starting"
    );

    // The node's parts run until their tokens in the shutdown order (`shutdown.rs`).
    let serving = CancellationToken::new();
    let draining = CancellationToken::new();
    let tasks = TaskTracker::new();
    let standing = membership.standing();
    let parts::Built {
        node,
        streams,
        registry,
        gate,
        scraped,
        connection_counters,
    } = parts::build(
        options,
        parts::Opened {
            store,
            guards,
            alerter: alerter.clone(),
            standing: standing.clone(),
        },
        parts::Runs {
            tasks: &tasks,
            serving: &serving,
            draining: &draining,
        },
    );
    // The lease is given up after every task has ended (`shutdown.rs`), so it runs outside the
    // tracker that shutdown waits on.
    let lease = CancellationToken::new();
    let lease_task = tokio::spawn(membership.run(lease.clone()));

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<WorkerServiceServer<WorkerApi>>().await;
    health
        .set_serving::<ControlServiceServer<ControlApi>>()
        .await;
    // The port and the ops listener share one connection cap: it is one process's files.
    let connections = connections::Connections::new(
        &node.options.connections,
        connection_counters,
        serving.clone(),
    );
    let ops_addr = match node.options.ops_listen {
        Some(address) => {
            Some(serve_ops(address, scraped, health_service.clone(), &connections).await?)
        }
        None => None,
    };
    let names = node_names(&node.options, tls.as_deref())?;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ax_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    // The web UI and its JSON API share the port: their routes first, the gRPC services added
    // to them (a browser speaks HTTP/1.1, so the server accepts it too).
    let routes = tonic::service::Routes::from(web::router(ControlApi::new(node.clone())))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(WorkerServiceServer::new(WorkerApi::new(streams)))
        .add_service(
            ControlServiceServer::new(ControlApi::new(node.clone()))
                .max_decoding_message_size(grpc::control::MAX_REQUEST_BYTES),
        )
        .prepare();
    // Outermost: a node cut off from its store answers at once, before a token is looked up.
    let service = tower::ServiceBuilder::new()
        .layer(cut_off_gate::CutOffLayer::new(
            standing.clone(),
            &node.options.node_id,
        ))
        .layer(auth::AuthLayer::new(gate, names))
        .service(routes);
    if let Some(tls) = &tls {
        tasks.spawn(tls.clone().watch(serving.clone()));
    }
    connections.serve(
        listener,
        connections::HttpService::new(service),
        tls.clone(),
    );
    Ok(RunningScheduler {
        local_addr,
        ops_addr,
        shutdown: shutdown::Shutdown {
            serving,
            draining,
            lease,
            tasks,
            lease_task,
            registry,
            connections,
            alerter,
        },
    })
}

/// Warns of live worker tokens that take any worker id (made before tokens named ids, or
/// with `--worker-id '*'`): whoever holds one may register as any worker that is not live.
async fn warn_of_broad_worker_tokens(store: &ax_store::Store) {
    let tokens = match store.list_tokens().await {
        Ok(tokens) => tokens,
        Err(err) => {
            tracing::warn!(error = %err, "cannot list tokens to check worker tokens' scopes");
            return;
        }
    };
    let now = clock::now_ms();
    for token in tokens.iter().filter(|token| token.is_valid_at(now)) {
        if let Some(scope) = &token.worker
            && scope.ids.iter().any(|pattern| pattern.is_any())
        {
            tracing::warn!(
                token = %token.name,
                "worker token {:?} takes any worker id: whoever holds it may register as any \
                 worker that is not connected; re-issue it with --worker-id naming its workers",
                token.name
            );
        }
    }
}

/// The names a node answers to in `Host` besides IP literals and `localhost`: its id, the
/// machine's host name, its advertised address, the DNS names of its TLS certificate (as they
/// are at start) and its public URLs.
fn node_names(
    options: &SchedulerOptions,
    tls: Option<&tls::ServerTls>,
) -> anyhow::Result<ax_core::cross_site::NodeNames> {
    let hostname = ax_proto::hostname();
    let advertised = options.advertise.as_deref().map(|url| {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        rest.split(['/', '?', '#']).next().unwrap_or("")
    });
    let certified = tls.map(tls::ServerTls::own_dns_names).unwrap_or_default();
    let names = [
        Some(options.node_id.as_str()),
        hostname.as_deref(),
        advertised,
    ];
    ax_core::cross_site::NodeNames::new(
        names
            .into_iter()
            .flatten()
            .chain(certified.iter().map(String::as_str)),
        &options.public_urls,
    )
    .map_err(|why| anyhow::anyhow!("--public-url: {why}"))
}

/// Starts the ops listener (`metrics::ops_router` and the same health service as the main
/// port), stopped with the main server.
async fn serve_ops(
    address: SocketAddr,
    scraped: metrics::Scraped,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    connections: &connections::Connections,
) -> anyhow::Result<SocketAddr> {
    let listener = connections::bind(address)
        .with_context(|| format!("binding the ops listener {address}"))?;
    let bound = listener.local_addr()?;
    let routes = tonic::service::Routes::from(metrics::ops_router(scraped))
        .add_service(health)
        .prepare();
    connections.serve(listener, connections::HttpService::new(routes), None);
    tracing::info!(addr = %bound, "ops listener (metrics, health) serving");
    Ok(bound)
}

/// A url without its password, for logs and errors.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

mod admission;
pub mod alerts;
mod audit_writer;
pub mod auth;
mod backstop;
mod clock;
pub mod config;
pub mod connections;
mod cut_off_gate;
mod dag_layouts;
mod deadlines;
mod dispatch_send;
mod dispatcher;
mod failure_alerts;
mod group_commit;
mod grpc;
pub mod guards;
mod json_errors;
mod log_writer;
mod membership;
mod metrics;
mod node;
mod parts;
mod place_now;
mod progress;
mod registry;
mod reporter;
mod retention;
mod run_creator;
mod schedules;
pub mod secrets;
mod shutdown;
mod specs;
mod spread;
mod sub_workflows;
pub mod telemetry;
pub mod tls;
mod to_worker;
mod wake;
mod watching;
mod web;
mod worker_refusals;
mod worker_rows;

#[cfg(test)]
mod tests {
    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            super::redact("mysql://root:secret@db:3306/ax"),
            "mysql://root:***@db:3306/ax"
        );
        assert_eq!(super::redact("mysql://root@db/ax"), "mysql://root@db/ax");
        assert_eq!(super::redact("sqlite://.ax/ax.db"), "sqlite://.ax/ax.db");
    }
}
