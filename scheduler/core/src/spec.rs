//! Workflow files: the model and the YAML parser.
//!
//! A workflow file declares one DAG of tasks and its schedule plan. Parsing refuses unknown
//! fields, duplicate task names, unknown upstreams, cycles, bad cron expressions and unknown time
//! zones with an error that names the file, the line and the field.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What starts runs of a workflow (and what started one run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    Cron,
    Manual,
    Api,
    Dependency,
}

impl TriggerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::Cron => "cron",
            TriggerKind::Manual => "manual",
            TriggerKind::Api => "api",
            TriggerKind::Dependency => "dependency",
        }
    }

    pub fn parse(s: &str) -> Option<TriggerKind> {
        [Self::Cron, Self::Manual, Self::Api, Self::Dependency]
            .into_iter()
            .find(|kind| kind.as_str() == s)
    }
}

impl fmt::Display for TriggerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// `Cron` when a cron expression is given, `Manual` otherwise.
    pub trigger: TriggerKind,
    /// Crontab dialect, validated by [`crate::cron::CronSchedule::parse`].
    pub cron: Option<String>,
    /// IANA time zone name; "UTC" by default.
    pub timezone: String,
}

impl Default for ScheduleSpec {
    fn default() -> Self {
        ScheduleSpec { trigger: TriggerKind::Manual, cron: None, timezone: "UTC".into() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskSpec {
    pub name: String,
    /// Run with `/bin/sh -c` unless `argv` is non-empty.
    pub command: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    /// 0 means no timeout.
    pub timeout_ms: u64,
    /// Further attempts after the first one fails.
    pub retries: u32,
    /// Base delay before a retry; doubled per attempt, with jitter, capped.
    pub retry_backoff_ms: u64,
    /// A worker must carry every one of these labels (same value) to run the task.
    pub labels: BTreeMap<String, String>,
    /// Higher runs first among waiting instances.
    pub priority: i32,
    pub upstream: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkflowSpec {
    pub name: String,
    pub app: String,
    pub owner: String,
    pub description: String,
    pub schedule: ScheduleSpec,
    pub tasks: Vec<TaskSpec>,
}

/// A parsed and validated workflow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedWorkflow {
    pub spec: WorkflowSpec,
    /// Things worth telling the user that do not stop the apply (an isolated task, say).
    pub warnings: Vec<String>,
}

/// A workflow file that cannot be applied: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}:{line}: {field}: {message}")]
pub struct SpecError {
    pub source_name: String,
    /// 1-based line of the offending node (0 when the error is about the file as a whole).
    pub line: usize,
    /// Path of the field, e.g. `tasks[2].upstream[0]` or `schedule.cron`.
    pub field: String,
    pub message: String,
}
