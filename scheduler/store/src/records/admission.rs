//! What the store asks of a node's bounds on waiting instances (`ax_core::admission`).

use ax_core::Millis;
use ax_core::admission::Past;
use ax_core::spec::TriggerKind;

/// A node's bounds on WAITING instances, as the store sees them when it creates a run that is
/// never refused (a cron or dependency fire, a child run, a backfill slot): the run is created
/// either way, and one created past a bound gets an `admitted_over_bound` decision in the same
/// transaction, so the fact and its explanation are stored together or not at all.
pub trait WaitingBounds: Send + Sync {
    /// The bound a new run of `app`'s workflow from `trigger` is created past at `now`, if any.
    /// Called inside a write transaction: it answers from memory.
    fn past_bound(&self, app: &str, trigger: TriggerKind, now: Millis) -> Option<Past>;

    /// The node the decisions name.
    fn node_id(&self) -> &str;
}
