//! The StatefulSets of before as the watch keeps them: what the adoption reads.

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::watch::digest::digest_naming;
use crate::watch::owned::{Owned, OwnedObject, names};
use crate::watch::triggers::OwnedTriggers;

/// The StatefulSets of the watched namespaces that the operator labelled as its own.
pub type Cache = operator_runtime::cache::Cache<OwnedObject<StatefulSet>>;

/// Only to adopt from it: nothing reads its status.
impl Owned for StatefulSet {
    type Status = serde::de::IgnoredAny;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

/// A StatefulSet's watch queues its Memcached when it changes or goes (its delete ends the
/// release); its status, which its controller rewrites as pods change, does not.
pub fn triggers() -> OwnedTriggers<StatefulSet> {
    OwnedTriggers::new(false)
}
