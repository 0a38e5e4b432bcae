//! The status each Memcached was last given, until its watch brings that write back. A
//! reconcile that reads the Memcached before then sees an older status: compared with it, the
//! status last written is written again, and a condition that changed since the status it read
//! gets a new transition time, so the same status a second later is another write, and the
//! time a condition changed moves to when the operator looked again.
//!
//! Behind means older than the version the write made, not only the version it was computed
//! from: reconciles between two of its watch events may write twice. Resource versions of one
//! kind compare as numbers (stable in Kubernetes 1.35, KEP-5504); one that does not parse as one
//! is never behind.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;

use crate::api::{Memcached, MemcachedStatus};
use crate::watch::digest::digest;
use crate::watch::triggers::key_of as key;
use operator_runtime::lock;

/// Longer than a watch takes to bring a write back, even on a saturated API server: a write
/// older than this is read back, and is dropped from memory at the next sweep.
const READ_BACK_WITHIN: Duration = Duration::from_secs(30);
/// Swept when the writes remembered have doubled since the last sweep, at least this many.
const FIRST_SWEEP: usize = 64;

/// The last status written per Memcached, and the version of the Memcached that write made.
pub struct StatusWrites(Mutex<Writes>);

struct Writes {
    last: HashMap<ObjectRef<Memcached>, Written>,
    sweep_at: usize,
}

struct Written {
    made: u64,
    at: Instant,
    status: Option<u64>,
    /// Each condition's type, status and transition time.
    transitions: Vec<(String, String, Time)>,
}

impl Default for StatusWrites {
    fn default() -> Self {
        Self(Mutex::new(Writes {
            last: HashMap::new(),
            sweep_at: FIRST_SWEEP,
        }))
    }
}

impl StatusWrites {
    /// Whether `status`, computed for `mc` as read, is to be written. While the watch has not
    /// brought back the status last written, compared with that one, whose conditions'
    /// transition times it takes (`now` for one whose status changed since); once it has, the
    /// write is forgotten and `status` is compared with `mc`'s own.
    pub fn to_write(&self, mc: &Memcached, status: &mut MemcachedStatus, now: &Time) -> bool {
        let mut writes = lock(&self.0);
        let key = key(mc);
        if let Some(w) = writes.last.get(&key) {
            let read = version(mc.metadata.resource_version.as_deref());
            if read.is_some_and(|read| read < w.made) {
                for c in &mut status.conditions {
                    if let Some((_, was, at)) = w.transitions.iter().find(|t| t.0 == c.type_) {
                        c.last_transition_time = if *was == c.status { at } else { now }.clone();
                    }
                }
                return w.status != digest(status);
            }
            writes.last.remove(&key);
        }
        mc.status.as_ref() != Some(status)
    }

    /// `status` was written for `mc`, making its version `made` (remembered if it is one that
    /// compares).
    pub fn wrote(&self, mc: &Memcached, status: &MemcachedStatus, made: Option<&str>) {
        let mut writes = lock(&self.0);
        let Some(made) = version(made) else {
            writes.last.remove(&key(mc));
            return;
        };
        let transitions = status
            .conditions
            .iter()
            .map(|c| {
                let at = c.last_transition_time.clone();
                (c.type_.clone(), c.status.clone(), at)
            })
            .collect();
        let written = Written {
            made,
            at: Instant::now(),
            status: digest(status),
            transitions,
        };
        writes.last.insert(key(mc), written);
        if writes.last.len() >= writes.sweep_at {
            writes.last.retain(|_, w| w.at.elapsed() < READ_BACK_WITHIN);
            writes.sweep_at = FIRST_SWEEP.max(2 * writes.last.len());
        }
    }

    pub fn forget(&self, key: &ObjectRef<Memcached>) {
        lock(&self.0).last.remove(key);
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        lock(&self.0).last.len()
    }
}

