//! The fast guards of exactly-once start: a dedup marker per dispatched attempt and a start lock
//! per instance (ARCHITECTURE.md, "An attempt's process starts at most once").
//!
//! Redis holds them in a cluster; a single node uses the in-process implementation. Neither is
//! the store of record: every transition is still a conditional update in the store, so when
//! Redis is unreachable the scheduler keeps going on the store's guards alone (and says so).

use std::time::Duration;

use ax_core::ids::{Attempt, InstanceId};

mod local;
mod redis;

pub use local::LocalGuards;
pub use redis::RedisGuards;

/// The answer of [`Guards::acquire_start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartLock {
    /// This attempt holds the instance's start lock now.
    Acquired,
    /// Another attempt of the instance holds it: that attempt may still be alive, so this one
    /// must wait (it neither starts beside it nor fails).
    HeldBy(Attempt),
    /// The guard store is unreachable; the caller goes on with the store's guards alone.
    Unavailable,
}

#[async_trait::async_trait]
pub trait Guards: Send + Sync + 'static {
    /// Takes the start lock of `instance` for `attempt` for `ttl` (the task's timeout plus a
    /// grace). Taking it again for the same attempt renews it.
    async fn acquire_start(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> StartLock;

    /// Releases the start lock if `attempt` holds it.
    async fn release_start(&self, instance: InstanceId, attempt: Attempt);

    /// Sets the dedup marker of a dispatched attempt. False when it was already set: the
    /// attempt was dispatched before, and this dispatch is a duplicate to drop.
    /// `None` when the guard store is unreachable.
    async fn mark_dispatch(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> Option<bool>;

    /// Clears the dedup marker so the same attempt can be dispatched again (after a worker
    /// rejected it before starting).
    async fn clear_dispatch(&self, instance: InstanceId, attempt: Attempt);

    /// Guard calls made without the guards' service while it was unreachable (none for
    /// guards that cannot be unreachable), for `/metrics`.
    fn fallbacks(&self) -> u64 {
        0
    }

    /// "redis" or "local", for logs and the health view.
    fn kind(&self) -> &'static str;
}

fn lock_key(namespace: &str, instance: InstanceId) -> String {
    format!("{namespace}:lock:instance:{instance}")
}

fn dispatch_key(namespace: &str, instance: InstanceId, attempt: Attempt) -> String {
    format!("{namespace}:dispatch:{instance}:{attempt}")
}

#[cfg(test)]
pub(crate) mod contract {
    //! The behaviour both implementations must have, run against each.

    use super::*;

    pub async fn start_lock_is_exclusive_per_instance(guards: &dyn Guards, instance: InstanceId) {
        let ttl = Duration::from_secs(30);
        assert_eq!(
            guards.acquire_start(instance, Attempt(1), ttl).await,
            StartLock::Acquired
        );
        // Renewing by the holder is fine; another attempt waits.
        assert_eq!(
            guards.acquire_start(instance, Attempt(1), ttl).await,
            StartLock::Acquired
        );
        assert_eq!(
            guards.acquire_start(instance, Attempt(2), ttl).await,
            StartLock::HeldBy(Attempt(1))
        );
        // Only the holder releases it.
        guards.release_start(instance, Attempt(2)).await;
        assert_eq!(
            guards.acquire_start(instance, Attempt(2), ttl).await,
            StartLock::HeldBy(Attempt(1))
        );
        guards.release_start(instance, Attempt(1)).await;
        assert_eq!(
            guards.acquire_start(instance, Attempt(2), ttl).await,
            StartLock::Acquired
        );
        guards.release_start(instance, Attempt(2)).await;
    }

    pub async fn start_lock_expires(guards: &dyn Guards, instance: InstanceId) {
        let short = Duration::from_millis(50);
        assert_eq!(
            guards.acquire_start(instance, Attempt(1), short).await,
            StartLock::Acquired
        );
        tokio::time::sleep(Duration::from_millis(120)).await;
        let ttl = Duration::from_secs(30);
        assert_eq!(
            guards.acquire_start(instance, Attempt(2), ttl).await,
            StartLock::Acquired
        );
        guards.release_start(instance, Attempt(2)).await;
    }

    pub async fn dispatch_marker_detects_duplicates(guards: &dyn Guards, instance: InstanceId) {
        let ttl = Duration::from_secs(30);
        assert_eq!(
            guards.mark_dispatch(instance, Attempt(1), ttl).await,
            Some(true)
        );
        assert_eq!(
            guards.mark_dispatch(instance, Attempt(1), ttl).await,
            Some(false)
        );
        assert_eq!(
            guards.mark_dispatch(instance, Attempt(2), ttl).await,
            Some(true)
        );
        guards.clear_dispatch(instance, Attempt(1)).await;
        assert_eq!(
            guards.mark_dispatch(instance, Attempt(1), ttl).await,
            Some(true)
        );
        guards.clear_dispatch(instance, Attempt(1)).await;
        guards.clear_dispatch(instance, Attempt(2)).await;
    }
}
