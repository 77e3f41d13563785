//! Alerts: failures, timeouts, lost workers and exhausted retries, sent to webhook channels.
//!
//! The scheduler calls [`Alerter::notify`] from its hot paths (the reporter, the backstops), so
//! `notify` never blocks and never awaits: it puts the alert on each matching channel's bounded
//! queue and returns. One delivery task per channel takes alerts off its queue, applies the
//! channel's rate limit, renders the body in the channel's format and posts it with retries. An
//! alert that cannot be delivered is logged (`warn`, with the channel name and the HTTP status)
//! and counted in [`AlertStats`]; it never holds up scheduling.
//!
//! Channel formats: a generic JSON webhook (schema below), DingTalk, Feishu/Lark, WeCom and Slack
//! incoming webhooks, each rendered as its service documents a plain markdown/text message.
//!
//! # The generic webhook body (schema version 1)
//!
//! Every field is always present (`null` when it does not apply); fields are only ever added,
//! and a change that is not an addition bumps `version`.
//!
//! ```json
//! {
//!   "version": 1,
//!   "kind": "instance_failed",      // run_failed | instance_failed | instance_timeout |
//!                                    // worker_lost | retries_exhausted | task_stalled |
//!                                    // deadline_missed | alerts_suppressed
//!   "workflow": "daily-sales-etl",   // "" for an alert that is not about one workflow
//!   "run_id": 12,                    // integer or null
//!   "instance_id": 34,               // integer or null
//!   "task": "clean",                 // string or null
//!   "attempt": 3,                    // integer or null
//!   "worker": "worker-7",            // string or null
//!   "message": "exit code 1",        // what happened, from the scheduler
//!   "at_ms": 1735689600000,          // when it happened, Unix milliseconds
//!   "suppressed": null,              // alerts_suppressed only: how many alerts were dropped
//!   "text": "[ax] FAILED daily-sales-etl / clean (run 12, instance 34, attempt 3): exit code 1"
//! }
//! ```
//!
//! With a `secret`, a generic webhook request carries `X-Ax-Signature: sha256=<hex>`, the
//! HMAC-SHA256 of the exact body bytes keyed with the secret.
//!
//! # Configuration
//!
//! ```toml
//! [[alerts.channels]]
//! name = "oncall"
//! format = "dingtalk"           # webhook | dingtalk | feishu (or lark) | wecom | slack
//! url = "https://oapi.dingtalk.com/robot/send?access_token=..."
//! secret = "SEC..."             # optional: DingTalk and Feishu signing, webhook HMAC header
//! kinds = ["run_failed", "retries_exhausted"]   # optional, empty or absent = every kind
//! max_per_minute = 20           # optional rate limit (token bucket), default 20
//! timeout = "5s"                # optional, per request, default 5s
//! retries = 3                   # optional, retries after the first try, default 3
//! retry_backoff = "500ms"       # optional, first retry delay, doubled each retry
//! ```

mod config;
mod delivery;
mod dingtalk;
mod feishu;
mod slack;
mod webhook;
mod wecom;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{AlertConfigError, AlertsConfig, ChannelConfig, ChannelFormat, RateLimit};

/// What went wrong. The serialized names (`run_failed`, …) are part of the webhook schema and of
/// the `kinds` filter in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// A run ended FAILED.
    RunFailed,
    /// An attempt of an instance failed (it may still be retried).
    InstanceFailed,
    /// An attempt of an instance ran past its timeout.
    InstanceTimeout,
    /// A worker was declared dead; its attempts are lost.
    WorkerLost,
    /// An instance failed with no retries left.
    RetriesExhausted,
    /// A running attempt's task heartbeat stopped while its worker is alive (never killed).
    TaskStalled,
    /// A run had not ended by its workflow's deadline (once per run).
    DeadlineMissed,
}

