//! Alerts against a real HTTP server on loopback that each test starts. The only time limits are
//! hang guards: a test that waits for something waits at most `GUARD`.

use std::collections::VecDeque;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;

const GUARD: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
struct Recorded {
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

impl Recorded {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }

    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    /// A query parameter, percent-decoded.
    fn query(&self, name: &str) -> Option<String> {
        let url = reqwest::Url::parse(&format!("http://test{}", self.uri)).ok()?;
        url.query_pairs()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    }
}

struct ServerState {
    requests: Mutex<Vec<Recorded>>,
    /// Answers to give, in order; then `200 OK` with a body every service reads as accepted.
    script: Mutex<VecDeque<(u16, String)>>,
    count: watch::Sender<usize>,
}

/// A loopback HTTP server that records every request.
struct TestServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    stop: CancellationToken,
}

const ACCEPTED_BODY: &str = r#"{"errcode":0,"errmsg":"ok","code":0,"msg":"success"}"#;

impl TestServer {
    async fn start(script: &[(u16, &str)]) -> TestServer {
        let state = Arc::new(ServerState {
            requests: Mutex::new(Vec::new()),
            script: Mutex::new(
                script
                    .iter()
                    .map(|(status, body)| (*status, body.to_string()))
                    .collect(),
            ),
            count: watch::channel(0).0,
        });
        let router = Router::new().fallback(record).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await
                .unwrap();
        });
        TestServer { addr, state, stop }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Waits until at least `n` requests arrived, and returns all of them.
    async fn wait_for(&self, n: usize) -> Vec<Recorded> {
        let mut count = self.state.count.subscribe();
        tokio::time::timeout(GUARD, count.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} requests did not arrive"))
            .unwrap();
        self.requests()
    }

    fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn record(
    State(state): State<Arc<ServerState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    state
        .requests
        .lock()
        .unwrap()
        .push(Recorded { uri, headers, body });
    state.count.send_modify(|count| *count += 1);
    let (status, body) = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((200, ACCEPTED_BODY.to_string()));
    (StatusCode::from_u16(status).unwrap(), body)
}

/// A server that accepts connections and never answers.
async fn hung_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

/// A test channel: short backoff so retries do not slow the suite.
fn channel(name: &str, format: ChannelFormat, url: String) -> ChannelConfig {
    let mut config = ChannelConfig::new(name, format, url);
    config.retry_backoff = Duration::from_millis(20);
    config
}

fn sample() -> Alert {
    Alert::new(
        AlertKind::InstanceFailed,
        "daily-sales-etl",
        "exit code 1",
        1_735_689_600_000,
    )
    .with_run(12)
    .with_instance(34, "clean", 3)
}

const SAMPLE_TEXT: &str =
    "[ax] FAILED daily-sales-etl / clean (run 12, instance 34, attempt 3): exit code 1";

