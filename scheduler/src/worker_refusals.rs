//! What this node refused of worker streams: a Register outside its credential (an id the token
//! or certificate does not name, a label the token may not claim, a second live stream for an
//! id) and a frame about an attempt not dispatched to the stream's worker (a log batch, a start,
//! an end, a task heartbeat, a rejection). Each refusal is counted (`/metrics`) and audited,
//! aggregated: the first of a kind from one worker is written at once, the ones of that kind
//! that follow within [`WINDOW_MS`] become one row that says how many there were, so a
//! misbehaving stream costs the audit trail two rows per kind and window, whatever its rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ax_core::Millis;
use ax_store::AuditRecord;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit_writer::AuditWriter;
use crate::clock::now_ms;
use crate::metrics::Metrics;

/// How long refusals of one kind from one worker are gathered into one audit row.
pub const WINDOW_MS: Millis = 10_000;

/// The audit action of a refused Register.
pub const REGISTER_REFUSED: &str = "worker_register_refused";
/// The audit action of refused frames.
pub const FRAME_REFUSED: &str = "worker_frame_refused";

/// One refusal.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The worker id the stream gave (or claimed, for a refused Register).
    pub worker: String,
    /// [`REGISTER_REFUSED`] or [`FRAME_REFUSED`].
    pub action: &'static str,
    /// What was refused, as the metric's label: `id`, `labels`, `certificate`,
    /// `second_stream` for a Register; `logs`, `started`, `finished`, `heartbeat`, `rejected`
    /// for a frame.
    pub kind: &'static str,
    /// Why, for people.
    pub detail: String,
    /// The stream's address.
    pub remote: String,
    /// The name of the stream's token (empty without authentication).
    pub token: String,
}

/// Refusals of one kind from one worker gathered since a window's first, which was written at
/// once.
struct Window {
    started: Millis,
    /// Refusals after the first.
    more: u64,
    last: Option<Refusal>,
}

/// A window's key: the worker, the action and the kind.
type Key = (String, &'static str, &'static str);

/// The node's record of refusals.
pub struct WorkerRefusals {
    audit: AuditWriter,
    /// Where the audit rows are written, off the streams' paths.
    tasks: TaskTracker,
    windows: Mutex<HashMap<Key, Window>>,
}

