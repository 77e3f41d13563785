//! A run's deadline judged missed (`Store::miss_deadline`).

use ax_core::Millis;
use ax_core::ids::RunId;

use super::runs::{CancelledAttempt, RunRecord};

/// A deadline judged missed by this node.
#[derive(Debug, Clone, PartialEq)]
pub struct MissedDeadline {
    /// The run as it is after the judgement (CANCELLED when it was cancelled).
    pub run: RunRecord,
    /// With `cancel`: the attempts that were dispatched or running, whose workers must kill
    /// them.
    pub cancelled: Option<Vec<CancelledAttempt>>,
}

/// One run to judge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineMiss {
    pub run_id: RunId,
    /// Now on the store's clock.
    pub now: Millis,
    /// The judging node, in the decision log.
    pub node_id: String,
    /// The decision's detail (`ax_core::deadline::missed_text`).
    pub detail: String,
    /// `on_deadline: cancel`: the run is cancelled in the same transaction.
    pub cancel: bool,
}