impl AlertKind {
    pub const ALL: [AlertKind; 7] = [
        AlertKind::RunFailed,
        AlertKind::InstanceFailed,
        AlertKind::InstanceTimeout,
        AlertKind::WorkerLost,
        AlertKind::RetriesExhausted,
        AlertKind::TaskStalled,
        AlertKind::DeadlineMissed,
    ];

    /// The name used in the webhook schema and in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::RunFailed => "run_failed",
            AlertKind::InstanceFailed => "instance_failed",
            AlertKind::InstanceTimeout => "instance_timeout",
            AlertKind::WorkerLost => "worker_lost",
            AlertKind::RetriesExhausted => "retries_exhausted",
            AlertKind::TaskStalled => "task_stalled",
            AlertKind::DeadlineMissed => "deadline_missed",
        }
    }

    /// Parses a configured kind; `-` and `_` are interchangeable and case does not matter.
    pub fn parse(text: &str) -> Option<AlertKind> {
        let normalized = text.trim().to_ascii_lowercase().replace('-', "_");
        AlertKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == normalized)
    }

    /// The word a person reads first in a chat message.
    fn label(self) -> &'static str {
        match self {
            AlertKind::RunFailed => "RUN FAILED",
            AlertKind::InstanceFailed => "FAILED",
            AlertKind::InstanceTimeout => "TIMEOUT",
            AlertKind::WorkerLost => "WORKER LOST",
            AlertKind::RetriesExhausted => "RETRIES EXHAUSTED",
            AlertKind::TaskStalled => "TASK STALLED",
            AlertKind::DeadlineMissed => "DEADLINE MISSED",
        }
    }
}

impl fmt::Display for AlertKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing that went wrong, as the scheduler reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    pub kind: AlertKind,
    /// The workflow's name; empty for an alert about no single workflow (a lost worker).
    pub workflow: String,
    pub run_id: Option<i64>,
    pub instance_id: Option<i64>,
    pub task: Option<String>,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    /// What happened, e.g. `exit code 1`.
    pub message: String,
    /// When it happened, Unix milliseconds.
    pub at_ms: i64,
}

impl Alert {
    /// An alert with only the kind, workflow and message; add the rest with the `with_` methods.
    pub fn new(
        kind: AlertKind,
        workflow: impl Into<String>,
        message: impl Into<String>,
        at_ms: i64,
    ) -> Alert {
        Alert {
            kind,
            workflow: workflow.into(),
            run_id: None,
            instance_id: None,
            task: None,
            attempt: None,
            worker: None,
            message: message.into(),
            at_ms,
        }
    }

    pub fn with_run(mut self, run_id: i64) -> Alert {
        self.run_id = Some(run_id);
        self
    }

    pub fn with_instance(
        mut self,
        instance_id: i64,
        task: impl Into<String>,
        attempt: u32,
    ) -> Alert {
        self.instance_id = Some(instance_id);
        self.task = Some(task.into());
        self.attempt = Some(attempt);
        self
    }

    pub fn with_worker(mut self, worker: impl Into<String>) -> Alert {
        self.worker = Some(worker.into());
        self
    }

    /// The short headline: `[ax] FAILED daily-sales-etl / clean`.
    pub fn title(&self) -> String {
        let mut title = format!("[ax] {}", self.kind.label());
        if !self.workflow.is_empty() {
            title.push(' ');
            title.push_str(&self.workflow);
            if let Some(task) = &self.task {
                title.push_str(" / ");
                title.push_str(task);
            }
        } else if let Some(task) = &self.task {
            title.push(' ');
            title.push_str(task);
        } else if let Some(worker) = &self.worker {
            title.push(' ');
            title.push_str(worker);
        }
        title
    }

