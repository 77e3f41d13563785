//! Audit rows, and the filter they are listed by.

use ax_core::Millis;

#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub at: Millis,
    /// Who: the actor the client named, or "anonymous".
    pub actor: String,
    /// What: `apply`, `trigger`, `cancel`, `pause`, `resume`, …
    pub action: String,
    /// Which object: `workflow/NAME`, `run/ID`, `instance/ID`.
    pub target: String,
    /// Free text (JSON is fine).
    pub detail: String,
    /// From where: the client's address.
    pub remote: String,
    /// The name of the token the call came with; empty when the node runs without
    /// authentication.
    pub token: String,
}

/// Which audit rows to list: exact matches on the fields that are set, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub limit: u32,
    pub action: Option<String>,
    pub target: Option<String>,
    pub actor: Option<String>,
    /// The name of the token the calls came with.
    pub token: Option<String>,
}
