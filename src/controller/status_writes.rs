//! The status each Memcached was last given, until its watch brings that write back. A
//! reconcile that reads the Memcached before then sees an older status, and would write the
//! status last written again: the API server answers such an apply in full, for nothing. At
//! 1,000 new Memcacheds about one status patch in eight was one.
//!
//! Behind means older than the version the write made, not only the version it was computed
//! from: reconciles between two of its watch events may write twice. Resource versions of one
//! kind compare as numbers (stable in Kubernetes 1.35, KEP-5504); one that does not parse as one
//! is never behind.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::api::{Memcached, MemcachedStatus};
use crate::watch::digest::digest;
use operator_runtime::lock;

/// The last status written per Memcached, and the version of the Memcached that write made.
#[derive(Default)]
pub struct StatusWrites(Mutex<HashMap<ObjectRef<Memcached>, Written>>);

struct Written {
    made: Option<String>,
    status: Option<u64>,
}

impl StatusWrites {
    /// Whether `status` is the one last written for `mc`, read at a version older than that
    /// write made. Once its watch has brought the write back, the write is forgotten.
    pub fn pending(&self, mc: &Memcached, status: &MemcachedStatus) -> bool {
        let mut writes = lock(&self.0);
        let key = ObjectRef::from_obj(mc);
        let Some(w) = writes.get(&key) else {
            return false;
        };
        let read = mc.metadata.resource_version.as_deref();
        match compare_versions(read, w.made.as_deref()) {
            Some(Ordering::Less) => w.status == digest(status),
            _ => {
                writes.remove(&key);
                false
            }
        }
    }

    /// `status` was written for `mc`, making its version `made`.
    pub fn wrote(&self, mc: &Memcached, status: &MemcachedStatus, made: Option<String>) {
        let written = Written {
            made,
            status: digest(status),
        };
        lock(&self.0).insert(ObjectRef::from_obj(mc), written);
    }

    pub fn forget(&self, key: &ObjectRef<Memcached>) {
        lock(&self.0).remove(key);
    }
}

/// KEP-5504's order of two resource versions: decimal numbers without leading zeros, the
/// longer the newer. `None` if either is not one.
fn compare_versions(a: Option<&str>, b: Option<&str>) -> Option<Ordering> {
    let well_formed =
        |v: &str| !v.is_empty() && !v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit());
    let (a, b) = (a.filter(|v| well_formed(v))?, b.filter(|v| well_formed(v))?);
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;

    fn status(replicas: i32) -> MemcachedStatus {
        MemcachedStatus {
            replicas,
            ..MemcachedStatus::default()
        }
    }

    fn at(mc: &mut Memcached, version: &str) {
        mc.metadata.resource_version = Some(version.into());
    }

    #[test]
    fn a_status_is_pending_until_the_version_it_made_is_read() {
        let writes = StatusWrites::default();
        let mut mc = memcached("cache", 1);
        at(&mut mc, "9");
        assert!(!writes.pending(&mc, &status(1)), "nothing written yet");
        writes.wrote(&mc, &status(1), Some("10".into()));
        assert!(writes.pending(&mc, &status(1)));
        assert!(
            !writes.pending(&mc, &status(2)),
            "another status is written"
        );
        writes.wrote(&mc, &status(2), Some("11".into()));
        at(&mut mc, "10");
        assert!(
            writes.pending(&mc, &status(2)),
            "read behind the last write"
        );
        at(&mut mc, "11");
        assert!(
            !writes.pending(&mc, &status(2)),
            "the watch brought it back"
        );
        at(&mut mc, "10");
        assert!(!writes.pending(&mc, &status(2)), "forgotten then");
    }

    #[test]
    fn a_version_that_is_not_a_number_is_never_behind() {
        let writes = StatusWrites::default();
        let mut mc = memcached("cache", 1);
        at(&mut mc, "9");
        writes.wrote(&mc, &status(1), Some("a10".into()));
        assert!(!writes.pending(&mc, &status(1)));
        writes.wrote(&mc, &status(1), None);
        assert!(!writes.pending(&mc, &status(1)));
    }

    #[test]
    fn versions_compare_by_length_then_digits() {
        let cmp = |a, b| compare_versions(Some(a), Some(b));
        assert_eq!(cmp("9", "10"), Some(Ordering::Less));
        assert_eq!(cmp("123", "122"), Some(Ordering::Greater));
        assert_eq!(cmp("42", "42"), Some(Ordering::Equal));
        assert_eq!(cmp("042", "42"), None, "a leading zero");
        assert_eq!(cmp("", "1"), None);
        assert_eq!(compare_versions(None, Some("1")), None);
    }
}
