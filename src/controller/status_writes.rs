//! The status each Memcached was last given, until its watch brings that write back. A
//! reconcile that reads the Memcached before then sees the status before it, and would write
//! the same status again: the API server answers such an apply in full, for nothing. At 1,000
//! new Memcacheds about one status patch in five was one.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::api::{Memcached, MemcachedStatus};
use crate::watch::digest::digest;
use operator_runtime::lock;

/// The last status written per Memcached, and the version of it that status was computed from.
#[derive(Default)]
pub struct StatusWrites(Mutex<HashMap<ObjectRef<Memcached>, Written>>);

struct Written {
    read: Option<String>,
    status: Option<u64>,
}

impl StatusWrites {
    /// Whether `status` was written for `mc` as read now, its watch not having brought that
    /// write back yet. Once it has (a newer version is read), the write is forgotten.
    pub fn pending(&self, mc: &Memcached, status: &MemcachedStatus) -> bool {
        let mut writes = lock(&self.0);
        let key = ObjectRef::from_obj(mc);
        match writes.get(&key) {
            Some(w) if w.read == mc.metadata.resource_version => w.status == digest(status),
            Some(_) => {
                writes.remove(&key);
                false
            }
            None => false,
        }
    }

    /// `status` was written for `mc` as read.
    pub fn wrote(&self, mc: &Memcached, status: &MemcachedStatus) {
        let written = Written {
            read: mc.metadata.resource_version.clone(),
            status: digest(status),
        };
        lock(&self.0).insert(ObjectRef::from_obj(mc), written);
    }

    pub fn forget(&self, key: &ObjectRef<Memcached>) {
        lock(&self.0).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;

    #[test]
    fn a_status_is_pending_until_a_newer_version_is_read() {
        let writes = StatusWrites::default();
        let mut mc = memcached("cache", 1);
        let status = MemcachedStatus {
            replicas: 1,
            ..MemcachedStatus::default()
        };
        assert!(!writes.pending(&mc, &status), "nothing written yet");
        writes.wrote(&mc, &status);
        assert!(writes.pending(&mc, &status));
        let other = MemcachedStatus {
            replicas: 2,
            ..MemcachedStatus::default()
        };
        assert!(!writes.pending(&mc, &other), "another status is written");
        mc.metadata.resource_version = Some("2".into());
        assert!(!writes.pending(&mc, &status), "the watch brought it back");
        mc.metadata.resource_version = Some("1".into());
        assert!(!writes.pending(&mc, &status), "forgotten then");
    }
}
