//! Saves workers' rows. Other nodes judge a worker by its row (connected, last heartbeat,
//! running count), so every heartbeat refreshes the row; with a thousand workers a transaction
//! per refresh would be two hundred a second on an idle cluster. So a refresh is kept, the
//! latest per worker, and the kept ones are written together a few times a second
//! (`Store::upsert_workers`). A connect or a disconnect is written at once, with the refreshes
//! kept so far, and its caller waits for it. Saves reach the store in the order they were made:
//! a refresh never overwrites a later disconnect (and the store keeps the newest row whatever
//! node saves last).
//!
//! A heartbeat is acknowledged to the worker only once its row is stored: an acknowledgement
//! is what the worker's self-fence counts as contact, so the worker measures its silence from
//! the same moment every node judges it by. A node that cannot write acknowledges nothing, and
//! its workers fence in time even if some other node still reaches the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ax_store::{Store, StoreError, WorkerRecord};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::to_worker::{Outbox, ToWorker};

/// A heartbeat to acknowledge once its row is stored.
pub struct PendingAck {
    pub outbox: Outbox,
    pub sent_at_ms: i64,
}

impl PendingAck {
    fn send(self) {
        // A full queue means the worker is far behind; the next ack will do.
        self.outbox.tell(ToWorker::HeartbeatAck {
            sent_at_ms: self.sent_at_ms,
        });
    }
}

/// How often kept refreshes are written at most, and at least.
const FLUSH_BOUNDS: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

pub struct WorkerRows {
    store: Arc<Store>,
    /// Refreshes not yet written, the latest per worker, with the heartbeat to acknowledge.
    kept: Mutex<HashMap<String, (WorkerRecord, Option<PendingAck>)>>,
    /// Held while a group is written, so groups are written one after the other.
    writing: tokio::sync::Mutex<()>,
}

impl WorkerRows {
    /// Starts writing kept refreshes every half heartbeat interval (within 10 ms and 1 s), so a
    /// row is never more than half an interval behind its refresh, on `tasks`; the task ends
    /// with the last handle, or writes what is kept once more when `stop` is cancelled.
    pub fn start(
        store: Arc<Store>,
        heartbeat_interval: Duration,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Arc<WorkerRows> {
        let rows = Arc::new(WorkerRows {
            store,
            kept: Mutex::default(),
            writing: tokio::sync::Mutex::new(()),
        });
        let every = (heartbeat_interval / 2).clamp(FLUSH_BOUNDS.0, FLUSH_BOUNDS.1);
        tasks.spawn(flush_kept(Arc::downgrade(&rows), every, stop));
        rows
    }

    /// Keeps `record` to be written with the next group, and `ack` to be sent once it is.
    pub fn refresh(&self, record: WorkerRecord, ack: Option<PendingAck>) {
        self.kept_rows().insert(record.id.clone(), (record, ack));
    }

    /// Writes `record` now, with the refreshes kept so far.
    pub async fn save(&self, record: WorkerRecord) -> Result<(), StoreError> {
        self.refresh(record, None);
        self.flush().await
    }

    /// Writes the refreshes kept so far in one transaction. If that fails they are kept again,
    /// except where a newer record for the same worker came meanwhile.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let _writing = self.writing.lock().await;
        let (group, acks): (Vec<WorkerRecord>, Vec<Option<PendingAck>>) =
            std::mem::take(&mut *self.kept_rows()).into_values().unzip();
        if group.is_empty() {
            return Ok(());
        }
        let written = self.store.upsert_workers(&group).await;
        if written.is_ok() {
            acks.into_iter().flatten().for_each(PendingAck::send);
        } else {
            let mut kept = self.kept_rows();
            for (record, ack) in group.into_iter().zip(acks) {
                kept.entry(record.id.clone()).or_insert((record, ack));
            }
        }
        written
    }

