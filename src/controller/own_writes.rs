//! The resourceVersions of our own writes to owned objects, so that the watch can tell the echo
//! of an apply from someone else's change. Without it every size change reconciled twice at high
//! priority: once for the Memcached's new generation, once for the Deployment's that our apply
//! made, doubling the queue that users' changes wait in.
//!
//! A resourceVersion is etcd's revision of the write, unique across every kind, so one set
//! serves all owned kinds. An entry leaves when its event arrives; a relist (after which events
//! of earlier writes never come) empties the set.

use std::collections::HashSet;
use std::sync::Mutex;

use kube::Resource;

use operator_runtime::lock;

#[derive(Default)]
pub struct OwnWrites {
    versions: Mutex<HashSet<String>>,
}

impl OwnWrites {
    /// Records the write that made `after`, unless it changed nothing (`before` has the same
    /// resourceVersion: no event will come). Returns whether an event will come.
    pub fn record<K: Resource>(&self, before: Option<&K>, after: &K) -> bool {
        let Some(version) = after.meta().resource_version.as_ref() else {
            return false;
        };
        if before.and_then(|b| b.meta().resource_version.as_ref()) == Some(version) {
            return false;
        }
        lock(&self.versions).insert(version.clone());
        true
    }

    /// Whether the watch event of `obj` is the echo of one of our writes; each echo is told once.
    pub fn is_echo<K: Resource>(&self, obj: &K) -> bool {
        obj.meta()
            .resource_version
            .as_ref()
            .is_some_and(|version| lock(&self.versions).remove(version))
    }

    /// A relist replaced the watch: echoes of earlier writes will not come.
    pub fn forget(&self) {
        lock(&self.versions).clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.versions).len()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::ObjectMeta;

    use super::*;

    fn at(version: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..Deployment::default()
        }
    }

    #[test]
    fn our_write_is_an_echo_once_and_a_later_change_is_not() {
        let own = OwnWrites::default();
        assert!(own.record(Some(&at("10")), &at("12")));
        assert!(own.is_echo(&at("12")));
        assert!(!own.is_echo(&at("12")), "told once");
        assert!(!own.is_echo(&at("15")), "someone else's write");
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
        assert!(!own.is_echo(&at("11")), "a relist forgets");
    }
}
