//! Apps as a boundary. A token scoped to an app (viewer, operator or admin) learns nothing of
//! another app's objects and changes none of them: every `ControlService` method and every
//! `/api/v1` route that names a workflow, run, instance, secret or app answers a sales-scoped
//! caller about a finance object exactly as about one that does not exist (code and message,
//! the name or id set aside), and the finance app's rows in the store are the same afterwards.
//!
//! Secrets belong to an app, or are global: a scoped admin can neither name another app's
//! secret in a workflow (issue 32's exfiltration: the apply is refused and nothing runs) nor
//! list, set or delete one; a dispatch takes the app's own secret or the global one, never
//! another app's, checked again when it is opened; and a stored log line is masked for the
//! secrets its task could have been given only, so masking tells no task whether a string is
//! another app's secret. A scoped run list pages over its own app's runs only.
//!
//! A trigger refused for load (the bounds on waiting instances) tells a scoped caller the bound
//! it met and its own app's count, never the cluster's, which spans the other apps; a trigger
//! of another app's workflow reads as missing before any bound is looked at.
//!
//! Runs on SQLite and, with `AX_TEST_MYSQL_URL`, MySQL.

use std::collections::BTreeSet;
use std::time::Duration;

use ax_core::access::Role;
use ax_integration_tests::harness::{Runtime, Test, test_name};
use ax_integration_tests::requirements::MYSQL;
use ax_integration_tests::{Backend, Cluster};
use ax_proto::client::{Bearer, ClientAuth};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use ax_scheduler::AuthMode;
use ax_scheduler::auth::tokens::{TokenRequest, create};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

type Client = ControlServiceClient<InterceptedService<Channel, Bearer>>;

/// 32 bytes, base64: this test's own secret key.
const KEY: &str = "dGhlIGFwcCBzY29wZXMgdGVzdCBrZXk6IDMyIGIhISE=";

const FINANCE_WF: &str = "name: finance-wf
app: finance
schedule:
  cron: '0 3 * * *'
tasks:
  - name: extract
    command: echo \"extract $DB\"
    env:
      DB: { secret: finance-db }
  - name: load
    upstream: [extract]
    command: echo load
";

const SALES_WF: &str = "name: sales-wf
app: sales
tasks:
  - name: report
    command: echo report
";

const FINANCE_VALUE: &str = "finance-db-s3cret-value";

/// A node asking for tokens, a worker serving it, an unscoped admin token and a viewer, an
/// operator and an admin scoped to app `sales`.
struct Scene {
    cluster: Cluster,
    endpoint: String,
    root: String,
    sales: Vec<(Role, String)>,
    worker: (CancellationToken, JoinHandle<anyhow::Result<()>>),
}

impl Scene {
    async fn start(backend: Backend) -> Scene {
        let cluster = Cluster::builder(backend)
            .auth(AuthMode::Tokens)
            .auth_failures_per_address(100_000)
            .secret_key(ax_scheduler::secrets::SecretKey::from_base64(KEY).expect("key"))
            .start()
            .await
            .expect("cluster");
        let store = ax_store::open(cluster.store_url()).await.expect("store");
        let now = chrono::Utc::now().timestamp_millis();
        let make = async |name: &str, role: Role, app: Option<&str>| {
            let request = TokenRequest {
                name: name.into(),
                role,
                app: app.map(str::to_string),
                lifetime_ms: None,
                created_by: "test".into(),
                worker: (role == Role::Worker).then(ax_core::worker_scope::WorkerScope::any),
            };
            create(store.as_ref(), request, now).await.expect("token").0
        };
        let root = make("root", Role::Admin, None).await;
        let worker_token = make("workers", Role::Worker, None).await;
        let mut sales = Vec::new();
        for role in [Role::Viewer, Role::Operator, Role::Admin] {
            let token = make(&format!("sales-{role}"), role, Some("sales")).await;
            sales.push((role, token));
        }
        let endpoint = cluster.endpoint();
        let options = ax_worker::WorkerOptions {
            endpoints: vec![endpoint.clone()],
            worker_id: "w1".into(),
            state_dir: Some(ax_integration_tests::fresh_state_dir()),
            capacity: 4,
            heartbeat_interval: Duration::from_millis(500),
            task_heartbeat_interval: Duration::from_secs(2),
            auth: ClientAuth {
                token: Some(worker_token),
                ..ClientAuth::default()
            },
            ..ax_worker::WorkerOptions::default()
        };
        let cancel = CancellationToken::new();
        let handle = tokio::spawn(ax_worker::run(options, cancel.clone()));
        let scene = Scene {
            cluster,
            endpoint,
            root,
            sales,
            worker: (cancel, handle),
        };
        let mut root = scene.root().await;
        eventually("the worker is live", async || {
            root.list_workers(pb::ListWorkersRequest {})
                .await
                .is_ok_and(|answer| {
                    answer
                        .into_inner()
                        .workers
                        .iter()
                        .any(|w| w.id == "w1" && w.state == pb::WorkerState::Live as i32)
                })
        })
        .await;
        scene
    }

    async fn client(&self, token: &str) -> Client {
        let auth = ClientAuth {
            token: Some(token.to_string()),
            ..ClientAuth::default()
        };
        let channel = auth
            .endpoint(&self.endpoint, None)
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        ControlServiceClient::with_interceptor(channel, auth.bearer().expect("bearer"))
    }

    async fn root(&self) -> Client {
        self.client(&self.root).await
    }

