//! The trigger policy: which watch event queues which Memcached, and how urgently. Pure: the
//! watches (watches.rs) call these with the event and what their cache held before it.
//!
//! - High: what users wait for — a Memcached's spec changed or it is new; someone else changed
//!   or deleted what we own.
//! - Low: what only the status reports — pods, an owned object's status, the echo of our own
//!   write, an object just created.

use std::marker::PhantomData;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::owned::{Owned, OwnedObject};
use super::pod_index::PodMeta;
use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::resources::LABEL_INSTANCE;
use crate::service_monitor::ServiceMonitor;
use operator_runtime::queue::Priority;

/// A reconcile to queue: the Memcached and how urgently.
pub type Trigger = (ObjectRef<Memcached>, Priority);

/// A Memcached whose spec changed (or that is new); status writes do not change the
/// generation, so our own status patches trigger nothing. `cached` is the version the cache held.
pub fn spec_change(
    cached: Option<&Memcached>,
    event: &watcher::Event<Memcached>,
) -> Option<Trigger> {
    let (watcher::Event::Apply(mc) | watcher::Event::InitApply(mc)) = event else {
        return None;
    };
    let changed = cached.is_none_or(|old| old.metadata.generation != mc.metadata.generation);
    changed.then_some((key_of(mc), Priority::High))
}

