//! Reconnect delays: exponential growth with full jitter.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with full jitter: the n-th delay is drawn uniformly from
/// `[0, min(max, initial * 2^n)]`. Full jitter spreads a fleet of workers that lost the same
/// scheduler node over the whole window, so they do not reconnect to the survivors in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            failures: 0,
        }
    }

    /// The upper bound of the next delay, before jitter.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Returns the delay to wait before the next try and counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// Forgets past failures, after a connection that registered successfully.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_maximum_and_delays_stay_under_it() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        let mut ceilings = Vec::new();
        for _ in 0..10 {
            let ceiling = backoff.ceiling();
            let delay = backoff.next_delay();
            assert!(delay <= ceiling, "{delay:?} > {ceiling:?}");
            ceilings.push(ceiling.as_millis());
        }
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000]
        );
        backoff.reset();
        assert_eq!(backoff.ceiling(), Duration::from_millis(100));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        for _ in 0..200 {
            backoff.next_delay();
        }
        assert_eq!(backoff.ceiling(), Duration::from_secs(10));
    }
}
