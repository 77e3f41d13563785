//! Retry policy: how long a failed attempt waits before the next one.

/// The longest any retry waits, whatever the base delay and attempt number.
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

/// Delay before the attempt after `failed_attempt` (1-based): `base × 2^(failed_attempt − 1)`,
/// capped at [`MAX_BACKOFF_MS`], then scaled by a jitter factor in [0.5, 1.0] so retries of a
/// burst of failures do not arrive together. `unit_random` is a number in [0, 1) from the caller,
/// which keeps this function pure.
pub fn retry_delay_ms(base_ms: u64, failed_attempt: u32, unit_random: f64) -> u64 {
    let exponent = failed_attempt.saturating_sub(1).min(32);
    let full = base_ms.saturating_mul(1u64 << exponent).min(MAX_BACKOFF_MS);
    let factor = 0.5 + 0.5 * unit_random.clamp(0.0, 1.0);
    (full as f64 * factor) as u64
}

/// Whether an instance whose attempt `attempt` just failed may try again, given `retries`
/// further attempts allowed after the first. `withdrawn` attempts (dispatches taken back before
/// they were confirmed started) do not count: they are not the task's failures.
pub fn retries_left(attempt: u32, withdrawn: u32, retries: u32) -> bool {
    attempt.saturating_sub(withdrawn) <= retries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_doubles_per_attempt_within_jitter_bounds() {
        assert_eq!(retry_delay_ms(1_000, 1, 0.999_999), 999);
        assert_eq!(retry_delay_ms(1_000, 1, 0.0), 500);
        assert_eq!(retry_delay_ms(1_000, 3, 0.0), 2_000);
        assert_eq!(retry_delay_ms(1_000, 3, 1.0), 4_000);
    }

    #[test]
    fn delay_is_capped_and_never_overflows() {
        assert_eq!(retry_delay_ms(1_000, 40, 1.0), MAX_BACKOFF_MS);
        assert_eq!(retry_delay_ms(u64::MAX, 40, 1.0), MAX_BACKOFF_MS);
        assert_eq!(retry_delay_ms(0, 5, 1.0), 0);
    }

    #[test]
    fn retries_count_attempts_after_the_first() {
        assert!(!retries_left(1, 0, 0));
        assert!(retries_left(1, 0, 2));
        assert!(retries_left(2, 0, 2));
        assert!(!retries_left(3, 0, 2));
    }

    #[test]
    fn withdrawn_attempts_are_not_failures() {
        // Attempt 1 was withdrawn, attempt 2 failed: with no retries it is still the first try.
        assert!(!retries_left(2, 1, 0));
        assert!(retries_left(2, 1, 1));
        assert!(retries_left(3, 2, 1));
        assert!(!retries_left(4, 2, 1));
    }
}