impl WorkerRefusals {
    pub fn new(audit: AuditWriter, tasks: TaskTracker) -> WorkerRefusals {
        WorkerRefusals {
            audit,
            tasks,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a refusal and audits it (at once when it opens a window, else in the window's
    /// summary row).
    pub fn record(&self, metrics: &Metrics, refusal: Refusal) {
        if refusal.action == REGISTER_REFUSED {
            metrics.register_refused(refusal.kind);
        } else {
            metrics.frame_refused(refusal.kind);
        }
        let now = now_ms();
        let mut rows = Vec::new();
        {
            let mut windows = self.lock();
            let key = (refusal.worker.clone(), refusal.action, refusal.kind);
            match windows.get_mut(&key) {
                Some(window) if now - window.started < WINDOW_MS => {
                    window.more += 1;
                    window.last = Some(refusal);
                }
                _ => {
                    if let Some(window) = windows.remove(&key) {
                        rows.extend(summary(window, now));
                    }
                    rows.push(row(&refusal, refusal.detail.clone(), now));
                    windows.insert(
                        key,
                        Window {
                            started: now,
                            more: 0,
                            last: None,
                        },
                    );
                }
            }
        }
        self.write(rows);
    }

    /// Writes the summary rows of the windows that are over.
    pub fn flush(&self) {
        let now = now_ms();
        let rows: Vec<AuditRecord> = {
            let mut windows = self.lock();
            let over: Vec<Key> = windows
                .iter()
                .filter(|(_, window)| now - window.started >= WINDOW_MS)
                .map(|(key, _)| key.clone())
                .collect();
            over.into_iter()
                .filter_map(|key| windows.remove(&key))
                .filter_map(|window| summary(window, now))
                .collect()
        };
        self.write(rows);
    }

    fn write(&self, rows: Vec<AuditRecord>) {
        if rows.is_empty() {
            return;
        }
        // Logged as audited: a flood of refused frames is a line or two per window here too.
        for row in &rows {
            tracing::warn!(worker = %row.target, remote = %row.remote, token = %row.token, action = %row.action, "{}", row.detail);
        }
        let audit = self.audit.clone();
        // Off the stream's path: a refused frame never waits for the audit trail.
        self.tasks.spawn(async move {
            for row in rows {
                if let Err(err) = audit.record(row).await {
                    tracing::error!(error = %err, "writing a worker refusal's audit row failed");
                }
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Window>> {
        self.windows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The row of the refusals a window gathered after its first; `None` when there were none.
fn summary(window: Window, now: Millis) -> Option<AuditRecord> {
    let last = window.last?;
    let detail = format!(
        "{} more refused in {}; the last: {}",
        window.more,
        ax_core::humane_duration(now - window.started),
        last.detail
    );
    Some(row(&last, detail, now))
}

fn row(refusal: &Refusal, detail: String, now: Millis) -> AuditRecord {
    AuditRecord {
        at: now,
        actor: format!("worker {}", refusal.worker),
        action: refusal.action.to_string(),
        target: format!("worker/{}", refusal.worker),
        detail,
        remote: refusal.remote.clone(),
        token: refusal.token.clone(),
    }
}

/// Writes the summaries of windows that are over, every second, until `cancel`.
pub async fn run(refusals: Arc<WorkerRefusals>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => refusals.flush(),
            () = cancel.cancelled() => {
                refusals.flush();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_writer::AuditRows;

    fn refusal(worker: &str, kind: &'static str, n: u32) -> Refusal {
        Refusal {
            worker: worker.into(),
            action: FRAME_REFUSED,
            kind,
            detail: format!("frame {n}"),
            remote: "127.0.0.1:9".into(),
            token: "rogue-token".into(),
        }
    }

    #[tokio::test]
    async fn the_first_refusal_is_written_at_once_and_the_rest_of_its_window_as_one_row() {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}", dir.path().join("audit.db").display());
        let store = ax_store::open(&url).await.expect("store");
        let tasks = TaskTracker::new();
        let audit = AuditWriter::start(AuditRows(store.clone()), &tasks, CancellationToken::new());
        let refusals = WorkerRefusals::new(audit, tasks);
        let metrics = Metrics::new();
        for n in 0..500 {
            refusals.record(
                &metrics,
                refusal("rogue", if n % 5 == 0 { "finished" } else { "logs" }, n),
            );
        }
        refusals.record(&metrics, refusal("other", "started", 0));
        let rows = async || {
            for _ in 0..100 {
                let rows = store.list_audit(100).await.expect("audit");
                if rows.len() >= 3 {
                    return rows;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("the first rows were never written");
        };
        let first = rows().await;
        assert_eq!(
            first.len(),
            3,
            "one row per worker and kind so far: {first:?}"
        );
        // Frame 0 is the first "finished", frame 1 the first "logs".
        let rogue = first
            .iter()
            .find(|r| r.target == "worker/rogue" && r.detail == "frame 0")
            .expect("rogue's first");
        assert_eq!(
            (
                rogue.action.as_str(),
                rogue.token.as_str(),
                rogue.actor.as_str()
            ),
            (FRAME_REFUSED, "rogue-token", "worker rogue")
        );
        assert_eq!(rogue.actor, "worker rogue");
        assert!(
            first.iter().any(|r| r.detail == "frame 1"),
            "the first logs refusal"
        );
        // The windows are over: one summary row for each kind that had more.
        {
            let mut windows = refusals.lock();
            for window in windows.values_mut() {
                window.started -= WINDOW_MS;
            }
        }
        refusals.flush();
        for _ in 0..100 {
            if store.list_audit(100).await.expect("audit").len() >= 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = store.list_audit(100).await.expect("audit");
        assert_eq!(all.len(), 5, "{all:?}");
        let summary = |more: &str, last: &str| {
            all.iter().any(|r| {
                r.detail.starts_with(&format!("{more} more refused in 10"))
                    && r.detail.ends_with(&format!("; the last: {last}"))
            })
        };
        assert!(
            summary("399", "frame 499") && summary("99", "frame 495"),
            "{all:?}"
        );
        let text = metrics_text(&metrics);
        assert!(
            text.contains("ax_worker_frames_refused_total{kind=\"logs\"} 400"),
            "{text}"
        );
        assert!(text.contains("ax_worker_frames_refused_total{kind=\"finished\"} 100"));
    }

    fn metrics_text(metrics: &Metrics) -> String {
        metrics.encode_now()
    }
}
