//! Which pods each Memcached has, kept current from the pod watch.
//!
//! A reconcile needs one Memcached's pod names. Filtering a cache of every pod would cost
//! O(all pods) per reconcile, and O(pods × Memcacheds) for a leader taking over; here the answer
//! costs O(its pods).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

use super::meta::Meta;
use super::meta::resource_of;
use crate::resources::{LABEL_INSTANCE, REVISION_LABEL, TOPOLOGY_ZONE};
use crate::status::pods::{PodStatusSeen, PodTrouble};
use operator_runtime::lock;
use operator_runtime::relisted::Relisted;

/// A pod as the pod watch decodes it: the metadata a reconcile reads, and why it is not Ready
/// (the spec, managedFields and the rest of the status are skipped). Decoded from protobuf
/// (pod_protobuf.rs); the JSON form stays for tests and fixtures. Not a metadata-only watch
/// (`metadata_api`): at 10,000 pods that cost the API server more CPU than sending whole pods
/// (docs/performance-history.md, Restart at 10,000), and the status says why a pod is not Ready.
#[derive(Clone, Debug, Default)]
pub struct PodMeta {
    pub metadata: ObjectMeta,
    pub trouble: Option<PodTrouble>,
    pub ip: Option<IpAddr>,
    pub ready_since: Option<Timestamp>,
    /// Since when it is not Ready: its Ready condition's last change, or its creation.
    pub not_ready_since: Option<Timestamp>,
}

impl<'de> Deserialize<'de> for PodMeta {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Meta<IgnoredAny>,
            #[serde(default)]
            status: PodStatusSeen,
        }
        let wire = Wire::deserialize(deserializer)?;
        Ok(Self::of(wire.metadata.meta, &wire.status))
    }
}

impl PodMeta {
    /// What the watch keeps of a pod with this metadata and status, however it was decoded.
    pub fn of(metadata: ObjectMeta, status: &PodStatusSeen) -> Self {
        let created = metadata.creation_timestamp.as_ref().map(|t| t.0);
        Self {
            trouble: status.trouble(),
            ip: status.pod_ip,
            ready_since: status.ready_since(),
            not_ready_since: status.not_ready_since(created),
            metadata,
        }
    }
}

impl Resource for PodMeta {
    resource_of!(Pod);

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// (namespace, name)
type Key = (String, String);

#[derive(Default)]
struct Index {
    /// Pod → the Memcached (instance label) it belongs to.
    owner: HashMap<Key, String>,
    /// Memcached → its pods, sorted by name (a Vec: most Memcacheds have a few pods, and a
    /// B-tree node is a few hundred bytes even for one).
    pods: HashMap<Key, Vec<PodEntry>>,
}

/// A pod's name, and why it is not Ready if it says (boxed: most pods are fine).
struct PodEntry {
    name: String,
    trouble: Option<Box<PodTrouble>>,
    ip: Option<IpAddr>,
    ready_since: Option<Timestamp>,
    not_ready_since: Option<Timestamp>,
    /// The revision of the members' template it was made from (`REVISION_LABEL`).
    revision: Option<Box<str>>,
    /// Being deleted: counted for nothing, but its name is taken until it is gone.
    terminating: bool,
    controller: Controller,
    /// Its zone (`TOPOLOGY_ZONE`, copied from its node when it is bound).
    zone: Option<Box<str>>,
}

/// What controls a pod, by its controller reference's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// The Memcached: a member the operator keeps.
    Memcached,
    /// A workload controller: a member of a release up to 0.6.0, until it is released to the
    /// Memcached (legacy.rs).
    Workload,
    /// Nothing: a released member, until it is adopted; or someone else's pod.
    None,
    /// Anything else.
    Other,
}

impl Controller {
    fn of(meta: &ObjectMeta) -> Self {
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        match owners.iter().find(|o| o.controller == Some(true)) {
            None => Controller::None,
            Some(o) if o.kind == "Memcached" => Controller::Memcached,
            Some(o) if o.api_version.starts_with("apps/") => Controller::Workload,
            Some(_) => Controller::Other,
        }
    }
}

/// A member as the index knows it, for an operator that keeps the pods itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub ready_since: Option<Timestamp>,
    pub not_ready_since: Option<Timestamp>,
    pub revision: Option<String>,
    pub controller: Controller,
    /// Its zone, as its pod is labelled (`TOPOLOGY_ZONE`).
    pub zone: Option<String>,
}

/// The pods of one Memcached as the pod watch last reported them.
#[derive(Debug, Default, PartialEq)]
pub struct Pods {
    /// Sorted names of the pods not being deleted.
    pub names: Vec<String>,
    /// Why those that are not Ready are not, where they say.
    pub troubles: Vec<PodTrouble>,
}

