//! Cross-site requests, as a browser sends them: a page of another origin (another port of
//! 127.0.0.1, or `localhost`) posting gRPC-framed bodies as `text/plain`, forms, JSON and event
//! streams to a node, with a signed-in admin's session cookie (tokens on) or with nothing (the
//! loopback default), and a DNS-rebinding page naming the node by the attacker's host. Nothing
//! is applied or triggered (the store is read after every attempt), answers name what was
//! wrong, no answer grants CORS, and the node's own page, `axctl`-style gRPC clients and scripts
//! without a browser's headers still work. The same attacks in a real browser:
//! `browser_attacks` (`integration-tests/browser/cross-site.test.mjs`).

use std::process::Command;
use std::time::Duration;

use ax_core::access::Role;
use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::requirements::BROWSER;
use ax_integration_tests::{Backend, Cluster, browser};
use ax_proto::v1 as pb;
use ax_proto::v1::control_service_client::ControlServiceClient;
use ax_scheduler::AuthMode;
use ax_scheduler::auth::tokens::{TokenRequest, create};
use prost::Message;
use reqwest::StatusCode;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) a_page_of_another_origin_cannot_act_through_a_signed_in_admins_browser),
        trial!(async(multi_thread) the_loopback_default_serves_only_its_own_origin_and_names),
        trial!(async(multi_thread) browser_attacks).requires(&BROWSER),
    ]
}

const PAYLOAD: &str = "name: pwned\ntasks:\n  - name: t\n    command: touch /tmp/ax-pwned\n";
const VICTIM: &str = "name: victim\ntasks:\n  - name: t\n    command: echo hi\n";
const ATTACKER_PAGE: &str = "http://127.0.0.1:9";

/// A gRPC message as it travels in a request body: uncompressed, its length, its bytes.
fn grpc_frame(message: &impl Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    frame.extend_from_slice(&bytes);
    frame
}

fn apply_body() -> Vec<u8> {
    grpc_frame(&pb::ApplyWorkflowRequest {
        source: PAYLOAD.into(),
        ..Default::default()
    })
}

fn trigger_body() -> Vec<u8> {
    grpc_frame(&pb::TriggerWorkflowRequest {
        name: "victim".into(),
        ..Default::default()
    })
}

async fn admin_token(store_url: &str) -> String {
    let store = ax_store::open(store_url).await.expect("store");
    let request = TokenRequest {
        name: "admin".into(),
        role: Role::Admin,
        app: None,
        lifetime_ms: None,
        created_by: "test".into(),
        worker: None,
    };
    let now = chrono::Utc::now().timestamp_millis();
    create(store.as_ref(), request, now).await.expect("token").0
}

/// The workflows and the number of runs, read with a token over gRPC.
async fn state(endpoint: &str, token: Option<&str>) -> (Vec<String>, usize) {
    let mut client = super::client(endpoint, token).await;
    let mut workflows: Vec<String> = client
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect("workflows")
        .into_inner()
        .workflows
        .into_iter()
        .map(|w| w.name)
        .collect();
    workflows.sort();
    let runs = client
        .list_runs(pb::ListRunsRequest::default())
        .await
        .expect("runs")
        .into_inner()
        .runs
        .len();
    (workflows, runs)
}

/// One attack: a request a page of another origin makes the browser send.
struct Attack {
    what: &'static str,
    method: reqwest::Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    /// The HTTP status the node must answer.
    expect: StatusCode,
}

