//! Workflow files: the model and the YAML parser.
//!
//! A workflow file declares one DAG of tasks and its schedule plan. Parsing refuses unknown
//! fields, duplicate task names, unknown upstreams, cycles, bad cron expressions and unknown time
//! zones with an error that names the file, the line and the field (`wf.yaml:7: tasks[1].upstream[0]:
//! unknown task "extract"`). Nothing is half-accepted: the first error stops the parse.
//!
//! # File format
//!
//! ```yaml
//! name: daily-sales-etl          # required, [a-z0-9][a-z0-9_.-]{0,63}
//! app: analytics                 # optional, default "default", same charset as name
//! owner: data-team@example.com   # optional
//! description: nightly sales     # optional
//! schedule:                      # optional; without cron or after the workflow is manual-only
//!   cron: "30 2 * * *"           # crontab dialect, 5 or 6 fields or @daily
//!   timezone: Asia/Shanghai      # IANA, default UTC
//!   misfire: fire_once           # slots missed while down or paused: skip | fire_once | catch_up
//!   max_catch_up: 10             # with catch_up: at most this many missed slots, the latest
//!   overlap: allow               # a fire while a run is active: allow | skip | queue | replace
//!                                # (a dependency fire obeys queue, never skip or replace)
//!   max_active_runs: 0           # runs active at once, 0 = no limit; more are queued
//!   start: 2026-01-01            # no cron slot before (date or date-time, in timezone; a
//!                                # dependency fire ignores start and end)
//!   end: 2026-12-31T23:59:59     # no slot after
//!   after: [ingest, dims]        # instead of cron: run once each has succeeded for a logical time
//!                                # (within max_active_runs, overlap queue and the key cap)
//! concurrency:                   # optional
//!   max_running_tasks: 10        # instances of this workflow on workers at once, 0 = no limit
//!   key: "${customer}"           # runs with the same key (from params) are capped ...
//!   max_runs_per_key: 1          # ... at this many active at once (default 1); others queue
//!                                # a trigger must give every param the key names (refused
//!                                # otherwise); cron, dependency and backfill runs have no
//!                                # params: they all share one key ("" for "${customer}")
//! defaults:                      # optional, applied to every task unless the task overrides
//!   timeout: 30m                 # durations: "500ms", "45s", "10m", "2h", "1h30m", or an integer = seconds
//!   retries: 2
//!   retry_backoff: 10s
//!   labels: {pool: etl}          # merged key by key with the task's own labels (the task wins)
//!   env: {TZ: UTC}               # merged key by key with the task's own env (the task wins)
//! tasks:                         # required, at least one
//!   - name: extract_orders       # required, same charset as the workflow name, unique
//!     command: ./extract.sh orders   # command XOR argv (a list of strings); one is required
//!     timeout: 10m               # default: defaults.timeout, else none (0)
//!     retries: 3                 # default: defaults.retries, else 0
//!     retry_backoff: 30s         # default: defaults.retry_backoff, else 10s
//!     env: {K: V}                # names match [A-Za-z_][A-Za-z0-9_]*
//!     working_dir: /tmp
//!     labels: {region: cn}
//!     priority: 10               # default 0, i32; higher runs first
//!     upstream: [a, b]           # or a single string; tasks of this file
//!     concurrency: 2             # instances of this task on workers at once, 0 = no limit
//!     pool: etl                  # capped with the pool's other tasks (scheduler config [pools])
//!     routing: default           # default | least_running | round_robin | random |
//!                                # consistent_hash | failover | sharded_broadcast
//!                                # consistent_hash / failover choose among the workers connected
//!                                # to the dispatching scheduler node (each node over its own);
//!                                # a full preferred worker passes to the next in hash/id order
//!     self_fence: true           # false: keep running when the worker is cut off from the
//!                                # schedulers (a retry may then run beside it)
//! ```
//!
//! `schedule.trigger` is derived (cron when `schedule.cron` is set, dependency when
//! `schedule.after` is, manual otherwise); there is no `trigger` key. An explicit YAML null (`owner:` with nothing after it) means the field is
//! absent. YAML aliases and multi-document files are refused.
//!
//! The parser drives `yaml-rust2`'s event parser itself and builds a small tree that keeps the
//! line of every key and value; the tree is then converted by hand, which is what lets every
//! error carry its line and field path.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::dag::{Dag, DagError};

/// What starts runs of a workflow (and what started one run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    Cron,
    Manual,
    Api,
    Dependency,
    /// A slot of `axctl backfill`.
    Backfill,
}

impl TriggerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::Cron => "cron",
            TriggerKind::Manual => "manual",
            TriggerKind::Api => "api",
            TriggerKind::Dependency => "dependency",
            TriggerKind::Backfill => "backfill",
        }
    }

    pub fn parse(s: &str) -> Option<TriggerKind> {
        [
            Self::Cron,
            Self::Manual,
            Self::Api,
            Self::Dependency,
            Self::Backfill,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == s)
    }
}

impl fmt::Display for TriggerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with cron slots that passed while the scheduler was down or the workflow paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// Drop them; the next run is the next slot from now.
    Skip,
    /// Run the latest missed slot once, now (the default).
    #[default]
    FireOnce,
    /// Run the missed slots in order, at most `max` of them (the latest ones).
    CatchUp { max: u32 },
}

impl MisfirePolicy {
    pub fn name(self) -> &'static str {
        match self {
            MisfirePolicy::Skip => "skip",
            MisfirePolicy::FireOnce => "fire_once",
            MisfirePolicy::CatchUp { .. } => "catch_up",
        }
    }
}

/// What a scheduled fire does when an earlier run of the workflow is still active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Start it beside the active runs (the default), within `max_active_runs`.
    #[default]
    Allow,
    /// Drop the fire.
    Skip,
    /// Create the run queued; it starts when the active runs have ended.
    Queue,
    /// Cancel the active runs, then start it.
    Replace,
}

impl OverlapPolicy {
    pub const ALL: [OverlapPolicy; 4] = [
        OverlapPolicy::Allow,
        OverlapPolicy::Skip,
        OverlapPolicy::Queue,
        OverlapPolicy::Replace,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::Queue => "queue",
            OverlapPolicy::Replace => "replace",
        }
    }
}

/// How the worker of a task's attempt is chosen. `Default` uses the scheduler's configured
/// strategy (least_running unless configured otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    #[default]
    Default,
    LeastRunning,
    RoundRobin,
    Random,
    /// The same task lands on the same worker while that worker lives.
    ConsistentHash,
    /// The first live eligible worker in the order of worker ids.
    Failover,
    /// One instance per eligible live worker, each told `AX_SHARD_INDEX` and `AX_SHARD_TOTAL`;
    /// the task succeeds when every shard did and fails when one failed with no retry left.
    /// Each shard runs (and retries) only on its worker, and fails once that worker is gone for
    /// good (see `crate::shard`).
    ShardedBroadcast,
}

impl Routing {
    pub const ALL: [Routing; 7] = [
        Routing::Default,
        Routing::LeastRunning,
        Routing::RoundRobin,
        Routing::Random,
        Routing::ConsistentHash,
        Routing::Failover,
        Routing::ShardedBroadcast,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Routing::Default => "default",
            Routing::LeastRunning => "least_running",
            Routing::RoundRobin => "round_robin",
            Routing::Random => "random",
            Routing::ConsistentHash => "consistent_hash",
            Routing::Failover => "failover",
            Routing::ShardedBroadcast => "sharded_broadcast",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScheduleSpec {
    /// `Cron` when a cron expression is given, `Dependency` when `after` names upstream
    /// workflows, `Manual` otherwise.
    pub trigger: TriggerKind,
    /// Crontab dialect, validated by [`crate::cron::CronSchedule::parse`].
    pub cron: Option<String>,
    /// IANA time zone name; "UTC" by default.
    pub timezone: String,
    pub misfire: MisfirePolicy,
    pub overlap: OverlapPolicy,
    /// Runs active at once (running, not queued); 0 means no limit. Runs past it are queued.
    pub max_active_runs: u32,
    /// No slot before this instant fires (`schedule.start`, read in `timezone`).
    pub start_at: Option<crate::Millis>,
    /// No slot after this instant fires (`schedule.end`, read in `timezone`).
    pub end_at: Option<crate::Millis>,
    /// Upstream workflows of a dependency trigger: this workflow runs for a logical time once
    /// each of them has a successful run for that same logical time.
    pub after: Vec<String>,
}

impl Default for ScheduleSpec {
    fn default() -> Self {
        ScheduleSpec {
            trigger: TriggerKind::Manual,
            cron: None,
            timezone: "UTC".into(),
            misfire: MisfirePolicy::default(),
            overlap: OverlapPolicy::default(),
            max_active_runs: 0,
            start_at: None,
            end_at: None,
            after: Vec::new(),
        }
    }
}

/// Cluster-wide caps on a workflow's runs and instances.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ConcurrencySpec {
    /// Instances of this workflow dispatched or running at once, across all its runs; 0 = none.
    pub max_running_tasks: u32,
    /// A template over the run's params (`"${customer}"`): runs with the same key are capped at
    /// `max_runs_per_key` active at once; the others are queued.
    pub key: Option<String>,
    /// Active runs per key (default 1 when `key` is set).
    pub max_runs_per_key: u32,
}

impl ConcurrencySpec {
    /// The run key for these params: the template with every `${name}` replaced by the param's
    /// value (empty when the run has no such param). `None` when the workflow has no key.
    pub fn run_key(&self, params: &BTreeMap<String, String>) -> Option<String> {
        let template = self.key.as_deref()?;
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    if let Some(value) = params.get(&after[..end]) {
                        out.push_str(value);
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        Some(out)
    }

    /// The params the key template names that `params` lacks, in template order (empty when
    /// the workflow has no key or every one is given).
    pub fn missing_key_params(&self, params: &BTreeMap<String, String>) -> Vec<String> {
        let Some(template) = self.key.as_deref() else {
            return Vec::new();
        };
        let mut missing: Vec<String> = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else { break };
            let name = &after[..end];
            if !params.contains_key(name) && !missing.iter().any(|m| m == name) {
                missing.push(name.to_string());
            }
            rest = &after[end + 1..];
        }
        missing
    }