impl Index {
    fn remove(&mut self, pod: &Key) {
        let Some(instance) = self.owner.remove(pod) else {
            return;
        };
        let key = (pod.0.clone(), instance);
        if let Some(names) = self.pods.get_mut(&key) {
            if let Ok(at) = names.binary_search_by(|p| p.name.cmp(&pod.1)) {
                names.remove(at);
            }
            if names.is_empty() {
                self.pods.remove(&key);
            }
        }
    }

    /// Records a pod as it now is: a pod being deleted is only a name taken, and one without
    /// our instance label counts for no Memcached (a relabelled pod leaves the one it was
    /// counted for).
    fn apply(&mut self, pod: &PodMeta) {
        let ns = pod.namespace().unwrap_or_default();
        let key = (ns.clone(), pod.name_any());
        self.remove(&key);
        let Some(instance) = pod.labels().get(LABEL_INSTANCE) else {
            return;
        };
        let names = self.pods.entry((ns, instance.clone())).or_default();
        if let Err(at) = names.binary_search_by(|p| p.name.cmp(&key.1)) {
            let entry = PodEntry {
                name: key.1.clone(),
                trouble: pod.trouble.clone().map(Box::new),
                ip: pod.ip,
                ready_since: pod.ready_since,
                not_ready_since: pod.not_ready_since,
                revision: pod.labels().get(REVISION_LABEL).map(|r| r.as_str().into()),
                terminating: pod.metadata.deletion_timestamp.is_some(),
                controller: Controller::of(&pod.metadata),
                zone: pod.labels().get(TOPOLOGY_ZONE).map(|z| z.as_str().into()),
            };
            names.insert(at, entry);
        }
        self.owner.insert(key, instance.clone());
    }
}

/// Pod names by Memcached, fed every event of the pod watch (before the controller sees it, so
/// the reconcile it triggers reads the index with the event applied).
#[derive(Default)]
pub struct PodIndex(Mutex<Relisted<Index>>);

impl PodIndex {
    pub fn observe(&self, event: &watcher::Event<PodMeta>) {
        lock(&self.0).observe(event, Index::apply, |index, pod| {
            index.remove(&(pod.namespace().unwrap_or_default(), pod.name_any()));
        });
    }

    /// The pods of Memcached `name` in `namespace` that are not being deleted.
    pub fn pods_of(&self, namespace: &str, name: &str) -> Pods {
        self.entries_of(namespace, name, |entries| Pods {
            names: live(entries).map(|p| p.name.clone()).collect(),
            troubles: live(entries)
                .filter_map(|p| p.trouble.as_deref().cloned())
                .collect(),
        })
    }

    /// The members of a Memcached whose pods are not being deleted, sorted by name.
    pub fn members_of(&self, namespace: &str, name: &str) -> Vec<Member> {
        self.entries_of(namespace, name, |entries| {
            live(entries)
                .map(|p| Member {
                    name: p.name.clone(),
                    ready_since: p.ready_since,
                    not_ready_since: p.not_ready_since,
                    revision: p.revision.as_deref().map(str::to_string),
                    controller: p.controller,
                    zone: p.zone.as_deref().map(str::to_string),
                })
                .collect()
        })
    }

    /// The names of Memcached `name`'s pods being deleted: taken until they are gone.
    pub fn terminating_of(&self, namespace: &str, name: &str) -> Vec<String> {
        self.entries_of(namespace, name, |entries| {
            entries
                .iter()
                .filter(|p| p.terminating)
                .map(|p| p.name.clone())
                .collect()
        })
    }

    /// The address of each of Memcached `name`'s pods not being deleted that has one, by pod
    /// name.
    pub fn addresses_of(&self, namespace: &str, name: &str) -> HashMap<String, IpAddr> {
        self.entries_of(namespace, name, |entries| {
            live(entries)
                .filter_map(|p| Some((p.name.clone(), p.ip?)))
                .collect()
        })
    }

    /// `read` of the entries of Memcached `name`'s pods (none if it has none).
    fn entries_of<T>(&self, namespace: &str, name: &str, read: impl FnOnce(&[PodEntry]) -> T) -> T {
        let index = lock(&self.0);
        let entries = index
            .live()
            .pods
            .get(&(namespace.to_string(), name.to_string()));
        read(entries.map_or(&[], Vec::as_slice))
    }
}