/// A resource version as the number KEP-5504 makes it: decimal, without leading zeros.
fn version(v: Option<&str>) -> Option<u64> {
    v.filter(|v| !v.starts_with('0'))?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;

    fn status(replicas: i32) -> MemcachedStatus {
        MemcachedStatus {
            replicas,
            ..MemcachedStatus::default()
        }
    }

    fn available(status: &str, at: i64) -> MemcachedStatus {
        MemcachedStatus {
            conditions: vec![Condition {
                type_: "Available".into(),
                status: status.into(),
                last_transition_time: time(at),
                message: String::new(),
                reason: "R".into(),
                observed_generation: None,
            }],
            ..MemcachedStatus::default()
        }
    }

    fn time(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    fn at(mc: &mut Memcached, version: &str, status: Option<MemcachedStatus>) {
        mc.metadata.resource_version = Some(version.into());
        mc.status = status;
    }

    #[test]
    fn a_status_read_behind_the_last_write_is_compared_with_that_write() {
        let writes = StatusWrites::default();
        let now = time(100);
        let mut mc = memcached("cache", 1);
        at(&mut mc, "9", None);
        assert!(
            writes.to_write(&mc, &mut status(1), &now),
            "nothing written yet"
        );
        writes.wrote(&mc, &status(1), Some("10"));
        assert!(!writes.to_write(&mc, &mut status(1), &now), "written");
        assert!(writes.to_write(&mc, &mut status(2), &now), "another status");
        writes.wrote(&mc, &status(2), Some("11"));
        at(&mut mc, "10", Some(status(1)));
        assert!(
            !writes.to_write(&mc, &mut status(2), &now),
            "behind the last write"
        );
        assert!(
            writes.to_write(&mc, &mut status(1), &now),
            "the status before it"
        );
        at(&mut mc, "11", Some(status(2)));
        assert!(!writes.to_write(&mc, &mut status(2), &now), "read back");
        assert!(writes.to_write(&mc, &mut status(1), &now));
    }

    #[test]
    fn a_status_read_behind_the_last_write_keeps_its_transition_times() {
        let writes = StatusWrites::default();
        let mut mc = memcached("cache", 1);
        at(&mut mc, "9", None);
        writes.wrote(&mc, &available("False", 100), Some("10"));
        // Computed from the status before it, the condition looks new a second later.
        let mut again = available("False", 101);
        assert!(!writes.to_write(&mc, &mut again, &time(101)));
        assert_eq!(again.conditions[0].last_transition_time, time(100));
        let mut changed = available("True", 100);
        assert!(writes.to_write(&mc, &mut changed, &time(102)));
        assert_eq!(changed.conditions[0].last_transition_time, time(102));
        // Read back: the Memcached's own status is the one compared.
        at(&mut mc, "10", Some(available("False", 100)));
        let mut same = available("False", 100);
        assert!(!writes.to_write(&mc, &mut same, &time(103)));
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_behind() {
        let writes = StatusWrites::default();
        let mut mc = memcached("cache", 1);
        at(&mut mc, "9", None);
        writes.wrote(&mc, &status(1), Some("a10"));
        assert!(writes.to_write(&mc, &mut status(1), &time(100)));
        writes.wrote(&mc, &status(1), None);
        assert!(writes.to_write(&mc, &mut status(1), &time(100)));
    }

    #[test]
    fn versions_are_decimal_numbers() {
        assert_eq!(version(Some("10")), Some(10));
        assert!(version(Some("9")) < version(Some("10")));
        assert_eq!(version(Some("042")), None, "a leading zero");
        assert_eq!(version(Some("")), None);
        assert_eq!(version(Some("a10")), None);
        assert_eq!(version(None), None);
    }

    #[test]
    fn writes_read_back_long_ago_are_swept() {
        let writes = StatusWrites::default();
        let write = |name: &str| {
            let mut mc = memcached(name, 1);
            mc.metadata.resource_version = Some("9".into());
            writes.wrote(&mc, &status(1), Some("10"));
            mc
        };
        for i in 1..FIRST_SWEEP {
            let mc = write(&format!("cache-{i}"));
            lock(&writes.0).last.get_mut(&key(&mc)).unwrap().at -= READ_BACK_WITHIN;
        }
        assert_eq!(writes.remembered(), FIRST_SWEEP - 1);
        write("cache-new");
        assert_eq!(writes.remembered(), 1, "only the write not yet read back");
    }
}