/// Pods only change what the status reports.
pub fn pod_change(event: &watcher::Event<PodMeta>) -> Option<Trigger> {
    match event {
        watcher::Event::Apply(pod)
        | watcher::Event::InitApply(pod)
        | watcher::Event::Delete(pod) => memcached_of_pod(pod).map(|key| (key, Priority::Low)),
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// Which changes of an owned kind queue its Memcached: a change by someone else of what we set
/// or of its owners always, at high priority (`OwnedObject::changed_from`).
pub struct OwnedTriggers<K: Owned> {
    /// Whether any other change (the status) does, at low priority.
    on_status: bool,
    kind: PhantomData<fn() -> K>,
}

impl<K: Owned> OwnedTriggers<K> {
    pub fn new(on_status: bool) -> Self {
        Self {
            on_status,
            kind: PhantomData,
        }
    }
}

impl OwnedTriggers<Service> {
    pub fn services() -> Self {
        Self::new(true)
    }
}

impl OwnedTriggers<PodDisruptionBudget> {
    /// The disruption controller rewrites a budget's status whenever a pod's readiness changes;
    /// the pod watch already reports that, so a status change triggers nothing.
    pub fn budgets() -> Self {
        Self::new(false)
    }
}

impl OwnedTriggers<Deployment> {
    /// The proxy's: its Ready pods are in the Memcached's status.
    pub fn deployments() -> Self {
        Self::new(true)
    }
}

impl OwnedTriggers<ConfigMap> {
    pub fn config_maps() -> Self {
        Self::new(false)
    }
}

impl OwnedTriggers<NetworkPolicy> {
    pub fn network_policies() -> Self {
        Self::new(false)
    }
}

impl OwnedTriggers<ServiceMonitor> {
    pub fn service_monitors() -> Self {
        Self::new(false)
    }
}

impl OwnedTriggers<Certificate> {
    /// cert-manager's status (Ready, renewal times) changes nothing of ours.
    pub fn certificates() -> Self {
        Self::new(false)
    }
}

impl<K: Owned> OwnedTriggers<K> {
    /// What an event of an owned object queues: `cached` is the version the cache held, `ours`
    /// whether the event is the echo of our own write.
    pub fn trigger(
        &self,
        cached: Option<&OwnedObject<K>>,
        event: &watcher::Event<OwnedObject<K>>,
        ours: bool,
    ) -> Option<Trigger> {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => self
                .priority(cached, obj, ours)
                .and_then(|p| controller_of(obj).map(|key| (key, p))),
            watcher::Event::Delete(obj) => controller_of(obj).map(|key| (key, Priority::High)),
            watcher::Event::Init | watcher::Event::InitDone => None,
        }
    }

    /// How urgently a change from `old` (as cached) to `new` calls for a reconcile.
    fn priority(
        &self,
        old: Option<&OwnedObject<K>>,
        new: &OwnedObject<K>,
        ours: bool,
    ) -> Option<Priority> {
        match old {
            Some(old) if !ours && new.changed_from(old) => Some(Priority::High),
            Some(_) if !self.on_status => None,
            _ => Some(Priority::Low),
        }
    }
}

/// A Memcached's key in the queue: its namespace and name (`ObjectRef::from_obj` would also
/// copy its resourceVersion and uid into every queued key).
pub fn key_of(mc: &Memcached) -> ObjectRef<Memcached> {
    ObjectRef::new(mc.metadata.name.as_deref().unwrap_or_default())
        .within(mc.metadata.namespace.as_deref().unwrap_or_default())
}

/// The Memcached a pod belongs to, by its instance label.
fn memcached_of_pod(pod: &PodMeta) -> Option<ObjectRef<Memcached>> {
    let ns = pod.namespace()?;
    let instance = pod.labels().get(LABEL_INSTANCE)?;
    Some(ObjectRef::new(instance).within(&ns))
}

/// The Memcached that controls an owned object.
fn controller_of<K: Resource>(obj: &K) -> Option<ObjectRef<Memcached>> {
    let ns = obj.namespace()?;
    let owner = obj
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Memcached::kind(&()))?;
    Some(ObjectRef::new(&owner.name).within(&ns))
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;
    use crate::fixtures::memcached;
    use crate::resources;

    fn cache_key() -> ObjectRef<Memcached> {
        ObjectRef::new("cache").within("default")
    }

    /// Our Service for the Memcached "cache", at `port`.
    fn service_at(port: i32) -> OwnedObject<Service> {
        let mut s = resources::service(&memcached("cache", 1));
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = port;
        OwnedObject::of(&s)
    }

    #[test]
    fn a_new_memcached_or_a_spec_change_is_urgent_and_a_status_write_queues_nothing() {
        let mc = memcached("cache", 1);
        let urgent = Some((cache_key(), Priority::High));
        assert_eq!(
            spec_change(None, &watcher::Event::Apply(mc.clone())),
            urgent
        );
        let mut resized = mc.clone();
        resized.metadata.generation = Some(2);
        assert_eq!(
            spec_change(Some(&mc), &watcher::Event::Apply(resized)),
            urgent
        );
        let mut status_written = mc.clone();
        status_written.metadata.resource_version = Some("2".into());
        assert_eq!(
            spec_change(Some(&mc), &watcher::Event::Apply(status_written)),
            None
        );
        assert_eq!(
            spec_change(Some(&mc), &watcher::Event::Delete(mc.clone())),
            None
        );
    }

    #[test]
    fn our_own_apply_is_a_status_refresh_and_someone_elses_is_drift() {
        let services = OwnedTriggers::services();
        let (before, after) = (service_at(11211), service_at(11311));
        let applied = watcher::Event::Apply(after.clone());
        let (urgent, refresh) = (
            Some((cache_key(), Priority::High)),
            Some((cache_key(), Priority::Low)),
        );
        assert_eq!(services.trigger(Some(&before), &applied, false), urgent);
        assert_eq!(services.trigger(Some(&before), &applied, true), refresh);
        let status_only = watcher::Event::Apply(before.clone());
        assert_eq!(
            services.trigger(Some(&before), &status_only, false),
            refresh,
            "a status change (a load balancer's, say)"
        );
        assert_eq!(
            services.trigger(None, &applied, false),
            refresh,
            "a new object"
        );
    }

    #[test]
    fn a_deleted_object_is_urgent_for_the_memcached_that_controls_it() {
        let gone = watcher::Event::Delete(service_at(11211));
        assert_eq!(
            OwnedTriggers::services().trigger(None, &gone, false),
            Some((cache_key(), Priority::High))
        );
        let mut orphan = resources::service(&memcached("cache", 1));
        orphan.metadata.owner_references = None;
        let orphan = watcher::Event::Delete(OwnedObject::of(&orphan));
        assert_eq!(
            OwnedTriggers::services().trigger(None, &orphan, false),
            None,
            "no Memcached controls it"
        );
    }

    #[test]
    fn a_budgets_status_queues_nothing_but_drift_does() {
        let mc = memcached("cache", 3);
        let budget = |generation| {
            let mut b = resources::pod_disruption_budget(&mc).expect("size 3 has one");
            b.metadata.generation = Some(generation);
            OwnedObject::of(&b)
        };
        let budgets = OwnedTriggers::budgets();
        let (before, after) = (budget(1), budget(2));
        assert_eq!(
            budgets.trigger(Some(&before), &watcher::Event::Apply(before.clone()), false),
            None
        );
        assert_eq!(
            budgets.trigger(Some(&before), &watcher::Event::Apply(after.clone()), true),
            None,
            "our own write"
        );
        assert_eq!(
            budgets.trigger(Some(&before), &watcher::Event::Apply(after), false),
            Some((cache_key(), Priority::High))
        );
    }

    #[test]
    fn a_service_drifts_when_its_spec_or_ownership_changes() {
        let ours = resources::service(&memcached("cache", 1));
        let cached = OwnedObject::of(&ours);
        assert!(!OwnedObject::of(&ours).changed_from(&cached));
        let mut ports = ours.clone();
        ports.spec.as_mut().unwrap().ports = None;
        assert!(OwnedObject::of(&ports).changed_from(&cached));
        let mut relabelled = ours;
        relabelled.metadata.labels = None;
        assert!(OwnedObject::of(&relabelled).changed_from(&cached));
    }

    #[test]
    fn a_pod_is_a_status_refresh_of_the_memcached_its_instance_label_names() {
        let pod = |labels: &[(&str, &str)]| PodMeta {
            trouble: None,
            ip: None,
            ready_since: None,
            not_ready_since: None,
            metadata: ObjectMeta {
                name: Some("cache-0".into()),
                namespace: Some("default".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
        };
        let ours = pod(&[(LABEL_INSTANCE, "cache")]);
        for event in [
            watcher::Event::Apply(ours.clone()),
            watcher::Event::Delete(ours.clone()),
        ] {
            assert_eq!(pod_change(&event), Some((cache_key(), Priority::Low)));
        }
        assert_eq!(pod_change(&watcher::Event::Apply(pod(&[]))), None);
    }

    #[test]
    fn the_service_fixture_is_controlled_by_its_memcached() {
        // The fixtures above rely on the builders setting a controller reference.
        assert_eq!(controller_of(&service_at(11211)), Some(cache_key()));
    }
}
