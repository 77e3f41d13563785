//! Writes audit rows in groups (`group_commit.rs`). A burst of control calls (API triggers at
//! hundreds a second) would otherwise cost one transaction per row beside the run each trigger
//! creates; here the rows that arrive together are one transaction (`Store::insert_audits`).
//! Each call still returns only once its row is stored.

use std::sync::Arc;

use ax_store::{AuditRecord, Store, StoreError};

use crate::group_commit::{GroupCommit, GroupWrite};

/// The handle through which a node records audit rows.
pub type AuditWriter = GroupCommit<AuditRows>;

/// Audit rows, written by the store.
pub struct AuditRows(pub Arc<Store>);

impl GroupWrite for AuditRows {
    type Item = AuditRecord;
    type Done = ();

    async fn write_group(&self, rows: &[AuditRecord]) -> Result<Vec<()>, StoreError> {
        self.0.insert_audits(rows).await?;
        Ok(vec![(); rows.len()])
    }

    async fn write_one(&self, row: &AuditRecord) -> Result<(), StoreError> {
        self.0.insert_audit(row).await
    }
}

impl AuditWriter {
    /// Stores `record`, in a group with the rows recorded at the same time.
    pub async fn record(&self, record: AuditRecord) -> Result<(), StoreError> {
        self.submit(record).await
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
        let writer = AuditWriter::start(
            AuditRows(store.clone()),
            &tokio_util::task::TaskTracker::new(),
            tokio_util::sync::CancellationToken::new(),
        );
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
                            token: String::new(),
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
