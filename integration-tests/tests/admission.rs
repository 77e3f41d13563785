//! Bounded admission end to end: a real scheduler with small bounds on waiting instances (5 per
//! app, 8 in total) and no worker, so whatever is admitted waits. Triggers past a bound are
//! refused over gRPC (RESOURCE_EXHAUSTED, `retry-after`, `ax-overloaded-bin` naming the bound,
//! the app, the count and the limit) and over HTTP (429, `Retry-After`, the bound in the JSON),
//! and so is a backfill; `ax_triggers_refused_total` counts each by app and bound; the store
//! holds exactly the runs that were accepted; a cron workflow of the full app keeps firing, each
//! fire with an `admitted_over_bound` decision that `axctl why` shows. Then a worker joins:
//! every accepted run ends SUCCESS, and `axctl trigger`, which kept trying while refused (and
//! said so on stderr), gets its run once the queue drains. A scoped caller meeting the total
//! bound is in `security/scopes.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use ax_core::admission::Bounds;
use ax_integration_tests::harness::Test;
use ax_integration_tests::{Backend, Cluster, TestClient, WorkerSpec, on_every_backend};
use ax_proto::v1 as pb;
use serde_json::Value;
use tonic::Code;

/// A hang guard, not a timing assertion.
const WITHIN: Duration = Duration::from_secs(60);

/// Longer than the node's reading interval (250 ms) twice over: the estimate is then the
/// store's count, with nothing admitted on top of it.
const SETTLE: Duration = Duration::from_millis(700);

const BOUNDS: Bounds = Bounds {
    total: Some(8),
    per_app: Some(5),
};

pub(crate) fn tests() -> Vec<Test> {
    let mut tests =
        on_every_backend!(triggers_past_a_bound_are_refused_with_a_hint_and_fires_go_on_explained);
    tests.extend(on_every_backend!(
        a_retried_key_past_the_bound_gets_its_run_and_a_new_key_is_refused
    ));
    tests
}

fn one_task(name: &str, app: &str) -> String {
    format!("name: {name}\napp: {app}\ntasks:\n  - name: t\n    command: \"true\"\n")
}

/// A refusal's `ax-overloaded-bin`, checked to be a refusal for load with `retry-after`.
fn overloaded(status: &tonic::Status) -> pb::Overloaded {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let overloaded = ax_proto::overloaded::of(status).expect("ax-overloaded-bin");
    let retry_after = status
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .expect("ascii");
    assert_eq!(
        retry_after,
        ax_proto::overloaded::retry_after_secs(&overloaded).to_string()
    );
    assert!(overloaded.retry_after_ms >= 1_000, "{overloaded:?}");
    overloaded
}

/// Triggers `workflow` `times` times, one after the other; the runs accepted and the refusals.
async fn trigger_times(
    client: &TestClient,
    workflow: &str,
    times: usize,
) -> (Vec<i64>, Vec<tonic::Status>) {
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for _ in 0..times {
        match client
            .control()
            .trigger_workflow(request(workflow, ""))
            .await
        {
            Ok(answer) => accepted.push(answer.into_inner().run.expect("a run").id),
            Err(status) => refused.push(status),
        }
    }
    (accepted, refused)
}

