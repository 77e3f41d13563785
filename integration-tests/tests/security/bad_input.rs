//! Bad input is the sender's fault, said plainly: a gRPC request whose string field is not
//! UTF-8, framed by hand and sent to `ControlService` and to `WorkerService.Connect` of a real
//! node, answers `INVALID_ARGUMENT` naming the field (not `INTERNAL`); the JSON API answers
//! such a body 400. And `ax-scheduler --config FILE` given a file that is not TOML says what is
//! wrong and where without quoting the file.

use ax_integration_tests::harness::{Test, trial};
use ax_integration_tests::{Backend, Cluster};
use ax_proto::v1 as pb;
use prost::Message;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread) a_request_that_is_not_utf8_is_an_invalid_argument_naming_the_field),
        trial!(async(multi_thread) a_config_file_that_is_not_toml_is_never_quoted),
    ]
}

/// Sends the bytes it is given as the message, and takes any answer as bytes: the request is
/// framed by gRPC, its content by hand.
#[derive(Debug, Clone, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// `message` encoded, with the bytes of `marker` (in one of its string fields) replaced by
/// bytes that are not UTF-8.
fn not_utf8<M: Message>(message: &M, marker: &str) -> Vec<u8> {
    let mut bytes = message.encode_to_vec();
    let at = bytes
        .windows(marker.len())
        .position(|window| window == marker.as_bytes())
        .expect("the marker is in the encoding");
    bytes[at..at + marker.len()].fill(0xff);
    bytes
}

async fn grpc(endpoint: &str) -> tonic::client::Grpc<Channel> {
    let channel = Channel::from_shared(endpoint.to_string())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    tonic::client::Grpc::new(channel)
}

async fn unary(endpoint: &str, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let mut grpc = grpc(endpoint).await;
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    match grpc.unary(tonic::Request::new(body), path, RawCodec).await {
        Ok(answer) => panic!("answered {:?}", answer.into_inner()),
        Err(status) => status,
    }
}

async fn a_request_that_is_not_utf8_is_an_invalid_argument_naming_the_field() {
    let cluster = Cluster::builder(Backend::Sqlite)
        .start()
        .await
        .expect("cluster");
    let endpoint = cluster.endpoint();

    let get = not_utf8(
        &pb::GetWorkflowRequest {
            name: "MARK".into(),
        },
        "MARK",
    );
    let status = unary(&endpoint, "/ax.v1.ControlService/GetWorkflow", get).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("GetWorkflowRequest.name")
            && status.message().contains("not UTF-8"),
        "{status:?}"
    );

    let trigger = not_utf8(
        &pb::TriggerWorkflowRequest {
            name: "etl".into(),
            params: [("region".to_string(), "MARK".to_string())].into(),
            ..Default::default()
        },
        "MARK",
    );
    let status = unary(&endpoint, "/ax.v1.ControlService/TriggerWorkflow", trigger).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("not UTF-8"), "{status:?}");

    // The worker stream: a Register whose hostname is not UTF-8.
    let register = not_utf8(
        &pb::WorkerMessage {
            body: Some(pb::worker_message::Body::Register(pb::Register {
                protocol: pb::ProtocolVersion::ProtocolVersion1 as i32,
                worker_id: "w-bad".into(),
                capacity: 1,
                hostname: "MARK".into(),
                ..Default::default()
            })),
        },
        "MARK",
    );
    let mut grpc = grpc(&endpoint).await;
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/ax.v1.WorkerService/Connect");
    let frames = tokio_stream::iter(vec![register]);
    let answer = grpc
        .streaming(tonic::Request::new(frames), path, RawCodec)
        .await;
    let status = match answer {
        Err(status) => status,
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("the stream is refused"),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("Register.hostname") && status.message().contains("not UTF-8"),
        "{status:?}"
    );

    // The JSON API: a body that is not UTF-8 is the caller's mistake too.
    let http = reqwest::Client::new();
    let mut body = br#"{"params": {"region": "MARK"}}"#.to_vec();
    let at = body.windows(4).position(|w| w == b"MARK").expect("marker");
    body[at..at + 4].fill(0xff);
    let url = format!("{endpoint}/api/v1/workflows/etl/trigger");
    let answer = http
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the JSON API answers");
    assert_eq!(answer.status(), reqwest::StatusCode::BAD_REQUEST);
    let answer = http
        .get(format!("{endpoint}/api/v1/workflows/%FF%FE"))
        .send()
        .await
        .expect("the JSON API answers");
    assert!(
        answer.status().is_client_error(),
        "a name that is not UTF-8: {}",
        answer.status()
    );
    cluster.shutdown().await.expect("shutdown");
}

/// `ax-scheduler --config FILE` given a file that is not TOML, whose first line looks like a
/// secret: the error names the file, the line and column and what was expected, and quotes
/// nothing of the file.
async fn a_config_file_that_is_not_toml_is_never_quoted() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("aws-credentials");
    let secret = "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nregion=x\n";
    std::fs::write(&path, secret).expect("write");
    let binary = ax_integration_tests::binary("ax-scheduler").expect("ax-scheduler is built");
    let run = tokio::process::Command::new(binary)
        .arg("--config")
        .arg(&path)
        .env_remove("AX_STORE")
        .env("RUST_LOG", "off")
        .current_dir(dir.path())
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the scheduler exits")
        .expect("the scheduler runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stderr}");
    let want = format!(
        "config file {}: line 1, column 22: key with no value, expected `=`",
        path.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    let said = format!("{stdout}{stderr}").replace(&path.display().to_string(), "PATH");
    let chars: Vec<char> = secret.chars().filter(|c| !c.is_whitespace()).collect();
    for piece in chars.windows(4) {
        let piece: String = piece.iter().collect();
        assert!(!said.contains(&piece), "{said:?} quotes {piece:?}");
    }
}
