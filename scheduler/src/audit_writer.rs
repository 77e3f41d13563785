//! Writes audit rows in groups. A burst of control calls (API triggers at hundreds a second)
//! would otherwise cost one transaction per row beside the run each trigger creates; here the
//! rows that arrive while a group is being written form the next group, one transaction
//! (`Store::insert_audits`), as runs are created (`run_creator.rs`). Each call still returns
//! only once its row is stored.

use std::sync::Arc;

use ax_store::{AuditRecord, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Rows per transaction at most.
const MAX_GROUP: usize = 128;

struct Request {
    record: AuditRecord,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// The handle through which a node records audit rows.
#[derive(Clone)]
pub struct AuditWriter {
    store: Arc<dyn Store>,
    requests: mpsc::Sender<Request>,
}

impl AuditWriter {
    /// Starts the task that writes the groups; it ends when the last handle is dropped.
    pub fn start(store: Arc<dyn Store>) -> AuditWriter {
        let (requests, inbox) = mpsc::channel(4 * MAX_GROUP);
        tokio::spawn(write_groups(store.clone(), inbox));
        AuditWriter { store, requests }
    }

    /// Stores `record`, in a group with the rows recorded at the same time.
    pub async fn record(&self, record: AuditRecord) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            record: record.clone(),
            reply,
        };
        if self.requests.send(request).await.is_ok()
            && let Ok(stored) = answer.await
        {
            return stored;
        }
        // The group task is gone (the node is stopping): store the row alone.
        self.store.insert_audit(&record).await
    }
}

async fn write_groups(store: Arc<dyn Store>, mut inbox: mpsc::Receiver<Request>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while inbox.recv_many(&mut group, MAX_GROUP).await > 0 {
        let records: Vec<AuditRecord> = group.iter().map(|r| r.record.clone()).collect();
        match store.insert_audits(&records).await {
            Ok(()) => {
                for request in group.drain(..) {
                    let _ = request.reply.send(Ok(()));
                }
            }
            // One row the store refuses must not cost the others theirs: each is tried alone,
            // for its own answer.
            Err(error) => {
                tracing::debug!(%error, rows = group.len(), "writing a group of audit rows failed; writing them one by one");
                for request in group.drain(..) {
                    let stored = store.insert_audit(&request.record).await;
                    let _ = request.reply.send(stored);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn concurrent_rows_are_all_stored_and_each_caller_waits_for_its_own() {
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}", dir.path().join("audit.db").display());
        let store = ax_store::open(&url).await.expect("store");
        let writer = AuditWriter::start(store.clone());
        let calls: Vec<_> = (0..300i64)
            .map(|n| {
                let writer = writer.clone();
                tokio::spawn(async move {
                    writer
                        .record(AuditRecord {
                            at: 1_000 + n,
                            actor: "alice".into(),
                            action: "trigger".into(),
                            target: format!("workflow/w{n}"),
                            detail: String::new(),
                            remote: "127.0.0.1:1".into(),
                        })
                        .await
                })
            })
            .collect();
        for call in calls {
            call.await.expect("task").expect("stored");
        }
        let stored = store.list_audit(1_000).await.expect("list");
        assert_eq!(stored.len(), 300);
        let mut targets: Vec<String> = stored.into_iter().map(|r| r.target).collect();
        targets.sort();
        targets.dedup();
        assert_eq!(targets.len(), 300, "every row once");
    }
}
