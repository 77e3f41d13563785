//! The HTTP edge on the scheduler's gRPC port, against an in-process scheduler with a real
//! worker: `/api/v1` answers in the protobuf JSON mapping of the `ControlService` messages,
//! names what was wrong in a bad request or an unknown id, and every other path is the page
//! (so a deep link loads cold). gRPC keeps working on the same port (the client applies and
//! triggers through it). SQLite always, MySQL when `AX_TEST_MYSQL_URL` is set.

use std::time::Duration;

use ax_integration_tests::harness::Test;
use ax_integration_tests::on_every_backend;
use ax_integration_tests::{Backend, Cluster, TestClient};
use reqwest::StatusCode;
use serde_json::Value;

/// A hang guard, not a timing assertion.
const TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn tests() -> Vec<Test> {
    on_every_backend!(
        the_api_answers_with_the_control_service_messages_as_json,
        a_bad_request_or_an_unknown_id_is_named_in_the_answer,
        any_other_path_is_the_page,
        event_streams_resume_after_the_last_event_id,
        an_action_takes_a_json_body_and_names_what_is_wrong,
    )
}

async fn started(backend: Backend) -> (Cluster, TestClient, String) {
    let cluster = Cluster::builder(backend)
        .worker("w1", 4)
        .start()
        .await
        .expect("cluster");
    let client = TestClient::connect(&cluster.endpoint())
        .await
        .expect("client");
    let base = format!("http://{}", cluster.addr);
    (cluster, client, base)
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
    let (cluster, client, base) = started(backend).await;
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
    // A summary (as the UI asks) leaves the tasks out but counts them, with the recent runs.
    let (status, summary) =
        get_json(&format!("{base}/api/v1/workflows?summary=true&recent=12")).await;
    assert_eq!(status, StatusCode::OK, "{summary}");
    let listed = &summary["workflows"][0];
    assert_eq!(
        (&listed["name"], &listed["app"], &listed["taskCount"]),
        (&"nightly".into(), &"etl".into(), &1.into()),
        "{summary}"
    );
    assert!(
        listed["tasks"].as_array().is_none_or(Vec::is_empty),
        "{summary}"
    );
    assert_eq!(
        listed["recentRuns"][0]["id"],
        run.id.to_string(),
        "{summary}"
    );

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
    // The list leaves attempts out unless asked, then gives each instance's as GetInstance does.
    assert!(
        extract["attempts"].as_array().is_none_or(Vec::is_empty),
        "{instances}"
    );
    let (status, with) = get_json(&format!(
        "{base}/api/v1/runs/{}/instances?attempts=true",
        run.id
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{with}");
    assert_eq!(
        with["instances"][0]["attempts"], instance["attempts"],
        "{with}"
    );

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
    let (cluster, _client, base) = started(backend).await;
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
        (
            "/api/v1/runs/1/instances?attempts=all",
            StatusCode::BAD_REQUEST,
            "attempts",
        ),
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
    let (cluster, _client, base) = started(backend).await;
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

/// The events of a Server-Sent Events body that ended: (event, id, data).
fn events(body: &str) -> Vec<(String, String, String)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .filter_map(|line| line.strip_prefix(name))
                    .map(|value| value.trim_start().to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            (field("event:"), field("id:"), field("data:"))
        })
        .collect()
}

async fn sse(url: &str, last_event_id: Option<&str>) -> Vec<(String, String, String)> {
    let mut request = reqwest::Client::new().get(url);
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id);
    }
    let response = tokio::time::timeout(TIMEOUT, request.send())
        .await
        .expect("an answer in time")
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK, "{url}");
    let body = tokio::time::timeout(TIMEOUT, response.text())
        .await
        .expect("the stream ends")
        .expect("a body");
    events(&body)
}

