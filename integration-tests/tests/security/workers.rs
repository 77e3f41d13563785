//! Who may hold a worker stream, what it is sent, and that a worker is who its credential says
//! (issue 32, the worker stream's part of 2 and all of 3), against a node with tokens on a real
//! store:
//!
//! - only `worker` tokens open `WorkerService.Connect` (an admin token, scoped or not, is
//!   refused);
//! - a worker token limited to apps is sent only their tasks, by every route (the dispatcher,
//!   tasks placed as they are created, consistent hashing, sharded broadcast); one limited to
//!   labels cannot register claiming another;
//! - a token registers only the ids it names (`w1` hijacked by another token's holder is
//!   refused, and w1's running attempt is untouched), and an id with a live stream is not taken
//!   by a second process, while a worker killed and restarted under its id, and one whose
//!   connection was cut or blackholed, take their id back at once (well before the silence that
//!   would let anyone take it);
//! - a stream's frames about attempts not dispatched to its worker (another worker's ended
//!   attempt, an attempt to come) are not stored, are answered `ReportRefused`, are counted in
//!   `/metrics` and audited in a few rows, not one per frame; lines cannot be written ahead for
//!   a retry;
//! - with mutual TLS, certificate names compare to ids exactly (`W1` and `w1.` are not `w1`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ax_core::access::Role;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::state::InstanceState;
use ax_core::worker_scope::WorkerScope;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::proto_worker::{ProtoWorker, ProtoWorkerOptions};
use ax_integration_tests::proxy::TcpProxy;
use ax_integration_tests::requirements::MYSQL;
use ax_integration_tests::{Backend, Cluster};
use ax_proto::v1 as pb;
use ax_scheduler::AuthMode;
use ax_scheduler::auth::tokens::{TokenRequest, create};
use ax_store::Store;
use pb::scheduler_message::Body as FromScheduler;
use pb::worker_message::Body as ToScheduler;
use tonic::Code;

use super::{Client, client};

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) sqlite_admin_tokens_cannot_hold_a_worker_stream),
        trial!(async(multi_thread) mysql_admin_tokens_cannot_hold_a_worker_stream).requires(&MYSQL),
        trial!(async(multi_thread) sqlite_a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve),
        trial!(async(multi_thread) mysql_a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve).requires(&MYSQL),
        trial!(async(multi_thread) sqlite_a_token_takes_only_its_ids_and_a_live_id_is_not_taken),
        trial!(async(multi_thread) mysql_a_token_takes_only_its_ids_and_a_live_id_is_not_taken).requires(&MYSQL),
        trial!(async(multi_thread) sqlite_a_killed_or_cut_worker_takes_its_id_back_at_once),
        trial!(async(multi_thread) mysql_a_killed_or_cut_worker_takes_its_id_back_at_once).requires(&MYSQL),
        trial!(async(multi_thread) sqlite_frames_about_attempts_not_dispatched_to_the_stream_are_refused),
        trial!(async(multi_thread) mysql_frames_about_attempts_not_dispatched_to_the_stream_are_refused).requires(&MYSQL),
        trial!(async(multi_thread) certificate_names_compare_to_worker_ids_exactly),
    ]
}

/// A hang guard for waits, never a measurement.
const GUARD: Duration = Duration::from_secs(30);

/// A node with tokens on, its store opened beside it, and an admin's client.
struct Node {
    cluster: Cluster,
    store: Arc<Store>,
    admin: Client,
}

impl Node {
    /// `heartbeat`: the node's worker heartbeat interval (a stream silent for two is gone).
    async fn start(backend: Backend, heartbeat: Option<Duration>) -> Node {
        let mut builder = Cluster::builder(backend)
            .auth(AuthMode::Tokens)
            .auth_failures_per_address(10_000)
            .ops_listener();
        if let Some(interval) = heartbeat {
            builder = builder.heartbeat_interval(interval);
        }
        let cluster = builder.start().await.expect("cluster");
        let store = ax_store::open(cluster.store_url()).await.expect("store");
        let admin_token = token(store.as_ref(), "admin", Role::Admin, None, None).await;
        let admin = client(&cluster.endpoint(), Some(&admin_token)).await;
        Node {
            cluster,
            store,
            admin,
        }
    }

    fn endpoint(&self) -> String {
        self.cluster.endpoint()
    }

    async fn apply(&mut self, source: &str) {
        self.admin
            .apply_workflow(pb::ApplyWorkflowRequest {
                source: source.into(),
                ..Default::default()
            })
            .await
            .expect("apply");
    }

