//! The gRPC codec of every ax.v1 service: prost's encoding, with one difference in decoding.
//! A message that does not decode (a string field that is not UTF-8, a truncated field) is the
//! sender's mistake, so it answers `INVALID_ARGUMENT` with prost's account of what is wrong and
//! where (`Register.hostname: invalid string value: data is not UTF-8 encoded`), not the
//! `INTERNAL` of tonic-prost's codec, which reads as the node's own failure. (A client decoding
//! a bad answer gets the same code.)

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// Encodes `T` and decodes `U` as [`tonic_prost::ProstCodec`] does, but for the status of a
/// message that does not decode.
#[derive(Debug, Clone)]
pub struct AxCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for AxCodec<T, U> {
    fn default() -> Self {
        AxCodec(PhantomData)
    }
}

impl<T, U> Codec for AxCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = AxDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        AxDecoder(PhantomData)
    }
}

/// Decodes `U`; a message that does not decode is `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct AxDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for AxDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|err| Status::invalid_argument(undecodable(&err)))
    }
}

/// prost's account of a message that does not decode, without its generic opening.
fn undecodable(err: &prost::DecodeError) -> String {
    let text = err.to_string();
    let detail = text
        .strip_prefix("failed to decode Protobuf message: ")
        .unwrap_or(&text);
    format!("the request does not decode: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::Register;

    #[test]
    fn a_string_that_is_not_utf8_names_its_field() {
        // Register.hostname (field 7, length-delimited) holding 0xff.
        let err = Register::decode(&[7 << 3 | 2, 1, 0xff][..]).unwrap_err();
        assert_eq!(
            undecodable(&err),
            "the request does not decode: Register.hostname: invalid string value: data is not \
             UTF-8 encoded"
        );
    }
}
