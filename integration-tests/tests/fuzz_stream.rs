//! The worker stream under random, truncated and hostile input: the scheduler answers with a
//! refusal or an error status (a report about another worker's attempt or one to come as not
//! the stream's own, its own ended attempt as not current), never panics, and keeps scheduling
//! real work afterwards.

use std::time::Duration;

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::{Backend, Cluster};
use ax_proto::v1 as pb;
use ax_proto::v1::worker_service_client::WorkerServiceClient;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(random_and_truncated_worker_frames_never_break_the_scheduler),
        trial!(async(multi_thread = 2) reports_on_unknown_or_stale_attempts_are_refused_with_a_code),
    ]
}

fn register(worker: &str) -> pb::WorkerMessage {
    pb::WorkerMessage {
        body: Some(pb::worker_message::Body::Register(pb::Register {
            protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
            worker_id: worker.into(),
            version: "fuzz".into(),
            capacity: 1,
            ..Default::default()
        })),
    }
}

/// Opens a stream as `worker`, sends `messages` after the Register frame, closes its side, and
/// returns what the scheduler sent back (or the status the stream ended with).
async fn converse(
    endpoint: &str,
    worker: &str,
    messages: Vec<pb::WorkerMessage>,
) -> (Vec<pb::SchedulerMessage>, Option<tonic::Status>) {
    let channel = Channel::from_shared(endpoint.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = WorkerServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(messages.len() + 2);
    tx.send(register(worker)).await.expect("queue");
    for message in messages {
        tx.send(message).await.expect("queue");
    }
    let response = client.connect(ReceiverStream::new(rx)).await;
    let mut inbound = match response {
        Ok(response) => response.into_inner(),
        Err(status) => return (Vec::new(), Some(status)),
    };
    let mut received = Vec::new();
    // The scheduler keeps the stream open while we do; collect answers for a moment, then hang up.
    let collect = async {
        loop {
            match inbound.message().await {
                Ok(Some(message)) => received.push(message),
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    };
    let ended = tokio::time::timeout(Duration::from_millis(300), collect)
        .await
        .unwrap_or(None);
    drop(tx);
    (received, ended)
}

fn refusals(messages: &[pb::SchedulerMessage]) -> Vec<pb::ReportRefused> {
    messages
        .iter()
        .filter_map(|message| match &message.body {
            Some(pb::scheduler_message::Body::Refused(refused)) => Some(refused.clone()),
            _ => None,
        })
        .collect()
}

/// Any worker frame, with ids near the real ones and far from them, and text of every kind.
fn worker_message(real_instance: i64) -> impl Strategy<Value = pb::WorkerMessage> {
    let instance = prop_oneof![
        Just(real_instance),
        Just(0i64),
        Just(-1i64),
        any::<i64>(),
        1i64..50
    ];
    let attempt = prop_oneof![Just(1u32), Just(0u32), any::<u32>()];
    let text = prop_oneof![
        ".{0,40}",
        Just("\u{0}\u{fffd}\n\r".to_string()),
        Just("x".repeat(70_000))
    ];
    (
        0u8..8,
        instance,
        attempt,
        text,
        any::<i32>(),
        any::<u64>(),
        any::<i64>(),
    )
        .prop_map(|(kind, instance_id, attempt, text, number, seq, at)| {
            use pb::worker_message::Body;
            let body = match kind {
                0 => Body::Accepted(pb::DispatchAccepted {
                    instance_id,
                    attempt,
                }),
                1 => Body::Rejected(pb::DispatchRejected {
                    instance_id,
                    attempt,
                    reason: text,
                    duplicate: number % 2 == 0,
                }),
                2 => Body::Started(pb::AttemptStarted {
                    instance_id,
                    attempt,
                    pid: number as u32,
                    started_at_ms: at,
                }),
                3 => Body::Logs(pb::LogBatch {
                    instance_id,
                    attempt,
                    first_seq: seq,
                    // Separate lines, packed lines, both, or neither; packed streams and text
                    // that may not match.
                    lines: if number % 3 == 0 {
                        Vec::new()
                    } else {
                        vec![pb::LogLine {
                            stream: number,
                            text: text.clone(),
                        }]
                    },
                    streams: if number % 2 == 0 {
                        number.to_le_bytes()[..number.unsigned_abs() as usize % 5].to_vec()
                    } else {
                        Vec::new()
                    },
                    body: if number % 2 == 0 { text } else { String::new() },
                    sent_at_ms: at,
                }),
                4 => Body::Heartbeat(pb::WorkerHeartbeat {
                    sent_at_ms: at,
                    running: number as u32,
                    capacity: 1,
                    draining: false,
                }),
                5 => Body::TaskHeartbeat(pb::TaskHeartbeat {
                    instance_id,
                    attempt,
                    sent_at_ms: at,
                }),
                6 => Body::Finished(pb::AttemptFinished {
                    instance_id,
                    attempt,
                    outcome: number,
                    exit_code: Some(number),
                    signal: None,
                    finished_at_ms: at,
                    log_lines: seq,
                    message: text,
                    outputs: Default::default(),
                }),
                _ => Body::Register(pb::Register {
                    worker_id: text,
                    ..Default::default()
                }),
            };
            pb::WorkerMessage { body: Some(body) }
        })
}

fn random_and_truncated_worker_frames_never_break_the_scheduler() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (cluster, client) = runtime.block_on(async {
        let cluster = Cluster::builder(Backend::Sqlite)
            .worker("real", 2)
            .start()
            .await
            .expect("cluster");
        let client = cluster.client().await.expect("client");
        client
            .apply("name: steady\ntasks:\n  - name: a\n    command: echo ok\n")
            .await
            .expect("apply");
        (cluster, client)
    });
    let endpoint = cluster.endpoint();
    let first_run = runtime.block_on(async {
        let run = client.trigger_run("steady").await.expect("trigger");
        client.wait_run(run.id).await.expect("run ends");
        run.id
    });
    let real_instance = runtime
        .block_on(client.instances(first_run))
        .expect("instances")[0]
        .id;

    // Decoding random and truncated bytes never panics; what decodes is sent as is.
    let valid = register("fuzz").encode_to_vec();
    let mut runner = TestRunner::new(Config::with_cases(64));
    let frames = prop::collection::vec(
        prop_oneof![
            worker_message(real_instance).prop_map(|m| m.encode_to_vec()),
            prop::collection::vec(any::<u8>(), 0..64),
            (0..valid.len()).prop_map(move |cut| valid[..cut].to_vec()),
        ],
        0..12,
    );
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&frames, |encoded| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let decoded: Vec<pb::WorkerMessage> = encoded
                .iter()
                .filter_map(|bytes| pb::WorkerMessage::decode(bytes.as_slice()).ok())
                .collect();
            let worker = format!("fuzz-{case}");
            let (answers, _status) = runtime.block_on(converse(&endpoint, &worker, decoded));
            // Whatever it sent, a fuzzing worker never gets work or a report accepted on the
            // real instance: it was dispatched to another worker.
            for answer in &answers {
                prop_assert!(!matches!(
                    answer.body,
                    Some(pb::scheduler_message::Body::Dispatch(_))
                ));
            }
            Ok(())
        })
        .expect("no case broke the scheduler");

    runtime.block_on(async {
        // The real instance is untouched by the storm: still SUCCESS with one attempt.
        let instance = client
            .instances(first_run)
            .await
            .expect("instances")
            .remove(0);
        assert_eq!(instance.state, pb::InstanceState::Success as i32);
        assert_eq!(instance.attempts.len(), 1);
        // And the scheduler still schedules.
        let run = client.trigger_run("steady").await.expect("trigger");
        let ended = client.wait_run(run.id).await.expect("run ends");
        assert_eq!(ended.state, pb::RunState::Success as i32);
        cluster.shutdown().await.expect("shutdown");
    });
}