    /// The one-line human message:
    /// `[ax] FAILED daily-sales-etl / clean (run 12, instance 34, attempt 3): exit code 1`.
    pub fn text(&self) -> String {
        let mut details = Vec::new();
        if let Some(run) = self.run_id {
            details.push(format!("run {run}"));
        }
        if let Some(instance) = self.instance_id {
            details.push(format!("instance {instance}"));
        }
        if let Some(attempt) = self.attempt {
            details.push(format!("attempt {attempt}"));
        }
        // A worker named in the title is not repeated in the details.
        let worker_in_title = self.workflow.is_empty() && self.task.is_none();
        if let (Some(worker), false) = (&self.worker, worker_in_title) {
            details.push(format!("worker {worker}"));
        }
        let mut text = self.title();
        if !details.is_empty() {
            text.push_str(" (");
            text.push_str(&details.join(", "));
            text.push(')');
        }
        if !self.message.is_empty() {
            text.push_str(": ");
            text.push_str(&truncate(&self.message, MAX_MESSAGE_CHARS));
        }
        text
    }
}

/// Chat services cap a message (WeCom markdown at 4096 bytes); a task's error text can be long.
const MAX_MESSAGE_CHARS: usize = 1000;

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// What a delivery task sends: an alert, or the summary of the alerts its rate limit dropped.
#[derive(Debug, Clone)]
pub(crate) enum Outbound {
    Alert(Alert),
    Suppressed { count: u64, at_ms: i64 },
}

impl Outbound {
    fn title(&self) -> String {
        match self {
            Outbound::Alert(alert) => alert.title(),
            Outbound::Suppressed { .. } => "[ax] alerts suppressed".to_string(),
        }
    }

    fn text(&self) -> String {
        match self {
            Outbound::Alert(alert) => alert.text(),
            Outbound::Suppressed { count, .. } => {
                let plural = if *count == 1 { "" } else { "s" };
                format!(
                    "[ax] {count} alert{plural} suppressed by this channel's rate limit; \
                     see the scheduler for details"
                )
            }
        }
    }
}

/// Delivery counters, for one channel or summed over all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlertStats {
    /// Messages the channel's service accepted (alerts and suppression summaries).
    pub sent: u64,
    /// Messages given up on after their retries, or refused by the service.
    pub failed: u64,
    /// Alerts dropped by the channel's rate limit (each one is counted in a later summary).
    pub dropped_rate_limited: u64,
    /// Alerts dropped because the channel's queue was full or closed.
    pub dropped_queue_full: u64,
}

impl std::ops::Add for AlertStats {
    type Output = AlertStats;

    fn add(self, other: AlertStats) -> AlertStats {
        AlertStats {
            sent: self.sent + other.sent,
            failed: self.failed + other.failed,
            dropped_rate_limited: self.dropped_rate_limited + other.dropped_rate_limited,
            dropped_queue_full: self.dropped_queue_full + other.dropped_queue_full,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped_rate_limited: AtomicU64,
    dropped_queue_full: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> AlertStats {
        AlertStats {
            sent: self.sent.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dropped_rate_limited: self.dropped_rate_limited.load(Ordering::Relaxed),
            dropped_queue_full: self.dropped_queue_full.load(Ordering::Relaxed),
        }
    }
}

/// How many alerts wait for one channel before `notify` starts dropping them. A channel that
/// keeps up never comes close; one that hangs must not grow memory.
const QUEUE_CAPACITY: usize = 256;

struct Channel {
    name: String,
    kinds: Vec<AlertKind>,
    queue: mpsc::Sender<Outbound>,
    counters: Arc<Counters>,
}

struct Inner {
    channels: Vec<Channel>,
    /// Tells the delivery tasks to stop taking alerts and send what is queued.
    drain: CancellationToken,
    /// Tells the delivery tasks to give up at once (the shutdown grace is over).
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// Sends alerts to the configured channels. Cheap to clone; all clones share the channels.
#[derive(Clone)]
pub struct Alerter {
    inner: Arc<Inner>,
}

impl fmt::Debug for Alerter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .inner
            .channels
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        f.debug_struct("Alerter").field("channels", &names).finish()
    }
}

impl Alerter {
    /// Validates the channels and starts one delivery task per channel. Must be called inside a
    /// Tokio runtime.
    pub fn new(channels: Vec<ChannelConfig>) -> Result<Alerter, AlertConfigError> {
        config::validate_all(&channels)?;
        if channels.is_empty() {
            return Ok(Alerter::disabled());
        }
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| AlertConfigError::NoRuntime)?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("ax-scheduler/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| AlertConfigError::Client(err.to_string()))?;
        let drain = CancellationToken::new();
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let mut started = Vec::with_capacity(channels.len());
        for config in channels {
            let (queue, inbox) = mpsc::channel(QUEUE_CAPACITY);
            let counters = Arc::new(Counters::default());
            started.push(Channel {
                name: config.name.clone(),
                kinds: config.kinds.clone(),
                queue,
                counters: counters.clone(),
            });
            let url =
                config::parse_url(&config.url).map_err(|message| AlertConfigError::Invalid {
                    channel: config.name.clone(),
                    field: "url",
                    message,
                })?;
            let task = delivery::Delivery::new(config, url, client.clone(), counters);
            tasks.spawn_on(task.run(inbox, drain.clone(), stop.clone()), &runtime);
        }
        tasks.close();
        Ok(Alerter {
            inner: Arc::new(Inner {
                channels: started,
                drain,
                stop,
                tasks,
            }),
        })
    }

