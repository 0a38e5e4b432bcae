//! The resourceVersions of our own writes to owned objects, so that the watch can tell the echo
//! of an apply from someone else's change. Without it every size change reconciled twice at high
//! priority: once for the Memcached's new generation, once for the owned object's that our
//! apply made, doubling the queue that users' changes wait in.
//!
//! A resourceVersion is etcd's revision of the write, unique across every kind, so one set
//! serves all owned kinds. An entry leaves when its event arrives; a relist (after which events
//! of earlier writes never come) empties the set.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Resource;

use super::owned::{Observation, Owned, OwnedObject};
use operator_runtime::lock;

/// Each our write's resourceVersion, and what was observed of the object it made (so that its
/// echo need not be digested again).
#[derive(Default)]
pub struct OwnWrites {
    versions: Mutex<HashMap<String, Observation>>,
}

impl OwnWrites {
    /// Records the write that made `after`, unless it changed nothing (`before` has the same
    /// resourceVersion: no event will come). Returns whether an event will come.
    pub fn record<K: Owned>(
        &self,
        before: Option<&OwnedObject<K>>,
        after: &OwnedObject<K>,
    ) -> bool {
        let Some(version) = after.meta().resource_version.as_ref() else {
            return false;
        };
        if before.and_then(|b| b.meta().resource_version.as_ref()) == Some(version) {
            return false;
        }
        lock(&self.versions).insert(version.clone(), after.observation());
        true
    }

    /// If the watch event of `obj` is the echo of one of our writes, what was observed of the
    /// object that write made; each echo is told once.
    pub fn echo_of<K: Resource>(&self, obj: &K) -> Option<Observation> {
        let version = obj.meta().resource_version.as_ref()?;
        lock(&self.versions).remove(version)
    }

    /// A relist replaced the watch: echoes of earlier writes will not come.
    pub fn forget(&self) {
        lock(&self.versions).clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.versions).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use crate::resources;

    fn at(version: &str) -> OwnedObject<k8s_openapi::api::core::v1::Service> {
        let mut d = resources::service(&memcached("cache", 1));
        d.metadata.resource_version = Some(version.into());
        OwnedObject::of(&d)
    }

    #[test]
    fn our_write_is_an_echo_once_and_a_later_change_is_not() {
        let own = OwnWrites::default();
        assert!(own.record(Some(&at("10")), &at("12")));
        assert_eq!(own.echo_of(&at("12")), Some(at("12").observation()));
        assert_eq!(own.echo_of(&at("12")), None, "told once");
        assert_eq!(own.echo_of(&at("15")), None, "someone else's write");
        assert_eq!(own.len(), 0);
    }

    #[test]
    fn an_apply_that_changed_nothing_leaves_nothing_behind() {
        let own = OwnWrites::default();
        assert!(!own.record(Some(&at("10")), &at("10")));
        assert_eq!(own.len(), 0);
        assert!(own.record(None, &at("11")));
        assert_eq!(own.len(), 1, "a create is a write");
        own.forget();
        assert_eq!(own.echo_of(&at("11")), None, "a relist forgets");
    }
}
