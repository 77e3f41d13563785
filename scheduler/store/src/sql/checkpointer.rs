//! SQLite's WAL checkpoints, off the commit path.
//!
//! By default SQLite checkpoints inside the COMMIT that takes the write-ahead log past 1,000
//! pages: that commit copies the log's pages into the database file and syncs it before it
//! returns, while its caller holds the store's one writer lock. Every transaction behind it (a
//! trigger's run, a report batch, a claim) waits for that disk work, which is the periodic stall
//! of a busy embedded node. The pool's connections therefore never checkpoint by themselves
//! (`wal_autocheckpoint = 0`), and this task runs a PASSIVE checkpoint every
//! [`CHECKPOINT_EVERY`] on one of the pool's connections: a passive checkpoint takes no writer lock,
//! so commits go on beside it, and it copies what no reader still needs. The log is rewound by
//! the first commit after a checkpoint that copied everything, and truncated to
//! [`WAL_SIZE_LIMIT`] then, so it stays small under steady load.

use std::time::Duration;

use sqlx::{AnyPool, Executor};
use tokio::task::JoinHandle;

/// How often the log is checkpointed.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Bytes the log file is cut back to when it is rewound.
pub(crate) const WAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// The running checkpoint task; dropping it stops the task (the last connection to close
/// checkpoints what is left, as SQLite always does).
#[derive(Debug)]
pub(crate) struct Checkpointer {
    task: JoinHandle<()>,
}

impl Checkpointer {
    pub(crate) fn start(pool: AnyPool) -> Checkpointer {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tick.tick().await;
                if pool.is_closed() {
                    return;
                }
                match pool.execute("PRAGMA wal_checkpoint(PASSIVE)").await {
                    Ok(_) => failing = false,
                    // A failed checkpoint loses nothing (the log keeps every page); say so once
                    // until one succeeds again.
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(error = %err, "SQLite checkpoint failed; the log grows until one succeeds");
                    }
                    Err(_) => {}
                }
            }
        });
        Checkpointer { task }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
