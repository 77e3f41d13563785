//! What the worker sends on its stream, and the codec that sends log batches as the bytes they
//! were encoded to when they were cut (`logs::LogFrame`) instead of encoding them again.

use ax_proto::v1::{SchedulerMessage, WorkerMessage};
use prost::Message;
use prost::bytes::{BufMut, Bytes};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{GrpcMethod, IntoStreamingRequest, Response, Status, Streaming};
use tonic_prost::ProstDecoder;

/// One message for the scheduler.
#[derive(Debug, Clone)]
pub enum Outgoing {
    Message(WorkerMessage),
    /// A `WorkerMessage` already encoded.
    Encoded(Bytes),
}

impl From<WorkerMessage> for Outgoing {
    fn from(message: WorkerMessage) -> Self {
        Outgoing::Message(message)
    }
}

/// `WorkerService.Connect` with [`Outgoing`] messages; the scheduler sees plain `WorkerMessage`s.
pub async fn connect(
    channel: Channel,
    outgoing: impl IntoStreamingRequest<Message = Outgoing>,
    bearer: &ax_proto::client::Bearer,
) -> Result<Response<Streaming<SchedulerMessage>>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|error| Status::unknown(format!("service was not ready: {error}")))?;
    let mut request = outgoing.into_streaming_request();
    bearer.apply(&mut request);
    request
        .extensions_mut()
        .insert(GrpcMethod::new("ax.v1.WorkerService", "Connect"));
    let path = PathAndQuery::from_static("/ax.v1.WorkerService/Connect");
    grpc.streaming(request, path, WorkerCodec).await
}

#[derive(Debug, Clone, Copy, Default)]
struct WorkerCodec;

impl Codec for WorkerCodec {
    type Encode = Outgoing;
    type Decode = SchedulerMessage;
    type Encoder = OutgoingEncoder;
    type Decoder = ProstDecoder<SchedulerMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        OutgoingEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct OutgoingEncoder;

impl Encoder for OutgoingEncoder {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, item: Outgoing, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {
            Outgoing::Message(message) => message
                .encode(buf)
                .map_err(|error| Status::internal(format!("encoding a message: {error}"))),
            Outgoing::Encoded(bytes) => {
                buf.put_slice(&bytes);
                Ok(())
            }
        }
    }
}
