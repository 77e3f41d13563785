//! The workflow model: what a workflow file means once it is read and checked, and what the
//! store keeps (as JSON) for every applied version.

use std::collections::BTreeMap;
use std::fmt;

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use super::template::{self, Piece};
use crate::dag::{Dag, DagError};
use crate::trigger_rule::TriggerRule;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerKind {
    Cron,
    Manual,
    Api,
    Dependency,
    /// A slot of `axctl backfill`.
    Backfill,
    /// Started by a `run_workflow` task of another run (`crate::sub_workflow`).
    Parent,
}

impl TriggerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::Cron => "cron",
            TriggerKind::Manual => "manual",
            TriggerKind::Api => "api",
            TriggerKind::Dependency => "dependency",
            TriggerKind::Backfill => "backfill",
            TriggerKind::Parent => "parent",
        }
    }

    pub fn parse(s: &str) -> Option<TriggerKind> {
        [
            Self::Cron,
            Self::Manual,
            Self::Api,
            Self::Dependency,
            Self::Backfill,
            Self::Parent,
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
        for piece in template::pieces(template) {
            match piece {
                Piece::Text(text) | Piece::Unclosed(text) => out.push_str(text),
                Piece::Param(name) => {
                    if let Some(value) = params.get(name) {
                        out.push_str(value);
                    }
                }
            }
        }
        Some(out)
    }

    /// The params the key template names that `params` lacks, in template order (empty when
    /// the workflow has no key or every one is given).
    pub fn missing_key_params(&self, params: &BTreeMap<String, String>) -> Vec<String> {
        let Some(template) = self.key.as_deref() else {
            return Vec::new();
        };
        let mut missing: Vec<String> = Vec::new();
        for piece in template::pieces(template) {
            if let Piece::Param(name) = piece
                && !params.contains_key(name)
                && !missing.iter().any(|m| m == name)
            {
                missing.push(name.to_string());
            }
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
    /// Environment variables whose values are secrets, by secret name (`{ secret: NAME }`):
    /// the scheduler puts the values in at dispatch; the spec holds only the names.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    /// How long an attempt may run; `None`: as long as it takes. Stored as a number, 0 for
    /// none, as the JSON of every stored workflow version has it.
    #[serde(with = "zero_is_none")]
    pub timeout_ms: Option<NonZeroU64>,
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
    /// `survive_worker_restart: true`: the attempt's process outlives a restart of its worker
    /// (crash, kill -9, upgrade), which takes it back; it costs a holder process per attempt.
    #[serde(default, skip_serializing_if = "is_default")]
    pub survives_worker_restart: bool,
    /// When the task runs given how its direct upstreams ended (`crate::trigger_rule`). Left
    /// out of the stored JSON when it is the default, as for the fields below, so versions
    /// stored before it existed read back (and compare) unchanged.
    #[serde(default, skip_serializing_if = "is_default")]
    pub trigger_rule: TriggerRule,
    /// Set for a task of the workflow's `on_failure` or `on_success` list: it runs once the
    /// run's outcome is known, not as part of the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<Handler>,
    /// `if:`: a CEL expression judged when the task's rule says it runs
    /// (`crate::condition`); false makes it SKIPPED.
    #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// `for_each:`: one instance per item of a list (`crate::for_each`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<crate::for_each::ForEach>,
    /// `max_items:`: the most items `for_each` may give; `None`: the default (10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_items: Option<u32>,
    /// `run_workflow:`: the task starts a run of this workflow (of its app) and ends as that
    /// run ends (`crate::sub_workflow`); it has no command then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_workflow: Option<String>,
    /// `params:` of a `run_workflow` task: the child run's params, each a template over the
    /// run's params (`${params.NAME}`) and upstream outputs (`${tasks.T.outputs.K}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

impl TaskSpec {
    /// The most items this task's `for_each` may give.
    pub fn max_items(&self) -> u32 {
        self.max_items.unwrap_or(crate::for_each::DEFAULT_MAX_ITEMS)
    }
}

impl TaskSpec {
    /// The `${tasks.T.outputs.K}` its command, argv and env name, each once, in order; those
    /// that do not parse are left out (validation refuses them before a spec is stored).
    pub fn output_refs(&self) -> Vec<crate::outputs::OutputRef> {
        let texts = std::iter::once(&self.command)
            .chain(&self.argv)
            .chain(self.env.values())
            .chain(self.params.values());
        let mut refs: Vec<crate::outputs::OutputRef> = texts
            .flat_map(|text| crate::outputs::references(text).unwrap_or_default())
            .collect();
        refs.sort();
        refs.dedup();
        refs
    }
}

/// The lists of tasks a run starts once its graph's outcome is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handler {
    /// `on_failure:`: the graph ended FAILED.
    OnFailure,
    /// `on_success:`: the graph ended SUCCESS.
    OnSuccess,
}

impl Handler {
    /// The field that lists these tasks in a workflow file.
    pub fn field(self) -> &'static str {
        match self {
            Handler::OnFailure => "on_failure",
            Handler::OnSuccess => "on_success",
        }
    }
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// How long a workflow's ended runs are kept before the purger deletes them (`retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retention {
    /// Never purged by retention, whatever the cluster's default (`retention: forever`).
    Forever,
    /// Purged once they ended this long ago (`retention: 90d`); more than zero.
    Keep { ms: u64 },
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
    /// `None`: the cluster's default retention applies. Left out of the stored JSON when unset,
    /// so versions stored before the field existed read back (and compare) unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    pub tasks: Vec<TaskSpec>,
    /// By when a run must have ended (`crate::deadline`); `None`: no deadline. Left out of the
    /// stored JSON when unset, as `on_deadline` when it is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<crate::deadline::Deadline>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_deadline: crate::deadline::OnDeadline,
    /// `params:`: the params a run of this workflow takes, in file order (`crate::params`
    /// fills in their defaults where runs are created). Left out of the stored JSON when none
    /// are declared, so versions stored before the field existed read back unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<ParamSpec>,
}

/// A param a workflow declares: what the trigger form shows and what a run gets when its
/// trigger leaves the param out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    /// What the param is for: the form's help text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The value a run gets when its trigger gives none (scheduled, dependency and backfill
    /// runs always get it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// A trigger must give it: one without it is refused, naming it. Never set with a default.
    #[serde(default, skip_serializing_if = "is_default")]
    pub required: bool,
    /// The only values it may take, when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
}

/// The app of a workflow file that names none.
pub const DEFAULT_APP: &str = "default";
/// The base retry delay of a task that names none (nor through `defaults`).
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 10_000;
/// Missed slots `misfire: catch_up` runs when `max_catch_up` is not given.
pub const DEFAULT_MAX_CATCH_UP: u32 = 10;

impl WorkflowSpec {
    /// The tasks of the graph, without the `on_failure`/`on_success` handlers.
    pub fn graph_tasks(&self) -> impl Iterator<Item = &TaskSpec> {
        self.tasks.iter().filter(|task| task.handler.is_none())
    }

    /// The task graph of this workflow. Always `Ok` for a spec that came out of
    /// [`super::parse_workflow`]; other specs (built by hand, read back from a store) are
    /// checked again.
    pub fn dag(&self) -> Result<Dag, DagError> {
        Dag::new(&self.tasks)
    }
}

/// A number of milliseconds in stored JSON, where 0 stands for none.
mod zero_is_none {
    use std::num::NonZeroU64;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        ms: &Option<NonZeroU64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(ms.map_or(0, NonZeroU64::get))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<NonZeroU64>, D::Error> {
        u64::deserialize(deserializer).map(NonZeroU64::new)
    }
}
