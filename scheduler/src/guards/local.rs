//! In-process guards for the embedded single-node mode.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ax_core::ids::{Attempt, InstanceId};

use super::{Guards, StartLock, dispatch_key, lock_key};

/// Keys with an expiry, like the Redis keys they stand in for.
#[derive(Default)]
pub struct LocalGuards {
    keys: Mutex<Keys>,
}

/// Expired keys of other instances are swept out once the map has doubled since the last sweep:
/// a sweep walks the map once, and enough calls come between two sweeps to pay for it. (A sweep
/// on every call past a fixed size costs 14% of the scheduler's CPU at 500 triggers/s.)
const FIRST_SWEEP_AT: usize = 10_000;

#[derive(Default)]
struct Keys {
    live: HashMap<String, (u32, Instant)>,
    /// The size past which the next sweep happens.
    sweep_at: usize,
}

impl LocalGuards {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the live value of `key` (expired keys read as absent).
    fn with_key<R>(&self, key: &str, f: impl FnOnce(&mut Option<(u32, Instant)>) -> R) -> R {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let keys = &mut *keys;
        let now = Instant::now();
        let mut entry = keys
            .live
            .get(key)
            .copied()
            .filter(|&(_, expires)| expires > now);
        let result = f(&mut entry);
        match entry {
            Some(value) => keys.live.insert(key.to_string(), value),
            None => keys.live.remove(key),
        };
        if keys.live.len() > keys.sweep_at.max(FIRST_SWEEP_AT) {
            keys.live.retain(|_, (_, expires)| *expires > now);
            keys.sweep_at = 2 * keys.live.len();
        }
        result
    }
}

#[async_trait::async_trait]
impl Guards for LocalGuards {
    async fn acquire_start(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> StartLock {
        self.with_key(&lock_key("", instance), |entry| match *entry {
            Some((holder, _)) if holder != attempt.0 => StartLock::HeldBy(Attempt(holder)),
            _ => {
                *entry = Some((attempt.0, Instant::now() + ttl));
                StartLock::Acquired
            }
        })
    }

    async fn release_start(&self, instance: InstanceId, attempt: Attempt) {
        self.with_key(&lock_key("", instance), |entry| {
            if matches!(*entry, Some((holder, _)) if holder == attempt.0) {
                *entry = None;
            }
        })
    }

    async fn mark_dispatch(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> Option<bool> {
        Some(
            self.with_key(&dispatch_key("", instance, attempt), |entry| {
                if entry.is_some() {
                    false
                } else {
                    *entry = Some((attempt.0, Instant::now() + ttl));
                    true
                }
            }),
        )
    }

    async fn clear_dispatch(&self, instance: InstanceId, attempt: Attempt) {
        self.with_key(&dispatch_key("", instance, attempt), |entry| *entry = None)
    }

    fn kind(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    #[tokio::test]
    async fn local_guards_keep_the_contract() {
        let guards = LocalGuards::new();
        contract::start_lock_is_exclusive_per_instance(&guards, InstanceId(1)).await;
        contract::start_lock_expires(&guards, InstanceId(2)).await;
        contract::dispatch_marker_detects_duplicates(&guards, InstanceId(3)).await;
    }

    #[tokio::test]
    async fn expired_keys_are_swept_and_live_ones_kept() {
        let guards = LocalGuards::new();
        let live = InstanceId(1);
        let held = guards
            .acquire_start(live, Attempt(1), Duration::from_secs(600))
            .await;
        assert!(matches!(held, StartLock::Acquired));
        // Three times the first sweep size of short-lived markers: the map stays bounded.
        for id in 2..=(3 * FIRST_SWEEP_AT as i64) {
            guards
                .mark_dispatch(InstanceId(id), Attempt(1), Duration::from_millis(1))
                .await;
            let size = guards.keys.lock().unwrap().live.len();
            assert!(size <= FIRST_SWEEP_AT + 1, "{size} keys held");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(matches!(
            guards
                .acquire_start(live, Attempt(2), Duration::from_secs(600))
                .await,
            StartLock::HeldBy(Attempt(1))
        ));
    }
}
