//! The answer to a person's mark of an instance (`Store::mark_instance`).

use ax_core::ids::InstanceId;
use ax_core::mark::MarkRefused;
use ax_core::state::InstanceState;

use crate::{CancelledAttempt, InstanceRecord};

/// The answer to `mark_instance`.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per mark: size does not matter here
pub enum MarkAnswer {
    /// The instance is in its marked state (`record`), moved from `from`; `killed` is its attempt
    /// that had reached a worker, whose process the worker must kill.
    Marked {
        record: InstanceRecord,
        from: InstanceState,
        killed: Option<CancelledAttempt>,
    },
    NotFound,
    /// The core's rules refuse it (`ax_core::mark::plan`).
    Refused(MarkRefused),
    /// A mapped or sharded task's instance whose `unfinished` items or shards still go: mark
    /// them, or wait for them.
    ChildrenGoing {
        unfinished: u32,
    },
    /// An item or shard of an earlier attempt of its task (`parent`): history, not marked.
    OldChild {
        parent: InstanceId,
    },
}
