//! A node's answer when it cannot reach its store (it serves no worker and no call until the
//! store answers): UNAVAILABLE, with `ax-cut-off` in the metadata (trailers) naming the node, so
//! a worker tells it from a node that failed and goes to the next node at once.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// The node that is cut off, in the status's metadata.
pub const CUT_OFF: &str = "ax-cut-off";

/// The status a node cut off from its store answers with.
pub fn status(node_id: &str) -> Status {
    let mut metadata = MetadataMap::new();
    if let Ok(value) = MetadataValue::try_from(node_id) {
        metadata.insert(CUT_OFF, value);
    }
    Status::with_metadata(
        Code::Unavailable,
        format!("scheduler node {node_id} cannot reach its store; connect to another node"),
        metadata,
    )
}

/// Whether `status` is a node's answer that it cannot reach its store.
pub fn is_cut_off(status: &Status) -> bool {
    status.code() == Code::Unavailable && status.metadata().contains_key(CUT_OFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_status_is_told_from_other_unavailable_ones() {
        let status = status("n2");
        assert!(is_cut_off(&status));
        assert!(status.message().contains("n2 cannot reach its store"));
        assert!(!is_cut_off(&Status::unavailable("connection reset")));
        // An id that is not a valid header value still gets the message, without the marker.
        assert!(!is_cut_off(&super::status("n\u{1}2")));
    }
}
