//! Identity and transport security, end to end: every RPC of `ControlService` and the worker
//! stream, called with no token, a malformed, expired or revoked one, and a token of each role,
//! is refused exactly where its role says (Unauthenticated or PermissionDenied) and changes
//! nothing when refused; audit rows name the token; failed authentications are audited; a token
//! scoped to an app sees nothing of another app; the JSON API takes the same tokens (header or
//! the UI's session cookie). Then real binaries: TLS with a CA, mutual TLS for workers (a
//! certificate naming another worker is refused), a certificate replaced on disk is served
//! without a restart, and a node refuses a public address without TLS and tokens unless told
//! `--insecure`. Runs on SQLite and, with `AX_TEST_MYSQL_URL`, MySQL.
//!
//! Each further subject of the threat model (`docs/security.md`) has a module of its own here.

mod auth_failures;
mod cross_site;
mod scopes;

use std::time::Duration;

use ax_core::access::{Role, control_method_needs};
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::process::free_port;
use ax_integration_tests::requirements::{MYSQL, PYTHON};
use ax_integration_tests::{Backend, Cluster};
use ax_proto::client::{Bearer, ClientAuth};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use ax_scheduler::AuthMode;
use ax_scheduler::auth::tokens::{TokenRequest, create};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub(crate) fn tests() -> Vec<Test> {
    let own = vec![
        trial!(async(multi_thread) sqlite_every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing),
        trial!(async(multi_thread) mysql_every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing).requires(&MYSQL),
        trial!(async(multi_thread) an_address_past_its_failed_authentications_has_its_failures_slowed_not_its_tokens),
        trial!(async(multi_thread) tls_with_worker_certificates_and_a_certificate_replaced_without_a_restart),
        trial!(a_public_address_needs_tls_and_tokens_unless_insecure),
        trial!(async(multi_thread) sqlite_secrets_reach_the_task_only),
        trial!(async(multi_thread) mysql_secrets_reach_the_task_only).requires(&MYSQL),
        trial!(async(multi_thread) without_a_key_secrets_are_refused_and_their_tasks_wait),
        trial!(async(multi_thread) the_python_sdk_speaks_tls_tokens_and_worker_certificates)
            .requires(&PYTHON),
    ];
    [
        own,
        auth_failures::tests(),
        bad_input::tests(),
        connections::tests(),
        cross_site::tests(),
        scopes::tests(),
        secret_cut::tests(),
        worker_token::tests(),
        workers::tests(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

mod bad_input;
mod connections;
mod secret_cut;
mod worker_token;
mod workers;

type Client = ControlServiceClient<InterceptedService<Channel, Bearer>>;

const WORKFLOW: &str = "name: guarded\napp: sales\ntasks:\n  - name: t\n    command: echo hi\n";
const OTHER_APP: &str = "name: books\napp: finance\ntasks:\n  - name: t\n    command: echo hi\n";

async fn client(endpoint: &str, token: Option<&str>) -> Client {
    let auth = ClientAuth {
        token: token.map(str::to_string),
        ..ClientAuth::default()
    };
    let channel = auth
        .endpoint(endpoint, None)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    ControlServiceClient::with_interceptor(channel, auth.bearer().expect("bearer"))
}

/// Calls the RPC `method` with a request that names the test's workflow, run 1 and instance 1;
/// answers the status code (`Ok` for success).
async fn call(client: &mut Client, method: &str) -> Code {
    let name = "guarded".to_string();
    let result: Result<(), tonic::Status> = match method {
        "ApplyWorkflow" => client
            .apply_workflow(pb::ApplyWorkflowRequest {
                source: WORKFLOW.into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ApplyWorkflows" => client
            .apply_workflows(pb::ApplyWorkflowsRequest {
                files: vec![pb::WorkflowFile {
                    source_name: "guarded.yaml".into(),
                    source: WORKFLOW.into(),
                }],
                ..Default::default()
            })
            .await
            .map(drop),
        "DeleteWorkflow" => client
            .delete_workflow(pb::DeleteWorkflowRequest {
                name: "nobody".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ListWorkflows" => client
            .list_workflows(pb::ListWorkflowsRequest::default())
            .await
            .map(drop),
        "GetWorkflow" => client
            .get_workflow(pb::GetWorkflowRequest { name })
            .await
            .map(drop),
        "PauseWorkflow" => client
            .pause_workflow(pb::PauseWorkflowRequest {
                name,
                ..Default::default()
            })
            .await
            .map(drop),
        "ResumeWorkflow" => client
            .resume_workflow(pb::ResumeWorkflowRequest {
                name,
                ..Default::default()
            })
            .await
            .map(drop),
        "TriggerWorkflow" => client
            .trigger_workflow(pb::TriggerWorkflowRequest {
                name,
                ..Default::default()
            })
            .await
            .map(drop),
        "ListRuns" => client
            .list_runs(pb::ListRunsRequest::default())
            .await
            .map(drop),
        "GetRun" => client.get_run(pb::GetRunRequest { id: 1 }).await.map(drop),
        "CancelRun" => client
            .cancel_run(pb::CancelRunRequest {
                id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "ListInstances" => client
            .list_instances(pb::ListInstancesRequest {
                run_id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "GetInstance" => client
            .get_instance(pb::GetInstanceRequest { id: 1 })
            .await
            .map(drop),
        "CancelInstance" => client
            .cancel_instance(pb::CancelInstanceRequest {
                id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "RetryInstance" => client
            .retry_instance(pb::RetryInstanceRequest {
                id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "MarkInstance" => client
            .mark_instance(pb::MarkInstanceRequest {
                id: 1,
                state: pb::InstanceState::Success.into(),
                reason: "security check".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "RerunRun" => client
            .rerun_run(pb::RerunRunRequest {
                id: 1,
                failed: true,
                ..Default::default()
            })
            .await
            .map(drop),
        "GetLogs" => client
            .get_logs(pb::GetLogsRequest {
                instance_id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "WatchRun" => client
            .watch_run(pb::WatchRunRequest {
                id: 1,
                ..Default::default()
            })
            .await
            .map(drop),
        "ListWorkers" => client
            .list_workers(pb::ListWorkersRequest {})
            .await
            .map(drop),
        "ListNodes" => client.list_nodes(pb::ListNodesRequest {}).await.map(drop),
        "GetDag" => client
            .get_dag(pb::GetDagRequest {
                workflow: name,
                ..Default::default()
            })
            .await
            .map(drop),
        "GetGrid" => client
            .get_grid(pb::GetGridRequest {
                workflow: name,
                ..Default::default()
            })
            .await
            .map(drop),
        "ExplainWorkflow" => client
            .explain_workflow(pb::ExplainWorkflowRequest {
                name,
                ..Default::default()
            })
            .await
            .map(drop),
        "ListAudit" => client
            .list_audit(pb::ListAuditRequest::default())
            .await
            .map(drop),
        "BackfillWorkflow" => client
            .backfill_workflow(pb::BackfillWorkflowRequest {
                name,
                dry_run: true,
                ..Default::default()
            })
            .await
            .map(drop),
        "PurgeRuns" => client
            .purge_runs(pb::PurgeRunsRequest {
                older_than_ms: 90 * 86_400_000,
                workflow: name,
                dry_run: true,
                ..Default::default()
            })
            .await
            .map(drop),
        "WhoAmI" => client.who_am_i(pb::WhoAmIRequest {}).await.map(drop),
        "CreateToken" => client
            .create_token(pb::CreateTokenRequest {
                name: "made-by-test".into(),
                role: "viewer".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ListTokens" => client.list_tokens(pb::ListTokensRequest {}).await.map(drop),
        "RevokeToken" => client
            .revoke_token(pb::RevokeTokenRequest {
                name: "nobody".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "SetSecret" => client
            .set_secret(pb::SetSecretRequest {
                name: "made-by-test".into(),
                value: "value".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ListSecrets" => client
            .list_secrets(pb::ListSecretsRequest::default())
            .await
            .map(drop),
        "DeleteSecret" => client
            .delete_secret(pb::DeleteSecretRequest {
                name: "nobody".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        other => panic!("the table has no call for {other}"),
    };
    match result {
        Ok(()) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Every `ControlService` method, from the proto's own descriptor: a method added later is in
/// this test at once (and fails it until `call` knows it).
fn every_method() -> Vec<String> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).expect("descriptor");
    set.file
        .iter()
        .flat_map(|file| &file.service)
        .filter(|service| service.name() == "ControlService")
        .flat_map(|service| &service.method)
        .map(|method| method.name().to_string())
        .collect()
}

struct Tokens {
    viewer: String,
    operator: String,
    admin: String,
    worker: String,
    expired: String,
    revoked: String,
    scoped: String,
}

async fn make_tokens(store_url: &str) -> Tokens {
    let store = ax_store::open(store_url).await.expect("store");
    let now = chrono::Utc::now().timestamp_millis();
    let make = async |name: &str, role: Role, app: Option<&str>, lifetime_ms: Option<i64>| {
        let request = TokenRequest {
            name: name.into(),
            role,
            app: app.map(str::to_string),
            lifetime_ms,
            created_by: "test".into(),
            worker: (role == Role::Worker).then(ax_core::worker_scope::WorkerScope::any),
        };
        create(store.as_ref(), request, now).await.expect("token").0
    };
    let tokens = Tokens {
        viewer: make("viewer", Role::Viewer, None, None).await,
        operator: make("operator", Role::Operator, None, None).await,
        admin: make("admin", Role::Admin, None, None).await,
        worker: make("worker", Role::Worker, None, None).await,
        expired: make("expired", Role::Admin, None, Some(1)).await,
        revoked: make("revoked", Role::Admin, None, None).await,
        scoped: make("sales-viewer", Role::Viewer, Some("sales"), None).await,
    };
    store.revoke_token("revoked", now).await.expect("revoke");
    tokens
}

fn denied(code: Code) -> bool {
    matches!(code, Code::Unauthenticated | Code::PermissionDenied)
}

/// What the store holds that a refused call could have changed.
async fn snapshot(admin: &mut Client) -> String {
    let workflows = admin
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("workflows")
        .into_inner()
        .workflows
        .iter()
        .map(|w| format!("{} v{} paused={}", w.name, w.version, w.paused))
        .collect::<Vec<_>>();
    let runs = admin
        .list_runs(pb::ListRunsRequest::default())
        .await
        .expect("runs")
        .into_inner()
        .runs
        .len();
    let tokens = admin
        .list_tokens(pb::ListTokensRequest {})
        .await
        .expect("tokens")
        .into_inner()
        .tokens
        .iter()
        .map(|t| format!("{} revoked={}", t.name, t.revoked_at_ms > 0))
        .collect::<Vec<_>>();
    format!("{workflows:?} runs={runs} {tokens:?}")
}

async fn every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing(backend: Backend) {
    // Every refusal below comes from one address: the throttle is tested on its own.
    let cluster = Cluster::builder(backend)
        .auth(AuthMode::Tokens)
        .auth_failures_per_address(10_000)
        .ops_listener()
        .start()
        .await
        .expect("cluster");
    let endpoint = cluster.endpoint();
    let tokens = make_tokens(cluster.store_url()).await;
    let mut admin = client(&endpoint, Some(&tokens.admin)).await;
    assert_eq!(call(&mut admin, "ApplyWorkflow").await, Code::Ok);
    let before = snapshot(&mut admin).await;

    let methods = every_method();
    assert!(methods.len() >= 25, "{methods:?}");
    let malformed = "axt_not-a-token".to_string();
    let callers: Vec<(&str, Option<&String>, Option<Role>)> = vec![
        ("no token", None, None),
        ("malformed", Some(&malformed), None),
        ("expired", Some(&tokens.expired), None),
        ("revoked", Some(&tokens.revoked), None),
        ("worker", Some(&tokens.worker), Some(Role::Worker)),
        ("viewer", Some(&tokens.viewer), Some(Role::Viewer)),
        ("operator", Some(&tokens.operator), Some(Role::Operator)),
    ];
    let mut checked = 0;
    for (who, token, role) in &callers {
        let mut caller = client(&endpoint, token.map(String::as_str)).await;
        for method in &methods {
            let need = control_method_needs(method);
            let allowed = role.is_some_and(|role| role.allows(need));
            if allowed {
                continue;
            }
            let want = if role.is_some() {
                Code::PermissionDenied
            } else {
                Code::Unauthenticated
            };
            assert_eq!(call(&mut caller, method).await, want, "{method} by {who}");
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} refusals checked");
    assert_eq!(
        snapshot(&mut admin).await,
        before,
        "a refused call changed the store"
    );

    // What each role may do goes through (its answer may be NotFound: no run 1 exists).
    for (who, token) in [
        ("viewer", &tokens.viewer),
        ("operator", &tokens.operator),
        ("admin", &tokens.admin),
    ] {
        let role: Role = who.parse().unwrap();
        let mut caller = client(&endpoint, Some(token)).await;
        for method in &methods {
            if role.allows(control_method_needs(method)) {
                let code = call(&mut caller, method).await;
                assert!(!denied(code), "{method} by {who}: {code:?}");
            }
        }
    }

    // The worker stream: only worker tokens open it (workers/ has the rest).
    for (who, token, open) in [
        ("a malformed token", &malformed, false),
        ("a revoked token", &tokens.revoked, false),
        ("viewer", &tokens.viewer, false),
        ("operator", &tokens.operator, false),
        ("admin", &tokens.admin, false),
        ("worker", &tokens.worker, true),
    ] {
        let code = connect_worker(&endpoint, token).await;
        assert_eq!(denied(code), !open, "worker stream by {who}: {code:?}");
    }
    assert_eq!(
        connect_worker(&endpoint, "").await,
        Code::Unauthenticated,
        "a worker stream without a token"
    );

    // Audit rows name the token; failed authentications are audited with the address.
    let audit = admin
        .list_audit(pb::ListAuditRequest {
            limit: 1000,
            ..Default::default()
        })
        .await
        .expect("audit")
        .into_inner()
        .entries;
    let mut triggers: Vec<&str> = audit
        .iter()
        .filter(|e| e.action == "trigger")
        .map(|e| e.token.as_str())
        .collect();
    triggers.sort();
    assert_eq!(
        triggers,
        ["admin", "operator"],
        "each trigger names its token"
    );
    let failed: Vec<_> = audit.iter().filter(|e| e.action == "auth_failed").collect();
    assert!(
        failed
            .iter()
            .any(|e| e.detail == "expired token" && e.token == "expired"),
        "{failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|e| e.detail == "revoked token" && e.token == "revoked")
    );
    assert!(
        failed
            .iter()
            .any(|e| e.detail == "malformed token" && e.token.is_empty())
    );
    assert!(
        failed.iter().all(|e| e.remote.starts_with("127.0.0.1:")),
        "{failed:?}"
    );

    // A scoped token: the other app's workflow does not exist for it, byte for byte.
    let mut admin_call = client(&endpoint, Some(&tokens.admin)).await;
    admin_call
        .apply_workflow(pb::ApplyWorkflowRequest {
            source: OTHER_APP.into(),
            ..Default::default()
        })
        .await
        .expect("apply finance");
    let mut scoped = client(&endpoint, Some(&tokens.scoped)).await;
    let listed = scoped
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .workflows;
    assert_eq!(
        listed.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
        ["guarded"]
    );
    let hidden = scoped
        .get_workflow(pb::GetWorkflowRequest {
            name: "books".into(),
        })
        .await
        .unwrap_err();
    let missing = scoped
        .get_workflow(pb::GetWorkflowRequest {
            name: "no-such".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(
        hidden.message().replace("books", "X"),
        missing.message().replace("no-such", "X")
    );
    assert_eq!(
        scoped
            .list_audit(pb::ListAuditRequest::default())
            .await
            .unwrap_err()
            .code(),
        Code::PermissionDenied
    );

    // The JSON API takes the same tokens, in a header or in the UI's session cookie.
    let http = reqwest::Client::new();
    let url = format!("{endpoint}/api/v1/workflows");
    let anonymous = http.get(&url).send().await.expect("get");
    assert_eq!(anonymous.status(), 401);
    let body: serde_json::Value = anonymous.json().await.expect("json");
    assert_eq!(body["code"], "Unauthenticated", "{body}");
    let by_cookie = http
        .get(&url)
        .header("cookie", format!("ax_session={}", tokens.viewer))
        .send()
        .await
        .expect("get");
    assert_eq!(by_cookie.status(), 200);
    let trigger = http
        .post(format!("{endpoint}/api/v1/workflows/guarded/trigger"))
        .bearer_auth(&tokens.viewer)
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("post");
    assert_eq!(trigger.status(), 403);
    // A backfill, dry run or not, is an operator's call too.
    let backfill = http
        .post(format!("{endpoint}/api/v1/workflows/guarded/backfill"))
        .bearer_auth(&tokens.viewer)
        .json(&serde_json::json!({"fromMs": "0", "toMs": "86400000", "dryRun": true}))
        .send()
        .await
        .expect("post");
    assert_eq!(backfill.status(), 403);
    // The JSON API keeps the scope too, the graph's export included.
    for path in [
        "/api/v1/workflows/books",
        "/api/v1/workflows/books/dag/export?format=dot",
    ] {
        let hidden = http
            .get(format!("{endpoint}{path}"))
            .bearer_auth(&tokens.scoped)
            .send()
            .await
            .expect("get");
        assert_eq!(hidden.status(), 404, "{path}");
    }
    let shown = http
        .get(format!(
            "{endpoint}/api/v1/workflows/guarded/dag/export?format=dot"
        ))
        .bearer_auth(&tokens.scoped)
        .send()
        .await
        .expect("get");
    assert_eq!(shown.status(), 200);
    // Metrics: a viewer's on the main port; open on the ops listener, which serves nothing else.
    let metrics = format!("{endpoint}/metrics");
    assert_eq!(http.get(&metrics).send().await.expect("get").status(), 401);
    let scraped = http
        .get(&metrics)
        .bearer_auth(&tokens.viewer)
        .send()
        .await
        .expect("get");
    assert_eq!(scraped.status(), 200);
    let ops = cluster.scheduler.ops_addr().expect("the ops listener");
    let open = http
        .get(format!("http://{ops}/metrics"))
        .send()
        .await
        .expect("get");
    assert_eq!(open.status(), 200);
    assert!(open.text().await.unwrap().contains("ax_dispatches_total"));
    // The page itself loads without a token: it asks for one.
    assert_eq!(
        http.get(format!("{endpoint}/"))
            .send()
            .await
            .expect("page")
            .status(),
        200
    );
    cluster.shutdown().await.expect("shutdown");
}

/// Opens a worker stream with `token` (none when empty) and answers how it ended (Ok:
/// registered).
async fn connect_worker(endpoint: &str, token: &str) -> Code {
    let auth = ClientAuth {
        token: (!token.is_empty()).then(|| token.into()),
        ..ClientAuth::default()
    };
    let channel = auth
        .endpoint(endpoint, None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut worker = pb::worker_service_client::WorkerServiceClient::with_interceptor(
        channel,
        auth.bearer().unwrap(),
    );
    let register = pb::WorkerMessage {
        body: Some(pb::worker_message::Body::Register(pb::Register {
            protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
            worker_id: "probe".into(),
            capacity: 1,
            started_at_ms: chrono::Utc::now().timestamp_millis(),
            ..Default::default()
        })),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(register).await.unwrap();
    let answer = worker
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let code = match answer {
        Err(status) => status.code(),
        Ok(response) => {
            let mut inbound = response.into_inner();
            match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
                Ok(Ok(Some(_))) => Code::Ok,
                Ok(Err(status)) => status.code(),
                _ => Code::Unknown,
            }
        }
    };
    drop(tx);
    code
}

async fn sqlite_every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing() {
    every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing(Backend::Sqlite).await;
}

async fn mysql_every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing() {
    every_call_is_refused_where_its_role_says_and_a_refusal_changes_nothing(Backend::MySql).await;
}

/// An address that keeps failing has its failures answered slowly, as ResourceExhausted, and
/// audited once each kind; a valid token from the same address (a client behind the same NAT,
/// a worker restarting) passes at once, one looked up in the cache and a new one alike.
async fn an_address_past_its_failed_authentications_has_its_failures_slowed_not_its_tokens() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .auth(AuthMode::Tokens)
        .auth_failures_per_address(3)
        .start()
        .await
        .expect("cluster");
    let endpoint = cluster.endpoint();
    let tokens = make_tokens(cluster.store_url()).await;
    let mut good = client(&endpoint, Some(&tokens.viewer)).await;
    let mut bad = client(&endpoint, Some("axt_guess")).await;
    assert_eq!(call(&mut good, "ListRuns").await, Code::Ok);
    for _ in 0..3 {
        assert_eq!(call(&mut bad, "ListRuns").await, Code::Unauthenticated);
    }
    assert_eq!(call(&mut bad, "ListRuns").await, Code::ResourceExhausted);
    assert_eq!(call(&mut bad, "ListRuns").await, Code::ResourceExhausted);
    assert_eq!(
        call(&mut good, "ListRuns").await,
        Code::Ok,
        "a valid token is never refused by the throttle"
    );
    // A token the node has not seen yet (a store read, not the cache) passes too.
    let store = ax_store::open(cluster.store_url()).await.expect("store");
    let now = chrono::Utc::now().timestamp_millis();
    let fresh = create(
        store.as_ref(),
        TokenRequest {
            name: "fresh".into(),
            role: Role::Viewer,
            app: None,
            lifetime_ms: None,
            created_by: "test".into(),
            worker: None,
        },
        now,
    )
    .await
    .expect("token")
    .0;
    let mut fresh = client(&endpoint, Some(&fresh)).await;
    assert_eq!(call(&mut fresh, "ListRuns").await, Code::Ok);
    assert_eq!(call(&mut bad, "ListRuns").await, Code::ResourceExhausted);
    let rows = store
        .query_audit(&ax_store::AuditFilter {
            limit: 10,
            action: Some("auth_failed".into()),
            ..Default::default()
        })
        .await
        .expect("audit");
    let details: Vec<&str> = rows.iter().map(|r| r.detail.as_str()).collect();
    assert_eq!(
        details,
        vec![
            "malformed token; this address's failures are slowed for 60s after 3 of them",
            "malformed token",
        ],
        "one row per kind of failure, repeats counted for the summary"
    );
    cluster.shutdown().await.expect("shutdown");
}

/// A certificate authority of the test's own, and what it signs.
struct Ca {
    cert: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A leaf certificate for `names` (DNS names or IP addresses), written as `stem.pem` and
    /// `stem.key` in `dir`.
    fn sign(&self, names: &[&str], dir: &std::path::Path, stem: &str) -> (String, String) {
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = dir.join(format!("{stem}.pem"));
        let key_path = dir.join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (
            cert_path.display().to_string(),
            key_path.display().to_string(),
        )
    }

    fn write(&self, dir: &std::path::Path, name: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path.display().to_string()
    }
}

/// Runs a binary to its end; answers (exit code, stdout, stderr).
fn run(program: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(ax_integration_tests::binary(program).unwrap())
        .args(args)
        .env_remove("AX_SERVER")
        .env_remove("AX_TOKEN")
        .env_remove("AX_TLS_CA")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn tls_with_worker_certificates_and_a_certificate_replaced_without_a_restart() {
    use ax_integration_tests::process::Process;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("ax test CA");
    let ca_file = ca.write(d, "ca.pem");
    let (server_cert, server_key) = ca.sign(&["localhost", "127.0.0.1"], d, "server");
    let (w1_cert, w1_key) = ca.sign(&["w1"], d, "w1");
    let store = format!("sqlite://{}", d.join("ax.db").display());
    let port = free_port().expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    let server = format!("https://localhost:{port}");

    let (code, admin, err) = run(
        "ax-scheduler",
        &[
            "--store", &store, "token", "create", "--name", "root", "--role", "admin",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let admin = admin.trim().to_string();
    assert!(
        ax_core::access::is_token_shaped(&admin),
        "stdout is the token alone: {admin:?}"
    );
    assert!(err.contains("shown once"), "{err}");

    let scheduler_args: Vec<String> = [
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
        "--node-id",
        "n1",
        "--heartbeat-interval",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scheduler = Process::spawn(
        "ax-scheduler",
        &ax_integration_tests::binary("ax-scheduler").unwrap(),
        &scheduler_args,
        d,
        d.join("scheduler.log"),
    )
    .unwrap();
    let axctl = |extra: &[&str]| {
        let mut args = vec!["--server", &server, "--tls-ca", &ca_file, "--token", &admin];
        args.extend_from_slice(extra);
        run("axctl", &args)
    };
    eventually("the node answers over TLS", || axctl(&["whoami"]).0 == 0).await;
    assert!(
        axctl(&["whoami"])
            .1
            .contains("token root (admin, every app)")
    );

    // Plaintext to a TLS port gets nowhere; a CA that did not sign the node is refused.
    let (code, _, err) = run(
        "axctl",
        &[
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--token",
            &admin,
            "whoami",
        ],
    );
    assert_ne!(code, 0, "plaintext was answered: {err}");
    let stranger = Ca::new("another CA").write(d, "stranger.pem");
    let (code, _, err) = run(
        "axctl",
        &[
            "--server", &server, "--tls-ca", &stranger, "--token", &admin, "whoami",
        ],
    );
    assert_eq!(code, 5, "{err}");

    // A worker token from axctl; the token alone on stdout. It may register any id: here the
    // certificates decide.
    let (code, worker_token, err) = axctl(&[
        "token",
        "create",
        "--name",
        "workers",
        "--role",
        "worker",
        "--worker-id",
        "*",
    ]);
    assert_eq!(code, 0, "{err}");
    let token_file = d.join("worker.token");
    std::fs::write(&token_file, &worker_token).unwrap();
    let token_file = token_file.display().to_string();
    let worker = |id: &str, cert: Option<(&str, &str)>| {
        let mut args: Vec<String> = [
            "--scheduler",
            &server,
            "--id",
            id,
            "--tls-ca",
            &ca_file,
            "--token-file",
            &token_file,
            "--heartbeat-interval",
            "500ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some((cert, key)) = cert {
            args.extend([
                "--tls-cert".into(),
                cert.into(),
                "--tls-key".into(),
                key.into(),
            ]);
        }
        args.extend([
            "--state-dir".into(),
            d.join(format!("state-{id}")).display().to_string(),
        ]);
        Process::spawn(
            id,
            &ax_integration_tests::binary("ax-worker").unwrap(),
            &args,
            d,
            d.join(format!("{id}.log")),
        )
        .unwrap()
    };
    let w1 = worker("w1", Some((&w1_cert, &w1_key)));
    let impostor = worker("w2", Some((&w1_cert, &w1_key)));
    let bare = worker("w3", None);
    let live = |id: &str| {
        let (_, out, _) = axctl(&["workers", "-o", "json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|w| w["id"] == id && w["state"] == "LIVE")
    };
    eventually("w1 registers with its certificate", || live("w1")).await;
    eventually("w2 is refused: the certificate names w1", || {
        impostor
            .log_text()
            .contains("does not name worker \\\"w2\\\"")
            || impostor.log_text().contains("does not name worker \"w2\"")
    })
    .await;
    eventually("w3 is refused: no certificate", || {
        bare.log_text().contains("client certificate")
    })
    .await;
    assert!(!live("w2") && !live("w3"));

    // A new certificate from another CA, written over the files: served without a restart.
    let ca2 = Ca::new("renewed CA");
    let ca2_file = ca2.write(d, "ca2.pem");
    let (cert2, key2) = ca2.sign(&["localhost", "127.0.0.1"], d, "server2");
    std::fs::copy(&key2, &server_key).unwrap();
    std::fs::copy(&cert2, &server_cert).unwrap();
    let renewed = || {
        run(
            "axctl",
            &[
                "--server", &server, "--tls-ca", &ca2_file, "--token", &admin, "whoami",
            ],
        )
        .0 == 0
    };
    eventually("the renewed certificate is served", renewed).await;
    assert!(scheduler.log_text().contains("TLS certificate reloaded"));
    drop((w1, impostor, bare, scheduler));
}

fn a_public_address_needs_tls_and_tokens_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("ax.db").display());
    let (code, _, err) = run(
        "ax-scheduler",
        &["--listen", "0.0.0.0:0", "--store", &store],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without TLS (--tls-cert and --tls-key)")
            && err.contains("--insecure"),
        "{err}"
    );
    // With --auth none the message names both; with TLS files but no auth it names auth only.
    let (_, _, err) = run(
        "ax-scheduler",
        &["--listen", "0.0.0.0:0", "--store", &store, "--auth", "none"],
    );
    assert!(
        err.contains("and token authentication (--auth tokens)"),
        "{err}"
    );
    // --insecure starts it: it serves until killed.
    let mut child =
        std::process::Command::new(ax_integration_tests::binary("ax-scheduler").unwrap())
            .args([
                "--listen",
                "0.0.0.0:0",
                "--store",
                &store,
                "--insecure",
                "--node-id",
                "open",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "an --insecure node started and stays up"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

fn test_key() -> ax_scheduler::secrets::SecretKey {
    // A key made for this test alone: 32 bytes, base64.
    ax_scheduler::secrets::SecretKey::from_base64("dGhpcyBpcyB0aGUgc2VjcmV0cyB0ZXN0J3Mga2V5ISE=")
        .expect("key")
}

const SECRET_VALUE: &str = "hunter2-very-secret";

const USES_SECRET: &str = "name: warehouse-load
tasks:
  - name: load
    command: 'echo \"pw=$DB_PASSWORD\"; test \"$DB_PASSWORD\" = hunter2-very-secret && echo match'
    env:
      DB_PASSWORD: { secret: warehouse-db }
";

async fn secrets_reach_the_task_only(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .secret_key(test_key())
        .worker("w1", 2)
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.expect("client");
    // A secret that does not exist fails the apply, naming it.
    let err = client.apply(USES_SECRET).await.unwrap_err();
    let status = err.downcast_ref::<tonic::Status>().expect("a status");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("env DB_PASSWORD names secret \"warehouse-db\", which does not exist"),
        "{status}"
    );

    // Set through axctl, the value on stdin.
    let mut axctl = std::process::Command::new(ax_integration_tests::binary("axctl").unwrap())
        .args([
            "--server",
            &cluster.endpoint(),
            "secret",
            "set",
            "warehouse-db",
        ])
        .env_remove("AX_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    axctl
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{SECRET_VALUE}\n").as_bytes())
        .unwrap();
    let out = axctl.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "secret warehouse-db set\n"
    );

    client.apply(USES_SECRET).await.expect("apply");
    let (_, run) = client.run_to_end("warehouse-load").await.expect("run");
    assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    let instance = &client.instances(run.id).await.unwrap()[0];
    let lines: Vec<String> = client
        .logs(instance.id)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.text)
        .collect();
    assert_eq!(
        lines,
        ["pw=***", "match"],
        "the task saw the value; the log shows it masked"
    );

    // Nothing the API answers, the audit trail or the store's table holds the value.
    let mut control = client.control();
    let listed = control
        .list_secrets(pb::ListSecretsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.secrets.len(), 1);
    assert!(!format!("{listed:?}").contains(SECRET_VALUE));
    let audit = control
        .list_audit(pb::ListAuditRequest {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        audit
            .entries
            .iter()
            .any(|e| e.action == "secret_create" && e.target == "secret/warehouse-db")
    );
    assert!(!format!("{audit:?}").contains(SECRET_VALUE));
    let store = ax_store::open(cluster.store_url()).await.unwrap();
    let stored = store.list_secrets().await.unwrap();
    assert!(!stored[0].sealed.contains(SECRET_VALUE) && !stored[0].sealed.is_empty());

    // A secret in use is not deleted; the refusal names the workflow.
    let err = control
        .delete_secret(pb::DeleteSecretRequest {
            name: "warehouse-db".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("warehouse-load"),
        "{}",
        err.message()
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn sqlite_secrets_reach_the_task_only() {
    secrets_reach_the_task_only(Backend::Sqlite).await;
}

async fn mysql_secrets_reach_the_task_only() {
    secrets_reach_the_task_only(Backend::MySql).await;
}

/// A node without the key cannot set secrets, and a task that names one waits, saying why.
async fn without_a_key_secrets_are_refused_and_their_tasks_wait() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .worker("w1", 1)
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.unwrap();
    let err = client
        .control()
        .set_secret(pb::SetSecretRequest {
            name: "warehouse-db".into(),
            value: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("--secret-key-file"),
        "{}",
        err.message()
    );
    // Sealed by a node that had the key: this one cannot open it.
    let store = ax_store::open(cluster.store_url()).await.unwrap();
    store
        .put_secret(
            "",
            "warehouse-db",
            &test_key().seal("", "warehouse-db", SECRET_VALUE),
            1,
            "test",
        )
        .await
        .unwrap();
    client.apply(USES_SECRET).await.expect("apply");
    let run = client.trigger_run("warehouse-load").await.unwrap();
    let explained = async || {
        let why = client
            .control()
            .explain_workflow(pb::ExplainWorkflowRequest {
                name: "warehouse-load".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        format!("{why:?}")
    };
    eventually_async("the task waits for its secret", async || {
        explained().await.contains("this node has no secret key")
    })
    .await;
    assert_eq!(
        client.get_run(run.id).await.unwrap().state,
        pb::RunState::Running as i32
    );
    assert!(
        client
            .logs(client.instances(run.id).await.unwrap()[0].id)
            .await
            .unwrap()
            .is_empty()
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn eventually_async(what: &str, check: impl AsyncFn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Python SDK, a second implementation of the client and the worker, against a node that
/// asks for TLS, tokens and worker certificates: its client applies and triggers with an admin
/// token, its worker registers with a worker token and a certificate naming it and runs the
/// task, and a client without a token is refused.
async fn the_python_sdk_speaks_tls_tokens_and_worker_certificates() {
    use ax_integration_tests::process::Process;
    let python = std::env::var_os("AX_TEST_PYTHON").expect("AX_TEST_PYTHON");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("ax python CA");
    let ca_file = ca.write(d, "ca.pem");
    let (server_cert, server_key) = ca.sign(&["localhost", "127.0.0.1"], d, "server");
    let (worker_cert, worker_key) = ca.sign(&["pyw1"], d, "pyw1");
    let store = format!("sqlite://{}", d.join("ax.db").display());
    let port = free_port().expect("a free port");
    let server = format!("https://localhost:{port}");
    let (code, admin, err) = run(
        "ax-scheduler",
        &[
            "--store", &store, "token", "create", "--name", "root", "--role", "admin",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
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
    let admin = admin.trim().to_string();
    let axctl = |extra: &[&str]| {
        let mut args = vec!["--server", &server, "--tls-ca", &ca_file, "--token", &admin];
        args.extend_from_slice(extra);
        run("axctl", &args)
    };
    eventually("the node answers over TLS", || axctl(&["whoami"]).0 == 0).await;
    let (code, worker_token, err) = axctl(&[
        "token",
        "create",
        "--name",
        "py-workers",
        "--role",
        "worker",
        "--worker-id",
        "pyw1",
    ]);
    assert_eq!(code, 0, "{err}");

    let script = r#"
import sys
from ax_sdk import AxError, Client, Worker
server, ca, admin, worker_token, cert, key = sys.argv[1:7]
client = Client(server, token=admin, tls_ca=ca)
client.apply(source="name: py-secure\ntasks:\n  - name: t\n    command: echo over-tls\n    labels: {sdk: python}\n")
worker = Worker(server, "pyw1", labels={"sdk": "python"}, token=worker_token, tls_ca=ca,
                tls_cert=cert, tls_key=key).start()
run = client.wait(client.trigger("py-secure").run.id, timeout=60)
print("run", run.id, client.instances(run.id)[0].worker_id,
      [line.text for line in client.logs(client.instances(run.id)[0].id)])
worker.stop(drain=True, timeout=10)
try:
    Client(server, tls_ca=ca).list_workflows()
    print("anonymous allowed")
except AxError as err:
    print("anonymous", err.code.name)
"#;
    let out = tokio::process::Command::new(&python)
        .args(["-c", script, &server, &ca_file, &admin, worker_token.trim()])
        .args([&worker_cert, &worker_key])
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the script ends")
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        scheduler.log_text()
    );
    assert!(stdout.contains("pyw1 ['over-tls']"), "{stdout}\n{stderr}");
    assert!(stdout.contains("anonymous UNAUTHENTICATED"), "{stdout}");
    let (_, runs, _) = axctl(&["get", "runs", "--workflow", "py-secure", "-o", "json"]);
    assert!(runs.contains("SUCCESS"), "{runs}");
    drop(scheduler);
}