/// Polls the counters until `done` holds.
async fn wait_stats(alerter: &Alerter, done: impl Fn(AlertStats) -> bool) -> AlertStats {
    tokio::time::timeout(GUARD, async {
        loop {
            let stats = alerter.stats();
            if done(stats) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("stats never got there: {:?}", alerter.stats()))
}

fn hmac_sha256_independent(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ---------------------------------------------------------------------------------------------
// Messages

#[test]
fn the_human_message_names_what_failed_where() {
    assert_eq!(sample().text(), SAMPLE_TEXT);
    assert_eq!(sample().title(), "[ax] FAILED daily-sales-etl / clean");
    let run = Alert::new(AlertKind::RunFailed, "daily-sales-etl", "2 tasks failed", 0).with_run(12);
    assert_eq!(
        run.text(),
        "[ax] RUN FAILED daily-sales-etl (run 12): 2 tasks failed"
    );
    let late = Alert::new(
        AlertKind::DeadlineMissed,
        "daily-sales-etl",
        "deadline 06:30 (2026-01-02 06:30:00 CST) passed before the run ended; the run goes on",
        0,
    )
    .with_run(12);
    assert_eq!(
        late.text(),
        "[ax] DEADLINE MISSED daily-sales-etl (run 12): deadline 06:30 (2026-01-02 06:30:00 CST) \
         passed before the run ended; the run goes on"
    );
    let lost =
        Alert::new(AlertKind::WorkerLost, "", "no heartbeat for 20 s", 0).with_worker("worker-7");
    assert_eq!(
        lost.text(),
        "[ax] WORKER LOST worker-7: no heartbeat for 20 s"
    );
    let timeout = sample().with_worker("worker-7");
    let timeout = Alert {
        kind: AlertKind::InstanceTimeout,
        message: "ran longer than 10m".into(),
        ..timeout
    };
    assert_eq!(
        timeout.text(),
        "[ax] TIMEOUT daily-sales-etl / clean (run 12, instance 34, attempt 3, worker worker-7): \
         ran longer than 10m"
    );
    let exhausted = Alert {
        kind: AlertKind::RetriesExhausted,
        message: "x".repeat(5000),
        ..sample()
    };
    let text = exhausted.text();
    assert!(text.starts_with("[ax] RETRIES EXHAUSTED daily-sales-etl / clean"));
    assert!(text.ends_with('…'), "a long message is cut");
    assert!(text.chars().count() < 1200);
}

#[test]
fn kinds_and_formats_parse_from_their_configured_names() {
    for kind in AlertKind::ALL {
        assert_eq!(AlertKind::parse(kind.as_str()), Some(kind));
        assert_eq!(
            AlertKind::parse(&kind.as_str().replace('_', "-").to_uppercase()),
            Some(kind)
        );
        assert_eq!(
            serde_json::to_value(kind).unwrap(),
            Value::String(kind.as_str().into())
        );
    }
    assert_eq!(AlertKind::parse("explosion"), None);
    assert_eq!(ChannelFormat::parse("Lark"), Some(ChannelFormat::Feishu));
    assert_eq!(
        ChannelFormat::parse("ding_talk"),
        Some(ChannelFormat::DingTalk)
    );
    assert_eq!(ChannelFormat::parse("WeCom"), Some(ChannelFormat::WeCom));
    assert_eq!(ChannelFormat::parse("teams"), None);
}

// ---------------------------------------------------------------------------------------------
// Formats, on the wire

#[tokio::test]
async fn webhook_body_is_schema_v1_and_signed_with_the_secret() {
    let server = TestServer::start(&[]).await;
    let mut config = channel("hook", ChannelFormat::Webhook, server.url("/ax/alerts"));
    config.secret = Some("s3cret".into());
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample().with_worker("worker-7"));
    let request = server.wait_for(1).await.remove(0);

    assert_eq!(request.uri.path(), "/ax/alerts");
    assert_eq!(
        request.header("content-type"),
        "application/json; charset=utf-8"
    );
    assert!(request.header("user-agent").starts_with("ax-scheduler/"));
    let body = request.json();
    let expected = serde_json::json!({
        "version": 1,
        "kind": "instance_failed",
        "workflow": "daily-sales-etl",
        "run_id": 12,
        "instance_id": 34,
        "task": "clean",
        "attempt": 3,
        "worker": "worker-7",
        "message": "exit code 1",
        "at_ms": 1_735_689_600_000_i64,
        "suppressed": null,
        "text": "[ax] FAILED daily-sales-etl / clean (run 12, instance 34, attempt 3, worker worker-7): exit code 1",
    });
    assert_eq!(body, expected);
    let mac = hmac_sha256_independent(b"s3cret", &request.body);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(request.header("x-ax-signature"), format!("sha256={hex}"));

    let stats = wait_stats(&alerter, |s| s.sent == 1).await;
    assert_eq!(
        stats,
        AlertStats {
            sent: 1,
            ..AlertStats::default()
        }
    );
}

#[tokio::test]
async fn dingtalk_markdown_with_timestamp_and_sign_in_the_url() {
    let server = TestServer::start(&[]).await;
    let secret = "SECabc123+/=xyz";
    let mut config = channel(
        "ding",
        ChannelFormat::DingTalk,
        server.url("/robot/send?access_token=tok"),
    );
    config.secret = Some(secret.into());
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let request = server.wait_for(1).await.remove(0);

    assert_eq!(request.uri.path(), "/robot/send");
    assert_eq!(request.query("access_token").as_deref(), Some("tok"));
    assert_eq!(
        request.json(),
        serde_json::json!({
            "msgtype": "markdown",
            "markdown": {
                "title": "[ax] FAILED daily-sales-etl / clean",
                "text": SAMPLE_TEXT,
            },
        })
    );
    let timestamp = request.query("timestamp").expect("timestamp param");
    let timestamp_ms: i64 = timestamp.parse().unwrap();
    assert!(
        (timestamp_ms - delivery::now_ms()).abs() < 3_600_000,
        "DingTalk wants milliseconds, close to now: {timestamp}"
    );
    let sign = request.query("sign").expect("sign param");
    let expected = base64(&hmac_sha256_independent(
        secret.as_bytes(),
        format!("{timestamp}\n{secret}").as_bytes(),
    ));
    assert_eq!(sign, expected);
    // The raw query carries the base64 percent-encoded, so `+` is not read as a space.
    let raw_query = request.uri.query().unwrap();
    let raw_sign = raw_query
        .split('&')
        .find_map(|pair| pair.strip_prefix("sign="))
        .unwrap();
    assert!(!raw_sign.contains(['+', '/', '=']), "{raw_sign}");
    wait_stats(&alerter, |s| s.sent == 1).await;
}

#[tokio::test]
async fn feishu_text_with_timestamp_and_sign_in_the_body() {
    let server = TestServer::start(&[]).await;
    let secret = "feishu-secret";
    let mut config = channel(
        "lark",
        ChannelFormat::Feishu,
        server.url("/open-apis/bot/v2/hook/x"),
    );
    config.secret = Some(secret.into());
    // An unsigned one too: no timestamp or sign fields then.
    let unsigned = channel("lark-plain", ChannelFormat::Feishu, server.url("/plain"));
    let alerter = Alerter::new(vec![config, unsigned]).unwrap();
    alerter.notify(sample());
    let requests = server.wait_for(2).await;
    let signed = requests
        .iter()
        .find(|r| r.uri.path() == "/open-apis/bot/v2/hook/x")
        .unwrap();
    let body = signed.json();
    assert_eq!(body["msg_type"], "text");
    assert_eq!(body["content"], serde_json::json!({ "text": SAMPLE_TEXT }));
    let timestamp = body["timestamp"].as_str().expect("timestamp is a string");
    let timestamp_s: i64 = timestamp.parse().unwrap();
    assert!(
        (timestamp_s - delivery::now_ms() / 1000).abs() < 3600,
        "Feishu wants seconds, close to now: {timestamp}"
    );
    let expected = base64(&hmac_sha256_independent(
        format!("{timestamp}\n{secret}").as_bytes(),
        b"",
    ));
    assert_eq!(body["sign"], Value::String(expected));

    let plain = requests.iter().find(|r| r.uri.path() == "/plain").unwrap();
    assert_eq!(
        plain.json(),
        serde_json::json!({ "msg_type": "text", "content": { "text": SAMPLE_TEXT } })
    );
    wait_stats(&alerter, |s| s.sent == 2).await;
}

#[tokio::test]
async fn wecom_markdown_body() {
    let server = TestServer::start(&[]).await;
    let config = channel(
        "wecom",
        ChannelFormat::WeCom,
        server.url("/cgi-bin/webhook/send?key=k"),
    );
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let request = server.wait_for(1).await.remove(0);
    assert_eq!(request.query("key").as_deref(), Some("k"));
    assert_eq!(
        request.json(),
        serde_json::json!({ "msgtype": "markdown", "markdown": { "content": SAMPLE_TEXT } })
    );
    assert_eq!(
        request.header("content-type"),
        "application/json; charset=utf-8"
    );
    wait_stats(&alerter, |s| s.sent == 1).await;
}

#[tokio::test]
async fn slack_text_escapes_its_control_characters() {
    let server = TestServer::start(&[(200, "ok")]).await;
    let config = channel("slack", ChannelFormat::Slack, server.url("/services/T/B/X"));
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(Alert {
        message: "a < b && c > d".into(),
        ..sample()
    });
    let request = server.wait_for(1).await.remove(0);
    assert_eq!(
        request.json(),
        serde_json::json!({
            "text": "[ax] FAILED daily-sales-etl / clean (run 12, instance 34, attempt 3): \
                     a &lt; b &amp;&amp; c &gt; d"
        })
    );
    wait_stats(&alerter, |s| s.sent == 1).await;
}

// ---------------------------------------------------------------------------------------------
// Delivery: retries, refusals, rate limit, hangs

#[tokio::test]
async fn retries_after_500_and_429_then_delivers() {
    let server = TestServer::start(&[(500, "boom"), (429, "slow down")]).await;
    let config = channel("hook", ChannelFormat::Webhook, server.url("/"));
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.sent + s.failed > 0).await;
    assert_eq!(stats.sent, 1);
    assert_eq!(stats.failed, 0);
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    // Every try carries the same alert.
    assert!(requests.iter().all(|r| r.json()["text"] == SAMPLE_TEXT));
}

#[tokio::test]
async fn no_retry_after_400() {
    let server = TestServer::start(&[(400, "invalid payload")]).await;
    let config = channel("hook", ChannelFormat::Webhook, server.url("/"));
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.sent + s.failed > 0).await;
    assert_eq!((stats.sent, stats.failed), (0, 1));
    // The failure is counted after the answer, so no retry can still be on its way.
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn gives_up_after_the_configured_retries() {
    let server = TestServer::start(&[(502, ""), (502, ""), (502, ""), (502, "")]).await;
    let mut config = channel("hook", ChannelFormat::Webhook, server.url("/"));
    config.retries = 2;
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.sent + s.failed > 0).await;
    assert_eq!((stats.sent, stats.failed), (0, 1));
    assert_eq!(server.requests().len(), 3, "one try and two retries");
}

