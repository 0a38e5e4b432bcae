//! Which HorizontalPodAutoscalers target each Memcached, from the HPA watch: two autoscalers of
//! one `spec.size` would fight, so the operator's own stops deciding while an HPA targets it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

use super::meta::{Meta, resource_of};
use super::triggers::Trigger;
use crate::api::Memcached;
use operator_runtime::lock;
use operator_runtime::queue::Priority;
use operator_runtime::relisted::Relisted;

/// An HPA as the watch decodes it: its name and the Memcached it targets, if it targets one.
#[derive(Clone, Debug, Default)]
pub struct HpaSeen {
    pub metadata: ObjectMeta,
    /// The Memcached of its `scaleTargetRef`.
    pub memcached: Option<String>,
}

impl<'de> Deserialize<'de> for HpaSeen {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Target {
            #[serde(default)]
            api_version: String,
            #[serde(default)]
            kind: String,
            #[serde(default)]
            name: String,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            scale_target_ref: Target,
        }
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Meta<IgnoredAny>,
            #[serde(default)]
            spec: Spec,
        }
        let wire = Wire::deserialize(deserializer)?;
        let target = wire.spec.scale_target_ref;
        let group = target.api_version.split('/').next().unwrap_or_default();
        let ours = target.kind == Memcached::kind(&()) && group == Memcached::group(&());
        Ok(Self {
            metadata: wire.metadata.meta,
            memcached: ours.then_some(target.name),
        })
    }
}

impl Resource for HpaSeen {
    resource_of!(HorizontalPodAutoscaler);

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
    /// HPA → the Memcached it targets.
    target: HashMap<Key, String>,
    /// Memcached → the HPAs targeting it.
    hpas: HashMap<Key, BTreeSet<String>>,
}

impl Index {
    fn remove(&mut self, hpa: &Key) {
        let Some(memcached) = self.target.remove(hpa) else {
            return;
        };
        let key = (hpa.0.clone(), memcached);
        if let Some(names) = self.hpas.get_mut(&key) {
            names.remove(&hpa.1);
            if names.is_empty() {
                self.hpas.remove(&key);
            }
        }
    }

    fn apply(&mut self, hpa: &HpaSeen) {
        let key = (hpa.namespace().unwrap_or_default(), hpa.name_any());
        self.remove(&key);
        let Some(memcached) = hpa.memcached.clone() else {
            return;
        };
        self.hpas
            .entry((key.0.clone(), memcached.clone()))
            .or_default()
            .insert(key.1.clone());
        self.target.insert(key, memcached);
    }
}

/// HPAs by the Memcached they target, fed every event of the HPA watch.
#[derive(Default)]
pub struct HpaIndex(Mutex<Relisted<Index>>);

impl HpaIndex {
    /// Records the event; the Memcached whose HPAs it changes is queued (before and after, for
    /// an HPA that moved to another target).
    pub fn observe(&self, event: &watcher::Event<HpaSeen>) -> Vec<Trigger> {
        let mut index = lock(&self.0);
        let mut targets = Vec::new();
        let mut queue = |ns: String, name: &str| {
            let key = ObjectRef::<Memcached>::new(name).within(&ns);
            targets.push((key, Priority::High));
        };
        if let watcher::Event::Apply(hpa)
        | watcher::Event::InitApply(hpa)
        | watcher::Event::Delete(hpa) = event
        {
            let key = (hpa.namespace().unwrap_or_default(), hpa.name_any());
            if let Some(before) = index.live().target.get(&key) {
                queue(key.0.clone(), &before.clone());
            }
            if let Some(now) = hpa
                .memcached
                .as_deref()
                .filter(|_| !matches!(event, watcher::Event::Delete(_)))
            {
                queue(key.0.clone(), now);
            }
        }
        index.observe(event, Index::apply, |index, hpa| {
            index.remove(&(hpa.namespace().unwrap_or_default(), hpa.name_any()));
        });
        targets.dedup();
        targets
    }

    /// The HPA targeting Memcached `name` in `namespace`, if any (the first by name).
    pub fn targeting(&self, namespace: &str, name: &str) -> Option<String> {
        let index = lock(&self.0);
        let names = index
            .live()
            .hpas
            .get(&(namespace.to_string(), name.to_string()))?;
        names.first().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(name: &str, kind: &str, api_version: &str, target: &str) -> HpaSeen {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"scaleTargetRef": {"apiVersion": api_version, "kind": kind, "name": target},
                     "maxReplicas": 5},
        }))
        .unwrap()
    }

    #[test]
    fn an_hpa_of_a_memcached_is_found_by_it_until_it_is_deleted_or_retargeted() {
        let index = HpaIndex::default();
        let ours = hpa("web", "Memcached", "cache.example.com/v1alpha1", "cache");
        let queued = index.observe(&watcher::Event::Apply(ours.clone()));
        assert_eq!(queued.len(), 1);
        assert_eq!(index.targeting("ns", "cache").as_deref(), Some("web"));
        // Retargeted to a Deployment: the Memcached is queued to be told, and is free again.
        let moved = hpa("web", "Deployment", "apps/v1", "cache");
        assert_eq!(index.observe(&watcher::Event::Apply(moved)).len(), 1);
        assert_eq!(index.targeting("ns", "cache"), None);
        index.observe(&watcher::Event::Apply(ours.clone()));
        index.observe(&watcher::Event::Delete(ours));
        assert_eq!(index.targeting("ns", "cache"), None);
    }

    #[test]
    fn a_kind_of_another_group_is_not_ours() {
        let other = hpa("web", "Memcached", "other.example.com/v1", "cache");
        assert_eq!(other.memcached, None);
    }
}
