//! A refusal for load (`ax.v1.Overloaded`) as it travels in a gRPC status: RESOURCE_EXHAUSTED,
//! with the hint in the metadata (trailers), where clients in any language read it without the
//! status-details machinery: `retry-after` in whole seconds, as HTTP's header, and
//! `ax-overloaded-bin`, the encoded message with the bound and the hint to the millisecond.

use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::v1::Overloaded;

/// Whole seconds to wait, as HTTP's `Retry-After`.
pub const RETRY_AFTER: &str = "retry-after";
/// The encoded [`Overloaded`].
pub const OVERLOADED: &str = "ax-overloaded-bin";

/// The status of a refusal for load: RESOURCE_EXHAUSTED with `message` and the hint.
pub fn status(message: impl Into<String>, overloaded: &Overloaded) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(RETRY_AFTER, retry_after_secs(overloaded).into());
    metadata.insert_bin(
        OVERLOADED,
        MetadataValue::from_bytes(&overloaded.encode_to_vec()),
    );
    Status::with_metadata(Code::ResourceExhausted, message, metadata)
}

/// The refusal for load `status` carries, if it is one.
pub fn of(status: &Status) -> Option<Overloaded> {
    if status.code() != Code::ResourceExhausted {
        return None;
    }
    let bytes = status.metadata().get_bin(OVERLOADED)?.to_bytes().ok()?;
    Overloaded::decode(bytes).ok()
}

/// The hint in whole seconds, rounded up (a `Retry-After` of 0 would say "now").
pub fn retry_after_secs(overloaded: &Overloaded) -> u64 {
    overloaded.retry_after_ms.div_ceil(1_000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_round_trips_through_a_status_and_others_are_not_one() {
        let sent = Overloaded {
            bound: "app".into(),
            app: "etl".into(),
            waiting: 12,
            limit: 10,
            retry_after_ms: 1_200,
        };
        let refused = status("full", &sent);
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert_eq!(refused.metadata().get(RETRY_AFTER).unwrap(), "2");
        assert_eq!(of(&refused), Some(sent));
        assert_eq!(of(&Status::resource_exhausted("too many failures")), None);
        assert_eq!(of(&Status::not_found("x")), None);
    }
}