#[tokio::test]
async fn a_refusal_in_a_200_body_is_a_failure_and_not_retried() {
    let server =
        TestServer::start(&[(200, r#"{"errcode":310000,"errmsg":"sign not match"}"#)]).await;
    let mut config = channel("ding", ChannelFormat::DingTalk, server.url("/robot/send"));
    config.secret = Some("wrong".into());
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.sent + s.failed > 0).await;
    assert_eq!((stats.sent, stats.failed), (0, 1));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn dingtalk_sent_too_fast_is_retried() {
    let server =
        TestServer::start(&[(200, r#"{"errcode":130101,"errmsg":"send too fast"}"#)]).await;
    let config = channel("ding", ChannelFormat::DingTalk, server.url("/robot/send"));
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.sent + s.failed > 0).await;
    assert_eq!((stats.sent, stats.failed), (1, 0));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn rate_limit_drops_and_counts_then_sends_one_summary() {
    let server = TestServer::start(&[]).await;
    let mut config = channel("hook", ChannelFormat::Webhook, server.url("/"));
    // Two at once, then one every three seconds: the three alerts after the burst are dropped
    // (the deliveries on loopback take milliseconds), and the first free token carries the
    // summary.
    config.rate_limit = RateLimit {
        max: 2,
        per: Duration::from_secs(6),
    };
    let alerter = Alerter::new(vec![config]).unwrap();
    for attempt in 1..=5 {
        alerter.notify(Alert {
            attempt: Some(attempt),
            ..sample()
        });
    }
    let requests = server.wait_for(3).await;
    let bodies: Vec<Value> = requests.iter().map(Recorded::json).collect();
    assert_eq!(bodies[0]["attempt"], 1);
    assert_eq!(bodies[1]["attempt"], 2);
    assert_eq!(bodies[2]["kind"], "alerts_suppressed");
    assert_eq!(bodies[2]["suppressed"], 3);
    assert_eq!(
        bodies[2]["text"],
        "[ax] 3 alerts suppressed by this channel's rate limit; see the scheduler for details"
    );
    let stats = wait_stats(&alerter, |s| s.sent == 3).await;
    assert_eq!(stats.dropped_rate_limited, 3);

    // Nothing else was suppressed, so shutting down sends nothing more.
    let stats = alerter.shutdown(GUARD).await;
    assert_eq!(stats.sent, 3);
    assert_eq!(server.requests().len(), 3, "exactly one summary");
}

#[tokio::test]
async fn a_hung_server_never_blocks_notify_and_delivery_gives_up() {
    let (addr, hung) = hung_server().await;
    let mut config = channel("hung", ChannelFormat::Webhook, format!("http://{addr}/"));
    config.timeout = Duration::from_millis(300);
    config.retries = 1;
    let alerter = Alerter::new(vec![config]).unwrap();

    // notify is synchronous; run it off the runtime so a blocking call would trip the guard
    // instead of stalling the test forever.
    let notifier = alerter.clone();
    tokio::time::timeout(
        GUARD,
        tokio::task::spawn_blocking(move || {
            for _ in 0..300 {
                notifier.notify(sample());
            }
        }),
    )
    .await
    .expect("notify blocked")
    .unwrap();
    let stats = alerter.stats();
    assert!(
        stats.dropped_queue_full >= 300 - QUEUE_CAPACITY as u64 - 1,
        "the bounded queue overflowed into drops: {stats:?}"
    );

    // The first alert's delivery gives up after its timeout and one retry.
    let stats = wait_stats(&alerter, |s| s.failed >= 1).await;
    assert_eq!(stats.sent, 0);

    // Shutting down with a short grace gives up on the rest; every alert is accounted for.
    let stats = tokio::time::timeout(GUARD, alerter.shutdown(Duration::from_millis(200)))
        .await
        .expect("shutdown is bounded");
    assert_eq!(stats.sent, 0);
    assert_eq!(
        stats.failed + stats.dropped_queue_full + stats.dropped_rate_limited,
        300,
        "{stats:?}"
    );
    hung.abort();
}

/// Collects what the tracing subscriber writes.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_unreachable_url_is_logged_and_counted() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    // The test runtime has one thread, so the delivery task logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut config = channel(
        "down",
        ChannelFormat::WeCom,
        format!("http://127.0.0.1:{port}/cgi-bin/webhook/send?key=TOKEN-123"),
    );
    config.retries = 2;
    let alerter = Alerter::new(vec![config]).unwrap();
    alerter.notify(sample());
    let stats = wait_stats(&alerter, |s| s.failed == 1).await;
    assert_eq!(stats.sent, 0);
    assert_eq!(alerter.channel_stats(), vec![("down".to_string(), stats)]);

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("alert not delivered"), "{text}");
    assert!(text.contains("channel=down"), "{text}");
    assert!(text.contains("attempts=3"), "{text}");
    assert!(
        !text.contains("TOKEN-123"),
        "the url's token is never logged: {text}"
    );
}

#[tokio::test]
async fn channels_take_only_their_kinds() {
    let server = TestServer::start(&[]).await;
    let all = channel("all", ChannelFormat::Webhook, server.url("/all"));
    let mut runs = channel("runs", ChannelFormat::Webhook, server.url("/runs"));
    runs.kinds = vec![AlertKind::RunFailed];
    let alerter = Alerter::new(vec![all, runs]).unwrap();
    alerter.notify(sample());
    alerter.notify(Alert::new(AlertKind::RunFailed, "daily-sales-etl", "failed", 0).with_run(12));
    let stats = alerter.shutdown(GUARD).await;
    assert_eq!(stats.sent, 3);
    let requests = server.requests();
    let to = |path: &str| -> Vec<Value> {
        requests
            .iter()
            .filter(|r| r.uri.path() == path)
            .map(|r| r.json()["kind"].clone())
            .collect()
    };
    assert_eq!(to("/all").len(), 2);
    assert_eq!(to("/runs"), vec![Value::String("run_failed".into())]);
}

#[tokio::test]
async fn shutdown_flushes_queued_alerts_then_refuses_new_ones() {
    let server = TestServer::start(&[]).await;
    let config = channel("hook", ChannelFormat::Webhook, server.url("/"));
    let alerter = Alerter::new(vec![config]).unwrap();
    let late = alerter.clone();
    for _ in 0..3 {
        alerter.notify(sample());
    }
    let stats = alerter.shutdown(GUARD).await;
    assert_eq!(stats.sent, 3);
    assert_eq!(server.requests().len(), 3);
    late.notify(sample());
    assert_eq!(late.stats().dropped_queue_full, 1);
}

#[tokio::test]
async fn a_disabled_alerter_does_nothing() {
    let alerter = Alerter::new(Vec::new()).unwrap();
    assert!(!alerter.is_enabled());
    alerter.notify(sample());
    assert_eq!(alerter.stats(), AlertStats::default());
    assert_eq!(
        Alerter::disabled().shutdown(GUARD).await,
        AlertStats::default()
    );
}

// ---------------------------------------------------------------------------------------------
// Configuration

#[test]
fn channels_parse_from_toml_with_defaults() {
    let config = AlertsConfig::from_toml_str(
        r#"
        store = "sqlite://.ax/ax.db"

        [[alerts.channels]]
        name = "oncall"
        format = "dingtalk"
        url = "https://oapi.dingtalk.com/robot/send?access_token=abc"
        secret = "SEC1"
        kinds = ["run_failed", "retries-exhausted"]
        max_per_minute = 10
        timeout = "2s"
        retries = 1
        retry_backoff = "250ms"

        [[alerts.channels]]
        name = "team"
        format = "Lark"
        url = "https://open.feishu.cn/open-apis/bot/v2/hook/x"
        max-per-minute = 5
        retry-backoff = "1s"

        [[alerts.channels]]
        name = "slack"
        format = "slack"
        url = "https://hooks.slack.com/services/T/B/X"
        "#,
    )
    .unwrap();
    let [oncall, team, slack] = config.channels.as_slice() else {
        panic!("three channels: {config:?}");
    };
    assert_eq!(oncall.name, "oncall");
    assert_eq!(oncall.format, ChannelFormat::DingTalk);
    assert_eq!(
        oncall.kinds,
        vec![AlertKind::RunFailed, AlertKind::RetriesExhausted]
    );
    assert_eq!(oncall.secret.as_deref(), Some("SEC1"));
    assert_eq!(oncall.rate_limit, RateLimit::per_minute(10));
    assert_eq!(oncall.timeout, Duration::from_secs(2));
    assert_eq!(oncall.retries, 1);
    assert_eq!(oncall.retry_backoff, Duration::from_millis(250));
    assert_eq!(team.format, ChannelFormat::Feishu);
    assert_eq!(team.rate_limit, RateLimit::per_minute(5));
    assert_eq!(team.retry_backoff, Duration::from_secs(1));
    let defaults = ChannelConfig::new("slack", ChannelFormat::Slack, slack.url.clone());
    assert_eq!(*slack, defaults);
    assert_eq!(slack.rate_limit, RateLimit::per_minute(20));
    assert_eq!(slack.timeout, Duration::from_secs(5));
    assert!(slack.kinds.is_empty());

    // Debug output never shows the url's token or the secret.
    let debug = format!("{oncall:?}");
    assert!(
        !debug.contains("access_token=abc") && !debug.contains("SEC1"),
        "{debug}"
    );

    assert!(
        AlertsConfig::from_toml_str("store = \"x\"")
            .unwrap()
            .channels
            .is_empty()
    );
}

#[test]
fn config_errors_name_the_channel_and_the_field() {
    let channel = |extra: &str| {
        format!(
            "[[alerts.channels]]\nname = \"ops\"\nformat = \"webhook\"\nurl = \"https://x.test/\"\n{extra}"
        )
    };
    let cases = [
        (
            "[[alerts.channels]]\nname = \"ops\"\nformat = \"webhook\"\nurl = \"ftp://x.test/\"\n"
                .to_string(),
            "alert channel \"ops\": url: scheme \"ftp\" is not http or https",
        ),
        (
            "[[alerts.channels]]\nname = \"ops\"\nformat = \"webhook\"\nurl = \"not a url\"\n"
                .to_string(),
            "alert channel \"ops\": url: not a valid url",
        ),
        (
            "[[alerts.channels]]\nname = \"ops\"\nformat = \"teams\"\nurl = \"https://x.test/\"\n"
                .to_string(),
            "alert channel \"ops\": format: unknown format \"teams\"",
        ),
        (
            channel("kinds = [\"run_failed\", \"explosion\"]"),
            "alert channel \"ops\": kinds: unknown kind \"explosion\" (expected one of run_failed,",
        ),
        (
            channel("timeout = \"5 parsecs\""),
            "alert channel \"ops\": timeout: invalid duration \"5 parsecs\"",
        ),
        (
            channel("retry_backoff = \"soon\""),
            "alert channel \"ops\": retry_backoff: invalid duration",
        ),
        (
            channel("timeout = \"0s\""),
            "alert channel \"ops\": timeout: must be longer than zero",
        ),
        (
            channel("max_per_minute = 0"),
            "alert channel \"ops\": max_per_minute: must allow at least one alert",
        ),
        (
            channel("retries = 50"),
            "alert channel \"ops\": retries: at most 10",
        ),
        (
            "[[alerts.channels]]\nname = \"ops\"\nformat = \"slack\"\nurl = \"https://x.test/\"\nsecret = \"s\"\n"
                .to_string(),
            "alert channel \"ops\": secret: slack webhooks are not signed",
        ),
        (channel("urls = \"x\""), "unknown field `urls`"),
        (
            format!("{}\n{}", channel(""), channel("")),
            "alert channel \"ops\" is configured twice",
        ),
    ];
    for (text, expected) in cases {
        let err = AlertsConfig::from_toml_str(&text).expect_err(&text);
        assert!(
            err.to_string().contains(expected),
            "for\n{text}\nexpected {expected:?} in:\n{err}"
        );
    }
}

#[test]
fn alerter_new_validates_channels_built_in_code() {
    let mut bad = ChannelConfig::new("ops", ChannelFormat::Webhook, "file:///etc/passwd");
    assert_eq!(
        Alerter::new(vec![bad.clone()]).unwrap_err(),
        AlertConfigError::Invalid {
            channel: "ops".into(),
            field: "url",
            message: "scheme \"file\" is not http or https".into(),
        }
    );
    bad.url = "http://127.0.0.1:1/".into();
    bad.secret = Some(String::new());
    assert!(matches!(
        Alerter::new(vec![bad]),
        Err(AlertConfigError::Invalid {
            field: "secret",
            ..
        })
    ));
    // A valid channel outside a runtime cannot start its delivery task.
    let good = ChannelConfig::new("ops", ChannelFormat::Webhook, "http://127.0.0.1:1/");
    assert_eq!(
        Alerter::new(vec![good]).unwrap_err(),
        AlertConfigError::NoRuntime
    );
}