    /// A manual or API trigger must give every param the key names, or the run would silently
    /// share a key with unrelated runs: the refusal names the missing params and the template.
    pub fn check_trigger_params(&self, params: &BTreeMap<String, String>) -> Result<(), String> {
        let missing = self.missing_key_params(params);
        if missing.is_empty() {
            return Ok(());
        }
        let template = self.key.as_deref().unwrap_or_default();
        Err(format!(
            "missing param {} for concurrency.key {template:?}: runs of this workflow are \
             limited per key, so a trigger must give it (--param {}=VALUE)",
            missing.join(", "),
            missing[0]
        ))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskSpec {
    pub name: String,
    /// A shell command line, run as `/bin/sh -c` would run it, unless `argv` is non-empty.
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
    /// Instances of this task dispatched or running at once, across all runs; 0 = no limit.
    #[serde(default)]
    pub concurrency: u32,
    /// A pool whose cluster-wide limit (scheduler config `[pools]`) caps this task with every
    /// other task of the pool.
    #[serde(default)]
    pub pool: Option<String>,
    #[serde(default)]
    pub routing: Routing,
    /// `self_fence: false`: the task keeps running when its worker is cut off from the
    /// schedulers, at the price that its retry may run beside it (the worker fences every other
    /// attempt).
    #[serde(default)]
    pub unfenced: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkflowSpec {
    pub name: String,
    pub app: String,
    pub owner: String,
    pub description: String,
    pub schedule: ScheduleSpec,
    #[serde(default)]
    pub concurrency: ConcurrencySpec,
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

/// The app of a workflow file that names none.
pub const DEFAULT_APP: &str = "default";
/// The base retry delay of a task that names none (nor through `defaults`).
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 10_000;

/// Deeper YAML than this is refused: the format needs four levels, and a bound keeps a hostile
/// `[[[[…` file from costing memory or stack.
const MAX_DEPTH: usize = 32;

const ROOT_FIELDS: &[&str] = &[
    "name",
    "app",
    "owner",
    "description",
    "schedule",
    "concurrency",
    "defaults",
    "tasks",
];
const SCHEDULE_FIELDS: &[&str] = &[
    "cron",
    "timezone",
    "misfire",
    "max_catch_up",
    "overlap",
    "max_active_runs",
    "start",
    "end",
    "after",
];
const CONCURRENCY_FIELDS: &[&str] = &["max_running_tasks", "key", "max_runs_per_key"];
/// Missed slots `misfire: catch_up` runs when `max_catch_up` is not given.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;
const DEFAULTS_FIELDS: &[&str] = &["timeout", "retries", "retry_backoff", "labels", "env"];
const TASK_FIELDS: &[&str] = &[
    "name",
    "command",
    "argv",
    "timeout",
    "retries",
    "retry_backoff",
    "env",
    "working_dir",
    "labels",
    "priority",
    "upstream",
    "concurrency",
    "pool",
    "routing",
    "self_fence",
];

impl WorkflowSpec {
    /// The task graph of this workflow. Always `Ok` for a spec that came out of
    /// [`parse_workflow`]; other specs (built by hand, read back from a store) are checked again.
    pub fn dag(&self) -> Result<Dag, DagError> {
        Dag::new(&self.tasks)
    }
}

/// Whether `name` is a valid workflow, app or task name: `[a-z0-9][a-z0-9_.-]{0,63}`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_lowercase() || first.is_ascii_digit() => {}
        _ => return false,
    }
    bytes.len() <= 64
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        })
}

/// Whether `name` is a valid environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(first) if first.is_ascii_alphabetic() || *first == b'_' => {}
        _ => return false,
    }
    bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// Parses a duration of the workflow format into milliseconds: `500ms`, `45s`, `10m`, `2h`,
/// `1h30m` (units from largest to smallest, each at most once), or a whole number of seconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let invalid = || {
        format!(
            "invalid duration \"{text}\": expected a form like 500ms, 45s, 10m, 2h, 1h30m \
             or a whole number of seconds"
        )
    };
    let too_large = || format!("duration \"{text}\" is too large");
    let s = text.trim();
    if s.is_empty() {
        return Err(invalid());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = s.parse().map_err(|_| too_large())?;
        return seconds.checked_mul(1_000).ok_or_else(too_large);
    }
    // Units in the only order they may appear, with their length in milliseconds.
    const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];
    let mut total: u64 = 0;
    let mut next_unit = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let letters = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || letters == 0 {
            return Err(invalid());
        }
        let unit = &rest[digits..digits + letters];
        let Some(position) = UNITS[next_unit..].iter().position(|(u, _)| *u == unit) else {
            return Err(invalid());
        };
        let (_, unit_ms) = UNITS[next_unit + position];
        next_unit += position + 1;
        let amount: u64 = rest[..digits].parse().map_err(|_| too_large())?;
        total = amount
            .checked_mul(unit_ms)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(too_large)?;
        rest = &rest[digits + letters..];
    }
    Ok(total)
}

/// Reads `2026-01-31`, `2026-01-31T08:30`, `2026-01-31T08:30:00` (wall time in `tz`; a time in
/// a spring-forward gap moves to after the gap, a repeated one takes its first occurrence) or an
/// RFC 3339 instant with its own offset.
pub fn parse_instant(text: &str, tz: chrono_tz::Tz) -> Option<crate::Millis> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone};
    let text = text.trim();
    if let Ok(instant) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(instant.timestamp_millis());
    }
    let naive = if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        date.and_hms_opt(0, 0, 0)?
    } else {
        [
            "%Y-%m-%dT%H:%M:%S",
            "%Y-%m-%dT%H:%M",
            "%Y-%m-%d %H:%M:%S",
            "%Y-%m-%d %H:%M",
        ]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())?
    };
    // Walk forward out of a DST gap a minute at a time (gaps are at most a few hours).
    (0..=24 * 60).find_map(|minutes| {
        tz.from_local_datetime(&(naive + chrono::Duration::minutes(minutes)))
            .earliest()
            .map(|t| t.timestamp_millis())
    })
}

/// Checks a run-key template: text with at least one `${param}` whose name is a valid
/// environment variable name.
pub fn check_key_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    let mut names = 0;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed \"${{\" in key template \"{template}\""));
        };
        let name = &after[..end];
        if !is_valid_env_name(name) {
            return Err(format!(
                "\"${{{name}}}\" in key template \"{template}\" is not a param name \
                 ([A-Za-z_][A-Za-z0-9_]*)"
            ));
        }
        names += 1;
        rest = &after[end + 1..];
    }
    if names == 0 {
        return Err(format!(
            "key template \"{template}\" names no param: use ${{name}}, e.g. \"${{customer}}\""
        ));
    }
    Ok(())
}

/// Parses and validates one workflow file. `source_name` names the file in errors;
/// `validate_cron` checks `schedule.cron` (the scheduler passes `CronSchedule::parse`), and its
/// error message is quoted in the [`SpecError`].
pub fn parse_workflow(
    source: &str,
    source_name: &str,
    validate_cron: &dyn Fn(&str) -> Result<(), String>,
) -> Result<ParsedWorkflow, SpecError> {
    let ctx = Ctx { source_name };
    let root =
        build_tree(source).map_err(|(line, field, message)| ctx.err(line, field, message))?;
    let Some(root) = root else {
        return Err(ctx.err(0, "(root)", "the file holds no workflow"));
    };
    ctx.workflow(&root, validate_cron)
}

// ---------------------------------------------------------------------------------------------
// The tree: YAML events folded into nodes that remember their line.

#[derive(Debug)]
struct Node {
    line: usize,
    value: Value,
}

#[derive(Debug)]
enum Value {
    /// `plain` is false for quoted and block scalars, which are always strings.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if is_null_text(text))
    }

    /// What the node is, for "expected X, found Y" messages.
    fn kind(&self) -> &'static str {
        match &self.value {
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
            Value::Scalar { plain: false, .. } => "a string",
            Value::Scalar { text, plain: true } => {
                if is_null_text(text) {
                    "null"
                } else if matches!(
                    text.as_str(),
                    "true" | "True" | "TRUE" | "false" | "False" | "FALSE"
                ) {
                    "a boolean"
                } else if is_integer_text(text) {
                    "an integer"
                } else if text.parse::<f64>().is_ok() {
                    "a number"
                } else {
                    "a string"
                }
            }
        }
    }
}

