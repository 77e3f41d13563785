//! In-process guards for the embedded single-node mode.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ax_core::ids::{Attempt, InstanceId};

use super::{Guards, StartLock, dispatch_key, lock_key};

/// Keys with an expiry, like the Redis keys they stand in for.
#[derive(Default)]
pub struct LocalGuards {
    keys: Mutex<HashMap<String, (u32, Instant)>>,
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
        let now = Instant::now();
        let mut entry = keys.get(key).copied().filter(|&(_, expires)| expires > now);
        let result = f(&mut entry);
        match entry {
            Some(value) => keys.insert(key.to_string(), value),
            None => keys.remove(key),
        };
        // Expired keys of other instances are dropped now and then so the map stays small.
        if keys.len() > 10_000 {
            keys.retain(|_, (_, expires)| *expires > now);
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
}