    fn sales(&self, role: Role) -> &str {
        self.sales
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, token)| token.as_str())
            .expect("a sales token of that role")
    }

    async fn store(&self) -> std::sync::Arc<ax_store::Store> {
        ax_store::open(self.cluster.store_url())
            .await
            .expect("store")
    }

    async fn stop(self) {
        let (cancel, handle) = self.worker;
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(30), handle)
            .await
            .expect("the worker stops")
            .expect("the worker's task")
            .expect("the worker");
        self.cluster.shutdown().await.expect("shutdown");
    }
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn set_secret(client: &mut Client, app: &str, name: &str, value: &str) {
    client
        .set_secret(pb::SetSecretRequest {
            name: name.into(),
            value: value.into(),
            app: app.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("set {app}/{name}: {status}"));
}

async fn apply(client: &mut Client, source: &str, dry_run: bool) -> Result<(), tonic::Status> {
    applied(client, source, dry_run).await.map(drop)
}

/// The apply's answer: its outcome and warnings.
async fn applied(
    client: &mut Client,
    source: &str,
    dry_run: bool,
) -> Result<pb::ApplyWorkflowResponse, tonic::Status> {
    client
        .apply_workflow(pb::ApplyWorkflowRequest {
            source: source.into(),
            source_name: "test.yaml".into(),
            dry_run,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Triggers `workflow` and waits for its run to end; answers the run.
async fn run_to_end(client: &mut Client, workflow: &str) -> pb::Run {
    let run = client
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: workflow.into(),
            ..Default::default()
        })
        .await
        .expect("trigger")
        .into_inner()
        .run
        .expect("a run");
    let ended = [
        pb::RunState::Success as i32,
        pb::RunState::Failed as i32,
        pb::RunState::Cancelled as i32,
    ];
    let mut last = run.clone();
    eventually(&format!("run {} of {workflow} ends", run.id), async || {
        last = client
            .get_run(pb::GetRunRequest { id: run.id })
            .await
            .expect("get run")
            .into_inner();
        ended.contains(&last.state)
    })
    .await;
    last
}

async fn log_lines(client: &mut Client, instance: i64) -> Vec<String> {
    let mut stream = client
        .get_logs(pb::GetLogsRequest {
            instance_id: instance,
            ..Default::default()
        })
        .await
        .expect("logs")
        .into_inner();
    let mut lines = Vec::new();
    while let Some(chunk) = stream.message().await.expect("a log chunk") {
        lines.extend(chunk.lines.into_iter().map(|line| line.text));
    }
    lines
}

/// The finance app: its workflow (paused, so no cron slot fires during the test), its secret,
/// and two ended runs. Answers the runs' ids and an instance of the first.
async fn finance(scene: &Scene) -> (Vec<i64>, i64) {
    let mut root = scene.root().await;
    set_secret(&mut root, "finance", "finance-db", FINANCE_VALUE).await;
    apply(&mut root, FINANCE_WF, false)
        .await
        .expect("apply finance-wf");
    root.pause_workflow(pb::PauseWorkflowRequest {
        name: "finance-wf".into(),
        ..Default::default()
    })
    .await
    .expect("pause");
    let mut runs = Vec::new();
    for _ in 0..2 {
        let run = run_to_end(&mut root, "finance-wf").await;
        assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
        runs.push(run.id);
    }
    let instance = root
        .list_instances(pb::ListInstancesRequest {
            run_id: runs[0],
            attempts: false,
            ..Default::default()
        })
        .await
        .expect("instances")
        .into_inner()
        .instances
        .iter()
        .find(|i| i.task == "extract")
        .expect("the extract instance")
        .id;
    assert_eq!(
        log_lines(&mut root, instance).await,
        ["extract ***"],
        "finance's own task got its secret, masked in its log"
    );
    (runs, instance)
}

/// What a scoped caller could have changed of the finance app, read from the store.
async fn finance_rows(store: &ax_store::Store) -> String {
    let workflow = store
        .get_workflow("finance-wf")
        .await
        .unwrap()
        .expect("finance-wf");
    let mut rows = vec![format!(
        "workflow v{} paused={} updated={} next={:?}",
        workflow.version, workflow.paused, workflow.updated_at, workflow.spec.schedule.cron
    )];
    for run in store
        .list_runs(Some("finance-wf"), None, None, 1_000)
        .await
        .unwrap()
    {
        rows.push(format!(
            "run {} {} finished={:?}",
            run.id, run.state, run.finished_at
        ));
        for instance in store.list_instances(run.id).await.unwrap() {
            rows.push(format!(
                "  instance {} {} {} attempt {}",
                instance.id, instance.task, instance.state, instance.attempt
            ));
        }
    }
    for secret in store.list_secrets().await.unwrap() {
        rows.push(format!(
            "secret {}/{} {} {} {}",
            secret.app, secret.name, secret.sealed, secret.updated_at, secret.updated_by
        ));
    }
    rows.join("\n")
}

/// The objects one side of the comparison names: finance's, or ones that do not exist.
struct Target {
    workflow: String,
    app: String,
    run: i64,
    instance: i64,
    secret: String,
}

impl Target {
    /// `text` with this target's names and ids replaced by placeholders.
    fn normalise(&self, text: &str) -> String {
        text.replace(&self.workflow, "WF")
            .replace(&self.secret, "SECRET")
            .replace(&self.app, "APP")
            .replace(&format!("run {}", self.run), "run N")
            .replace(&format!("instance {}", self.instance), "instance N")
            .replace(&format!("/runs/{}", self.run), "/runs/N")
            .replace(&format!("/instances/{}", self.instance), "/instances/N")
    }

    fn fill(&self, template: &str) -> String {
        template
            .replace("{WF}", &self.workflow)
            .replace("{APP}", &self.app)
            .replace("{RUN}", &self.run.to_string())
            .replace("{INST}", &self.instance.to_string())
            .replace("{SECRET}", &self.secret)
    }
}

/// The gRPC calls that name an object, by a row name starting with the method's.
const GRPC_ROWS: &[&str] = &[
    "GetWorkflow",
    "PauseWorkflow",
    "ResumeWorkflow",
    "TriggerWorkflow",
    "TriggerWorkflow with a key",
    "ListRuns of the workflow",
    "GetDag",
    "GetDag of a run, on a workflow of one's own",
    "GetDag of a run's version, on a workflow of one's own",
    "GetGrid",
    "ExplainWorkflow",
    "BackfillWorkflow, dry run",
    "BackfillWorkflow",
    "PurgeRuns, dry run",
    "PurgeRuns",
    "GetRun",
    "WatchRun",
    "CancelRun",
    "ListInstances",
    "ListInstances grouping items",
    "ListInstances items of an instance",
    "RerunRun of the failed part",
    "RerunRun from a task",
    "GetInstance",
    "CancelInstance",
    "RetryInstance",
    "MarkInstance",
    "GetLogs",
    "GetLogs of an attempt",
    "ApplyWorkflow after it, dry run",
    "ApplyWorkflow after it",
    "ApplyWorkflow naming its secret, dry run",
    "ApplyWorkflow naming its secret",
    "ApplyWorkflows after it, dry run",
    "ApplyWorkflows after it",
    "ApplyWorkflows pruning the app, dry run",
    "ApplyWorkflows pruning the app",
    "ApplyWorkflow calling it with run_workflow, dry run",
    "ApplyWorkflow calling it with run_workflow",
    "ApplyWorkflows calling it with run_workflow",
    "DeleteWorkflow",
    "ListWorkflows of the app",
    "ListSecrets of the app",
    "SetSecret of the app",
    "DeleteSecret of the app",
    "DeleteSecret",
    "ListAudit of the workflow",
];

/// The methods that name no object of an app: what they answer does not depend on one.
const NAMING_NOTHING: &[&str] = &[
    "ListWorkflows",
    "ListRuns",
    "ListWorkers",
    "ListNodes",
    "ListAudit",
    "WhoAmI",
    "CreateToken",
    "ListTokens",
    "RevokeToken",
    "ListSecrets",
];

/// A row's answer as text: `OK …` with the answer, or the status code and message.
async fn grpc_answer(client: &mut Client, row: &str, t: &Target) -> String {
    let wf = t.workflow.clone();
    let ok = |debug: String| Ok::<String, tonic::Status>(format!("OK {debug}"));
    let after = format!(
        "name: sales-after\napp: sales\nschedule:\n  after: [{wf}]\ntasks:\n  - name: t\n    \
         command: echo hi\n"
    );
    let calling =
        format!("name: sales-calls\napp: sales\ntasks:\n  - name: t\n    run_workflow: {wf}\n");
    let naming = format!(
        "name: sales-secret\napp: sales\ntasks:\n  - name: t\n    command: echo \"$S\"\n    \
         env:\n      S: {{ secret: {} }}\n",
        t.secret
    );
    let answer = match row {
        "GetWorkflow" => client
            .get_workflow(pb::GetWorkflowRequest { name: wf })
            .await
            .map(|r| format!("OK {}", r.into_inner().name)),
        "PauseWorkflow" => client
            .pause_workflow(pb::PauseWorkflowRequest {
                name: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK paused={}", r.into_inner().paused)),
        "ResumeWorkflow" => client
            .resume_workflow(pb::ResumeWorkflowRequest {
                name: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK paused={}", r.into_inner().paused)),
        "TriggerWorkflow" | "TriggerWorkflow with a key" => client
            .trigger_workflow(pb::TriggerWorkflowRequest {
                name: wf,
                idempotency_key: if row.ends_with("key") {
                    "k1".into()
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .await
            .map(|r| format!("OK created={}", r.into_inner().created)),
        "ListRuns of the workflow" => client
            .list_runs(pb::ListRunsRequest {
                workflow: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {} runs", r.into_inner().runs.len())),
        "GetDag" => client
            .get_dag(pb::GetDagRequest {
                workflow: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {} nodes", r.into_inner().nodes.len())),
        "GetDag of a run, on a workflow of one's own"
        | "GetDag of a run's version, on a workflow of one's own" => client
            .get_dag(pb::GetDagRequest {
                workflow: "sales-wf".into(),
                run_id: t.run,
                version: if row.contains("version") { 1 } else { 0 },
                layout: true,
            })
            .await
            .map(|r| format!("OK {} nodes", r.into_inner().nodes.len())),
        "GetGrid" => client
            .get_grid(pb::GetGridRequest {
                workflow: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {} runs", r.into_inner().runs.len())),
        "ExplainWorkflow" => client
            .explain_workflow(pb::ExplainWorkflowRequest {
                name: wf,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {:?}", r.into_inner().verdict)),
        "BackfillWorkflow, dry run" | "BackfillWorkflow" => {
            let now = chrono::Utc::now().timestamp_millis();
            client
                .backfill_workflow(pb::BackfillWorkflowRequest {
                    name: wf,
                    from_ms: now - 3 * 86_400_000,
                    to_ms: now,
                    dry_run: row.ends_with("dry run"),
                    ..Default::default()
                })
                .await
                .map(|r| format!("OK {} slots", r.into_inner().slots.len()))
        }
        "PurgeRuns, dry run" | "PurgeRuns" => client
            .purge_runs(pb::PurgeRunsRequest {
                older_than_ms: 1,
                workflow: wf,
                dry_run: row.ends_with("dry run"),
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {} runs", r.into_inner().runs)),
        "GetRun" => client
            .get_run(pb::GetRunRequest { id: t.run })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "WatchRun" => match client
            .watch_run(pb::WatchRunRequest {
                id: t.run,
                ..Default::default()
            })
            .await
        {
            Err(status) => Err(status),
            Ok(stream) => {
                let mut stream = stream.into_inner();
                match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                    Ok(Ok(Some(run))) => ok(format!("{}", run.state)),
                    Ok(Ok(None)) => ok("an empty stream".into()),
                    Ok(Err(status)) => Err(status),
                    Err(_) => ok("a stream that waits".into()),
                }
            }
        },
        "CancelRun" => client
            .cancel_run(pb::CancelRunRequest {
                id: t.run,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "ListInstances" | "ListInstances grouping items" | "ListInstances items of an instance" => {
            client
                .list_instances(pb::ListInstancesRequest {
                    run_id: t.run,
                    attempts: true,
                    group_items: row.ends_with("grouping items"),
                    items_of: if row.ends_with("of an instance") {
                        t.instance
                    } else {
                        0
                    },
                    ..Default::default()
                })
                .await
                .map(|r| format!("OK {} instances", r.into_inner().instances.len()))
        }
        "RerunRun of the failed part" | "RerunRun from a task" => client
            .rerun_run(pb::RerunRunRequest {
                id: t.run,
                failed: row.ends_with("part"),
                from_task: if row.ends_with("task") {
                    "extract".into()
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "GetInstance" => client
            .get_instance(pb::GetInstanceRequest { id: t.instance })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "CancelInstance" => client
            .cancel_instance(pb::CancelInstanceRequest {
                id: t.instance,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "RetryInstance" => client
            .retry_instance(pb::RetryInstanceRequest {
                id: t.instance,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "MarkInstance" => client
            .mark_instance(pb::MarkInstanceRequest {
                id: t.instance,
                state: pb::InstanceState::Success.into(),
                reason: "scope check".into(),
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().state)),
        "GetLogs" | "GetLogs of an attempt" => {
            let opened = client
                .get_logs(pb::GetLogsRequest {
                    instance_id: t.instance,
                    attempt: if row.ends_with("attempt") { 7 } else { 0 },
                    ..Default::default()
                })
                .await;
            match opened {
                Err(status) => Err(status),
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                        Ok(Ok(Some(chunk))) => ok(format!("{} lines", chunk.lines.len())),
                        Ok(Ok(None)) => ok("no lines".into()),
                        Ok(Err(status)) => Err(status),
                        Err(_) => ok("a stream that waits".into()),
                    }
                }
            }
        }
        "ApplyWorkflow after it, dry run" | "ApplyWorkflow after it" => {
            applied(client, &after, row.ends_with("dry run"))
                .await
                .map(|r| format!("OK {} warnings {:?}", r.outcome, r.warnings))
        }
        // A sub-workflow of another app would start that app's runs: apply refuses it as it
        // refuses a name that does not exist, never starting anything.
        "ApplyWorkflow calling it with run_workflow, dry run"
        | "ApplyWorkflow calling it with run_workflow" => {
            applied(client, &calling, row.ends_with("dry run"))
                .await
                .map(|r| format!("OK {} warnings {:?}", r.outcome, r.warnings))
        }
        "ApplyWorkflows calling it with run_workflow" => client
            .apply_workflows(pb::ApplyWorkflowsRequest {
                files: vec![pb::WorkflowFile {
                    source_name: "calling.yaml".into(),
                    source: calling.clone(),
                }],
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {:?}", r.into_inner().files.len())),
        "ApplyWorkflow naming its secret, dry run" | "ApplyWorkflow naming its secret" => {
            applied(client, &naming, row.ends_with("dry run"))
                .await
                .map(|r| format!("OK {} warnings {:?}", r.outcome, r.warnings))
        }
        "ApplyWorkflows after it, dry run"
        | "ApplyWorkflows after it"
        | "ApplyWorkflows pruning the app, dry run"
        | "ApplyWorkflows pruning the app" => {
            let prune = row.contains("pruning");
            client
                .apply_workflows(pb::ApplyWorkflowsRequest {
                    files: vec![pb::WorkflowFile {
                        source_name: "test.yaml".into(),
                        source: after.clone(),
                    }],
                    dry_run: row.ends_with("dry run"),
                    prune,
                    app: if prune { t.app.clone() } else { String::new() },
                    ..Default::default()
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    format!("OK {:?} deleted {:?}", r.files, r.deleted)
                })
        }
        "DeleteWorkflow" => client
            .delete_workflow(pb::DeleteWorkflowRequest {
                name: wf,
                cancel_runs: true,
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {:?}", r.into_inner().workflow)),
        "ListWorkflows of the app" => client
            .list_workflows(pb::ListWorkflowsRequest {
                app: t.app.clone(),
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {:?}", r.into_inner().workflows)),
        "ListSecrets of the app" => client
            .list_secrets(pb::ListSecretsRequest { app: t.app.clone() })
            .await
            .map(|r| format!("OK {:?}", r.into_inner().secrets)),
        "SetSecret of the app" => client
            .set_secret(pb::SetSecretRequest {
                name: t.secret.clone(),
                value: "overwritten".into(),
                app: t.app.clone(),
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().app)),
        "DeleteSecret of the app" | "DeleteSecret" => client
            .delete_secret(pb::DeleteSecretRequest {
                name: t.secret.clone(),
                app: if row.ends_with("app") {
                    t.app.clone()
                } else {
                    String::new()
                },
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {}", r.into_inner().app)),
        "ListAudit of the workflow" => client
            .list_audit(pb::ListAuditRequest {
                target: format!("workflow/{wf}"),
                ..Default::default()
            })
            .await
            .map(|r| format!("OK {} rows", r.into_inner().entries.len())),
        other => panic!("no call for row {other:?}"),
    };
    let text = match answer {
        Ok(text) => text,
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    };
    t.normalise(&text)
}

/// The routes of `/api/v1` that name an object: method, path, JSON body.
const HTTP_ROWS: &[(&str, &str, &str)] = &[
    ("GET", "/api/v1/workflows/{WF}", ""),
    ("GET", "/api/v1/workflows/{WF}/dag?layout=true", ""),
    ("GET", "/api/v1/workflows/{WF}/dag/export?format=dot", ""),
    ("GET", "/api/v1/workflows/{WF}/why", ""),
    ("GET", "/api/v1/workflows/{WF}/grid", ""),
    ("GET", "/api/v1/workflows/{WF}/grid/events", ""),
    ("GET", "/api/v1/workflows/sales-wf/dag?run={RUN}", ""),
    (
        "GET",
        "/api/v1/workflows/sales-wf/dag/export?format=svg&run={RUN}",
        "",
    ),
    ("GET", "/api/v1/workflows?app={APP}", ""),
    ("GET", "/api/v1/runs?workflow={WF}", ""),
    ("GET", "/api/v1/runs/{RUN}", ""),
    ("GET", "/api/v1/runs/{RUN}/instances?attempts=true", ""),
    ("GET", "/api/v1/runs/{RUN}/instances?group_items=true", ""),
    (
        "GET",
        "/api/v1/runs/{RUN}/instances?items_of={INST}&state=failed",
        "",
    ),
    ("GET", "/api/v1/runs/{RUN}/events", ""),
    ("GET", "/api/v1/instances/{INST}", ""),
    ("GET", "/api/v1/instances/{INST}/logs", ""),
    ("GET", "/api/v1/instances/{INST}/logs?attempt=7", ""),
    ("GET", "/api/v1/instances/{INST}/logs/download", ""),
    ("GET", "/api/v1/instances/{INST}/logs/tail", ""),
    ("GET", "/api/v1/audit?target=workflow/{WF}", ""),
    ("POST", "/api/v1/workflows/{WF}/trigger", "{}"),
    (
        "POST",
        "/api/v1/workflows/{WF}/backfill",
        r#"{"fromMs": "1767225600000", "toMs": "1767312000000", "dryRun": true}"#,
    ),
    (
        "POST",
        "/api/v1/workflows/{WF}/backfill",
        r#"{"fromMs": "1767225600000", "toMs": "1767312000000"}"#,
    ),
    ("POST", "/api/v1/workflows/{WF}/pause", "{}"),
    ("POST", "/api/v1/workflows/{WF}/resume", "{}"),
    ("POST", "/api/v1/runs/{RUN}/cancel", "{}"),
    ("POST", "/api/v1/runs/{RUN}/rerun", r#"{"failed": true}"#),
    (
        "POST",
        "/api/v1/runs/{RUN}/rerun",
        r#"{"fromTask": "extract"}"#,
    ),
    (
        "POST",
        "/api/v1/runs/{RUN}/rerun",
        r#"{"tasks": ["extract"]}"#,
    ),
    ("POST", "/api/v1/instances/{INST}/retry", "{}"),
    (
        "POST",
        "/api/v1/instances/{INST}/mark",
        r#"{"state": "INSTANCE_STATE_SUCCESS", "reason": "scope check"}"#,
    ),
    ("POST", "/api/v1/instances/{INST}/cancel", "{}"),
];

async fn http_answer(
    http: &reqwest::Client,
    endpoint: &str,
    token: &str,
    (method, path, body): (&str, &str, &str),
    t: &Target,
) -> String {
    let url = format!("{endpoint}{}", t.fill(path));
    let request = match method {
        "GET" => http.get(&url),
        _ => http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string()),
    };
    let response = request.bearer_auth(token).send().await.expect("request");
    let status = response.status();
    // A stream that opened (a wrong answer) is cut short rather than read to its end.
    let body = match tokio::time::timeout(Duration::from_secs(3), response.text()).await {
        Ok(Ok(body)) => body,
        Ok(Err(err)) => format!("<body: {err}>"),
        Err(_) => "<a stream that goes on>".into(),
    };
    t.normalise(&format!("{status} {body}"))
}

/// Every `ControlService` method, from the proto's descriptor.
fn every_method() -> BTreeSet<String> {
    super::every_method().into_iter().collect()
}

async fn another_apps_objects_read_as_missing_ones(backend: Backend) {
    let scene = Scene::start(backend).await;
    // Every method is either in the table or names nothing of an app: a method added later
    // fails this until it is placed.
    let tabled: BTreeSet<String> = GRPC_ROWS
        .iter()
        .chain(NAMING_NOTHING)
        .map(|row| row.split([' ', ',']).next().unwrap().to_string())
        .collect();
    assert_eq!(every_method(), tabled, "every method is placed");

    let (runs, instance) = finance(&scene).await;
    let mut root = scene.root().await;
    apply(&mut root, SALES_WF, false).await.expect("sales-wf");
    let store = scene.store().await;
    let before = finance_rows(store.as_ref()).await;

    let finance = Target {
        workflow: "finance-wf".into(),
        app: "finance".into(),
        run: runs[0],
        instance,
        secret: "finance-db".into(),
    };
    let missing = Target {
        workflow: "no-such-wf".into(),
        app: "no-such-app".into(),
        run: 900_001,
        instance: 900_002,
        secret: "no-such-secret".into(),
    };
    let http = reqwest::Client::new();
    let mut differences = Vec::new();
    let mut compared = 0;
    for (role, token) in &scene.sales {
        let mut client = scene.client(token).await;
        for row in GRPC_ROWS {
            let of_finance = grpc_answer(&mut client, row, &finance).await;
            let of_nothing = grpc_answer(&mut client, row, &missing).await;
            compared += 1;
            if of_finance != of_nothing {
                differences.push(format!(
                    "sales {role}, {row}:\n  finance's: {of_finance}\n  missing:   {of_nothing}"
                ));
            }
        }
        for row in HTTP_ROWS {
            let of_finance = http_answer(&http, &scene.endpoint, token, *row, &finance).await;
            let of_nothing = http_answer(&http, &scene.endpoint, token, *row, &missing).await;
            compared += 1;
            if of_finance != of_nothing {
                differences.push(format!(
                    "sales {role}, {} {}:\n  finance's: {of_finance}\n  missing:   {of_nothing}",
                    row.0, row.1
                ));
            }
        }
    }
    assert!(compared > 150, "{compared} answers compared");
    // And what both read as: a sub-workflow of another app is refused at apply, never started.
    let mut admin = scene.client(scene.sales(Role::Admin)).await;
    for row in [
        "ApplyWorkflow calling it with run_workflow",
        "ApplyWorkflows calling it with run_workflow",
    ] {
        let answer = grpc_answer(&mut admin, row, &finance).await;
        assert!(
            answer.starts_with("InvalidArgument")
                && answer.contains("run_workflow: workflow WF not found in app sales"),
            "{row}: {answer}"
        );
    }
    assert!(
        differences.is_empty(),
        "{} answers tell another app's objects from missing ones:\n{}",
        differences.len(),
        differences.join("\n")
    );
    assert_eq!(
        finance_rows(store.as_ref()).await,
        before,
        "a scoped caller changed the finance app"
    );
    scene.stop().await;
}

async fn a_scoped_admin_cannot_take_another_apps_secret(backend: Backend) {
    let scene = Scene::start(backend).await;
    let mut root = scene.root().await;
    set_secret(&mut root, "finance", "finance-db", FINANCE_VALUE).await;
    let mut admin = scene.client(scene.sales(Role::Admin)).await;

    // Issue 32: a sales workflow that names the finance secret and sends it out, encoded so
    // masking would not hide it. Refused, dry run or not, and reads as no such secret.
    let exfil = "name: exfil
app: sales
tasks:
  - name: leak
    command: printf %s \"$S\" | base64
    env:
      S: { secret: finance-db }
";
    for dry_run in [true, false] {
        let refused = apply(&mut admin, exfil, dry_run).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
        assert!(
            refused
                .message()
                .contains("names secret \"finance-db\", which does not exist in app sales"),
            "{refused}"
        );
        assert!(!refused.message().contains("finance "), "{refused}");
    }
    // An unscoped admin may not either: the rule is the workflow's app's, whoever applies it
    // (it is told where such a secret is).
    let refused = apply(&mut root, exfil, false).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("app finance has one"),
        "{refused}"
    );
    let store = scene.store().await;
    assert!(store.get_workflow("exfil").await.unwrap().is_none());
    let trigger = admin
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: "exfil".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(trigger.code(), Code::NotFound);
    assert!(
        store
            .list_runs(None, None, None, 100)
            .await
            .unwrap()
            .is_empty(),
        "nothing ran"
    );

    // Its own app's secrets (a scoped admin sets them: its token's app is the default) and the
    // global ones reach its tasks. A line that holds another
    // app's value is stored as printed: masking it would tell the task that the string it
    // printed is some app's secret (an oracle to guess values with). Its own value is masked.
    let uses = format!(
        "name: sales-uses
app: sales
tasks:
  - name: use
    command: 'test \"$OWN\" = sales-own-value && test \"$SHARED\" = global-shared-value && echo both match; echo guess {FINANCE_VALUE}; echo own $OWN; echo shared $SHARED'
    env:
      OWN: {{ secret: sales-db }}
      SHARED: {{ secret: shared-db }}
"
    );
    set_secret(&mut root, "", "shared-db", "global-shared-value").await;
    set_secret(&mut admin, "", "sales-db", "sales-own-value").await;
    apply(&mut admin, &uses, false)
        .await
        .expect("apply sales-uses");
    let run = run_to_end(&mut admin, "sales-uses").await;
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    let instance = admin
        .list_instances(pb::ListInstancesRequest {
            run_id: run.id,
            attempts: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .instances[0]
        .id;
    assert_eq!(
        log_lines(&mut admin, instance).await,
        [
            "both match".to_string(),
            format!("guess {FINANCE_VALUE}"),
            "own ***".into(),
            "shared ***".into()
        ]
    );
    scene.stop().await;
}

async fn secrets_are_listed_set_and_deleted_within_the_callers_app(backend: Backend) {
    let scene = Scene::start(backend).await;
    let mut root = scene.root().await;
    set_secret(&mut root, "finance", "finance-db", FINANCE_VALUE).await;
    set_secret(&mut root, "", "shared-db", "global-shared-value").await;
    let store = scene.store().await;
    let finance_row = || async {
        store
            .list_secrets()
            .await
            .unwrap()
            .into_iter()
            .find(|s| s.app == "finance" && s.name == "finance-db")
            .expect("finance's secret")
    };

    let mut admin = scene.client(scene.sales(Role::Admin)).await;
    let listed = |answer: pb::ListSecretsResponse| -> Vec<(String, String)> {
        answer
            .secrets
            .into_iter()
            .map(|s| (s.app, s.name))
            .collect()
    };
    // A scoped admin lists its app's secrets and the global ones its workflows may name.
    let seen = listed(
        admin
            .list_secrets(pb::ListSecretsRequest::default())
            .await
            .expect("a scoped admin lists")
            .into_inner(),
    );
    assert_eq!(seen, [(String::new(), "shared-db".to_string())]);
    // Another app's secrets, or a global one, are not its to change.
    for app in ["finance", "no-such-app"] {
        let refused = admin
            .list_secrets(pb::ListSecretsRequest { app: app.into() })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
        let refused = admin
            .delete_secret(pb::DeleteSecretRequest {
                name: "finance-db".into(),
                app: app.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused}");
    }
    let missing = |name: &str| pb::DeleteSecretRequest {
        name: name.into(),
        ..Default::default()
    };
    let hidden = admin
        .delete_secret(missing("finance-db"))
        .await
        .unwrap_err();
    let absent = admin
        .delete_secret(missing("no-such-secret"))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(
        hidden.message().replace("finance-db", "X"),
        absent.message().replace("no-such-secret", "X")
    );
    let global = admin.delete_secret(missing("shared-db")).await.unwrap_err();
    assert_eq!(
        global.code(),
        Code::NotFound,
        "a global secret is not its own"
    );
    // Its own secret of a name another app uses is its own: finance's stays as it was.
    let finance_before = finance_row().await;
    set_secret(&mut admin, "", "finance-db", "sales-value").await;
    assert_eq!(finance_row().await, finance_before);
    let seen = listed(
        admin
            .list_secrets(pb::ListSecretsRequest::default())
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(
        seen,
        [
            (String::new(), "shared-db".to_string()),
            ("sales".to_string(), "finance-db".to_string())
        ]
    );
    let deleted = admin
        .delete_secret(missing("finance-db"))
        .await
        .expect("delete its own")
        .into_inner();
    assert_eq!(deleted.app, "sales");
    assert_eq!(finance_row().await, finance_before);

    // An unscoped admin sees and manages every app's and the global ones.
    let all = listed(
        root.list_secrets(pb::ListSecretsRequest::default())
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(
        all,
        [
            (String::new(), "shared-db".to_string()),
            ("finance".to_string(), "finance-db".to_string())
        ]
    );
    let for_finance = listed(
        root.list_secrets(pb::ListSecretsRequest {
            app: "finance".into(),
        })
        .await
        .unwrap()
        .into_inner(),
    );
    assert_eq!(for_finance, all, "what finance's workflows may name");

    // axctl: --app, and the APP column.
    let axctl = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(ax_integration_tests::binary("axctl").unwrap())
            .args(["--server", &scene.endpoint, "--token", &scene.root])
            .args(args)
            .env_remove("AX_TOKEN")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("axctl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "axctl {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        axctl(&["secret", "set", "hr-db", "--app", "hr"], "hr-value\n"),
        "secret hr-db of app hr set\n"
    );
    let table = axctl(&["secret", "list"], "");
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|line| line.split_whitespace().take(2).collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["APP", "NAME"],
            vec!["(global)", "shared-db"],
            vec!["finance", "finance-db"],
            vec!["hr", "hr-db"]
        ],
        "{table}"
    );
    assert_eq!(
        axctl(&["secret", "delete", "finance-db", "--app", "finance"], ""),
        "secret finance-db of app finance deleted\n"
    );
    assert!(
        !store
            .list_secrets()
            .await
            .unwrap()
            .iter()
            .any(|s| s.name == "finance-db")
    );

    // A secret a workflow gets for a name is not deleted; one it does not get (its app has
    // its own of that name) is.
    let uses_shared = "name: uses-shared
app: sales
tasks:
  - name: t
    command: echo hi
    env:
      S: { secret: shared-db }
";
    apply(&mut admin, uses_shared, false)
        .await
        .expect("a global secret is the app's to name");
    let global = pb::DeleteSecretRequest {
        name: "shared-db".into(),
        ..Default::default()
    };
    let in_use = root.delete_secret(global.clone()).await.unwrap_err();
    assert_eq!(in_use.code(), Code::FailedPrecondition);
    assert!(in_use.message().contains("uses-shared"), "{in_use}");
    set_secret(&mut admin, "", "shared-db", "sales-shared-value").await;
    root.delete_secret(global)
        .await
        .expect("sales' workflow now gets sales' own");
    let own = admin.delete_secret(missing("shared-db")).await.unwrap_err();
    assert_eq!(own.code(), Code::FailedPrecondition);
    assert!(
        own.message()
            .contains("secret \"shared-db\" of app sales is named by workflow uses-shared"),
        "{own}"
    );
    scene.stop().await;
}

async fn a_scoped_run_list_pages_over_its_own_apps_runs_only(backend: Backend) {
    let scene = Scene::start(backend).await;
    finance(&scene).await;
    let mut root = scene.root().await;
    apply(&mut root, SALES_WF, false).await.expect("sales-wf");
    let mut viewer = scene.client(scene.sales(Role::Viewer)).await;
    let page = |limit| pb::ListRunsRequest {
        limit,
        ..Default::default()
    };
    // No run of its own: an empty page with no next one, as on a store with no runs at all.
    let empty = viewer.list_runs(page(1)).await.unwrap().into_inner();
    assert!(empty.runs.is_empty());
    assert_eq!(
        empty.next_before_id, 0,
        "no page follows: finance's runs do not count"
    );

    let own = run_to_end(&mut root, "sales-wf").await;
    let first = viewer.list_runs(page(1)).await.unwrap().into_inner();
    assert_eq!(
        first.runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        [own.id]
    );
    assert_eq!(first.next_before_id, 0, "finance's older runs do not count");
    let second = run_to_end(&mut root, "sales-wf").await;
    let first = viewer.list_runs(page(1)).await.unwrap().into_inner();
    assert_eq!(
        first.runs.iter().map(|r| r.id).collect::<Vec<_>>(),
        [second.id]
    );
    assert_eq!(first.next_before_id, second.id);
    let next = viewer
        .list_runs(pb::ListRunsRequest {
            limit: 1,
            before_id: first.next_before_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.runs.iter().map(|r| r.id).collect::<Vec<_>>(), [own.id]);
    assert_eq!(next.next_before_id, 0);
    // The JSON API pages alike.
    let body: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/api/v1/runs?limit=1", scene.endpoint))
        .bearer_auth(scene.sales(Role::Viewer))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["runs"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body["nextBeforeId"], second.id.to_string(), "{body}");
    scene.stop().await;
}

/// A dispatch opens the app's own secret, else the global one, and never another app's, even
/// when the app's own is gone after the apply's check (removed from the store here, as a
/// concurrent change would): the task waits, saying why, until a secret it may have exists.
async fn a_dispatch_takes_its_apps_secret_or_a_global_one_never_another_apps(backend: Backend) {
    let scene = Scene::start(backend).await;
    let mut root = scene.root().await;
    set_secret(&mut root, "finance", "late-db", FINANCE_VALUE).await;
    set_secret(&mut root, "sales", "late-db", "sales-late-value").await;
    let late = "name: late
app: sales
tasks:
  - name: t
    command: 'echo \"got $S\"'
    env:
      S: { secret: late-db }
";
    apply(&mut root, late, false).await.expect("apply late");
    let store = scene.store().await;
    assert!(store.delete_secret("sales", "late-db").await.unwrap());
    let run = root
        .trigger_workflow(pb::TriggerWorkflowRequest {
            name: "late".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    let mut viewer = scene.client(scene.sales(Role::Viewer)).await;
    eventually("the task waits for its secret, saying why", async || {
        let why = viewer
            .explain_workflow(pb::ExplainWorkflowRequest {
                name: "late".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        format!("{why:?}").contains("neither app sales nor the global secrets have one")
    })
    .await;
    let instances = root
        .list_instances(pb::ListInstancesRequest {
            run_id: run.id,
            attempts: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .instances;
    assert_eq!(instances[0].state, pb::InstanceState::Waiting as i32);
    assert!(instances[0].attempts.iter().all(|a| a.worker_id.is_empty()));
    // A global secret of that name is one the task may have: it goes on with it.
    set_secret(&mut root, "", "late-db", "global-late-value").await;
    let mut ended = run.clone();
    eventually("the run ends", async || {
        ended = root
            .get_run(pb::GetRunRequest { id: run.id })
            .await
            .unwrap()
            .into_inner();
        ended.state == pb::RunState::Success as i32
    })
    .await;
    assert_eq!(log_lines(&mut root, instances[0].id).await, ["got ***"]);
    // The value it got was the global one: finance's would be stored as printed (it is not
    // the task's to mask), so compare through a task that prints it transformed.
    let check = "name: late-check
app: sales
tasks:
  - name: t
    command: 'test \"$S\" = global-late-value && echo global'
    env:
      S: { secret: late-db }
";
    apply(&mut root, check, false).await.expect("apply");
    let checked = run_to_end(&mut root, "late-check").await;
    assert_eq!(checked.state, pb::RunState::Success as i32, "{checked:?}");
    scene.stop().await;
}

/// Each named scenario on SQLite and, where `AX_TEST_MYSQL_URL` is set, on MySQL.
/// A node asking for tokens with a cluster-wide bound of 3 waiting instances and no worker:
/// finance's 3 runs fill it. The sales operator's trigger is refused at the total bound without
/// the count (gRPC and HTTP); the unscoped admin sees it; the sales operator's trigger of the
/// finance workflow is the not-found of a missing one, whatever the bounds.
async fn a_refusal_for_load_tells_a_scoped_caller_no_other_apps_count(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .auth(AuthMode::Tokens)
        .auth_failures_per_address(100_000)
        .max_waiting(ax_core::admission::Bounds {
            total: Some(3),
            per_app: Some(100),
        })
        .start()
        .await
        .expect("cluster");
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let now = chrono::Utc::now().timestamp_millis();
    let make = async |name: &str, role: Role, app: Option<&str>| {
        let request = TokenRequest {
            name: name.into(),
            role,
            app: app.map(str::to_string),
            lifetime_ms: None,
            created_by: "test".into(),
            worker: None,
        };
        create(store.as_ref(), request, now).await.expect("token").0
    };
    let root = make("root", Role::Admin, None).await;
    let sales = make("sales-operator", Role::Operator, Some("sales")).await;
    let endpoint = cluster.endpoint();
    let client = async |token: &str| {
        let auth = ClientAuth {
            token: Some(token.to_string()),
            ..ClientAuth::default()
        };
        let channel = auth
            .endpoint(&endpoint, None)
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        ControlServiceClient::with_interceptor(channel, auth.bearer().expect("bearer"))
    };
    let mut root_client = client(&root).await;
    let mut sales_client = client(&sales).await;
    let finance = "name: finance-wf\napp: finance\ntasks:\n  - name: t\n    command: \"true\"\n";
    apply(&mut root_client, finance, false)
        .await
        .expect("apply finance");
    apply(&mut root_client, SALES_WF, false)
        .await
        .expect("apply sales");
    let trigger = |name: &str| pb::TriggerWorkflowRequest {
        name: name.into(),
        ..Default::default()
    };
    // Past the node's first reading, then finance fills the cluster's bound. The node's
    // estimate errs high while a reading overlaps a trigger (the reading may count a run the
    // estimate also adds), so a finance trigger refused on the way is tried again once the
    // next reading has settled, until three finance runs exist.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut created = 0;
    for _ in 0..20 {
        match root_client.trigger_workflow(trigger("finance-wf")).await {
            Ok(_) => created += 1,
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
            Err(status) => panic!("finance trigger: {status:?}"),
        }
        if created == 3 {
            break;
        }
    }
    assert_eq!(created, 3, "finance's runs fill the bound");
    tokio::time::sleep(Duration::from_millis(700)).await;

    let refused = sales_client
        .trigger_workflow(trigger("sales-wf"))
        .await
        .expect_err("refused at the total bound");
    let seen = ax_proto::overloaded::of(&refused).expect("a refusal for load");
    assert_eq!(
        (
            seen.bound.as_str(),
            seen.app.as_str(),
            seen.waiting,
            seen.limit
        ),
        ("total", "sales", 0, 3)
    );
    assert!(refused.message().contains("bound of 3"), "{refused:?}");
    assert!(!refused.message().contains("3 instances"), "{refused:?}");
    let http = reqwest::Client::new()
        .post(format!("{endpoint}/api/v1/workflows/sales-wf/trigger"))
        .bearer_auth(&sales)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("POST");
    assert_eq!(http.status().as_u16(), 429);
    let body: serde_json::Value = http.json().await.expect("json");
    assert_eq!(body["overloaded"]["waiting"], "0", "{body}");
    assert!(
        !body["message"]
            .as_str()
            .unwrap_or("")
            .contains("3 instances"),
        "{body}"
    );

    let unscoped = root_client
        .trigger_workflow(trigger("sales-wf"))
        .await
        .expect_err("refused at the total bound");
    let seen = ax_proto::overloaded::of(&unscoped).expect("a refusal for load");
    assert_eq!((seen.bound.as_str(), seen.waiting), ("total", 3));
    assert!(
        unscoped.message().contains("3 instances are waiting"),
        "{unscoped:?}"
    );

    let other_app = sales_client
        .trigger_workflow(trigger("finance-wf"))
        .await
        .expect_err("another app's workflow");
    let missing = sales_client
        .trigger_workflow(trigger("no-such-wf"))
        .await
        .expect_err("a missing workflow");
    assert_eq!(other_app.code(), Code::NotFound);
    assert_eq!(
        other_app.message().replace("finance-wf", "NAME"),
        missing.message().replace("no-such-wf", "NAME")
    );
    assert!(ax_proto::overloaded::of(&other_app).is_none());
    cluster.shutdown().await.expect("shutdown");
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        vec![$(
            Test::on_tokio(
                test_name(module_path!(), concat!("sqlite::", stringify!($name))),
                Runtime::MultiThread(None),
                || $name(Backend::Sqlite),
            ),
            Test::on_tokio(
                test_name(module_path!(), concat!("mysql::", stringify!($name))),
                Runtime::MultiThread(None),
                || $name(Backend::MySql),
            )
            .requires(&MYSQL),
        )*]
    };
}

pub(crate) fn tests() -> Vec<Test> {
    on_both_backends!(
        another_apps_objects_read_as_missing_ones,
        a_scoped_admin_cannot_take_another_apps_secret,
        secrets_are_listed_set_and_deleted_within_the_callers_app,
        a_scoped_run_list_pages_over_its_own_apps_runs_only,
        a_dispatch_takes_its_apps_secret_or_a_global_one_never_another_apps,
        a_refusal_for_load_tells_a_scoped_caller_no_other_apps_count,
    )
}