fn is_null_text(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn is_integer_text(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

enum Frame {
    Seq {
        line: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

/// Receives parser events and folds them into a [`Node`] tree with an explicit stack.
#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Frame>,
    root: Option<Node>,
    documents: usize,
    /// The first problem met, as (line, field, message); later events are ignored.
    error: Option<(usize, &'static str, String)>,
}

impl TreeBuilder {
    fn fail(&mut self, line: usize, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some((line, "(yaml)", message.into()));
        }
    }

    fn open(&mut self, frame: Frame, line: usize) {
        if self.stack.len() >= MAX_DEPTH {
            self.fail(line, format!("nesting deeper than {MAX_DEPTH} levels"));
        }
        self.stack.push(frame);
    }

    fn complete(&mut self, mut node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => *key = Some(node),
                Some(k) => {
                    // The parser places an empty value at the next token, often lines later;
                    // its key's line is where the user looks.
                    if node.is_null() {
                        node.line = k.line;
                    }
                    entries.push((k, node));
                }
            },
        }
    }
}

impl MarkedEventReceiver for TreeBuilder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let line = mark.line();
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.fail(line, "a workflow file holds exactly one YAML document");
                }
            }
            Event::Alias(_) => self.fail(line, "YAML aliases are not supported"),
            Event::Scalar(text, style, _, _) => {
                let plain = style == TScalarStyle::Plain;
                self.complete(Node {
                    line,
                    value: Value::Scalar { text, plain },
                });
            }
            Event::SequenceStart(_, _) => self.open(
                Frame::Seq {
                    line,
                    items: Vec::new(),
                },
                line,
            ),
            Event::MappingStart(_, _) => self.open(
                Frame::Map {
                    line,
                    entries: Vec::new(),
                    key: None,
                },
                line,
            ),
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Frame::Seq { line, items }) => Node {
                        line,
                        value: Value::Seq(items),
                    },
                    Some(Frame::Map { line, entries, .. }) => Node {
                        line,
                        value: Value::Map(entries),
                    },
                    None => return self.fail(line, "unbalanced YAML collection"),
                };
                self.complete(node);
            }
        }
    }
}

/// Parses YAML into a tree; `Ok(None)` for a file without any document (empty, or comments).
///
/// Events are pulled one by one rather than through `Parser::load`, whose node loading recurses
/// once per nesting level; pulling keeps the whole parse iterative and lets it stop at the first
/// problem.
fn build_tree(source: &str) -> Result<Option<Node>, (usize, &'static str, String)> {
    let mut parser = Parser::new_from_str(source);
    let mut builder = TreeBuilder::default();
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| (e.marker().line(), "(yaml)", e.info().to_string()))?;
        let end = event == Event::StreamEnd;
        builder.on_event(event, mark);
        if let Some(error) = builder.error.take() {
            return Err(error);
        }
        if end {
            return Ok(builder.root);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Conversion: tree to model, with a line and a field path for every refusal.

struct Ctx<'a> {
    source_name: &'a str,
}

/// The fields of one mapping, checked against the allowed names.
struct Fields<'n> {
    line: usize,
    path: String,
    entries: Vec<(&'n str, &'n Node, &'n Node)>,
}

impl<'n> Fields<'n> {
    /// The value of `name`, or `None` when it is absent or null.
    fn get(&self, name: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _, v)| *k == name && !v.is_null())
            .map(|(_, _, v)| *v)
    }

    fn key_line(&self, name: &str) -> usize {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == name)
            .map_or(self.line, |(_, k, _)| k.line)
    }

    fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Where in the file each task and upstream entry is, to place DAG errors.
struct TaskLines {
    task: usize,
    name: usize,
    upstream: Vec<usize>,
}

/// Task settings given once under `defaults`.
#[derive(Default)]
struct Defaults {
    timeout_ms: Option<u64>,
    retries: Option<u32>,
    retry_backoff_ms: Option<u64>,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
}

