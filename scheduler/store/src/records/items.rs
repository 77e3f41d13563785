//! A mapped task's items read as a group (`for_each`): what `sql/items.rs` answers.

use ax_core::ids::InstanceId;
use ax_core::state::InstanceState;

use super::runs::InstanceRecord;

/// How many failed items a summary names: enough to see a pattern, few enough for a row.
pub const FIRST_FAILURES: u32 = 5;

/// The most items one page holds.
pub const MAX_ITEM_PAGE: u32 = 1_000;

/// How the items of one mapped task stand (its latest fan-out).
#[derive(Debug, Clone, PartialEq)]
pub struct ItemSummary {
    /// The task's own instance, the items' parent.
    pub parent: InstanceId,
    pub total: u32,
    /// Items per state, in the states' order; states without items are left out.
    pub states: Vec<(InstanceState, u32)>,
    /// The first FAILED, TIMEOUT or CANCELLED items by index, at most [`FIRST_FAILURES`].
    pub first_failures: Vec<InstanceRecord>,
}

/// Which of a mapped task's items to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemPage {
    /// Only items in this state; `None` for every state.
    pub state: Option<InstanceState>,
    /// Items from this index on (0-based).
    pub from_index: u32,
    /// At most this many; the API keeps a page within [`MAX_ITEM_PAGE`].
    pub limit: u32,
}
