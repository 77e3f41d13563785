//! SQLite's write-ahead log checkpoints, off the commit path.
//!
//! By default SQLite checkpoints inside the commit that takes the log past 1,000 pages: that
//! commit copies the log's pages into the database file and syncs it while its caller holds the
//! store's one writer lock, and every transaction behind it (a trigger's run, a report batch, a
//! claim) waits for the disk. The pool's connections therefore never checkpoint by themselves
//! (`wal_autocheckpoint = 0`); this task does it, on a connection of its own, in two passes:
//!
//! - every [`CHECKPOINT_EVERY`] a PASSIVE checkpoint, which takes no writer lock: commits go on
//!   beside it while it copies what no reader still needs;
//! - when the log still holds [`REWIND_AT`] pages after that, a RESTART checkpoint under the
//!   store's writer lock. Only the pages committed since the passive pass are left to copy, so
//!   the writers behind it wait briefly; and it returns once no reader uses the log, so the next
//!   commit writes the log from its start again. Without this pass the log never rewinds under
//!   steady load (a passive checkpoint beside writers never finds it wholly copied at the moment
//!   a writer starts) and grows for as long as the load lasts.
//!
//! The restart pass waits at most [`RESTART_PATIENCE`] for readers still on the log, so the
//! writers it holds back never wait longer than that for a reader. A reader that stays longer
//! (a long read transaction) makes it give up, and it then skips ticks, twice as many after each
//! pass that gave up, up to [`MAX_REWIND_SKIP`]: a reader that holds the log for minutes costs
//! the writers one such wait every few seconds, not every tick.

use std::sync::Arc;
use std::time::Duration;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, Connection, Executor};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// How often the log is checkpointed.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// Pages left in the log after a passive pass that make the checkpointer rewind it (SQLite's
/// own automatic checkpoint waits for as many).
pub(crate) const REWIND_AT: i64 = 1_000;

/// How long the rewinding pass waits for readers still on the log.
pub(crate) const RESTART_PATIENCE: Duration = Duration::from_millis(100);

/// Most ticks skipped between rewinding passes that find readers on the log.
pub(crate) const MAX_REWIND_SKIP: u32 = 16;

/// Bytes the log file is cut back to when it is rewound (it keeps its size otherwise, to be
/// written over).
pub(crate) const WAL_SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// The running checkpoint task.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Opens the checkpointer's connection to the file of `options` and starts the task.
    /// Dropping the checkpointer stops the task too.
    pub(crate) async fn start(
        options: &AnyConnectOptions,
        write_lock: Arc<Mutex<()>>,
    ) -> Result<Checkpointer, sqlx::Error> {
        let mut conn = AnyConnection::connect_with(options).await?;
        conn.execute(sqlx::AssertSqlSafe(format!(
            "PRAGMA busy_timeout = {}",
            RESTART_PATIENCE.as_millis()
        )))
        .await?;
        conn.execute("PRAGMA synchronous = NORMAL").await?;
        conn.execute("PRAGMA wal_autocheckpoint = 0").await?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            let mut rewind = RewindBackoff::default();
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    // Stopped, or the checkpointer dropped.
                    _ = stopped.changed() => break,
                }
                match checkpoint(&mut conn, &write_lock, &mut rewind).await {
                    Ok(()) => failing = false,
                    // A failed checkpoint loses nothing (the log keeps every page); say so once
                    // until one succeeds again.
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(error = %err, "SQLite checkpoint failed; the log grows until one succeeds");
                    }
                    Err(_) => {}
                }
            }
            if let Err(err) = conn.close().await {
                tracing::debug!(error = %err, "closing the checkpointer's connection");
            }
        });
        Ok(Checkpointer {
            stop,
            task: std::sync::Mutex::new(Some(task)),
        })
    }

    /// Stops the task and closes its connection.
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = match self.task.lock() {
            Ok(mut task) => task.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// One tick: the passive pass, then the rewinding pass when the log is still long.
async fn checkpoint(
    conn: &mut AnyConnection,
    write_lock: &Mutex<()>,
    rewind: &mut RewindBackoff,
) -> Result<(), sqlx::Error> {
    let (_, log_pages, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(&mut *conn)
        .await?;
    if log_pages < REWIND_AT || rewind.skips_this_tick() {
        return Ok(());
    }
    let _writers_wait = write_lock.lock().await;
    // Busy (a reader stayed on the log past the patience) is a row, not an error.
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(RESTART)")
        .fetch_one(&mut *conn)
        .await?;
    rewind.after_pass(busy != 0);
    Ok(())
}

/// When the next rewinding pass may run, after passes that found readers on the log.
#[derive(Debug, Default)]
struct RewindBackoff {
    /// Ticks still to skip.
    skip: u32,
    /// Ticks skipped after the last pass that gave up; 0 after one that rewound.
    last_skip: u32,
}

impl RewindBackoff {
    fn skips_this_tick(&mut self) -> bool {
        if self.skip == 0 {
            return false;
        }
        self.skip -= 1;
        true
    }

    fn after_pass(&mut self, gave_up: bool) {
        self.last_skip = if gave_up {
            (self.last_skip * 2).clamp(1, MAX_REWIND_SKIP)
        } else {
            0
        };
        self.skip = self.last_skip;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped_before_next_pass(rewind: &mut RewindBackoff) -> u32 {
        let mut skipped = 0;
        while rewind.skips_this_tick() {
            skipped += 1;
        }
        skipped
    }

    #[test]
    fn passes_that_find_readers_back_off_doubling_up_to_the_cap_and_a_rewind_resets_it() {
        let mut rewind = RewindBackoff::default();
        assert_eq!(
            skipped_before_next_pass(&mut rewind),
            0,
            "the first pass runs at once"
        );
        let mut skips = Vec::new();
        for _ in 0..7 {
            rewind.after_pass(true);
            skips.push(skipped_before_next_pass(&mut rewind));
        }
        assert_eq!(skips, [1, 2, 4, 8, 16, 16, 16]);
        rewind.after_pass(false);
        assert_eq!(
            skipped_before_next_pass(&mut rewind),
            0,
            "a rewind ends the back-off"
        );
        rewind.after_pass(true);
        assert_eq!(skipped_before_next_pass(&mut rewind), 1);
    }
}
