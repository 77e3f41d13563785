//! Guards in Redis, shared by every scheduler node of a cluster.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ax_core::ids::{Attempt, InstanceId};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Guards, StartLock, dispatch_key, lock_key};

/// Takes the lock when free, renews it for its holder, and otherwise answers the holder.
const ACQUIRE: &str = r"
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
return tonumber(holder)
";

/// Deletes the lock only if the given attempt holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

pub struct RedisGuards {
    connection: ConnectionManager,
    /// Prefix of every key, so several ax clusters (or test stores) can share one Redis.
    namespace: String,
    acquire: redis::Script,
    release: redis::Script,
    /// True while Redis is unreachable, so an outage is logged once, not per call.
    degraded: AtomicBool,
    outages: AtomicU64,
    degraded_calls: AtomicU64,
}

impl RedisGuards {
    /// Connects lazily: a Redis that is down at start-up is an outage like any other, not a
    /// reason to refuse to schedule. A malformed url is an error.
    pub fn connect(url: &str, namespace: &str) -> redis::RedisResult<RedisGuards> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(2));
        let connection = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(RedisGuards {
            connection,
            namespace: namespace.to_string(),
            acquire: redis::Script::new(ACQUIRE),
            release: redis::Script::new(RELEASE),
            degraded: AtomicBool::new(false),
            outages: AtomicU64::new(0),
            degraded_calls: AtomicU64::new(0),
        })
    }

    /// How many times Redis became unreachable, and how many guard calls went without it.
    pub fn outage_counts(&self) -> (u64, u64) {
        (
            self.outages.load(Ordering::Relaxed),
            self.degraded_calls.load(Ordering::Relaxed),
        )
    }

    fn ok<T>(&self, result: redis::RedisResult<T>) -> Option<T> {
        match result {
            Ok(value) => {
                if self.degraded.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "redis is reachable again; start locks and dedup markers back on"
                    );
                }
                Some(value)
            }
            Err(err) => {
                self.degraded_calls.fetch_add(1, Ordering::Relaxed);
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    self.outages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %err, "redis unreachable; scheduling on the store's guards alone");
                }
                None
            }
        }
    }
}

fn millis(ttl: Duration) -> u64 {
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}

#[async_trait::async_trait]
impl Guards for RedisGuards {
    async fn acquire_start(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> StartLock {
        let mut connection = self.connection.clone();
        let result: redis::RedisResult<u32> = self
            .acquire
            .key(lock_key(&self.namespace, instance))
            .arg(attempt.0)
            .arg(millis(ttl))
            .invoke_async(&mut connection)
            .await;
        match self.ok(result) {
            Some(0) => StartLock::Acquired,
            Some(holder) => StartLock::HeldBy(Attempt(holder)),
            None => StartLock::Unavailable,
        }
    }

    async fn release_start(&self, instance: InstanceId, attempt: Attempt) {
        let mut connection = self.connection.clone();
        let result: redis::RedisResult<u32> = self
            .release
            .key(lock_key(&self.namespace, instance))
            .arg(attempt.0)
            .invoke_async(&mut connection)
            .await;
        self.ok(result);
    }

    async fn mark_dispatch(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        ttl: Duration,
    ) -> Option<bool> {
        let mut connection = self.connection.clone();
        let result: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(dispatch_key(&self.namespace, instance, attempt))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .query_async(&mut connection)
            .await;
        self.ok(result).map(|set| set.is_some())
    }

    async fn clear_dispatch(&self, instance: InstanceId, attempt: Attempt) {
        let mut connection = self.connection.clone();
        let result: redis::RedisResult<u32> = redis::cmd("DEL")
            .arg(dispatch_key(&self.namespace, instance, attempt))
            .query_async(&mut connection)
            .await;
        self.ok(result);
    }

    fn fallbacks(&self) -> u64 {
        self.outage_counts().1
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use super::super::contract;
    use super::*;

    /// The Redis url for tests: `AX_TEST_REDIS_URL`. Without it the test is ignored
    /// (`build.rs`); run anyway (`--ignored`, or under `CI=true`) it fails saying what it lacks.
    fn test_url() -> String {
        match std::env::var("AX_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => panic!("AX_TEST_REDIS_URL is not set: the Redis guards' test needs a Redis"),
        }
    }

    /// Instance ids unique to this process so parallel test runs share one Redis safely.
    fn unique_instance(n: i64) -> InstanceId {
        let base = (std::process::id() as i64) << 20;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64 & 0xfff_ffff)
            .unwrap_or(0);
        InstanceId(-(base + now * 16 + n))
    }

    #[tokio::test]
    #[cfg_attr(
        ax_test_without_redis,
        ignore = "set AX_TEST_REDIS_URL=redis://HOST:PORT to run the Redis guards' test"
    )]
    async fn redis_guards_keep_the_contract() {
        let url = test_url();
        let guards = RedisGuards::connect(&url, "ax-test").expect("redis url");
        contract::start_lock_is_exclusive_per_instance(&guards, unique_instance(1)).await;
        contract::start_lock_expires(&guards, unique_instance(2)).await;
        contract::dispatch_marker_detects_duplicates(&guards, unique_instance(3)).await;
        assert_eq!(guards.outage_counts(), (0, 0));
    }

    #[tokio::test]
    async fn an_unreachable_redis_degrades_instead_of_failing() {
        // Nothing listens on port 1.
        let guards = RedisGuards::connect("redis://127.0.0.1:1/", "ax").expect("well-formed url");
        let ttl = Duration::from_secs(1);
        assert_eq!(
            guards.acquire_start(InstanceId(1), Attempt(1), ttl).await,
            StartLock::Unavailable
        );
        assert_eq!(
            guards.mark_dispatch(InstanceId(1), Attempt(1), ttl).await,
            None
        );
        let (outages, degraded_calls) = guards.outage_counts();
        assert_eq!(outages, 1, "one outage, logged once");
        assert_eq!(degraded_calls, 2);
    }
}