    /// Validates an `[alerts]` section of a configuration file and starts its channels.
    pub fn from_config(config: AlertsConfig) -> Result<Alerter, AlertConfigError> {
        Alerter::new(config.channels)
    }

    /// An alerter with no channels: `notify` does nothing.
    pub fn disabled() -> Alerter {
        let tasks = TaskTracker::new();
        tasks.close();
        Alerter {
            inner: Arc::new(Inner {
                channels: Vec::new(),
                drain: CancellationToken::new(),
                stop: CancellationToken::new(),
                tasks,
            }),
        }
    }

    /// Whether any channel is configured.
    pub fn is_enabled(&self) -> bool {
        !self.inner.channels.is_empty()
    }

    /// Queues the alert for every channel that takes its kind. Never blocks and never awaits: a
    /// channel whose queue is full (its service hangs) drops the alert and counts it.
    pub fn notify(&self, alert: Alert) {
        for channel in &self.inner.channels {
            if !channel.kinds.is_empty() && !channel.kinds.contains(&alert.kind) {
                continue;
            }
            if channel
                .queue
                .try_send(Outbound::Alert(alert.clone()))
                .is_err()
            {
                let dropped = channel
                    .counters
                    .dropped_queue_full
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                // A hung channel during a failure storm would otherwise log once per alert.
                if dropped == 1 || dropped % 100 == 0 {
                    tracing::warn!(
                        channel = %channel.name,
                        kind = %alert.kind,
                        dropped,
                        "alert queue full or closed; alert dropped"
                    );
                }
            }
        }
    }

    /// The counters summed over every channel.
    pub fn stats(&self) -> AlertStats {
        self.inner
            .channels
            .iter()
            .map(|channel| channel.counters.snapshot())
            .fold(AlertStats::default(), |total, stats| total + stats)
    }

    /// The counters of each channel, in configuration order.
    pub fn channel_stats(&self) -> Vec<(String, AlertStats)> {
        self.inner
            .channels
            .iter()
            .map(|channel| (channel.name.clone(), channel.counters.snapshot()))
            .collect()
    }

    /// Stops taking alerts, sends what is queued, and gives up on what is left after `grace`
    /// (counted as failed). Returns the final counters. Other clones' `notify` calls after this
    /// are dropped and counted.
    pub async fn shutdown(self, grace: Duration) -> AlertStats {
        self.inner.drain.cancel();
        if tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "alert channels did not flush within the shutdown grace; giving up"
            );
            self.inner.stop.cancel();
            self.inner.tasks.wait().await;
        }
        self.stats()
    }
}
