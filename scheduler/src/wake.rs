//! A wake-up call for a loop that otherwise polls: the dispatcher is woken by new WAITING
//! instances and freed slots, the cron loop by a schedule applied, paused or resumed. Waking a
//! loop that is busy makes it look once more when its pass ends; wake-ups never queue up.

use std::sync::Arc;

use tokio::sync::Notify;

/// A loop's wake-up call; clones wake the same loop.
#[derive(Clone, Default)]
pub struct Wake(Arc<Notify>);

impl Wake {
    pub fn new() -> Wake {
        Wake::default()
    }

    /// Wakes the loop, or makes its next wait return at once.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Waits for a wake-up.
    pub async fn notified(&self) {
        self.0.notified().await;
    }
}
