//! Since when this node has been able to see its workers: its start, or the moment its store
//! answered again after losing it. The backstop judges no worker before the dead-worker
//! threshold has passed from then (`ax_core::liveness`), so the node's own blindness never
//! counts against a worker; every loop that finds the store unreachable says so here.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use ax_core::Millis;

/// Since when this node has been able to see its workers: its start, or the moment its store
/// answered again after a failure (meanwhile other nodes may not have been able to record
/// their workers' heartbeats either).
#[derive(Debug)]
pub struct Watching {
    since: AtomicI64,
    store_lost: AtomicBool,
}

impl Watching {
    pub fn new(now: Millis) -> Watching {
        Watching {
            since: AtomicI64::new(now),
            store_lost: AtomicBool::new(false),
        }
    }

    /// A store call failed: if the store could not be reached, what workers did meanwhile may
    /// not be recorded. Any other failure (a statement refused) says nothing about that.
    pub fn store_failed(&self, error: &anyhow::Error) {
        let unreachable = error.chain().any(|cause| {
            cause
                .downcast_ref::<ax_store::StoreError>()
                .is_some_and(ax_store::StoreError::is_unreachable)
        });
        if unreachable {
            self.store_lost();
        }
    }

    /// The store could not be reached.
    pub fn store_lost(&self) {
        self.store_lost.store(true, Ordering::Relaxed);
    }

    /// The store answered at `now`: after a failure, watching starts anew.
    pub fn store_answered(&self, now: Millis) -> Millis {
        if self.store_lost.swap(false, Ordering::Relaxed) {
            self.since.store(now, Ordering::Relaxed);
            tracing::info!(
                "the store answers again; judging no worker until they had the dead-worker threshold to reconnect"
            );
        }
        self.since.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_store_starts_the_watch_anew() {
        let watching = Watching::new(100);
        // A statement the store refused: the node saw everything it could.
        watching.store_failed(&anyhow::Error::new(ax_store::StoreError::NotFound(
            "instance 7".into(),
        )));
        assert_eq!(watching.store_answered(500), 100);
        // The store could not be reached: the node starts watching again when it answers.
        let lost = anyhow::Error::new(ax_store::StoreError::Database(sqlx::Error::PoolTimedOut))
            .context("reading waiting instances");
        watching.store_failed(&lost);
        assert_eq!(watching.store_answered(900), 900);
        assert_eq!(watching.store_answered(1_500), 900);
    }
}