async fn reports_on_unknown_or_stale_attempts_are_refused_with_a_code() {
    let mut cluster = Cluster::builder(Backend::Sqlite)
        .worker("real", 2)
        .start()
        .await
        .expect("cluster");
    let client = cluster.client().await.expect("client");
    client
        .apply("name: steady\ntasks:\n  - name: a\n    command: echo ok\n")
        .await
        .expect("apply");
    let run = client.trigger_run("steady").await.expect("trigger");
    client.wait_run(run.id).await.expect("run ends");
    let instance = client.instances(run.id).await.expect("instances").remove(0);

    let started = |instance_id, attempt| pb::WorkerMessage {
        body: Some(pb::worker_message::Body::Started(pb::AttemptStarted {
            instance_id,
            attempt,
            pid: 1,
            started_at_ms: 1,
        })),
    };
    // Reports about attempts never dispatched to the stream's worker (an unknown instance, an
    // attempt number to come) are another worker's business: refused as not its own.
    let (answers, status) = converse(
        &cluster.endpoint(),
        "intruder",
        vec![started(987_654, 1), started(instance.id, 7)],
    )
    .await;
    assert!(status.is_none(), "the stream stays up: {status:?}");
    let refused = refusals(&answers);
    assert_eq!(refused.len(), 2, "{answers:?}");
    for (refusal, id) in refused.iter().zip([987_654, instance.id]) {
        assert_eq!(
            (refusal.instance_id, refusal.code),
            (id, tonic::Code::PermissionDenied as i32)
        );
        assert!(refusal.kill);
        assert!(
            refusal.reason.contains("not dispatched to worker intruder"),
            "{}",
            refusal.reason
        );
    }
    // The worker's own attempt, reported again once it is over, is not current.
    cluster.stop_worker("real").await.expect("stop real");
    let (answers, status) =
        converse(&cluster.endpoint(), "real", vec![started(instance.id, 1)]).await;
    assert!(status.is_none(), "the stream stays up: {status:?}");
    let refused = refusals(&answers);
    assert_eq!(refused.len(), 1, "{answers:?}");
    assert_eq!(
        (refused[0].instance_id, refused[0].code),
        (instance.id, tonic::Code::FailedPrecondition as i32)
    );
    assert!(
        refused[0].reason.contains("not current"),
        "{}",
        refused[0].reason
    );

    // A stream that does not open with Register is refused with a status naming the problem.
    let channel = Channel::from_shared(cluster.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = WorkerServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(2);
    tx.send(started(1, 1)).await.expect("queue");
    let status = client
        .connect(ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("Register"),
        "{}",
        status.message()
    );
    cluster.shutdown().await.expect("shutdown");
}