    fn kept_rows(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (WorkerRecord, Option<PendingAck>)>> {
        // The map is whole after any panic (single inserts and takes), so a poisoned lock is
        // still usable.
        self.kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn flush_kept(rows: Weak<WorkerRows>, every: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    while !stopping {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => stopping = true,
        }
        let Some(rows) = rows.upgrade() else { return };
        if let Err(error) = rows.flush().await {
            tracing::warn!(%error, "saving workers' rows failed; they are tried again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, heartbeat: i64, connected: bool) -> WorkerRecord {
        WorkerRecord {
            id: id.into(),
            version: "0.1.0".into(),
            hostname: "host".into(),
            labels: Default::default(),
            capacity: 8,
            running: 0,
            started_at: 1,
            last_heartbeat: heartbeat,
            node_id: "node-a".into(),
            draining: false,
            connected,
            apps: None,
            incarnation: String::new(),
        }
    }

    async fn sqlite_store() -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}", dir.path().join("workers.db").display());
        let store = ax_store::open(&url).await.expect("store");
        (dir, store)
    }

    #[tokio::test]
    async fn refreshes_are_written_together_and_a_save_goes_out_at_once_with_them() {
        let (_dir, store) = sqlite_store().await;
        // An hour between timed flushes: only `save` writes in this test.
        let rows = WorkerRows::start(
            store.clone(),
            Duration::from_secs(7200),
            &TaskTracker::new(),
            CancellationToken::new(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // the first tick is immediate
        for n in 0..50 {
            rows.refresh(record(&format!("w{n:02}"), 100, true), None);
        }
        rows.refresh(record("w07", 200, true), None);
        assert!(
            store.list_workers().await.expect("list").is_empty(),
            "kept, not written"
        );

        rows.save(record("w99", 300, true)).await.expect("save");
        let stored = store.list_workers().await.expect("list");
        assert_eq!(stored.len(), 51);
        assert_eq!(stored[7].last_heartbeat, 200, "the latest refresh of w07");
        assert_eq!(stored[50].id, "w99");
    }

    #[tokio::test]
    async fn a_disconnect_saved_after_a_refresh_is_what_stays() {
        let (_dir, store) = sqlite_store().await;
        let rows = WorkerRows::start(
            store.clone(),
            Duration::from_millis(20),
            &TaskTracker::new(),
            CancellationToken::new(),
        );
        rows.refresh(record("w1", 100, true), None);
        rows.save(record("w1", 150, false)).await.expect("save");
        // Timed flushes come and go; nothing older may overwrite the disconnect.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            store.list_workers().await.expect("list"),
            [record("w1", 150, false)]
        );
    }

    #[tokio::test]
    async fn kept_refreshes_are_written_by_the_timer() {
        let (_dir, store) = sqlite_store().await;
        let rows = WorkerRows::start(
            store.clone(),
            Duration::from_millis(40),
            &TaskTracker::new(),
            CancellationToken::new(),
        );
        let (outbox, mut acks) = crate::to_worker::outbox(1);
        let ack = PendingAck {
            outbox,
            sent_at_ms: 77,
        };
        rows.refresh(record("w1", 100, true), Some(ack));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.list_workers().await.expect("list").is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "never written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            store.list_workers().await.expect("list"),
            [record("w1", 100, true)]
        );
        // The heartbeat is acknowledged once its row is stored.
        let ack = acks.recv().await.expect("an ack");
        assert_eq!(ack, ToWorker::HeartbeatAck { sent_at_ms: 77 });
    }

    #[tokio::test]
    async fn a_heartbeat_whose_row_cannot_be_stored_is_not_acknowledged() {
        let (dir, store) = sqlite_store().await;
        let rows = WorkerRows::start(
            store.clone(),
            Duration::from_secs(7200),
            &TaskTracker::new(),
            CancellationToken::new(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The store's file loses its table: every write fails.
        let url = format!("sqlite://{}", dir.path().join("workers.db").display());
        let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
        sqlx::query("DROP TABLE worker")
            .execute(&pool)
            .await
            .expect("drop");
        let (outbox, mut acks) = crate::to_worker::outbox(1);
        let ack = PendingAck {
            outbox,
            sent_at_ms: 5,
        };
        rows.refresh(record("w1", 100, true), Some(ack));
        assert!(rows.flush().await.is_err());
        assert!(acks.try_recv().is_err(), "nothing acknowledged");
    }
}
