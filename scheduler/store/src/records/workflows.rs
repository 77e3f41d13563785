//! Workflows as stored: a version with its spec and source, the light head a list reads, the
//! outcome of an apply, and a schedule whose fire time has come.

use ax_core::Millis;
use ax_core::ids::WorkflowId;
use ax_core::spec::WorkflowSpec;

#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    pub id: WorkflowId,
    pub name: String,
    /// Starts at 1; a new version is stored only when the applied spec differs.
    pub version: u32,
    pub spec: WorkflowSpec,
    /// The workflow file's text as applied.
    pub source: String,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A workflow and its latest version number, without the version's spec: what a list of many
/// workflows reads before it takes their specs from a cache (versions never change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowHead {
    pub id: WorkflowId,
    pub name: String,
    pub version: u32,
    pub paused: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    Created,
    Updated,
    Unchanged,
}

/// A cron schedule whose next fire time has come.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSchedule {
    pub workflow_id: WorkflowId,
    pub workflow: String,
    pub workflow_version: u32,
    pub cron: String,
    pub timezone: String,
    pub next_fire_at: Millis,
}