async fn event_streams_resume_after_the_last_event_id(backend: Backend) {
    let (cluster, client, base) = started(backend).await;
    client
        .apply("name: three\ntasks:\n  - name: say\n    command: printf 'one\\ntwo\\nthree\\n'\n")
        .await
        .expect("apply");
    let run = client.trigger_run("three").await.expect("trigger");
    client
        .wait_run_within(run.id, TIMEOUT)
        .await
        .expect("run ends");
    let instance = client.instances(run.id).await.expect("instances").remove(0);

    // A tail of an ended attempt sends its lines, then `end`; after line 2, only line 3.
    let tail = format!("{base}/api/v1/instances/{}/logs/tail", instance.id);
    let all = sse(&tail, None).await;
    assert_eq!(all.last().map(|e| e.0.as_str()), Some("end"), "{all:?}");
    let texts: Vec<String> = all
        .iter()
        .filter(|(event, _, _)| event == "lines")
        .flat_map(|(_, _, data)| {
            let chunk: Value = serde_json::from_str(data).expect("a LogChunk");
            chunk["lines"]
                .as_array()
                .expect("lines")
                .iter()
                .map(|line| line["text"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(texts, ["one", "two", "three"], "{all:?}");
    let resumed = sse(&tail, Some("2")).await;
    assert_eq!(resumed.len(), 2, "{resumed:?}");
    assert_eq!(resumed[0].0, "lines");
    assert_eq!(
        resumed[0].1, "3",
        "the id of a lines event is its last line"
    );
    assert!(resumed[0].2.contains("three") && !resumed[0].2.contains("two"));

    // A run's stream sends its state, then `end`; with that state's id, only `end`.
    let url = format!("{base}/api/v1/runs/{}/events", run.id);
    let first = sse(&url, None).await;
    let kinds: Vec<&str> = first.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds, ["run", "end"], "{first:?}");
    let snapshot: Value = serde_json::from_str(&first[0].2).expect("a snapshot");
    assert_eq!(snapshot["run"]["state"], "RUN_STATE_SUCCESS");
    assert_eq!(snapshot["instances"]["tasks"][0]["status"], "success");
    let again = sse(&url, Some(&first[0].1)).await;
    let kinds: Vec<&str> = again.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds, ["end"], "{again:?}");
    let unknown = reqwest::get(format!("{base}/api/v1/runs/424242/events"))
        .await
        .expect("answer");
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    cluster.shutdown().await.expect("shutdown");
}

async fn an_action_takes_a_json_body_and_names_what_is_wrong(backend: Backend) {
    let (cluster, client, base) = started(backend).await;
    client
        .apply("name: acted\ntasks:\n  - name: a\n    command: \"true\"\n")
        .await
        .expect("apply");
    let http = reqwest::Client::new();
    let post = |path: &str, kind: &str, body: &str| {
        http.post(format!("{base}{path}"))
            .header("content-type", kind)
            .body(body.to_string())
            .send()
    };
    let cases = [
        // What a form could send is refused before the handler (cross-site rules).
        (
            "/api/v1/workflows/acted/trigger",
            "text/plain",
            "{}",
            StatusCode::FORBIDDEN,
            "Content-Type application/json",
        ),
        (
            "/api/v1/workflows/acted/trigger",
            "application/json",
            "{\"parms\": {}}",
            StatusCode::BAD_REQUEST,
            "parms",
        ),
        (
            "/api/v1/workflows/acted/trigger",
            "application/json",
            "[1]",
            StatusCode::BAD_REQUEST,
            "object",
        ),
        (
            "/api/v1/workflows/nope/trigger",
            "application/json",
            "",
            StatusCode::NOT_FOUND,
            "nope",
        ),
        (
            "/api/v1/runs/abc/cancel",
            "application/json",
            "{}",
            StatusCode::BAD_REQUEST,
            "id",
        ),
        (
            "/api/v1/runs/424242/cancel",
            "application/json",
            "{}",
            StatusCode::NOT_FOUND,
            "424242",
        ),
    ];
    for (path, kind, body, expected, named) in cases {
        let response = post(path, kind, body).await.expect("answer");
        let status = response.status();
        let answer: Value = response.json().await.expect("a JSON error");
        assert_eq!(status, expected, "{path} {body}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(named),
            "{path} {body}: {message:?} does not name {named:?}"
        );
    }
    // No run was made by the refused triggers; an accepted one is audited as the web's, with
    // the caller's address.
    let runs: Value = reqwest::get(format!("{base}/api/v1/runs?workflow=acted"))
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
    let response = post(
        "/api/v1/workflows/acted/trigger",
        "application/json",
        "{\"params\": {\"day\": \"monday\"}, \"idempotencyKey\": \"k1\"}",
    )
    .await
    .expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let triggered: Value = response.json().await.expect("json");
    assert_eq!(triggered["created"], true, "{triggered}");
    assert_eq!(triggered["run"]["params"]["day"], "monday", "{triggered}");
    let (_, audit) = get_json(&format!("{base}/api/v1/audit?action=trigger&actor=web")).await;
    let entry = &audit["entries"][0];
    assert!(
        entry["target"]
            .as_str()
            .unwrap_or_default()
            .contains("acted"),
        "{audit}"
    );
    assert!(
        entry["remote"]
            .as_str()
            .unwrap_or_default()
            .starts_with("127.0.0.1:"),
        "{audit}"
    );
    cluster.shutdown().await.expect("shutdown");
}
