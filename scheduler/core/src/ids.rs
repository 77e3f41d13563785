//! Identifier newtypes, so an instance id is never passed where a run id is expected.

use std::fmt;

macro_rules! int_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

int_id!(
    /// One task in one run (a `task_instance` row).
    InstanceId
);
int_id!(
    /// One trigger of a workflow.
    RunId
);
int_id!(
    /// A workflow's stable identity across versions.
    WorkflowId
);

/// One try of an instance, numbered from 1. It is the fencing token of every worker report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt(pub u32);

impl Attempt {
    pub const FIRST: Attempt = Attempt(1);

    pub fn next(self) -> Attempt {
        Attempt(self.0 + 1)
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
