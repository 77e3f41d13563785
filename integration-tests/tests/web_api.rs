//! The HTTP edge on the scheduler's gRPC port, against an in-process scheduler with a real
//! worker: `/api/v1` answers in the protobuf JSON mapping of the `ControlService` messages,
//! names what was wrong in a bad request or an unknown id, and every other path is the page
//! (so a deep link loads cold). gRPC keeps working on the same port (the client applies and
//! triggers through it). SQLite always, MySQL when `AX_TEST_MYSQL_URL` is set.

use std::time::Duration;

use ax_integration_tests::{Backend, Cluster, TestClient};
use reqwest::StatusCode;
use serde_json::Value;

/// A hang guard, not a timing assertion.
const TIMEOUT: Duration = Duration::from_secs(60);

ax_integration_tests::on_every_backend!(
    the_api_answers_with_the_control_service_messages_as_json,
    a_bad_request_or_an_unknown_id_is_named_in_the_answer,
    any_other_path_is_the_page,
);

async fn started(backend: Backend) -> Option<(Cluster, TestClient, String)> {
    let cluster = Cluster::builder(backend)
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster")?;
    let client = TestClient::connect(&cluster.endpoint())
        .await
        .expect("client");
    let base = format!("http://{}", cluster.addr);
    Some((cluster, client, base))
}

async fn get(url: &str) -> (StatusCode, String) {
    let response = reqwest::get(url).await.expect("an HTTP answer");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

async fn get_json(url: &str) -> (StatusCode, Value) {
    let (status, body) = get(url).await;
    let json = serde_json::from_str(&body).unwrap_or_else(|err| panic!("{url}: {err}: {body}"));
    (status, json)
}

async fn the_api_answers_with_the_control_service_messages_as_json(backend: Backend) {
    let Some((cluster, client, base)) = started(backend).await else {
        return;
    };
    client
        .apply("name: nightly\napp: etl\ntasks:\n  - name: extract\n    command: echo hi\n")
        .await
        .expect("apply");
    let run = client.trigger_run("nightly").await.expect("trigger");
    client
        .wait_run_within(run.id, TIMEOUT)
        .await
        .expect("run ends");

    let (status, listed) = get_json(&format!("{base}/api/v1/workflows")).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let workflows = listed["workflows"].as_array().expect("a list");
    assert_eq!(workflows.len(), 1, "{listed}");
    assert_eq!(workflows[0]["name"], "nightly");
    assert_eq!(workflows[0]["app"], "etl");

    let (status, workflow) = get_json(&format!("{base}/api/v1/workflows/nightly")).await;
    assert_eq!(status, StatusCode::OK, "{workflow}");
    assert_eq!(workflow["tasks"][0]["name"], "extract");

    // 64-bit ids are strings in the JSON mapping; enums are their names.
    let (status, got) = get_json(&format!("{base}/api/v1/runs/{}", run.id)).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["id"], run.id.to_string());
    assert_eq!(got["state"], "RUN_STATE_SUCCESS");

    let (status, runs) = get_json(&format!(
        "{base}/api/v1/runs?workflow=nightly&state=success"
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{runs}");
    let runs = runs["runs"].as_array().expect("a list");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["id"], run.id.to_string());

    let (status, instances) = get_json(&format!("{base}/api/v1/runs/{}/instances", run.id)).await;
    assert_eq!(status, StatusCode::OK, "{instances}");
    let extract = &instances["instances"][0];
    assert_eq!(extract["task"], "extract", "{instances}");
    let id = extract["id"].as_str().expect("a string id");
    let (status, instance) = get_json(&format!("{base}/api/v1/instances/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{instance}");
    let attempt = &instance["attempts"][0];
    assert_eq!(attempt["workerId"], "w1", "{instance}");
    // Defaults are written: a clean exit reads as 0, not as a missing field.
    assert_eq!(attempt["exitCode"], 0, "{instance}");

    let (status, dag) = get_json(&format!(
        "{base}/api/v1/workflows/nightly/dag?run={}",
        run.id
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{dag}");
    assert!(dag.to_string().contains("extract"), "{dag}");
    let (status, why) = get_json(&format!("{base}/api/v1/workflows/nightly/why")).await;
    assert_eq!(status, StatusCode::OK, "{why}");
    let (status, workers) = get_json(&format!("{base}/api/v1/workers")).await;
    assert_eq!(status, StatusCode::OK, "{workers}");
    assert_eq!(workers["workers"][0]["id"], "w1", "{workers}");
    let (status, nodes) = get_json(&format!("{base}/api/v1/nodes")).await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(1), "{nodes}");
    let (status, audit) = get_json(&format!("{base}/api/v1/audit?action=trigger")).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    assert!(audit.to_string().contains("nightly"), "{audit}");
    cluster.shutdown().await.expect("shutdown");
}

async fn a_bad_request_or_an_unknown_id_is_named_in_the_answer(backend: Backend) {
    let Some((cluster, _client, base)) = started(backend).await else {
        return;
    };
    let cases = [
        ("/api/v1/workflows/nope", StatusCode::NOT_FOUND, "nope"),
        ("/api/v1/runs/424242", StatusCode::NOT_FOUND, "424242"),
        ("/api/v1/runs/abc", StatusCode::BAD_REQUEST, "id"),
        ("/api/v1/instances/0x1", StatusCode::BAD_REQUEST, "id"),
        ("/api/v1/workflows/nope/dag", StatusCode::NOT_FOUND, "nope"),
        (
            "/api/v1/workflows/nope/dag?run=x",
            StatusCode::BAD_REQUEST,
            "run",
        ),
        (
            "/api/v1/workflows/nope/why?at=soon",
            StatusCode::BAD_REQUEST,
            "at",
        ),
        ("/api/v1/audit?limit=lots", StatusCode::BAD_REQUEST, "limit"),
        ("/api/v1/runs?limit=-1", StatusCode::BAD_REQUEST, "limit"),
        (
            "/api/v1/runs?state=sleepy",
            StatusCode::BAD_REQUEST,
            "sleepy",
        ),
        (
            "/api/v1/no-such-thing",
            StatusCode::NOT_FOUND,
            "/api/v1/no-such-thing",
        ),
    ];
    for (path, expected, named) in cases {
        let (status, body) = get_json(&format!("{base}{path}")).await;
        assert_eq!(status, expected, "{path}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(named),
            "{path}: {message:?} does not name {named:?}"
        );
    }
    cluster.shutdown().await.expect("shutdown");
}

async fn any_other_path_is_the_page(backend: Backend) {
    let Some((cluster, _client, base)) = started(backend).await else {
        return;
    };
    for path in ["/", "/workflows/nightly", "/runs/7"] {
        let response = reqwest::get(format!("{base}{path}")).await.expect("answer");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(kind.starts_with("text/html"), "{path}: {kind}");
        let body = response.text().await.expect("body");
        assert!(body.contains("/api/v1/workflows"), "{path}: not the page");
    }
    cluster.shutdown().await.expect("shutdown");
}
