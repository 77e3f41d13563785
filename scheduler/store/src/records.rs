//! The records the store takes and gives, by subject; the crate root re-exports each.

pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod audit;
pub(crate) mod deadlines;
pub(crate) mod decisions;
pub(crate) mod dispatch;
pub(crate) mod grid;
pub(crate) mod items;
pub(crate) mod logs;
pub(crate) mod marks;
pub(crate) mod nodes;
pub(crate) mod placement;
pub(crate) mod purge;
pub(crate) mod reports;
pub(crate) mod reruns;
pub(crate) mod runs;
pub(crate) mod sub_workflows;
pub(crate) mod workers;
pub(crate) mod workflows;