/// The entries of pods not being deleted.
fn live(entries: &[PodEntry]) -> impl Iterator<Item = &PodEntry> {
    entries.iter().filter(|p| !p.terminating)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::status::pods::Cause;

    fn pod(ns: &str, name: &str, instance: Option<&str>) -> PodMeta {
        let labels =
            instance.map(|i| BTreeMap::from([(LABEL_INSTANCE.to_string(), i.to_string())]));
        PodMeta {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels,
                ..Default::default()
            },
            trouble: None,
            ip: None,
            ready_since: None,
            not_ready_since: None,
        }
    }

    #[test]
    fn a_pod_decodes_to_the_metadata_read() {
        let pod: PodMeta = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "cache-1", "namespace": "a", "labels": {LABEL_INSTANCE: "cache"},
                         "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
            "spec": {"containers": [{"name": "memcached"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        assert_eq!(pod.metadata, pod_meta("a", "cache-1", "cache"));
        assert_eq!(pod.trouble, None, "a running pod");
    }

    #[test]
    fn a_pod_that_is_not_ready_keeps_why_until_it_is() {
        let unschedulable = |ready: bool| -> PodMeta {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "cache-1", "namespace": "a", "labels": {LABEL_INSTANCE: "cache"}},
                "status": {"conditions": [
                    {"type": "PodScheduled", "status": if ready { "True" } else { "False" },
                     "reason": "Unschedulable", "message": "0/1 nodes are available"},
                    {"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            }))
            .unwrap()
        };
        let index = PodIndex::default();
        index.observe(&watcher::Event::Apply(unschedulable(false)));
        index.observe(&watcher::Event::Apply(pod("a", "cache-2", Some("cache"))));
        let pods = index.pods_of("a", "cache");
        assert_eq!(pods.names, ["cache-1", "cache-2"]);
        assert_eq!(
            pods.troubles,
            [PodTrouble {
                cause: Cause::Unschedulable,
                words: "0/1 nodes are available".into()
            }]
        );
        index.observe(&watcher::Event::Apply(unschedulable(true)));
        assert!(index.pods_of("a", "cache").troubles.is_empty());
    }

    fn pod_meta(ns: &str, name: &str, instance: &str) -> ObjectMeta {
        pod(ns, name, Some(instance)).metadata
    }

    #[test]
    fn pods_are_listed_per_memcached_and_namespace_sorted() {
        let index = PodIndex::default();
        for p in [
            pod("a", "cache-2", Some("cache")),
            pod("a", "cache-1", Some("cache")),
            pod("a", "other-1", Some("other")),
            pod("b", "cache-9", Some("cache")),
            pod("a", "stray", None),
        ] {
            index.observe(&watcher::Event::Apply(p));
        }
        assert_eq!(index.pods_of("a", "cache").names, ["cache-1", "cache-2"]);
        assert_eq!(index.pods_of("b", "cache").names, ["cache-9"]);
        assert_eq!(index.pods_of("a", "other").names, ["other-1"]);
        assert!(index.pods_of("c", "cache").names.is_empty());
    }

    #[test]
    fn deleted_terminating_and_relabelled_pods_leave_their_memcached() {
        let index = PodIndex::default();
        for name in ["cache-1", "cache-2", "cache-3"] {
            index.observe(&watcher::Event::Apply(pod("a", name, Some("cache"))));
        }
        index.observe(&watcher::Event::Delete(pod("a", "cache-1", Some("cache"))));
        let mut terminating = pod("a", "cache-2", Some("cache"));
        terminating.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        index.observe(&watcher::Event::Apply(terminating));
        index.observe(&watcher::Event::Apply(pod("a", "cache-3", Some("other"))));
        assert!(index.pods_of("a", "cache").names.is_empty());
        assert!(index.members_of("a", "cache").is_empty());
        assert_eq!(index.pods_of("a", "other").names, ["cache-3"]);
        assert_eq!(
            index.terminating_of("a", "cache"),
            ["cache-2"],
            "its name is taken until it is gone"
        );
        index.observe(&watcher::Event::Delete(pod("a", "cache-2", Some("cache"))));
        assert!(index.terminating_of("a", "cache").is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_only_when_complete() {
        let index = PodIndex::default();
        index.observe(&watcher::Event::Apply(pod("a", "gone", Some("cache"))));
        index.observe(&watcher::Event::Init);
        index.observe(&watcher::Event::InitApply(pod(
            "a",
            "cache-1",
            Some("cache"),
        )));
        assert_eq!(
            index.pods_of("a", "cache").names,
            ["gone"],
            "a half-done relist is not visible"
        );
        index.observe(&watcher::Event::InitDone);
        assert_eq!(index.pods_of("a", "cache").names, ["cache-1"]);
    }
}