fn attacks(cookie: Option<&str>, node: &str) -> Vec<Attack> {
    let cookie = |mut headers: Vec<(&'static str, String)>| {
        if let Some(token) = cookie {
            headers.push(("cookie", format!("ax_session={token}")));
        }
        headers
    };
    let grpc_path = "/ax.v1.ControlService/ApplyWorkflow".to_string();
    let trigger_path = "/ax.v1.ControlService/TriggerWorkflow".to_string();
    let api_trigger = "/api/v1/workflows/victim/trigger".to_string();
    vec![
        Attack {
            what: "a no-cors fetch of ApplyWorkflow, gRPC framing as text/plain",
            method: reqwest::Method::POST,
            path: grpc_path.clone(),
            headers: cookie(vec![
                ("content-type", "text/plain;charset=UTF-8".into()),
                ("origin", ATTACKER_PAGE.into()),
                ("sec-fetch-site", "same-site".into()),
                ("sec-fetch-mode", "no-cors".into()),
            ]),
            body: apply_body(),
            expect: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        },
        Attack {
            what: "a no-cors fetch of TriggerWorkflow from localhost",
            method: reqwest::Method::POST,
            path: trigger_path.clone(),
            headers: cookie(vec![
                ("content-type", "text/plain".into()),
                ("origin", "http://localhost:9".into()),
            ]),
            body: trigger_body(),
            expect: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        },
        Attack {
            what: "a form posting ApplyWorkflow",
            method: reqwest::Method::POST,
            path: grpc_path.clone(),
            headers: cookie(vec![
                (
                    "content-type",
                    "application/x-www-form-urlencoded".to_string(),
                ),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: apply_body(),
            expect: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        },
        Attack {
            what: "gRPC's own content type from a page (a browser sends Origin)",
            method: reqwest::Method::POST,
            path: trigger_path.clone(),
            headers: cookie(vec![
                ("content-type", "application/grpc".into()),
                ("te", "trailers".into()),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: trigger_body(),
            expect: StatusCode::OK,
        },
        Attack {
            what: "a form posting the JSON API's trigger",
            method: reqwest::Method::POST,
            path: api_trigger.clone(),
            headers: cookie(vec![
                ("content-type", "text/plain".into()),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: b"{}".to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a JSON POST to the trigger from another port (a preflight the browser skips)",
            method: reqwest::Method::POST,
            path: api_trigger.clone(),
            headers: cookie(vec![
                ("content-type", "application/json".into()),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: b"{}".to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a JSON POST to the backfill from another page",
            method: reqwest::Method::POST,
            path: "/api/v1/workflows/victim/backfill".to_string(),
            headers: cookie(vec![
                ("content-type", "application/json".into()),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: br#"{"fromMs": "0", "toMs": "86400000"}"#.to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a JSON POST marking an instance from another page",
            method: reqwest::Method::POST,
            path: "/api/v1/instances/1/mark".to_string(),
            headers: cookie(vec![
                ("content-type", "application/json".into()),
                ("origin", ATTACKER_PAGE.into()),
            ]),
            body: br#"{"state": "INSTANCE_STATE_SUCCESS", "reason": "x"}"#.to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a JSON POST that says only Sec-Fetch-Site: cross-site",
            method: reqwest::Method::POST,
            path: api_trigger,
            headers: cookie(vec![
                ("content-type", "application/json".into()),
                ("sec-fetch-site", "cross-site".into()),
            ]),
            body: b"{}".to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a same-origin form (no JSON, no request header)",
            method: reqwest::Method::POST,
            path: "/api/v1/workflows/victim/pause".into(),
            headers: cookie(vec![
                ("content-type", "application/x-www-form-urlencoded".into()),
                ("origin", format!("http://{node}")),
            ]),
            body: b"reason=x".to_vec(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "an event stream opened by another origin",
            method: reqwest::Method::GET,
            path: "/api/v1/runs/1/events".into(),
            headers: cookie(vec![
                ("accept", "text/event-stream".into()),
                ("origin", "http://localhost:9".into()),
            ]),
            body: Vec::new(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a workflow's grid stream opened by another origin",
            method: reqwest::Method::GET,
            path: "/api/v1/workflows/victim/grid/events".into(),
            headers: cookie(vec![
                ("accept", "text/event-stream".into()),
                ("origin", "http://localhost:9".into()),
            ]),
            body: Vec::new(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "a read of the API naming the node by a rebinding host",
            method: reqwest::Method::GET,
            path: "/api/v1/workflows".into(),
            headers: cookie(vec![("host", format!("attacker.example:{}", port(node)))]),
            body: Vec::new(),
            expect: StatusCode::FORBIDDEN,
        },
        Attack {
            what: "ApplyWorkflow as gRPC from a rebinding page (same origin to the browser)",
            method: reqwest::Method::POST,
            path: grpc_path,
            headers: cookie(vec![
                ("content-type", "application/grpc".into()),
                ("te", "trailers".into()),
                ("host", format!("attacker.example:{}", port(node))),
                ("origin", format!("http://attacker.example:{}", port(node))),
            ]),
            body: apply_body(),
            expect: StatusCode::OK,
        },
    ]
}

fn port(node: &str) -> &str {
    node.rsplit_once(':').map_or("", |(_, port)| port)
}

/// Sends every attack; each is refused with its status and a message, its gRPC ones with a
/// gRPC error, and none changes what the store holds.
async fn every_attack_is_refused(node: &str, cookie: Option<&str>, read_token: Option<&str>) {
    let endpoint = format!("http://{node}");
    let before = state(&endpoint, read_token).await;
    let http = reqwest::Client::builder()
        .http1_only()
        .build()
        .expect("http client");
    for attack in attacks(cookie, node) {
        let mut request = http
            .request(attack.method.clone(), format!("{endpoint}{}", attack.path))
            .body(attack.body.clone());
        for (name, value) in &attack.headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.expect(attack.what);
        let status = response.status();
        let headers = response.headers().clone();
        assert!(
            !headers.contains_key("access-control-allow-origin"),
            "{}: CORS granted",
            attack.what
        );
        let grpc_status = headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = response.text().await.unwrap_or_default();
        assert_eq!(status, attack.expect, "{}: {body}", attack.what);
        if attack.expect == StatusCode::OK {
            // A gRPC client hears a gRPC refusal (PermissionDenied, 7).
            assert_eq!(grpc_status.as_deref(), Some("7"), "{}", attack.what);
        } else {
            assert!(
                body.contains("\"message\""),
                "{}: the refusal says why: {body}",
                attack.what
            );
        }
        assert_eq!(
            state(&endpoint, read_token).await,
            before,
            "{}: the store changed",
            attack.what
        );
    }
}

async fn a_page_of_another_origin_cannot_act_through_a_signed_in_admins_browser() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .auth(AuthMode::Tokens)
        .start()
        .await
        .expect("cluster");
    let admin = admin_token(cluster.store_url()).await;
    let node = cluster.addr.to_string();
    let endpoint = cluster.endpoint();
    let http = reqwest::Client::new();

    // The admin applies the victim workflow with a token, as axctl does.
    let applied = state(&endpoint, Some(&admin)).await;
    assert_eq!(applied, (vec![], 0));
    let mut client = super::client(&endpoint, Some(&admin)).await;
    client
        .apply_workflow(pb::ApplyWorkflowRequest {
            source: VICTIM.into(),
            ..Default::default()
        })
        .await
        .expect("apply");

    every_attack_is_refused(&node, Some(&admin), Some(&admin)).await;

    // gRPC never reads the cookie, even from a client that is no browser.
    let by_cookie = http
        .post(format!("{endpoint}/ax.v1.ControlService/TriggerWorkflow"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("cookie", format!("ax_session={admin}"))
        .body(trigger_body())
        .send()
        .await
        .expect("post");
    assert_eq!(
        by_cookie
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()),
        Some("16"),
        "Unauthenticated: the cookie is not a gRPC credential"
    );

    // The node's own page still acts with the cookie: its origin, JSON or its header.
    let own = format!("http://{node}");
    let trigger = http
        .post(format!("{endpoint}/api/v1/workflows/victim/trigger"))
        .header("cookie", format!("ax_session={admin}"))
        .header("origin", &own)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("trigger");
    assert_eq!(
        trigger.status(),
        200,
        "{}",
        trigger.text().await.unwrap_or_default()
    );
    let run: serde_json::Value = http
        .get(format!("{endpoint}/api/v1/runs/1"))
        .header("cookie", format!("ax_session={admin}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .expect("run")
        .json()
        .await
        .expect("json");
    assert_eq!(run["workflow"], "victim", "{run}");
    let sign_out = http
        .delete(format!("{endpoint}/api/v1/session"))
        .header("origin", &own)
        .header("x-ax-request", "1")
        .send()
        .await
        .expect("sign out");
    assert_eq!(sign_out.status(), 200);
    // A token in the Authorization header needs no origin: it is not the browser's to attach.
    let with_token = http
        .post(format!("{endpoint}/api/v1/workflows/victim/pause"))
        .bearer_auth(&admin)
        .header("origin", ATTACKER_PAGE)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("pause");
    assert_eq!(with_token.status(), 200);
    assert_eq!(
        state(&endpoint, Some(&admin)).await,
        (vec!["victim".to_string()], 1)
    );
    cluster.shutdown().await.expect("shutdown");
}

async fn the_loopback_default_serves_only_its_own_origin_and_names() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .public_url("https://ax.example.com")
        .start()
        .await
        .expect("cluster");
    let node = cluster.addr.to_string();
    let endpoint = cluster.endpoint();
    let client = cluster.client().await.expect("client");
    client.apply(VICTIM).await.expect("apply");

    every_attack_is_refused(&node, None, None).await;

    let http = reqwest::Client::new();
    // The rebinding refusal names the setting that would allow the name.
    let rebound = http
        .get(format!("{endpoint}/"))
        .header("host", format!("attacker.example:{}", port(&node)))
        .send()
        .await
        .expect("page");
    assert_eq!(rebound.status(), 403);
    let text = rebound.text().await.expect("text");
    assert!(text.contains("--public-url"), "{text}");
    // A gRPC client that names the node by another host is refused too (its :authority).
    let rebinding_channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
        .expect("endpoint")
        .origin(
            format!("http://attacker.example:{}", port(&node))
                .parse()
                .expect("uri"),
        )
        .connect()
        .await
        .expect("connect");
    let refused = ControlServiceClient::new(rebinding_channel)
        .list_workflows(pb::ListWorkflowsRequest::default())
        .await
        .expect_err("a rebinding host is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(refused.message().contains("--public-url"), "{refused:?}");

    // What a proxy serves the node as is the node's own, host and origin.
    let proxied = http
        .post(format!("{endpoint}/api/v1/workflows/victim/trigger"))
        .header("host", "ax.example.com")
        .header("origin", "https://ax.example.com")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("proxied trigger");
    assert_eq!(
        proxied.status(),
        200,
        "{}",
        proxied.text().await.unwrap_or_default()
    );
    // A script with no browser headers (curl) still uses the API, and the page still loads.
    let script = http
        .post(format!("{endpoint}/api/v1/workflows/victim/trigger"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("script trigger");
    assert_eq!(script.status(), 200);
    let page = http
        .get(format!("http://localhost:{}/", port(&node)))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    assert_eq!(
        state(&endpoint, None).await,
        (vec!["victim".to_string()], 2)
    );
    cluster.shutdown().await.expect("shutdown");
}

/// The attacks above, made by pages in Chromium (`browser/cross-site.test.mjs`): pages on
/// another port of 127.0.0.1 and on `localhost` against a node with tokens (an admin signed in
/// through the UI) and one without, and a rebinding page. The store is read here afterwards.
async fn browser_attacks() {
    let chromium = browser::tools().unwrap_or_else(|missing| panic!("{missing}"));
    for tokens in [true, false] {
        let mut builder = Cluster::builder(Backend::Sqlite);
        if tokens {
            builder = builder.auth(AuthMode::Tokens);
        }
        let cluster = builder.start().await.expect("cluster");
        let admin = if tokens {
            Some(admin_token(cluster.store_url()).await)
        } else {
            None
        };
        let endpoint = cluster.endpoint();
        super::client(&endpoint, admin.as_deref())
            .await
            .apply_workflow(pb::ApplyWorkflowRequest {
                source: VICTIM.into(),
                ..Default::default()
            })
            .await
            .expect("apply");
        let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/ui-screenshots/cross-site")
            .join(if tokens { "tokens" } else { "none" });
        std::fs::create_dir_all(&shots).expect("screenshot dir");
        let grpc_apply = hex(&apply_body());
        let grpc_trigger = hex(&trigger_body());
        let token = admin.clone().unwrap_or_default();
        let chromium = chromium.clone();
        let suite = tokio::task::spawn_blocking(move || {
            Command::new("node")
                .args(["--test", "--test-reporter=spec", "cross-site.test.mjs"])
                .current_dir(browser::dir())
                .env("AX_UI_URL", &endpoint)
                .env("AX_UI_TOKEN", &token)
                .env("AX_UI_SHOTS", &shots)
                .env("AX_CHROMIUM", &chromium)
                .env("AX_GRPC_APPLY", &grpc_apply)
                .env("AX_GRPC_TRIGGER", &grpc_trigger)
                .output()
        });
        let output = tokio::time::timeout(Duration::from_secs(300), suite)
            .await
            .expect("the browser checks hang")
            .expect("join")
            .expect("node");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "cross-site browser checks (tokens {tokens}) failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // The attacks changed nothing; the page's own trigger (the suite's last step) ran.
        let (workflows, runs) = state(&cluster.endpoint(), admin.as_deref()).await;
        assert_eq!(workflows, vec!["victim".to_string()], "tokens {tokens}");
        assert_eq!(
            runs, 1,
            "only the UI's own trigger made a run (tokens {tokens})"
        );
        cluster.shutdown().await.expect("shutdown");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