impl Ctx<'_> {
    fn err(&self, line: usize, field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError {
            source_name: self.source_name.to_string(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    fn type_err(&self, node: &Node, field: &str, expected: &str) -> SpecError {
        self.err(
            node.line,
            field,
            format!("expected {expected}, found {}", node.kind()),
        )
    }

    fn missing(&self, fields: &Fields<'_>, name: &str) -> SpecError {
        self.err(
            fields.key_line(name),
            fields.path(name),
            "missing required field",
        )
    }

    fn fields<'n>(
        &self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
    ) -> Result<Fields<'n>, SpecError> {
        let Value::Map(pairs) = &node.value else {
            let field = if path.is_empty() { "(root)" } else { path };
            return Err(self.type_err(node, field, "a mapping"));
        };
        let mut entries: Vec<(&'n str, &'n Node, &'n Node)> = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let name = self.key(key, path)?;
            if let Some((_, first, _)) = entries.iter().find(|(k, _, _)| *k == name) {
                return Err(self.err(
                    key.line,
                    join(path, name),
                    format!("duplicate key \"{name}\" (first at line {})", first.line),
                ));
            }
            if !allowed.contains(&name) {
                return Err(self.err(
                    key.line,
                    join(path, name),
                    format!(
                        "unknown field \"{name}\"; allowed fields: {}",
                        allowed.join(", ")
                    ),
                ));
            }
            entries.push((name, key, value));
        }
        Ok(Fields {
            line: node.line,
            path: path.to_string(),
            entries,
        })
    }

    fn key<'n>(&self, key: &'n Node, path: &str) -> Result<&'n str, SpecError> {
        match &key.value {
            Value::Scalar { text, .. } if !key.is_null() => Ok(text),
            _ => Err(self.err(
                key.line,
                if path.is_empty() { "(root)" } else { path },
                format!("keys must be strings, found {}", key.kind()),
            )),
        }
    }

    fn string(&self, node: &Node, field: &str) -> Result<String, SpecError> {
        match &node.value {
            Value::Scalar { text, .. } if !node.is_null() => Ok(text.clone()),
            _ => Err(self.type_err(node, field, "a string")),
        }
    }

    fn non_empty_string(&self, node: &Node, field: &str) -> Result<String, SpecError> {
        let text = self.string(node, field)?;
        if text.trim().is_empty() {
            return Err(self.err(node.line, field, "must not be empty"));
        }
        Ok(text)
    }

    fn name(&self, node: &Node, field: &str) -> Result<String, SpecError> {
        let name = self.string(node, field)?;
        if !is_valid_name(&name) {
            return Err(self.err(
                node.line,
                field,
                format!(
                    "invalid name \"{name}\": expected 1 to 64 of a-z, 0-9, '_', '.', '-', \
                     starting with a letter or digit"
                ),
            ));
        }
        Ok(name)
    }

    fn boolean(&self, node: &Node, field: &str) -> Result<bool, SpecError> {
        match &node.value {
            Value::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" => Ok(true),
                "false" | "False" | "FALSE" => Ok(false),
                _ => Err(self.type_err(node, field, "true or false")),
            },
            _ => Err(self.type_err(node, field, "true or false")),
        }
    }

    fn integer(&self, node: &Node, field: &str, min: i64, max: i64) -> Result<i64, SpecError> {
        let text = match &node.value {
            Value::Scalar { text, plain: true } if is_integer_text(text) => text,
            _ => return Err(self.type_err(node, field, "an integer")),
        };
        let out_of_range = || {
            self.err(
                node.line,
                field,
                format!("must be between {min} and {max}, found {text}"),
            )
        };
        let value: i64 = text.parse().map_err(|_| out_of_range())?;
        if value < min || value > max {
            return Err(out_of_range());
        }
        Ok(value)
    }

    fn duration(&self, node: &Node, field: &str) -> Result<u64, SpecError> {
        match &node.value {
            Value::Scalar { text, .. } if !node.is_null() => {
                parse_duration_ms(text).map_err(|message| self.err(node.line, field, message))
            }
            _ => Err(self.type_err(node, field, "a duration")),
        }
    }

    /// A mapping of strings to strings (env, labels), each key checked by `check_key`.
    fn string_map(
        &self,
        node: &Node,
        path: &str,
        check_key: &dyn Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>, SpecError> {
        let Value::Map(pairs) = &node.value else {
            return Err(self.type_err(node, path, "a mapping"));
        };
        let mut map = BTreeMap::new();
        let mut lines: HashMap<&str, usize> = HashMap::new();
        for (key, value) in pairs {
            let name = self.key(key, path)?;
            let field = join(path, name);
            if let Some(first) = lines.get(name) {
                return Err(self.err(
                    key.line,
                    field,
                    format!("duplicate key \"{name}\" (first at line {first})"),
                ));
            }
            if let Some(message) = check_key(name) {
                return Err(self.err(key.line, field, message));
            }
            lines.insert(name, key.line);
            map.insert(name.to_string(), self.string(value, &field)?);
        }
        Ok(map)
    }

    fn env(&self, node: &Node, path: &str) -> Result<BTreeMap<String, String>, SpecError> {
        self.string_map(node, path, &|name| {
            (!is_valid_env_name(name)).then(|| {
                format!(
                    "invalid environment variable name \"{name}\": expected [A-Za-z_][A-Za-z0-9_]*"
                )
            })
        })
    }

    fn labels(&self, node: &Node, path: &str) -> Result<BTreeMap<String, String>, SpecError> {
        self.string_map(node, path, &|name| {
            name.trim()
                .is_empty()
                .then(|| "label names must not be empty".to_string())
        })
    }

    fn workflow(
        &self,
        root: &Node,
        validate_cron: &dyn Fn(&str) -> Result<(), String>,
    ) -> Result<ParsedWorkflow, SpecError> {
        let fields = self.fields(root, "", ROOT_FIELDS)?;
        let name = match fields.get("name") {
            Some(node) => self.name(node, "name")?,
            None => return Err(self.missing(&fields, "name")),
        };
        let app = match fields.get("app") {
            Some(node) => self.name(node, "app")?,
            None => DEFAULT_APP.to_string(),
        };
        let owner = fields
            .get("owner")
            .map(|n| self.string(n, "owner"))
            .transpose()?
            .unwrap_or_default();
        let description = fields
            .get("description")
            .map(|n| self.string(n, "description"))
            .transpose()?
            .unwrap_or_default();
        let schedule = match fields.get("schedule") {
            Some(node) => self.schedule(node, validate_cron)?,
            None => ScheduleSpec::default(),
        };
        let concurrency = match fields.get("concurrency") {
            Some(node) => self.concurrency(node)?,
            None => ConcurrencySpec::default(),
        };
        if let Some(after) = schedule.after.iter().find(|upstream| **upstream == name) {
            let line = fields.get("schedule").map_or(0, |n| n.line);
            return Err(self.err(
                line,
                "schedule.after",
                format!("workflow {after} cannot depend on itself"),
            ));
        }
        let defaults = match fields.get("defaults") {
            Some(node) => self.defaults(node)?,
            None => Defaults::default(),
        };

        let Some(tasks_node) = fields.get("tasks") else {
            return Err(self.missing(&fields, "tasks"));
        };
        let Value::Seq(items) = &tasks_node.value else {
            return Err(self.type_err(tasks_node, "tasks", "a list of tasks"));
        };
        if items.is_empty() {
            return Err(self.err(tasks_node.line, "tasks", "at least one task is required"));
        }
        let mut tasks = Vec::with_capacity(items.len());
        let mut lines = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let (task, task_lines) = self.task(item, &format!("tasks[{i}]"), &defaults)?;
            tasks.push(task);
            lines.push(task_lines);
        }

        let dag = Dag::new(&tasks).map_err(|e| self.dag_error(e, &tasks, &lines))?;
        let warnings = dag
            .isolated()
            .into_iter()
            .map(|task| format!("task {task} has no upstream and no downstream"))
            .collect();
        let spec = WorkflowSpec {
            name,
            app,
            owner,
            description,
            schedule,
            concurrency,
            tasks,
        };
        Ok(ParsedWorkflow { spec, warnings })
    }

    fn schedule(
        &self,
        node: &Node,
        validate_cron: &dyn Fn(&str) -> Result<(), String>,
    ) -> Result<ScheduleSpec, SpecError> {
        let fields = self.fields(node, "schedule", SCHEDULE_FIELDS)?;
        let mut schedule = ScheduleSpec::default();
        if let Some(node) = fields.get("timezone") {
            let timezone = self.non_empty_string(node, "schedule.timezone")?;
            if timezone.parse::<chrono_tz::Tz>().is_err() {
                return Err(self.err(
                    node.line,
                    "schedule.timezone",
                    format!("unknown time zone \"{timezone}\": expected an IANA name such as UTC or Asia/Shanghai"),
                ));
            }
            schedule.timezone = timezone;
        }
        if let Some(node) = fields.get("cron") {
            let cron = self.non_empty_string(node, "schedule.cron")?;
            if let Err(reason) = validate_cron(&cron) {
                return Err(self.err(
                    node.line,
                    "schedule.cron",
                    format!("invalid cron expression \"{cron}\": {reason}"),
                ));
            }
            schedule.cron = Some(cron);
            schedule.trigger = TriggerKind::Cron;
        }
        if let Some(node) = fields.get("after") {
            let items: Vec<&Node> = match &node.value {
                Value::Seq(items) => items.iter().collect(),
                Value::Scalar { .. } => vec![node],
                Value::Map(_) => {
                    return Err(self.type_err(
                        node,
                        "schedule.after",
                        "a workflow name or a list of workflow names",
                    ));
                }
            };
            if items.is_empty() {
                return Err(self.err(node.line, "schedule.after", "must not be empty"));
            }
            for (i, item) in items.into_iter().enumerate() {
                let name = self.name(item, &format!("schedule.after[{i}]"))?;
                if schedule.after.contains(&name) {
                    return Err(self.err(
                        item.line,
                        format!("schedule.after[{i}]"),
                        format!("workflow {name} is listed twice"),
                    ));
                }
                schedule.after.push(name);
            }
            if schedule.cron.is_some() {
                return Err(self.err(
                    node.line,
                    "schedule.after",
                    "cron and after exclude each other: a workflow is started by its clock or \
                     by its upstream workflows",
                ));
            }
            schedule.trigger = TriggerKind::Dependency;
        }
        if let Some(node) = fields.get("misfire") {
            let text = self.non_empty_string(node, "schedule.misfire")?;
            schedule.misfire = match text.as_str() {
                "skip" => MisfirePolicy::Skip,
                "fire_once" => MisfirePolicy::FireOnce,
                "catch_up" => MisfirePolicy::CatchUp {
                    max: DEFAULT_MAX_CATCH_UP,
                },
                _ => {
                    return Err(self.err(
                        node.line,
                        "schedule.misfire",
                        format!(
                            "unknown misfire policy \"{text}\": expected skip, fire_once or catch_up"
                        ),
                    ));
                }
            };
        }
        if let Some(node) = fields.get("max_catch_up") {
            let max = self.integer(node, "schedule.max_catch_up", 1, 10_000)? as u32;
            match &mut schedule.misfire {
                MisfirePolicy::CatchUp { max: slot } => *slot = max,
                _ => {
                    return Err(self.err(
                        node.line,
                        "schedule.max_catch_up",
                        "only meaningful with misfire: catch_up",
                    ));
                }
            }
        }
        if let Some(node) = fields.get("overlap") {
            let text = self.non_empty_string(node, "schedule.overlap")?;
            schedule.overlap = OverlapPolicy::ALL
                .into_iter()
                .find(|policy| policy.as_str() == text)
                .ok_or_else(|| {
                    self.err(
                        node.line,
                        "schedule.overlap",
                        format!(
                            "unknown overlap policy \"{text}\": expected allow, skip, queue or replace"
                        ),
                    )
                })?;
        }
        if let Some(node) = fields.get("max_active_runs") {
            schedule.max_active_runs =
                self.integer(node, "schedule.max_active_runs", 0, u32::MAX.into())? as u32;
        }
        let tz: chrono_tz::Tz = schedule.timezone.parse().unwrap_or(chrono_tz::UTC);
        if let Some(node) = fields.get("start") {
            schedule.start_at = Some(self.instant(node, "schedule.start", tz)?);
        }
        if let Some(node) = fields.get("end") {
            schedule.end_at = Some(self.instant(node, "schedule.end", tz)?);
        }
        if let (Some(start), Some(end), Some(node)) =
            (schedule.start_at, schedule.end_at, fields.get("end"))
            && end < start
        {
            return Err(self.err(node.line, "schedule.end", "is before schedule.start"));
        }
        Ok(schedule)
    }

    /// A date (`2026-01-01`, midnight) or a date-time (`2026-01-01T08:30[:00]`, or with an
    /// offset or `Z`), read in `tz` unless it carries its own offset.
    fn instant(
        &self,
        node: &Node,
        field: &str,
        tz: chrono_tz::Tz,
    ) -> Result<crate::Millis, SpecError> {
        let text = self.non_empty_string(node, field)?;
        parse_instant(&text, tz).ok_or_else(|| {
            self.err(
                node.line,
                field,
                format!(
                    "invalid date \"{text}\": expected 2026-01-31, 2026-01-31T08:30:00 or \
                     2026-01-31T08:30:00+08:00"
                ),
            )
        })
    }

    fn concurrency(&self, node: &Node) -> Result<ConcurrencySpec, SpecError> {
        let fields = self.fields(node, "concurrency", CONCURRENCY_FIELDS)?;
        let mut spec = ConcurrencySpec::default();
        if let Some(node) = fields.get("max_running_tasks") {
            spec.max_running_tasks =
                self.integer(node, "concurrency.max_running_tasks", 0, u32::MAX.into())? as u32;
        }
        if let Some(node) = fields.get("key") {
            let key = self.non_empty_string(node, "concurrency.key")?;
            check_key_template(&key)
                .map_err(|message| self.err(node.line, "concurrency.key", message))?;
            spec.key = Some(key);
            spec.max_runs_per_key = 1;
        }
        if let Some(node) = fields.get("max_runs_per_key") {
            if spec.key.is_none() {
                return Err(self.err(
                    node.line,
                    "concurrency.max_runs_per_key",
                    "only meaningful with concurrency.key",
                ));
            }
            spec.max_runs_per_key =
                self.integer(node, "concurrency.max_runs_per_key", 1, u32::MAX.into())? as u32;
        }
        Ok(spec)
    }

    fn defaults(&self, node: &Node) -> Result<Defaults, SpecError> {
        let fields = self.fields(node, "defaults", DEFAULTS_FIELDS)?;
        let mut defaults = Defaults::default();
        if let Some(node) = fields.get("timeout") {
            defaults.timeout_ms = Some(self.duration(node, "defaults.timeout")?);
        }
        if let Some(node) = fields.get("retries") {
            defaults.retries =
                Some(self.integer(node, "defaults.retries", 0, u32::MAX.into())? as u32);
        }
        if let Some(node) = fields.get("retry_backoff") {
            defaults.retry_backoff_ms = Some(self.duration(node, "defaults.retry_backoff")?);
        }
        if let Some(node) = fields.get("labels") {
            defaults.labels = self.labels(node, "defaults.labels")?;
        }
        if let Some(node) = fields.get("env") {
            defaults.env = self.env(node, "defaults.env")?;
        }
        Ok(defaults)
    }

    fn task(
        &self,
        node: &Node,
        path: &str,
        defaults: &Defaults,
    ) -> Result<(TaskSpec, TaskLines), SpecError> {
        let fields = self.fields(node, path, TASK_FIELDS)?;
        let field = |name: &str| join(path, name);

        let Some(name_node) = fields.get("name") else {
            return Err(self.missing(&fields, "name"));
        };
        let name = self.name(name_node, &field("name"))?;

        let command = fields
            .get("command")
            .map(|n| self.non_empty_string(n, &field("command")))
            .transpose()?;
        let argv = match fields.get("argv") {
            Some(node) => {
                let Value::Seq(items) = &node.value else {
                    return Err(self.type_err(node, &field("argv"), "a list of strings"));
                };
                if items.is_empty() {
                    return Err(self.err(node.line, field("argv"), "must not be empty"));
                }
                let argv = items
                    .iter()
                    .enumerate()
                    .map(|(j, item)| self.string(item, &format!("{path}.argv[{j}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                Some((node.line, argv))
            }
            None => None,
        };
        let (command, argv) = match (command, argv) {
            (Some(_), Some((line, _))) => {
                return Err(self.err(
                    line,
                    field("argv"),
                    "command and argv exclude each other; give one of them",
                ));
            }
            (None, None) => {
                return Err(self.err(node.line, path, "one of command or argv is required"));
            }
            (Some(command), None) => (command, Vec::new()),
            (None, Some((_, argv))) => (String::new(), argv),
        };

        let timeout_ms = match fields.get("timeout") {
            Some(n) => self.duration(n, &field("timeout"))?,
            None => defaults.timeout_ms.unwrap_or(0),
        };
        let retries = match fields.get("retries") {
            Some(n) => self.integer(n, &field("retries"), 0, u32::MAX.into())? as u32,
            None => defaults.retries.unwrap_or(0),
        };
        let retry_backoff_ms = match fields.get("retry_backoff") {
            Some(n) => self.duration(n, &field("retry_backoff"))?,
            None => defaults
                .retry_backoff_ms
                .unwrap_or(DEFAULT_RETRY_BACKOFF_MS),
        };
        let mut env = defaults.env.clone();
        if let Some(n) = fields.get("env") {
            env.extend(self.env(n, &field("env"))?);
        }
        let mut labels = defaults.labels.clone();
        if let Some(n) = fields.get("labels") {
            labels.extend(self.labels(n, &field("labels"))?);
        }
        let working_dir = fields
            .get("working_dir")
            .map(|n| self.non_empty_string(n, &field("working_dir")))
            .transpose()?;
        let priority = match fields.get("priority") {
            Some(n) => {
                self.integer(n, &field("priority"), i32::MIN.into(), i32::MAX.into())? as i32
            }
            None => 0,
        };

        let mut upstream = Vec::new();
        let mut upstream_lines = Vec::new();
        if let Some(n) = fields.get("upstream") {
            match &n.value {
                Value::Seq(items) => {
                    for (j, item) in items.iter().enumerate() {
                        upstream.push(self.string(item, &format!("{path}.upstream[{j}]"))?);
                        upstream_lines.push(item.line);
                    }
                }
                Value::Scalar { .. } => {
                    upstream.push(self.string(n, &field("upstream"))?);
                    upstream_lines.push(n.line);
                }
                Value::Map(_) => {
                    return Err(self.type_err(
                        n,
                        &field("upstream"),
                        "a task name or a list of task names",
                    ));
                }
            }
        }

        let concurrency = match fields.get("concurrency") {
            Some(n) => self.integer(n, &field("concurrency"), 0, u32::MAX.into())? as u32,
            None => 0,
        };
        let pool = fields
            .get("pool")
            .map(|n| self.name(n, &field("pool")))
            .transpose()?;
        let routing = match fields.get("routing") {
            Some(n) => {
                let text = self.non_empty_string(n, &field("routing"))?;
                Routing::ALL
                    .into_iter()
                    .find(|routing| routing.as_str() == text)
                    .ok_or_else(|| {
                        self.err(
                            n.line,
                            field("routing"),
                            format!(
                                "unknown routing \"{text}\": expected default, least_running, \
                                 round_robin, random, consistent_hash, failover or \
                                 sharded_broadcast"
                            ),
                        )
                    })?
            }
            None => Routing::Default,
        };

        let unfenced = match fields.get("self_fence") {
            Some(n) => !self.boolean(n, &field("self_fence"))?,
            None => false,
        };

        let task = TaskSpec {
            name,
            command,
            argv,
            env,
            working_dir,
            timeout_ms,
            retries,
            retry_backoff_ms,
            labels,
            priority,
            upstream,
            concurrency,
            pool,
            routing,
            unfenced,
        };
        let lines = TaskLines {
            task: node.line,
            name: name_node.line,
            upstream: upstream_lines,
        };
        Ok((task, lines))
    }

    fn dag_error(&self, error: DagError, tasks: &[TaskSpec], lines: &[TaskLines]) -> SpecError {
        let upstream_entry = |index: usize, upstream_index: usize, message: String| {
            let line = lines[index]
                .upstream
                .get(upstream_index)
                .copied()
                .unwrap_or(lines[index].task);
            self.err(
                line,
                format!("tasks[{index}].upstream[{upstream_index}]"),
                message,
            )
        };
        match error {
            DagError::DuplicateTask {
                name,
                index,
                first_index,
            } => self.err(
                lines[index].name,
                format!("tasks[{index}].name"),
                format!(
                    "duplicate task name \"{name}\" (first defined at line {})",
                    lines[first_index].name
                ),
            ),
            DagError::UnknownUpstream {
                upstream,
                index,
                upstream_index,
                ..
            } => upstream_entry(
                index,
                upstream_index,
                format!("unknown task \"{upstream}\""),
            ),
            DagError::SelfDependency {
                task,
                index,
                upstream_index,
            } => upstream_entry(
                index,
                upstream_index,
                format!("cycle: {task} → {task} (task \"{task}\" cannot depend on itself)"),
            ),
            DagError::DuplicateUpstream {
                upstream,
                index,
                upstream_index,
                first_upstream_index,
                ..
            } => upstream_entry(
                index,
                upstream_index,
                format!(
                    "upstream \"{upstream}\" is listed twice (first as upstream[{first_upstream_index}])"
                ),
            ),
            DagError::Cycle { ref path } => {
                let index = path
                    .first()
                    .and_then(|first| tasks.iter().position(|t| &t.name == first))
                    .unwrap_or(0);
                self.err(
                    lines[index].task,
                    format!("tasks[{index}]"),
                    error.to_string(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "wf.yaml";

    /// The canonical example of the file format (the one in the module documentation, with a
    /// valid DAG).
    const EXAMPLE: &str = "
        name: daily-sales-etl          # required
        app: analytics
        owner: data-team@example.com
        description: Nightly sales rollup
        schedule:
          cron: \"30 2 * * *\"
          timezone: Asia/Shanghai
        defaults:
          timeout: 30m
          retries: 2
          retry_backoff: 10s
          labels: {pool: etl}
          env: {TZ: UTC}
        tasks:
          - name: extract_orders
            command: ./extract.sh orders
            timeout: 10m
            retries: 3
            retry_backoff: 30s
            env: {SOURCE: orders, TZ: Asia/Shanghai}
            working_dir: /tmp
            labels: {region: cn}
            priority: 10
          - name: extract_refunds
            argv: [./extract.sh, refunds]
          - name: load
            command: ./load.sh
            upstream: [extract_orders, extract_refunds]
          - name: report
            command: ./report.sh
            upstream: load
    ";

    /// Drops the first line break and the common indentation, so test files can be indented
    /// with the code; line 1 is the first line after the opening quote.
    fn doc(text: &str) -> String {
        let text = text.strip_prefix('\n').unwrap_or(text);
        let indent = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        text.lines()
            .map(|l| l.get(indent..).unwrap_or("").trim_end())
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }

    /// Stands in for `CronSchedule::parse`: 5 or 6 fields, or a few macros.
    fn fake_cron(expr: &str) -> Result<(), String> {
        if expr.starts_with('@') {
            return match expr {
                "@hourly" | "@daily" | "@weekly" | "@monthly" | "@yearly" => Ok(()),
                _ => Err(format!("unknown macro {expr}")),
            };
        }
        match expr.split_whitespace().count() {
            5 | 6 => Ok(()),
            n => Err(format!("expected 5 or 6 fields, found {n}")),
        }
    }

    fn parse(yaml: &str) -> Result<ParsedWorkflow, SpecError> {
        parse_workflow(&doc(yaml), FILE, &fake_cron)
    }

    fn parse_ok(yaml: &str) -> ParsedWorkflow {
        match parse(yaml) {
            Ok(parsed) => parsed,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[track_caller]
    fn check_err(yaml: &str, expected: &str) {
        match parse(yaml) {
            Ok(parsed) => panic!("expected `{expected}`, but it parsed: {parsed:?}"),
            Err(e) => assert_eq!(e.to_string(), expected),
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn canonical_example_round_trip() {
        let parsed = parse_ok(EXAMPLE);
        let expected = WorkflowSpec {
            name: "daily-sales-etl".into(),
            app: "analytics".into(),
            owner: "data-team@example.com".into(),
            description: "Nightly sales rollup".into(),
            schedule: ScheduleSpec {
                trigger: TriggerKind::Cron,
                cron: Some("30 2 * * *".into()),
                timezone: "Asia/Shanghai".into(),
                ..ScheduleSpec::default()
            },
            concurrency: ConcurrencySpec::default(),
            tasks: vec![
                TaskSpec {
                    name: "extract_orders".into(),
                    command: "./extract.sh orders".into(),
                    argv: vec![],
                    env: map(&[("SOURCE", "orders"), ("TZ", "Asia/Shanghai")]),
                    working_dir: Some("/tmp".into()),
                    timeout_ms: 600_000,
                    retries: 3,
                    retry_backoff_ms: 30_000,
                    labels: map(&[("pool", "etl"), ("region", "cn")]),
                    priority: 10,
                    upstream: vec![],
                    ..TaskSpec::default()
                },
                TaskSpec {
                    name: "extract_refunds".into(),
                    command: String::new(),
                    argv: strings(&["./extract.sh", "refunds"]),
                    env: map(&[("TZ", "UTC")]),
                    working_dir: None,
                    timeout_ms: 1_800_000,
                    retries: 2,
                    retry_backoff_ms: 10_000,
                    labels: map(&[("pool", "etl")]),
                    priority: 0,
                    upstream: vec![],
                    ..TaskSpec::default()
                },
                TaskSpec {
                    name: "load".into(),
                    command: "./load.sh".into(),
                    env: map(&[("TZ", "UTC")]),
                    timeout_ms: 1_800_000,
                    retries: 2,
                    retry_backoff_ms: 10_000,
                    labels: map(&[("pool", "etl")]),
                    upstream: strings(&["extract_orders", "extract_refunds"]),
                    ..TaskSpec::default()
                },
                TaskSpec {
                    name: "report".into(),
                    command: "./report.sh".into(),
                    env: map(&[("TZ", "UTC")]),
                    timeout_ms: 1_800_000,
                    retries: 2,
                    retry_backoff_ms: 10_000,
                    labels: map(&[("pool", "etl")]),
                    upstream: strings(&["load"]),
                    ..TaskSpec::default()
                },
            ],
        };
        assert_eq!(parsed.spec, expected);
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);

        // The model survives serialization unchanged (the store and the API carry it as JSON).
        let json = serde_json::to_string(&parsed.spec).unwrap();
        let back: WorkflowSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, parsed.spec);

        let dag = parsed.spec.dag().unwrap();
        assert_eq!(dag.roots(), ["extract_orders", "extract_refunds"]);
        assert_eq!(dag.downstream("load"), ["report"]);
    }

    #[test]
    fn minimal_workflow_gets_the_defaults() {
        let parsed = parse_ok(
            "
            name: one
            tasks:
              - name: only
                command: echo hi
            ",
        );
        assert_eq!(parsed.spec.app, DEFAULT_APP);
        assert_eq!(parsed.spec.schedule, ScheduleSpec::default());
        assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Manual);
        let task = &parsed.spec.tasks[0];
        assert_eq!(task.timeout_ms, 0);
        assert_eq!(task.retries, 0);
        assert_eq!(task.retry_backoff_ms, DEFAULT_RETRY_BACKOFF_MS);
        assert_eq!(task.priority, 0);
        assert!(task.env.is_empty() && task.labels.is_empty() && task.upstream.is_empty());
        // A lone task is a workflow of one, not an isolated task.
        assert!(parsed.warnings.is_empty());
    }

    #[test]
    fn nulls_mean_absent_and_schedule_without_cron_is_manual() {
        let parsed = parse_ok(
            "
            name: etl
            owner:
            description: ~
            schedule:
              timezone: Europe/Paris
            defaults:
            tasks:
              - name: a
                command: x
                upstream:
                priority: -2147483648
            ",
        );
        assert_eq!(parsed.spec.owner, "");
        assert_eq!(parsed.spec.description, "");
        assert_eq!(
            parsed.spec.schedule,
            ScheduleSpec {
                trigger: TriggerKind::Manual,
                cron: None,
                timezone: "Europe/Paris".into(),
                ..ScheduleSpec::default()
            }
        );
        assert_eq!(parsed.spec.tasks[0].priority, i32::MIN);
    }

    #[test]
    fn scalars_become_strings_where_strings_are_expected() {
        let parsed = parse_ok(
            "
            name: 2024
            schedule: {cron: '@daily'}
            tasks:
              - name: a
                argv: [sleep, 10]
                env: {PORT: 8080, DEBUG: true, EMPTY: ''}
                timeout: 90
                retry_backoff: '500ms'
            ",
        );
        assert_eq!(parsed.spec.name, "2024");
        assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Cron);
        let task = &parsed.spec.tasks[0];
        assert_eq!(task.argv, ["sleep", "10"]);
        assert_eq!(
            task.env,
            map(&[("PORT", "8080"), ("DEBUG", "true"), ("EMPTY", "")])
        );
        assert_eq!(task.timeout_ms, 90_000);
        assert_eq!(task.retry_backoff_ms, 500);
    }

    #[test]
    fn isolated_tasks_are_warnings() {
        let parsed = parse_ok(
            "
            name: etl
            tasks:
              - {name: a, command: x}
              - {name: b, command: x, upstream: a}
              - {name: lonely, command: x}
              - {name: alone, command: x}
            ",
        );
        assert_eq!(
            parsed.warnings,
            [
                "task lonely has no upstream and no downstream",
                "task alone has no upstream and no downstream"
            ]
        );
    }

    #[test]
    fn durations() {
        for (text, ms) in [
            ("0", 0),
            ("90", 90_000),
            ("500ms", 500),
            ("45s", 45_000),
            ("10m", 600_000),
            ("2h", 7_200_000),
            ("1h30m", 5_400_000),
            ("1h30m15s500ms", 5_415_500),
            ("0s", 0),
        ] {
            assert_eq!(parse_duration_ms(text), Ok(ms), "{text}");
        }
        for text in [
            "", "1.5h", "30m1h", "1h1h", "10x", "-5s", "-5", "h", "10 m", "1d", "5ms3s",
        ] {
            assert!(parse_duration_ms(text).is_err(), "{text} must be refused");
        }
        assert_eq!(
            parse_duration_ms("99999999999999999h"),
            Err("duration \"99999999999999999h\" is too large".to_string())
        );
        assert_eq!(
            parse_duration_ms("99999999999999999999"),
            Err("duration \"99999999999999999999\" is too large".to_string())
        );
    }

    #[test]
    fn names() {
        for ok in ["a", "0", "daily-sales-etl", "x.y_z", &"a".repeat(64)] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "A", "-a", "_a", ".a", "a b", "été", &"a".repeat(65)] {
            assert!(!is_valid_name(bad), "{bad}");
        }
        for ok in ["A", "_", "PATH", "my_var2"] {
            assert!(is_valid_env_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A.B", "É"] {
            assert!(!is_valid_env_name(bad), "{bad}");
        }
    }

    #[test]
    fn self_fence_is_on_unless_a_task_opts_out() {
        let parsed = parse_ok(
            "
            name: etl
            tasks:
              - {name: a, command: x}
              - {name: b, command: x, self_fence: false}
              - {name: c, command: x, self_fence: true}
            ",
        );
        let unfenced: Vec<bool> = parsed.spec.tasks.iter().map(|t| t.unfenced).collect();
        assert_eq!(unfenced, [false, true, false]);
    }

    #[test]
    fn unknown_fields_name_the_allowed_ones() {
        check_err(
            "
            name: etl
            schedul:
              cron: '0 * * * *'
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:2: schedul: unknown field \"schedul\"; allowed fields: name, app, owner, \
             description, schedule, concurrency, defaults, tasks",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                retires: 3
            ",
            "wf.yaml:5: tasks[0].retires: unknown field \"retires\"; allowed fields: name, command, \
             argv, timeout, retries, retry_backoff, env, working_dir, labels, priority, upstream, \
             concurrency, pool, routing, self_fence",
        );
        check_err(
            "
            name: etl
            schedule:
              cron: '0 * * * *'
              trigger: cron
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:4: schedule.trigger: unknown field \"trigger\"; allowed fields: cron, timezone, \
             misfire, max_catch_up, overlap, max_active_runs, start, end, after",
        );
        check_err(
            "
            name: etl
            defaults:
              priority: 3
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: defaults.priority: unknown field \"priority\"; allowed fields: timeout, \
             retries, retry_backoff, labels, env",
        );
    }

    #[test]
    fn wrong_types() {
        check_err(
            "- a\n",
            "wf.yaml:1: (root): expected a mapping, found a list",
        );
        check_err(
            "just text\n",
            "wf.yaml:1: (root): expected a mapping, found a string",
        );
        check_err(
            "
            name: [etl]
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:1: name: expected a string, found a list",
        );
        check_err(
            "
            name: etl
            tasks: {a: {command: x}}
            ",
            "wf.yaml:2: tasks: expected a list of tasks, found a mapping",
        );
        check_err(
            "
            name: etl
            schedule: daily
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:2: schedule: expected a mapping, found a string",
        );
        check_err(
            "
            name: etl
            tasks:
              - just-a-name
            ",
            "wf.yaml:3: tasks[0]: expected a mapping, found a string",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                env: [A]
            ",
            "wf.yaml:5: tasks[0].env: expected a mapping, found a list",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                env: {A: [1]}
            ",
            "wf.yaml:5: tasks[0].env.A: expected a string, found a list",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                retries: '3'
            ",
            "wf.yaml:5: tasks[0].retries: expected an integer, found a string",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                priority: 1.5
            ",
            "wf.yaml:5: tasks[0].priority: expected an integer, found a number",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                self_fence: 'no'
            ",
            "wf.yaml:5: tasks[0].self_fence: expected true or false, found a string",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                argv: ./run.sh
            ",
            "wf.yaml:4: tasks[0].argv: expected a list of strings, found a string",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                argv:
                  - ./run.sh
                  - {x: 1}
            ",
            "wf.yaml:6: tasks[0].argv[1]: expected a string, found a mapping",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: {b: 1}
            ",
            "wf.yaml:5: tasks[0].upstream: expected a task name or a list of task names, found a mapping",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: [1]
            ",
            "wf.yaml:5: tasks[0].timeout: expected a duration, found a list",
        );
        check_err(
            "
            name: etl
            {[a]: 1}: x
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:2: (root): keys must be strings, found a mapping",
        );
    }

    #[test]
    fn missing_required_fields() {
        check_err(
            "
            app: analytics
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:1: name: missing required field",
        );
        check_err("name: etl\n", "wf.yaml:1: tasks: missing required field");
        check_err(
            "
            name: etl
            tasks:
            ",
            "wf.yaml:2: tasks: missing required field",
        );
        check_err(
            "
            name: etl
            tasks: []
            ",
            "wf.yaml:2: tasks: at least one task is required",
        );
        check_err(
            "
            name: etl
            tasks:
              - command: x
                priority: 1
            ",
            "wf.yaml:3: tasks[0].name: missing required field",
        );
        check_err("", "wf.yaml:0: (root): the file holds no workflow");
        check_err(
            "# only a comment\n",
            "wf.yaml:0: (root): the file holds no workflow",
        );
    }

    #[test]
    fn bad_names() {
        let rule = "expected 1 to 64 of a-z, 0-9, '_', '.', '-', starting with a letter or digit";
        check_err(
            "
            name: Daily ETL
            tasks: [{name: a, command: x}]
            ",
            &format!("wf.yaml:1: name: invalid name \"Daily ETL\": {rule}"),
        );
        check_err(
            "
            name: etl
            app: My App
            tasks: [{name: a, command: x}]
            ",
            &format!("wf.yaml:2: app: invalid name \"My App\": {rule}"),
        );
        check_err(
            &format!(
                "
                name: etl
                tasks:
                  - name: a
                    command: x
                  - name: {}
                    command: x
                ",
                "b".repeat(65)
            ),
            &format!(
                "wf.yaml:5: tasks[1].name: invalid name \"{}\": {rule}",
                "b".repeat(65)
            ),
        );
        check_err(
            "
            name: etl
            tasks:
              - name: -a
                command: x
            ",
            &format!("wf.yaml:3: tasks[0].name: invalid name \"-a\": {rule}"),
        );
    }

    #[test]
    fn bad_durations_and_numbers() {
        let forms = "expected a form like 500ms, 45s, 10m, 2h, 1h30m or a whole number of seconds";
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: 1.5h
            ",
            &format!("wf.yaml:5: tasks[0].timeout: invalid duration \"1.5h\": {forms}"),
        );
        check_err(
            "
            name: etl
            defaults:
              retry_backoff: 30m1h
            tasks: [{name: a, command: x}]
            ",
            &format!("wf.yaml:3: defaults.retry_backoff: invalid duration \"30m1h\": {forms}"),
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: -5
            ",
            &format!("wf.yaml:5: tasks[0].timeout: invalid duration \"-5\": {forms}"),
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                timeout: 99999999999999999999h
            ",
            "wf.yaml:5: tasks[0].timeout: duration \"99999999999999999999h\" is too large",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                retries: -1
            ",
            "wf.yaml:5: tasks[0].retries: must be between 0 and 4294967295, found -1",
        );
        check_err(
            "
            name: etl
            defaults:
              retries: 4294967296
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: defaults.retries: must be between 0 and 4294967295, found 4294967296",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                priority: 2147483648
            ",
            "wf.yaml:5: tasks[0].priority: must be between -2147483648 and 2147483647, found 2147483648",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                retries: 99999999999999999999999
            ",
            "wf.yaml:5: tasks[0].retries: must be between 0 and 4294967295, found 99999999999999999999999",
        );
    }

    #[test]
    fn env_and_labels() {
        let rule = "expected [A-Za-z_][A-Za-z0-9_]*";
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  GOOD: 1
                  1BAD: 2
            ",
            &format!(
                "wf.yaml:7: tasks[0].env.1BAD: invalid environment variable name \"1BAD\": {rule}"
            ),
        );
        check_err(
            "
            name: etl
            defaults:
              env: {A-B: x}
            tasks: [{name: a, command: x}]
            ",
            &format!(
                "wf.yaml:3: defaults.env.A-B: invalid environment variable name \"A-B\": {rule}"
            ),
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                labels: {'': x}
            ",
            "wf.yaml:5: tasks[0].labels.: label names must not be empty",
        );
    }

    #[test]
    fn command_and_argv() {
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                argv: [x]
            ",
            "wf.yaml:5: tasks[0].argv: command and argv exclude each other; give one of them",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                priority: 1
            ",
            "wf.yaml:3: tasks[0]: one of command or argv is required",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: '  '
            ",
            "wf.yaml:4: tasks[0].command: must not be empty",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                argv: []
            ",
            "wf.yaml:4: tasks[0].argv: must not be empty",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                working_dir: ''
            ",
            "wf.yaml:5: tasks[0].working_dir: must not be empty",
        );
    }

    #[test]
    fn graph_errors_point_at_the_line() {
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
              - name: b
                command: x
              - name: a
                command: y
            ",
            "wf.yaml:7: tasks[2].name: duplicate task name \"a\" (first defined at line 3)",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
              - name: b
                command: x
                upstream:
                  - a
                  - nope
            ",
            "wf.yaml:9: tasks[1].upstream[1]: unknown task \"nope\"",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: ghost
            ",
            "wf.yaml:5: tasks[0].upstream[0]: unknown task \"ghost\"",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: [a]
            ",
            "wf.yaml:5: tasks[0].upstream[0]: cycle: a → a (task \"a\" cannot depend on itself)",
        );
        check_err(
            "
            name: etl
            tasks:
              - {name: a, command: x}
              - {name: b, command: x, upstream: [a, a]}
            ",
            "wf.yaml:4: tasks[1].upstream[1]: upstream \"a\" is listed twice (first as upstream[0])",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                upstream: [c]
              - name: b
                command: x
                upstream: [a]
              - name: c
                command: x
                upstream: [b]
            ",
            "wf.yaml:3: tasks[0]: cycle: a → b → c → a",
        );
        check_err(
            "
            name: etl
            tasks:
              - {name: start, command: x}
              - {name: x, command: x, upstream: [start, z]}
              - {name: y, command: x, upstream: x}
              - {name: z, command: x, upstream: y}
            ",
            "wf.yaml:4: tasks[1]: cycle: x → y → z → x",
        );
    }

    #[test]
    fn a_trigger_must_give_the_params_the_key_names() {
        let keyed = parse_ok(
            "{name: etl, concurrency: {key: '${customer}-${region}-${customer}'}, \
             tasks: [{name: a, command: x}]}",
        );
        let concurrency = &keyed.spec.concurrency;
        let params = map(&[("customer", "acme")]);
        assert_eq!(concurrency.missing_key_params(&params), ["region"]);
        assert_eq!(
            concurrency.missing_key_params(&map(&[])),
            ["customer", "region"]
        );
        let err = concurrency.check_trigger_params(&params).unwrap_err();
        assert!(
            err.starts_with("missing param region for concurrency.key \"${customer}-${region}"),
            "{err}"
        );
        assert!(err.contains("--param region=VALUE"), "{err}");
        let full = map(&[("customer", "acme"), ("region", "eu")]);
        assert_eq!(concurrency.check_trigger_params(&full), Ok(()));
        // Without a key nothing is required.
        assert_eq!(
            ConcurrencySpec::default().check_trigger_params(&map(&[])),
            Ok(())
        );
    }

    #[test]
    fn schedule_policies_and_concurrency() {
        let parsed = parse_ok(
            "
            name: etl
            schedule:
              cron: '0 2 * * *'
              timezone: Asia/Shanghai
              misfire: catch_up
              max_catch_up: 3
              overlap: queue
              max_active_runs: 2
              start: 2026-01-01
              end: 2026-06-30T18:00:00Z
            concurrency:
              max_running_tasks: 10
              key: 'cust-${customer}-${region}'
              max_runs_per_key: 2
            tasks:
              - {name: a, command: x, concurrency: 3, pool: etl, routing: sharded_broadcast}
              - {name: b, command: x, upstream: a}
            ",
        );
        let schedule = &parsed.spec.schedule;
        assert_eq!(schedule.misfire, MisfirePolicy::CatchUp { max: 3 });
        assert_eq!(schedule.overlap, OverlapPolicy::Queue);
        assert_eq!(schedule.max_active_runs, 2);
        // Midnight in Shanghai is 16:00 UTC the day before.
        assert_eq!(schedule.start_at, Some(1_767_196_800_000));
        assert_eq!(schedule.end_at, Some(1_782_842_400_000));
        let concurrency = &parsed.spec.concurrency;
        assert_eq!(concurrency.max_running_tasks, 10);
        assert_eq!(concurrency.max_runs_per_key, 2);
        let params = map(&[("customer", "acme"), ("region", "eu")]);
        assert_eq!(
            concurrency.run_key(&params).as_deref(),
            Some("cust-acme-eu")
        );
        assert_eq!(
            concurrency.run_key(&map(&[])).as_deref(),
            Some("cust--"),
            "a missing param is empty"
        );
        let a = &parsed.spec.tasks[0];
        assert_eq!((a.concurrency, a.pool.as_deref()), (3, Some("etl")));
        assert_eq!(a.routing, Routing::ShardedBroadcast);
        assert_eq!(parsed.spec.tasks[1].routing, Routing::Default);

        let defaults = parse_ok("{name: etl, tasks: [{name: a, command: x}]}").spec;
        assert_eq!(defaults.schedule.misfire, MisfirePolicy::FireOnce);
        assert_eq!(defaults.schedule.overlap, OverlapPolicy::Allow);
        assert_eq!(defaults.concurrency, ConcurrencySpec::default());
        assert_eq!(defaults.concurrency.run_key(&params), None);
        let keyed =
            parse_ok("{name: etl, concurrency: {key: '${c}'}, tasks: [{name: a, command: x}]}");
        assert_eq!(keyed.spec.concurrency.max_runs_per_key, 1);
    }

    #[test]
    fn a_dependency_trigger_names_its_upstream_workflows() {
        let parsed = parse_ok(
            "
            name: report
            schedule: {after: [ingest, dims]}
            tasks: [{name: a, command: x}]
            ",
        );
        assert_eq!(parsed.spec.schedule.trigger, TriggerKind::Dependency);
        assert_eq!(parsed.spec.schedule.after, strings(&["ingest", "dims"]));
        let single =
            parse_ok("{name: r, schedule: {after: ingest}, tasks: [{name: a, command: x}]}");
        assert_eq!(single.spec.schedule.after, strings(&["ingest"]));

        check_err(
            "
            name: report
            schedule:
              cron: '0 2 * * *'
              after: [ingest]
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:4: schedule.after: cron and after exclude each other: a workflow is started \
             by its clock or by its upstream workflows",
        );
        check_err(
            "
            name: report
            schedule: {after: [ingest, ingest]}
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:2: schedule.after[1]: workflow ingest is listed twice",
        );
        check_err(
            "
            name: report
            schedule:
              after: [report]
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: schedule.after: workflow report cannot depend on itself",
        );
        check_err(
            "
            name: report
            schedule:
              after: [Bad Name]
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: schedule.after[0]: invalid name \"Bad Name\": expected 1 to 64 of a-z, 0-9, \
             '_', '.', '-', starting with a letter or digit",
        );
    }

    #[test]
    fn policy_errors() {
        let cases = [
            (
                "schedule: {cron: '0 2 * * *', misfire: later}",
                "wf.yaml:2: schedule.misfire: unknown misfire policy \"later\": expected skip, \
                 fire_once or catch_up",
            ),
            (
                "schedule: {cron: '0 2 * * *', max_catch_up: 3}",
                "wf.yaml:2: schedule.max_catch_up: only meaningful with misfire: catch_up",
            ),
            (
                "schedule: {cron: '0 2 * * *', misfire: catch_up, max_catch_up: 0}",
                "wf.yaml:2: schedule.max_catch_up: must be between 1 and 10000, found 0",
            ),
            (
                "schedule: {cron: '0 2 * * *', overlap: sometimes}",
                "wf.yaml:2: schedule.overlap: unknown overlap policy \"sometimes\": expected \
                 allow, skip, queue or replace",
            ),
            (
                "schedule: {cron: '0 2 * * *', start: tomorrow}",
                "wf.yaml:2: schedule.start: invalid date \"tomorrow\": expected 2026-01-31, \
                 2026-01-31T08:30:00 or 2026-01-31T08:30:00+08:00",
            ),
            (
                "schedule: {cron: '0 2 * * *', start: 2026-02-01, end: 2026-01-01}",
                "wf.yaml:2: schedule.end: is before schedule.start",
            ),
            (
                "concurrency: {key: customer}",
                "wf.yaml:2: concurrency.key: key template \"customer\" names no param: use \
                 ${name}, e.g. \"${customer}\"",
            ),
            (
                "concurrency: {key: '${cust-id}'}",
                "wf.yaml:2: concurrency.key: \"${cust-id}\" in key template \"${cust-id}\" is not \
                 a param name ([A-Za-z_][A-Za-z0-9_]*)",
            ),
            (
                "concurrency: {key: '${c'}",
                "wf.yaml:2: concurrency.key: unclosed \"${\" in key template \"${c\"",
            ),
            (
                "concurrency: {max_runs_per_key: 2}",
                "wf.yaml:2: concurrency.max_runs_per_key: only meaningful with concurrency.key",
            ),
            (
                "concurrency: {limit: 2}",
                "wf.yaml:2: concurrency.limit: unknown field \"limit\"; allowed fields: \
                 max_running_tasks, key, max_runs_per_key",
            ),
        ];
        for (line, expected) in cases {
            check_err(
                &format!("name: etl\n{line}\ntasks: [{{name: a, command: x}}]\n"),
                expected,
            );
        }
        check_err(
            "name: etl\ntasks: [{name: a, command: x, routing: nearest}]\n",
            "wf.yaml:2: tasks[0].routing: unknown routing \"nearest\": expected default, \
             least_running, round_robin, random, consistent_hash, failover or sharded_broadcast",
        );
        check_err(
            "name: etl\ntasks: [{name: a, command: x, pool: ETL}]\n",
            "wf.yaml:2: tasks[0].pool: invalid name \"ETL\": expected 1 to 64 of a-z, 0-9, '_', '.', \
             '-', starting with a letter or digit",
        );
    }

    #[test]
    fn instants_in_a_time_zone() {
        let ny: chrono_tz::Tz = "America/New_York".parse().unwrap();
        // 2026-03-08 02:30 does not exist in New York: it moves past the gap to 03:00 EDT.
        assert_eq!(
            parse_instant("2026-03-08T02:30", ny),
            parse_instant("2026-03-08T03:00:00-04:00", chrono_tz::UTC)
        );
        // 2026-11-01 01:30 happens twice: the first (EDT) is taken.
        assert_eq!(
            parse_instant("2026-11-01 01:30:00", ny),
            parse_instant("2026-11-01T05:30:00Z", chrono_tz::UTC)
        );
        assert_eq!(parse_instant("2026-13-01", ny), None);
        assert_eq!(parse_instant("", ny), None);
    }

    #[test]
    fn schedule_errors() {
        check_err(
            "
            name: etl
            schedule:
              cron: '* * *'
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: schedule.cron: invalid cron expression \"* * *\": expected 5 or 6 fields, found 3",
        );
        check_err(
            "
            name: etl
            schedule:
              cron: '0 3 * * *'
              timezone: Mars/Olympus_Mons
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:4: schedule.timezone: unknown time zone \"Mars/Olympus_Mons\": expected an \
             IANA name such as UTC or Asia/Shanghai",
        );
        check_err(
            "
            name: etl
            schedule:
              cron: ''
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:3: schedule.cron: must not be empty",
        );
    }

    #[test]
    fn duplicate_keys() {
        check_err(
            "
            name: etl
            name: other
            tasks: [{name: a, command: x}]
            ",
            "wf.yaml:2: name: duplicate key \"name\" (first at line 1)",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                env:
                  A: 1
                  A: 2
            ",
            "wf.yaml:7: tasks[0].env.A: duplicate key \"A\" (first at line 6)",
        );
        check_err(
            "
            name: etl
            tasks:
              - name: a
                command: x
                command: y
            ",
            "wf.yaml:5: tasks[0].command: duplicate key \"command\" (first at line 4)",
        );
    }

    #[test]
    fn yaml_level_errors() {
        check_err(
            "
            name: etl
             tasks: x
            ",
            "wf.yaml:2: (yaml): mapping values are not allowed in this context",
        );
        check_err(
            "
            name: etl
            tasks: [{name: a, command: x}]
            ---
            name: other
            ",
            "wf.yaml:3: (yaml): a workflow file holds exactly one YAML document",
        );
        check_err(
            "
            name: &n etl
            tasks: [{name: *n, command: x}]
            ",
            "wf.yaml:2: (yaml): YAML aliases are not supported",
        );
        // Deep nesting is refused early instead of building (and later dropping) a deep tree.
        let deep = format!("name: etl\ntasks: {}\n", "[".repeat(40));
        assert_eq!(
            parse_workflow(&deep, FILE, &fake_cron)
                .unwrap_err()
                .to_string(),
            "wf.yaml:2: (yaml): nesting deeper than 32 levels"
        );
        // Far deeper nesting is stopped by the scanner itself, without exhausting the stack.
        let deeper = format!("name: etl\ntasks: {}\n", "[".repeat(100_000));
        assert_eq!(
            parse_workflow(&deeper, FILE, &fake_cron)
                .unwrap_err()
                .to_string(),
            "wf.yaml:2: (yaml): recursion limit exceeded"
        );
    }

    #[test]
    fn wide_file_parses() {
        let mut yaml = String::from("name: big\ntasks:\n");
        for i in 0..2_000 {
            yaml.push_str(&format!("  - name: t{i}\n    command: run {i}\n"));
            if i > 0 {
                yaml.push_str(&format!("    upstream: t{}\n", i - 1));
            }
        }
        let parsed = parse_workflow(&yaml, FILE, &fake_cron).unwrap();
        assert_eq!(parsed.spec.tasks.len(), 2_000);
        assert_eq!(parsed.spec.dag().unwrap().roots(), ["t0"]);
    }
}
