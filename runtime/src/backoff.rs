//! Per-object exponential backoff for failed reconciles, as controller-runtime's default rate
//! limiter: 5 ms doubling to 1000 s, with jitter so objects failing together do not retry together.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use rand::Rng;

pub const BASE_DELAY: Duration = Duration::from_millis(5);
pub const MAX_DELAY: Duration = Duration::from_secs(1000);
/// Each delay is scaled by a random factor in [1 - JITTER, 1 + JITTER].
const JITTER: f64 = 0.1;

/// Delay before the retry that follows `failures` consecutive failures (the first failure is 1).
pub fn delay(failures: u32, jitter: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(31);
    let nominal = BASE_DELAY.saturating_mul(1u32 << exponent).min(MAX_DELAY);
    nominal
        .mul_f64(1.0 + jitter.clamp(-JITTER, JITTER))
        .min(MAX_DELAY)
}

/// Failure counts per object; reset when the object reconciles successfully.
pub struct Backoff<K> {
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Hash + Eq> Default for Backoff<K> {
    fn default() -> Self {
        Self {
            failures: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq> Backoff<K> {
    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: K) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        delay(*count, rand::rng().random_range(-JITTER..=JITTER))
    }

    pub fn reset(&self, key: &K) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub fn failures(&self, key: &K) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_5ms_and_caps_at_1000s() {
        assert_eq!(delay(1, 0.0), Duration::from_millis(5));
        assert_eq!(delay(2, 0.0), Duration::from_millis(10));
        assert_eq!(delay(11, 0.0), Duration::from_millis(5120));
        assert_eq!(
            delay(19, 0.0),
            Duration::from_millis(1_310_720).min(MAX_DELAY)
        );
        assert_eq!(delay(40, 0.0), MAX_DELAY);
        assert_eq!(delay(u32::MAX, 0.5), MAX_DELAY);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        assert_eq!(delay(3, 0.1), Duration::from_millis(22));
        assert_eq!(delay(3, -0.1), Duration::from_millis(18));
        assert_eq!(
            delay(3, 5.0),
            Duration::from_millis(22),
            "jitter is clamped"
        );
    }

    #[test]
    fn counts_per_object_and_resets_on_success() {
        let b = Backoff::default();
        let first = b.next_delay("a");
        let _ = b.next_delay("a");
        let third = b.next_delay("a");
        assert!(third > first * 3, "{third:?} should be ~4x {first:?}");
        assert_eq!(b.failures(&"a"), 3);
        assert_eq!(b.failures(&"b"), 0, "other objects are unaffected");
        b.reset(&"a");
        assert_eq!(b.failures(&"a"), 0);
        assert!(b.next_delay("a") <= Duration::from_micros(5500));
    }
}