/// A trigger of `workflow` under the idempotency `key` (none when empty).
fn request(workflow: &str, key: &str) -> pb::TriggerWorkflowRequest {
    pb::TriggerWorkflowRequest {
        name: workflow.into(),
        actor: "admission-test".into(),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

/// A client whose keyed trigger was accepted but whose answer it lost retries with the same
/// key: past the bound it gets that run (created: false), since answering creates nothing,
/// while a trigger with a new key is refused.
async fn a_retried_key_past_the_bound_gets_its_run_and_a_new_key_is_refused(backend: Backend) {
    let cluster = Cluster::builder(backend)
        .max_waiting(BOUNDS)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    client
        .apply(&one_task("keyed", "etl"))
        .await
        .expect("apply");
    tokio::time::sleep(SETTLE).await;
    let first = client
        .control()
        .trigger_workflow(request("keyed", "order-1"))
        .await
        .expect("the first keyed trigger")
        .into_inner();
    assert!(first.created);
    let first_run = first.run.expect("a run").id;
    // Fill the app's bound (5) with runs of no key, then let the estimate settle on them.
    let (filled, _) = trigger_times(&client, "keyed", 8).await;
    assert!(filled.len() >= 3, "accepted {filled:?}");
    tokio::time::sleep(SETTLE).await;
    // A loaded machine's estimate may have refused early and, settled, have room again: fill
    // until a trigger is refused, so the bound is met when the new key comes.
    let (refilled, refusals) = trigger_times(&client, "keyed", 8).await;
    assert!(!refusals.is_empty(), "the bound was never met");
    let refused = client
        .control()
        .trigger_workflow(request("keyed", "order-2"))
        .await
        .expect_err("a new key past the bound");
    assert_eq!(overloaded(&refused).bound, "app");
    let again = client
        .control()
        .trigger_workflow(request("keyed", "order-1"))
        .await
        .expect("the retried key past the bound")
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.run.expect("its run").id, first_run);
    let stored = client.runs("keyed").await.expect("runs");
    assert_eq!(
        stored.len(),
        1 + filled.len() + refilled.len(),
        "{stored:?}"
    );
    cluster.shutdown().await.expect("shutdown");
}

/// The `value` of the metric line `name{labels}`, if the scrape has it.
fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

async fn triggers_past_a_bound_are_refused_with_a_hint_and_fires_go_on_explained(backend: Backend) {
    let mut cluster = Cluster::builder(backend)
        .max_waiting(BOUNDS)
        .start()
        .await
        .expect("cluster starts");
    let client = cluster.client().await.expect("client");
    client
        .apply(&one_task("burst", "etl"))
        .await
        .expect("apply");
    client.apply(&one_task("page", "web")).await.expect("apply");
    tokio::time::sleep(SETTLE).await;

    // App etl: a trigger is admitted while fewer than 5 of its instances wait. An estimate errs
    // high for one reading at most (an admission counted in a reading and on top of it), so
    // one fewer may go in; never more.
    let (burst, refused) = trigger_times(&client, "burst", 8).await;
    assert!((4..=5).contains(&burst.len()), "accepted {burst:?}");
    assert_eq!(refused.len(), 8 - burst.len());
    for status in &refused {
        let o = overloaded(status);
        assert_eq!(
            (o.bound.as_str(), o.app.as_str(), o.limit),
            ("app", "etl", 5)
        );
        assert!(status.message().contains("not triggered"), "{status:?}");
        assert!(status.message().contains("app \"etl\""), "{status:?}");
    }
    // Settled, the estimate is the store's count: exactly what was accepted.
    tokio::time::sleep(SETTLE).await;
    let (more, refused_settled) = trigger_times(&client, "burst", 1).await;
    let mut burst = burst;
    burst.extend(&more);
    let mut etl_refusals = refused.len() + refused_settled.len();
    if let Some(status) = refused_settled.first() {
        assert_eq!(overloaded(status).waiting, burst.len() as u64);
    }

    // Over HTTP: 429 with Retry-After and the bound in the body.
    tokio::time::sleep(SETTLE).await;
    let http = reqwest::Client::new();
    let answer = http
        .post(format!(
            "http://{}/api/v1/workflows/burst/trigger",
            cluster.addr
        ))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .expect("POST trigger");
    assert_eq!(answer.status().as_u16(), 429);
    let retry_after: u64 = answer
        .headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("whole seconds");
    assert!(retry_after >= 1);
    let body: Value = answer.json().await.expect("JSON body");
    assert_eq!(body["code"], "ResourceExhausted", "{body}");
    assert_eq!(body["overloaded"]["bound"], "app", "{body}");
    assert_eq!(body["overloaded"]["app"], "etl", "{body}");
    assert_eq!(body["overloaded"]["limit"], "5", "{body}");
    assert_eq!(
        body["overloaded"]["waiting"],
        burst.len().to_string(),
        "{body}"
    );
    etl_refusals += 1;

    // App web has room of its own, but the cluster's 8 is met first.
    let (page, refused) = trigger_times(&client, "page", 6).await;
    let waiting = burst.len() + page.len();
    assert!(
        (7..=8).contains(&waiting),
        "{} + {} waiting",
        burst.len(),
        page.len()
    );
    assert_eq!(refused.len(), 6 - page.len());
    for status in &refused {
        let o = overloaded(status);
        assert_eq!(
            (o.bound.as_str(), o.app.as_str(), o.limit),
            ("total", "web", 8)
        );
        assert!(o.waiting >= 7, "{o:?}");
    }
    let web_refusals = refused.len();

    // Nothing refused was created, nothing accepted was lost.
    for (workflow, accepted) in [("burst", &burst), ("page", &page)] {
        let stored: BTreeSet<i64> = client
            .runs(workflow)
            .await
            .expect("runs")
            .iter()
            .map(|run| run.id)
            .collect();
        assert_eq!(
            stored,
            accepted.iter().copied().collect::<BTreeSet<_>>(),
            "{workflow}"
        );
    }

    // A cron workflow of the full app fires every second all the same, each fire explained. A
    // backfill of it is a request, and refused whole.
    let tick = "name: tick\napp: etl\nschedule:\n  cron: \"* * * * * *\"\ntasks:\n  - name: t\n    command: \"true\"\n";
    client.apply(tick).await.expect("apply tick");
    let now = chrono::Utc::now().timestamp_millis();
    let backfill = client
        .control()
        .backfill_workflow(pb::BackfillWorkflowRequest {
            name: "tick".into(),
            from_ms: now - 600_000,
            to_ms: now - 598_000,
            actor: "admission-test".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(overloaded(&backfill).bound, "app");
    etl_refusals += 1;
    let deadline = tokio::time::Instant::now() + WITHIN;
    let fired = loop {
        let runs = client.runs("tick").await.expect("runs");
        if runs.len() >= 3 {
            break runs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tick fired {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        fired
            .iter()
            .all(|run| run.trigger == pb::TriggerKind::Cron as i32),
        "no backfill run: {fired:?}"
    );
    let explanation = client
        .control()
        .explain_workflow(pb::ExplainWorkflowRequest {
            name: "tick".into(),
            at_ms: 0,
        })
        .await
        .expect("ExplainWorkflow")
        .into_inner();
    let past: Vec<&pb::DecisionEntry> = explanation
        .decisions
        .iter()
        .filter(|d| d.kind == "admitted_over_bound")
        .collect();
    assert!(!past.is_empty(), "{:?}", explanation.decisions);
    let fired_ids: BTreeSet<i64> = fired.iter().map(|run| run.id).collect();
    for decision in &past {
        assert!(fired_ids.contains(&decision.run_id), "{decision:?}");
        assert!(
            decision.detail.contains("of app \"etl\" were waiting")
                && decision.detail.ends_with("a cron fire is never refused"),
            "{decision:?}"
        );
    }
    let why = cluster.axctl(&["why", "tick"]).expect("axctl why");
    let text = String::from_utf8_lossy(&why.stdout);
    assert!(text.contains("admitted_over_bound"), "{text}");
    assert!(
        text.contains("admitted past the bound on waiting instances"),
        "{text}"
    );

    // Every refusal counted, by app and bound.
    let scrape = reqwest::get(format!("http://{}/metrics", cluster.addr))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics");
    assert_eq!(
        metric(
            &scrape,
            "ax_triggers_refused_total{app=\"etl\",bound=\"app\"}"
        ),
        Some(etl_refusals as f64),
        "{scrape}"
    );
    assert_eq!(
        metric(
            &scrape,
            "ax_triggers_refused_total{app=\"web\",bound=\"total\"}"
        ),
        Some(web_refusals as f64),
        "{scrape}"
    );

    // axctl keeps trying while refused, says so, and gives up with exit 8.
    let out = cluster
        .axctl(&["trigger", "burst", "--retry-for", "2s"])
        .expect("axctl trigger");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains("trigger burst: refused for load ("),
        "{stderr}"
    );
    assert!(stderr.contains("trying again in "), "{stderr}");

    // A worker drains the queue: every accepted run ends SUCCESS, and a patient axctl gets in.
    cluster.add_worker(WorkerSpec {
        id: "w1".into(),
        capacity: 8,
        labels: Default::default(),
    });
    for id in burst.iter().chain(&page) {
        let run = client.wait_run_within(*id, WITHIN).await.expect("run ends");
        assert_eq!(run.state, pb::RunState::Success as i32, "{run:?}");
    }
    let out = cluster
        .axctl(&["trigger", "burst", "--retry-for", "60s"])
        .expect("axctl trigger");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("created"), "{stderr}");
    cluster.shutdown().await.expect("shutdown");
}