    async fn trigger(&mut self, workflow: &str) -> i64 {
        self.admin
            .trigger_workflow(pb::TriggerWorkflowRequest {
                name: workflow.into(),
                ..Default::default()
            })
            .await
            .expect("trigger")
            .into_inner()
            .run
            .expect("a run")
            .id
    }

    /// The instances of `run` once `done` holds for them.
    async fn wait_instances(
        &self,
        run: i64,
        what: &str,
        done: impl Fn(&[ax_store::InstanceRecord]) -> bool,
    ) -> Vec<ax_store::InstanceRecord> {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let instances = self
                .store
                .list_instances(ax_core::ids::RunId(run))
                .await
                .expect("instances");
            if done(&instances) {
                return instances;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never: {what}: {instances:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The attempt's stored lines, once as many are stored as the attempt produced (or the guard
    /// passed): the node's log writer stores them a moment after the end it reported.
    async fn lines(&self, instance: InstanceId, attempt: u32) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let produced = self
                .store
                .list_attempts(instance)
                .await
                .expect("attempts")
                .into_iter()
                .find(|a| a.attempt == Attempt(attempt))
                .map_or(0, |a| a.log_lines);
            let lines: Vec<String> = self
                .store
                .read_logs(instance, Attempt(attempt), 0, 1_000)
                .await
                .expect("logs")
                .into_iter()
                .map(|line| line.text)
                .collect();
            if lines.len() as u64 >= produced || tokio::time::Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The audit rows about worker `id` with `action`.
    /// The audit rows of `action` on worker `id`, once there are `at_least` of them (or the
    /// guard passed): the node's audit writer stores them a group at a time, after the call
    /// that caused them has answered.
    async fn audit(&self, action: &str, id: &str, at_least: usize) -> Vec<ax_store::AuditRecord> {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let rows: Vec<ax_store::AuditRecord> = self
                .store
                .list_audit(10_000)
                .await
                .expect("audit")
                .into_iter()
                .filter(|row| row.action == action && row.target == format!("worker/{id}"))
                .collect();
            if rows.len() >= at_least || tokio::time::Instant::now() > deadline {
                return rows;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of one series of the node's `/metrics` (0 when it is not there).
    async fn metric(&self, series: &str) -> f64 {
        let ops = self.cluster.scheduler.ops_addr().expect("ops listener");
        let text = reqwest::get(format!("http://{ops}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text");
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

async fn token(
    store: &Store,
    name: &str,
    role: Role,
    app: Option<&str>,
    worker: Option<WorkerScope>,
) -> String {
    let request = TokenRequest {
        name: name.into(),
        role,
        app: app.map(str::to_string),
        lifetime_ms: None,
        created_by: "test".into(),
        worker,
    };
    create(store, request, chrono::Utc::now().timestamp_millis())
        .await
        .expect("token")
        .0
}

fn scope(ids: &[&str], apps: &[&str], labels: &[&str]) -> WorkerScope {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    WorkerScope::parse(&strings(ids), &strings(apps), &strings(labels)).expect("scope")
}

fn register(id: &str, incarnation: &str) -> pb::Register {
    pb::Register {
        protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
        worker_id: id.into(),
        version: "test".into(),
        capacity: 4,
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        hostname: "test".into(),
        incarnation: incarnation.into(),
        ..Default::default()
    }
}

/// A worker stream driven frame by frame: what a hostile worker process can do with a token.
struct Raw {
    tx: tokio::sync::mpsc::Sender<pb::WorkerMessage>,
    inbound: tonic::Streaming<pb::SchedulerMessage>,
}

impl Raw {
    /// Opens a stream with `token`, sends `register`, and waits for the node's answer: the
    /// stream once Registered, else the status it was refused with.
    async fn open(
        endpoint: &str,
        token: &str,
        register: pb::Register,
    ) -> Result<Raw, tonic::Status> {
        let auth = ax_proto::client::ClientAuth {
            token: Some(token.into()),
            ..Default::default()
        };
        let channel = auth
            .endpoint(endpoint, None)
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut client = pb::worker_service_client::WorkerServiceClient::with_interceptor(
            channel,
            auth.bearer().expect("bearer"),
        );
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        tx.send(wrap(ToScheduler::Register(register)))
            .await
            .expect("queue Register");
        let mut inbound = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        match tokio::time::timeout(GUARD, inbound.message()).await {
            Ok(Ok(Some(pb::SchedulerMessage {
                body: Some(FromScheduler::Registered(_)),
            }))) => Ok(Raw { tx, inbound }),
            Ok(Ok(other)) => panic!("expected Registered, got {other:?}"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer to Register"),
        }
    }

    async fn send(&self, body: ToScheduler) {
        self.tx.send(wrap(body)).await.expect("send");
    }

    /// The ReportRefused frames received until `count` have come.
    async fn refusals(&mut self, count: usize) -> Vec<pb::ReportRefused> {
        let mut refused = Vec::new();
        let deadline = tokio::time::Instant::now() + GUARD;
        while refused.len() < count {
            let message = tokio::time::timeout_at(deadline, self.inbound.message())
                .await
                .unwrap_or_else(|_| panic!("only {} refusals: {refused:?}", refused.len()))
                .expect("stream")
                .expect("open");
            if let Some(FromScheduler::Refused(r)) = message.body {
                refused.push(r);
            }
        }
        refused
    }
}

fn wrap(body: ToScheduler) -> pb::WorkerMessage {
    pb::WorkerMessage { body: Some(body) }
}

fn proto_worker(id: &str, endpoint: &str, token: &str) -> ProtoWorkerOptions {
    ProtoWorkerOptions {
        token: Some(token.into()),
        ..ProtoWorkerOptions::new(id, endpoint)
    }
}

/// The workflows of the Dispatch frames a worker received.
fn dispatched_workflows(worker: &ProtoWorker) -> Vec<String> {
    worker
        .received()
        .into_iter()
        .filter_map(|message| match message.body {
            Some(FromScheduler::Dispatch(dispatch)) => Some(dispatch.workflow),
            _ => None,
        })
        .collect()
}

async fn admin_tokens_cannot_hold_a_worker_stream(backend: Backend) {
    let node = Node::start(backend, None).await;
    let store = node.store.as_ref();
    let admin = token(store, "root", Role::Admin, None, None).await;
    let sales_admin = token(store, "sales-admin", Role::Admin, Some("sales"), None).await;
    let operator = token(store, "ops", Role::Operator, None, None).await;
    let worker = token(
        store,
        "any-worker",
        Role::Worker,
        None,
        Some(scope(&["*"], &[], &[])),
    )
    .await;
    for (who, token) in [
        ("an admin token", &admin),
        ("an admin token scoped to an app", &sales_admin),
        ("an operator token", &operator),
    ] {
        let refused = Raw::open(&node.endpoint(), token, register("probe", "p"))
            .await
            .err()
            .unwrap_or_else(|| panic!("{who} opened a worker stream"));
        assert_eq!(refused.code(), Code::PermissionDenied, "{who}: {refused:?}");
        assert!(
            refused.message().contains("needs a worker token"),
            "{who}: {}",
            refused.message()
        );
    }
    assert!(
        Raw::open(&node.endpoint(), &worker, register("probe", "p"))
            .await
            .is_ok(),
        "a worker token opens it"
    );
    node.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_admin_tokens_cannot_hold_a_worker_stream() {
    admin_tokens_cannot_hold_a_worker_stream(Backend::Sqlite).await;
}

async fn mysql_admin_tokens_cannot_hold_a_worker_stream() {
    admin_tokens_cannot_hold_a_worker_stream(Backend::MySql).await;
}

const SALES: &str = "name: sales-wf
app: sales
tasks:
  - name: t
    command: echo sales
";

/// Every route a task can take: the dispatcher's default, consistent hashing (chosen among the
/// cluster's workers), and a sharded broadcast (a shard per worker that may serve it).
const FINANCE: &str = "name: finance-wf
app: finance
tasks:
  - name: plain
    command: echo finance
  - name: hashed
    command: echo hashed
    routing: consistent_hash
  - name: everywhere
    command: echo shard
    routing: sharded_broadcast
";

async fn a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve(backend: Backend) {
    let mut node = Node::start(backend, None).await;
    let store = node.store.clone();
    let sales_token = token(
        store.as_ref(),
        "sales-workers",
        Role::Worker,
        None,
        Some(scope(&["sales-*"], &["sales"], &["pool=gpu"])),
    )
    .await;
    let finance_token = token(
        store.as_ref(),
        "finance-workers",
        Role::Worker,
        None,
        Some(scope(&["fin-1"], &["finance"], &[])),
    )
    .await;
    node.apply(SALES).await;
    node.apply(FINANCE).await;

    // Labels: a worker may claim only what its token lists.
    for labels in [
        vec![("pool", "prod-db")],
        vec![("pool", "gpu"), ("zone", "east")],
    ] {
        let mut claim = register("sales-2", "p");
        claim.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let refused = Raw::open(&node.endpoint(), &sales_token, claim)
            .await
            .err()
            .unwrap_or_else(|| panic!("registered claiming {labels:?}"));
        assert_eq!(refused.code(), Code::PermissionDenied);
        assert!(
            refused
                .message()
                .contains("is not one this token may claim"),
            "{}",
            refused.message()
        );
    }

    let mut options = proto_worker("sales-1", &node.endpoint(), &sales_token);
    options.labels = BTreeMap::from([("pool".to_string(), "gpu".to_string())]);
    let sales = ProtoWorker::start(options).await.expect("sales-1");

    // With only the sales worker live, the finance run waits, saying why, and sales-1 is sent
    // none of it; a sales run goes to sales-1 meanwhile.
    let finance_run = node.trigger("finance-wf").await;
    let sales_run = node.trigger("sales-wf").await;
    let done = node
        .wait_instances(sales_run, "the sales run on sales-1", |instances| {
            instances.iter().all(|i| i.state == InstanceState::Success)
        })
        .await;
    assert_eq!(done[0].worker_id.as_deref(), Some("sales-1"));
    let workflow_id = node
        .store
        .get_workflow("finance-wf")
        .await
        .expect("read")
        .expect("finance-wf")
        .id;
    let deadline = tokio::time::Instant::now() + GUARD;
    let why = loop {
        let decisions = node
            .store
            .list_decisions(workflow_id, 0, i64::MAX, 100)
            .await
            .expect("decisions");
        if let Some(decision) = decisions
            .iter()
            .find(|d| d.detail.contains("whose token allows app finance"))
        {
            break decision.detail.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NoWorker decision: {decisions:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(why, "no live worker whose token allows app finance");
    let waiting = node
        .store
        .list_instances(ax_core::ids::RunId(finance_run))
        .await
        .expect("instances");
    assert!(
        waiting.iter().all(|i| i.state == InstanceState::Waiting),
        "{waiting:?}"
    );

    // A finance worker comes: the whole finance run goes to it, every route included, and the
    // broadcast has one shard (the sales worker may not serve it).
    let finance = ProtoWorker::start(proto_worker("fin-1", &node.endpoint(), &finance_token))
        .await
        .expect("fin-1");
    let instances = node
        .wait_instances(finance_run, "the finance run on fin-1", |instances| {
            instances.len() >= 4 && instances.iter().all(|i| i.state == InstanceState::Success)
        })
        .await;
    // (A sharded task's parent runs nowhere: its shards do.)
    for instance in instances
        .iter()
        .filter(|i| i.task != "everywhere" || i.shard.is_some())
    {
        assert_eq!(
            instance.worker_id.as_deref(),
            Some("fin-1"),
            "{}",
            instance.task
        );
    }
    let shards = instances.iter().filter(|i| i.shard.is_some()).count();
    assert_eq!(shards, 1, "{instances:?}");
    assert!(
        dispatched_workflows(&sales)
            .iter()
            .all(|workflow| workflow == "sales-wf"),
        "sales-1 was sent {:?}",
        dispatched_workflows(&sales)
    );
    assert!(
        dispatched_workflows(&finance)
            .iter()
            .all(|workflow| workflow == "finance-wf")
    );
    // Tasks placed as they are created go by the same rule: a sales run's task is placed on
    // sales-1 in the transaction that creates it, a finance run's on fin-1.
    for (workflow, worker) in [("sales-wf", "sales-1"), ("finance-wf", "fin-1")] {
        let run = node.trigger(workflow).await;
        let done = node
            .wait_instances(run, workflow, |instances| {
                !instances.is_empty() && instances.iter().all(|i| i.state == InstanceState::Success)
            })
            .await;
        assert!(
            done.iter()
                .filter(|i| i.task != "everywhere" || i.shard.is_some())
                .all(|i| i.worker_id.as_deref() == Some(worker)),
            "{done:?}"
        );
    }
    assert!(
        dispatched_workflows(&sales)
            .iter()
            .all(|workflow| workflow == "sales-wf")
    );
    drop((sales, finance));
    node.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve() {
    a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve(Backend::Sqlite).await;
}

async fn mysql_a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve() {
    a_worker_token_limited_to_apps_and_labels_gets_only_what_it_may_serve(Backend::MySql).await;
}

const LONG: &str = "name: long
tasks:
  - name: t
    command: sleep 60
    retries: 1
    retry_backoff: 1s
";

async fn a_token_takes_only_its_ids_and_a_live_id_is_not_taken(backend: Backend) {
    let mut node = Node::start(backend, None).await;
    let store = node.store.clone();
    let w1_token = token(
        store.as_ref(),
        "w1",
        Role::Worker,
        None,
        Some(scope(&["w1"], &[], &[])),
    )
    .await;
    let etl_token = token(
        store.as_ref(),
        "etl",
        Role::Worker,
        None,
        Some(scope(&["etl-*"], &[], &[])),
    )
    .await;
    let any_token = token(
        store.as_ref(),
        "anyone",
        Role::Worker,
        None,
        Some(scope(&["*"], &[], &[])),
    )
    .await;
    node.apply(LONG).await;
    let w1 = ProtoWorker::start(proto_worker("w1", &node.endpoint(), &w1_token))
        .await
        .expect("w1");
    let run = node.trigger("long").await;
    let running = node
        .wait_instances(run, "w1 runs the task", |instances| {
            instances.iter().any(|i| i.state == InstanceState::Running)
        })
        .await;
    let instance = running[0].id;

    // Another token's holder, registering as w1, listing nothing.
    let refused = Raw::open(&node.endpoint(), &etl_token, register("w1", "hijack"))
        .await
        .err()
        .expect("the etl token registered as w1");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused
            .message()
            .contains("worker id \"w1\" is not one this token may register (it allows etl-*)"),
        "{}",
        refused.message()
    );
    // A token that allows any id: w1's stream is live, so it is not taken.
    let refused = Raw::open(&node.endpoint(), &any_token, register("w1", "hijack"))
        .await
        .err()
        .expect("a second stream took w1");
    assert_eq!(refused.code(), Code::AlreadyExists);
    assert!(
        refused
            .message()
            .contains("worker \"w1\" already has a live stream on this node, from 127.0.0.1:"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("last heard"),
        "{}",
        refused.message()
    );

    // w1's attempt is untouched: still running, attempt 1, on w1, nothing lost.
    let now = node
        .store
        .get_instance(instance)
        .await
        .expect("read")
        .expect("instance");
    assert_eq!(
        (now.state, now.attempt, now.worker_id.as_deref()),
        (InstanceState::Running, Attempt(1), Some("w1"))
    );
    assert_eq!(
        node.store
            .list_attempts(instance)
            .await
            .expect("attempts")
            .len(),
        1
    );
    let refusals = node.audit("worker_register_refused", "w1", 2).await;
    let tokens: Vec<&str> = refusals.iter().map(|r| r.token.as_str()).collect();
    assert!(
        tokens.contains(&"etl") && tokens.contains(&"anyone"),
        "{refusals:?}"
    );
    assert_eq!(
        node.metric("ax_worker_registers_refused_total{reason=\"id\"}")
            .await,
        1.0
    );
    assert_eq!(
        node.metric("ax_worker_registers_refused_total{reason=\"second_stream\"}")
            .await,
        1.0
    );
    drop(w1);
    node.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_a_token_takes_only_its_ids_and_a_live_id_is_not_taken() {
    a_token_takes_only_its_ids_and_a_live_id_is_not_taken(Backend::Sqlite).await;
}

async fn mysql_a_token_takes_only_its_ids_and_a_live_id_is_not_taken() {
    a_token_takes_only_its_ids_and_a_live_id_is_not_taken(Backend::MySql).await;
}

const ECHO: &str = "name: echo
tasks:
  - name: t
    command: echo after
";

/// The node's heartbeat is 30 s here, so a stream is taken over by silence only after 60 s:
/// every recovery below, within the 30 s guard, is the node telling a gone stream from a live
/// one (its connection closed, or the same process reconnecting), not waiting it out.
async fn a_killed_or_cut_worker_takes_its_id_back_at_once(backend: Backend) {
    let mut node = Node::start(backend, Some(Duration::from_secs(30))).await;
    let store = node.store.clone();
    let any_token = token(
        store.as_ref(),
        "workers",
        Role::Worker,
        None,
        Some(scope(&["*"], &[], &[])),
    )
    .await;
    node.apply(LONG).await;
    node.apply(ECHO).await;

    // Killed (its connection closes with it) and started again under its id: it registers at
    // once, and what the dead process ran is ended and retried on it.
    let first = ProtoWorker::start(proto_worker("w1", &node.endpoint(), &any_token))
        .await
        .expect("w1");
    let run = node.trigger("long").await;
    let running = node
        .wait_instances(run, "w1 runs the task", |instances| {
            instances.iter().any(|i| i.state == InstanceState::Running)
        })
        .await;
    first.die();
    let again = ProtoWorker::start(proto_worker("w1", &node.endpoint(), &any_token))
        .await
        .expect("w1 restarted takes its id back");
    let retried = node
        .wait_instances(run, "the retry runs on the restarted w1", |instances| {
            instances
                .iter()
                .any(|i| i.attempt == Attempt(2) && i.state == InstanceState::Running)
        })
        .await;
    assert_eq!(retried[0].id, running[0].id);
    let attempts = node
        .store
        .list_attempts(running[0].id)
        .await
        .expect("attempts");
    assert!(
        attempts[0]
            .message
            .contains("worker w1 registered without it"),
        "{attempts:?}"
    );
    drop(again);

    // A worker behind a proxy that blackholes its stream (the node's side stays open and
    // silent) moves to its other endpoint and takes its id back there.
    let direct: std::net::SocketAddr = node.cluster.addr;
    let blackholed = TcpProxy::start(direct).await.expect("proxy");
    let cut = TcpProxy::start(direct).await.expect("proxy");
    let worker = |id: &str, endpoints: Vec<String>| {
        let options = ax_worker::WorkerOptions {
            endpoints,
            worker_id: id.into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            capacity: 2,
            heartbeat_interval: Duration::from_millis(300),
            task_heartbeat_interval: Duration::from_secs(2),
            reconnect_initial: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(500),
            auth: ax_proto::client::ClientAuth {
                token: Some(any_token.clone()),
                ..Default::default()
            },
            ..ax_worker::WorkerOptions::default()
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run(options, cancel.clone()));
        (cancel, handle)
    };
    let (stop_w2, w2) = worker("w2", vec![blackholed.url(), node.endpoint()]);
    let (stop_w3, w3) = worker("w3", vec![cut.url()]);
    let live_on = |id: &'static str, store: Arc<Store>| async move {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let row = store.worker(id).await.expect("row");
            if row.as_ref().is_some_and(|row| row.connected) {
                return row.expect("row");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never registered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    live_on("w2", store.clone()).await;
    live_on("w3", store.clone()).await;
    assert!(
        blackholed.forwarded() > 0,
        "w2 came through the proxy first"
    );
    let refused_before = node
        .metric("ax_worker_registers_refused_total{reason=\"second_stream\"}")
        .await;
    let broken_at = chrono::Utc::now().timestamp_millis();
    blackholed.blackhole();
    cut.cut();
    tokio::time::sleep(Duration::from_millis(100)).await;
    cut.heal();
    // Each is heard again after the break, so on a new stream: the blackholed one delivers
    // nothing, the cut one is closed. (w2's old stream is still open on the node, and silent
    // for less than the 60 s that would make it gone: it is the same process coming back.)
    for id in ["w2", "w3"] {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let row = store.worker(id).await.expect("row").expect("a row");
            if row.connected && row.last_heartbeat > broken_at + 1_000 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for _ in 0..4 {
        let run = node.trigger("echo").await;
        node.wait_instances(run, "a run after the break", |instances| {
            !instances.is_empty() && instances.iter().all(|i| i.state == InstanceState::Success)
        })
        .await;
    }
    assert_eq!(
        node.metric("ax_worker_registers_refused_total{reason=\"second_stream\"}")
            .await,
        refused_before,
        "a worker coming back after a break was refused"
    );
    stop_w2.cancel();
    stop_w3.cancel();
    let _ = tokio::time::timeout(GUARD, w2).await;
    let _ = tokio::time::timeout(GUARD, w3).await;
    node.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_a_killed_or_cut_worker_takes_its_id_back_at_once() {
    a_killed_or_cut_worker_takes_its_id_back_at_once(Backend::Sqlite).await;
}

async fn mysql_a_killed_or_cut_worker_takes_its_id_back_at_once() {
    a_killed_or_cut_worker_takes_its_id_back_at_once(Backend::MySql).await;
}

const HELLO: &str = "name: hello
tasks:
  - name: t
    command: echo hello
";

async fn frames_about_attempts_not_dispatched_to_the_stream_are_refused(backend: Backend) {
    let mut node = Node::start(backend, None).await;
    let store = node.store.clone();
    let w1_token = token(
        store.as_ref(),
        "w1",
        Role::Worker,
        None,
        Some(scope(&["w1"], &[], &[])),
    )
    .await;
    let rogue_token = token(
        store.as_ref(),
        "rogue",
        Role::Worker,
        None,
        Some(scope(&["rogue"], &[], &[])),
    )
    .await;
    node.apply(HELLO).await;
    let w1 = ProtoWorker::start(proto_worker("w1", &node.endpoint(), &w1_token))
        .await
        .expect("w1");
    let run = node.trigger("hello").await;
    let done = node
        .wait_instances(run, "w1 runs hello", |instances| {
            instances.iter().all(|i| i.state == InstanceState::Success)
        })
        .await;
    let instance = done[0].id;
    assert_eq!(node.lines(instance, 1).await, ["hello"]);

    let mut rogue = Raw::open(&node.endpoint(), &rogue_token, register("rogue", "r"))
        .await
        .expect("rogue registers as itself");
    let logs = |attempt: u32, first_seq: u64, text: &str| {
        ToScheduler::Logs(pb::LogBatch {
            instance_id: instance.0,
            attempt,
            first_seq,
            sent_at_ms: 1,
            streams: vec![1],
            body: text.into(),
            ..Default::default()
        })
    };
    // Lines for w1's ended attempt (the issue's INJECTED), 50 times, and for attempt 2, which
    // does not exist yet (a retry would have found its first line taken).
    for n in 0..50 {
        rogue.send(logs(1, 2 + n, "INJECTED: after the end")).await;
    }
    rogue.send(logs(2, 1, "INJECTED: ahead")).await;
    rogue
        .send(ToScheduler::Started(pb::AttemptStarted {
            instance_id: instance.0,
            attempt: 2,
            pid: 1,
            started_at_ms: 1,
        }))
        .await;
    rogue
        .send(ToScheduler::TaskHeartbeat(pb::TaskHeartbeat {
            instance_id: instance.0,
            attempt: 1,
            sent_at_ms: 1,
        }))
        .await;
    rogue
        .send(ToScheduler::Rejected(pb::DispatchRejected {
            instance_id: instance.0,
            attempt: 1,
            reason: "rogue".into(),
            duplicate: false,
        }))
        .await;
    rogue
        .send(ToScheduler::Finished(pb::AttemptFinished {
            instance_id: instance.0,
            attempt: 1,
            outcome: pb::AttemptOutcome::Failed as i32,
            exit_code: Some(1),
            finished_at_ms: 1,
            message: "INJECTED".into(),
            ..Default::default()
        }))
        .await;
    let refused = rogue.refusals(55).await;
    assert!(
        refused
            .iter()
            .all(|r| r.code == Code::PermissionDenied as i32 && r.instance_id == instance.0),
        "{refused:?}"
    );
    assert!(
        refused[0]
            .reason
            .contains("which was not dispatched to worker rogue"),
        "{refused:?}"
    );

    // Nothing of it was stored.
    assert_eq!(node.lines(instance, 1).await, ["hello"]);
    assert!(node.lines(instance, 2).await.is_empty());
    let now = node
        .store
        .get_instance(instance)
        .await
        .expect("read")
        .expect("instance");
    assert_eq!(
        (now.state, now.attempt),
        (InstanceState::Success, Attempt(1))
    );
    assert_eq!(
        node.store
            .list_attempts(instance)
            .await
            .expect("attempts")
            .len(),
        1
    );

    // Counted, each kind; audited in a row per kind, not one per frame.
    for (kind, count) in [
        ("logs", 51.0),
        ("started", 1.0),
        ("heartbeat", 1.0),
        ("rejected", 1.0),
        ("finished", 1.0),
    ] {
        assert_eq!(
            node.metric(&format!(
                "ax_worker_frames_refused_total{{kind=\"{kind}\"}}"
            ))
            .await,
            count,
            "{kind}"
        );
    }
    let rows = node.audit("worker_frame_refused", "rogue", 5).await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(rows.iter().all(|row| row.token == "rogue"), "{rows:?}");
    assert!(
        rows.iter().any(|row| row.detail
            == format!(
                "log lines for attempt 1 of instance {instance}, which was not dispatched to \
                 worker rogue: not stored"
            )),
        "{rows:?}"
    );

    // The attempt the rogue wrote ahead for (a rerun) runs on w1 with its own lines only.
    // (The rogue leaves first: it is a worker too, and would be sent the rerun.)
    drop(rogue);
    let deadline = tokio::time::Instant::now() + GUARD;
    while node
        .store
        .worker("rogue")
        .await
        .expect("row")
        .is_some_and(|row| row.connected)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rogue never left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.admin
        .rerun_run(pb::RerunRunRequest {
            id: run,
            from_task: "t".into(),
            ..Default::default()
        })
        .await
        .expect("rerun");
    node.wait_instances(run, "attempt 2 on w1", |instances| {
        instances
            .iter()
            .all(|i| i.attempt == Attempt(2) && i.state == InstanceState::Success)
    })
    .await;
    assert_eq!(node.lines(instance, 2).await, ["hello"]);
    drop(w1);
    node.cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_frames_about_attempts_not_dispatched_to_the_stream_are_refused() {
    frames_about_attempts_not_dispatched_to_the_stream_are_refused(Backend::Sqlite).await;
}

async fn mysql_frames_about_attempts_not_dispatched_to_the_stream_are_refused() {
    frames_about_attempts_not_dispatched_to_the_stream_are_refused(Backend::MySql).await;
}

/// With mutual TLS a worker's certificate must name its id exactly: DNS matching would take
/// `W1` and `w1.` for `w1`.
async fn certificate_names_compare_to_worker_ids_exactly() {
    use ax_integration_tests::process::Process;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = super::Ca::new("ax test CA");
    let ca_file = ca.write(d, "ca.pem");
    let (server_cert, server_key) = ca.sign(&["localhost", "127.0.0.1"], d, "server");
    let store = format!("sqlite://{}", d.join("ax.db").display());
    let create = |args: &[&str]| {
        let mut all = vec!["--store", &store, "token", "create"];
        all.extend_from_slice(args);
        let (code, token, err) = super::run("ax-scheduler", &all);
        assert_eq!(code, 0, "{err}");
        token.trim().to_string()
    };
    let admin = create(&["--name", "root", "--role", "admin"]);
    let worker_token = create(&["--name", "workers", "--role", "worker", "--worker-id", "*"]);
    let token_file = d.join("worker.token");
    std::fs::write(&token_file, &worker_token).unwrap();
    let port = super::free_port().expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    let server = format!("https://localhost:{port}");
    let args: Vec<String> = [
        "--listen",
        &listen,
        "--store",
        &store,
        "--auth",
        "tokens",
        "--tls-cert",
        &server_cert,
        "--tls-key",
        &server_key,
        "--tls-client-ca",
        &ca_file,
        "--heartbeat-interval",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scheduler = Process::spawn(
        "ax-scheduler",
        &ax_integration_tests::binary("ax-scheduler").unwrap(),
        &args,
        d,
        d.join("scheduler.log"),
    )
    .unwrap();
    let axctl = |extra: &[&str]| {
        let mut args = vec!["--server", &server, "--tls-ca", &ca_file, "--token", &admin];
        args.extend_from_slice(extra);
        super::run("axctl", &args)
    };
    super::eventually("the node answers over TLS", || axctl(&["whoami"]).0 == 0).await;
    let live = || {
        let (_, out, _) = axctl(&["workers", "-o", "json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|w| w["id"] == "w1" && w["state"] == "LIVE")
    };
    let token_file = token_file.display().to_string();
    let worker_as_w1 = |stem: &str, name: &str| {
        let (cert, key) = ca.sign(&[name], d, stem);
        let args: Vec<String> = [
            "--scheduler",
            &server,
            "--id",
            "w1",
            "--tls-ca",
            &ca_file,
            "--token-file",
            &token_file,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--heartbeat-interval",
            "500ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--state-dir".to_string(),
            d.join(format!("state-{stem}")).display().to_string(),
        ])
        .collect();
        Process::spawn(
            stem,
            &ax_integration_tests::binary("ax-worker").unwrap(),
            &args,
            d,
            d.join(format!("{stem}.log")),
        )
        .unwrap()
    };
    for (stem, name) in [("upper", "W1"), ("dotted", "w1.")] {
        let mut worker = worker_as_w1(stem, name);
        super::eventually(
            &format!("a certificate naming {name:?} is refused for w1"),
            || {
                worker
                    .log_text()
                    .contains("the worker's certificate does not name worker")
            },
        )
        .await;
        assert!(!live(), "w1 registered with a certificate naming {name:?}");
        worker.kill().await.unwrap();
    }
    let exact = worker_as_w1("exact", "w1");
    super::eventually("a certificate naming w1 registers w1", live).await;
    drop((exact, scheduler));
}
