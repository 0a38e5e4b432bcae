//! What the caches keep of an owned object: what a reconcile reads of it, and a digest of what
//! our apply set in it.
//!
//! A reconcile reads an owned object's metadata (name, owner, generation), its status, and
//! whether applying the desired object would change anything. For the last,
//! what matters is what our last apply left in place: the fields our managedFields entry lists,
//! with the values they have now. A field someone else changed has moved to their entry, so it
//! is missing there, and that shows as a difference as a changed value would. So the cache keeps
//! a 64-bit digest of those fields, not the fields: `needs` compares it with the same digest of
//! the desired object. Server defaults and other managers' fields are not ours, so they are not
//! in it; empty maps and lists count as absent, as the API server drops them.
//!
//! An object arrives with its spec and managedFields as text; `observe` digests them and lets
//! them go. Most versions need no parsing: a status update (most events) keeps the spec and
//! metadata the cached version had, and so its digest; an apply's response has our fields forced
//! to the desired object's, and so its digest (`observe_applied`); the watch's echo of our write
//! is that response again (own_writes.rs keeps what was observed of it). The rest (a restart's
//! lists, others' changes) is walked once per shape of spec, not once per object: objects alike
//! but for the strings that name them share their spec digests (known_fields.rs).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::digest::{digest, digest_naming, map_digest};
use super::known_fields::KnownFields;
use super::managed_fields::our_fields;
use super::meta::{Meta, resource_of};
use crate::certificate::Certificate;
use crate::service_monitor::ServiceMonitor;

/// A kind this operator owns objects of, and what of its status a reconcile reads.
pub trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Serialize
    + DeserializeOwned
    + Clone
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The status as kept; `IgnoredAny` where nothing reads it.
    type Status: DeserializeOwned + Clone + Debug + PartialEq + Send + Sync + 'static;
    /// Whether every spec change moves the generation (so an update at the same generation
    /// keeps the spec, and its digest).
    const GENERATION_TRACKS_SPEC: bool = true;
    /// The field that holds what our apply sets beside the metadata: `spec`, or a ConfigMap's
    /// `data`.
    const CONTENT: &str = "spec";

    /// Drops from a decoded status what nothing reads.
    fn drop_unread(_status: &mut Self::Status) {}

    /// The digest of the spec (`digest::digest_naming` of it, with the object's `names`).
    fn spec_digest(&self) -> Option<u64>;
}

impl Owned for PodDisruptionBudget {
    // The disruption controller's counts; nothing here reads them.
    type Status = IgnoredAny;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

impl Owned for NetworkPolicy {
    // It has none.
    type Status = IgnoredAny;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

impl Owned for ServiceMonitor {
    type Status = IgnoredAny;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

impl Owned for Certificate {
    // cert-manager's conditions and renewal times; nothing here reads them.
    type Status = IgnoredAny;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

impl Owned for Deployment {
    type Status = DeploymentSeen;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

/// What a reconcile reads of a Deployment's status (the proxy's): how many pods are Ready, and
/// whether a rollout is under way (more pods than wanted, or not all of the current template).
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSeen {
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default)]
    pub replicas: i32,
}

impl Owned for ConfigMap {
    type Status = IgnoredAny;
    // ConfigMaps have no generation, and hold `data` where others hold a spec.
    const GENERATION_TRACKS_SPEC: bool = false;
    const CONTENT: &str = "data";

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.data, &names(&self.metadata))
    }
}

impl Owned for Service {
    type Status = IgnoredAny;
    // Services have no generation.
    const GENERATION_TRACKS_SPEC: bool = false;

    fn spec_digest(&self) -> Option<u64> {
        digest_naming(&self.spec, &names(&self.metadata))
    }
}

/// An owned object as the caches keep it (see the module's doc). Labels and annotations are
/// not kept: only the digest reads them.
#[derive(Clone, Debug)]
pub struct OwnedObject<K: Owned> {
    pub metadata: ObjectMeta,
    pub status: Option<K::Status>,
    /// Digests of our fields; `None` before `observe`, and for an object that does not parse.
    ours: Option<Digests>,
    /// The spec and managedFields as sent, until `observe`.
    sent_spec: Option<Box<RawValue>>,
    managed_fields: Option<Box<RawValue>>,
    kind: PhantomData<fn() -> K>,
}

/// What the cache knows of an object's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Digests {
    /// Of the fields our apply owns: labels, annotations and owner references, and the spec
    /// (all of them while no managedFields entry is ours: such an object is applied once, which
    /// makes one).
    object: Option<u64>,
    /// Of the labels, annotations and owner references as sent: when they and the generation
    /// are unchanged, so is `object`.
    metadata: u64,
}

/// Decodes the spec in place as text. That needs serde_json's own deserializer reading the
/// object, not a buffered copy: kube decodes a watch event (serde's adjacent tagging) in place
/// when its `type` comes before its `object`, which is how the API server writes it (Go's
/// WatchEvent struct: Type, then Object).
impl<'de, K: Owned> Deserialize<'de> for OwnedObject<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The wire form: the spec left as text, to be digested (or dropped for a digest kept).
        #[derive(Deserialize)]
        struct Wire<S> {
            #[serde(default)]
            metadata: Meta,
            // No kind kept has both.
            #[serde(alias = "data")]
            spec: Option<Box<RawValue>>,
            status: Option<S>,
        }
        let mut wire = Wire::<K::Status>::deserialize(deserializer)?;
        if let Some(status) = &mut wire.status {
            K::drop_unread(status);
        }
        Ok(Self {
            metadata: wire.metadata.meta,
            managed_fields: wire.metadata.managed_fields,
            status: wire.status,
            ours: None,
            sent_spec: wire.spec,
            kind: PhantomData,
        })
    }
}

impl<K: Owned> Resource for OwnedObject<K> {
    resource_of!(K);

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K: Owned> OwnedObject<K> {
    /// Digests the object as sent and lets go of what only the digest reads; `old` is the
    /// cached version it replaces, `echo` what our write of this very version recorded, `known`
    /// the watch's parsed entries.
    pub fn observe(
        &mut self,
        old: Option<&Self>,
        echo: Option<Observation>,
        known: &mut KnownFields,
    ) {
        let metadata = metadata_digest(&self.metadata);
        match (echo, old) {
            (Some(echo), _) => self.take(echo),
            (None, Some(old))
                if K::GENERATION_TRACKS_SPEC
                    && self.metadata.generation.is_some()
                    && self.metadata.generation == old.metadata.generation
                    && self.metadata.uid == old.metadata.uid
                    && old.ours.is_some_and(|ours| ours.metadata == metadata) =>
            {
                self.take(old.observation());
            }
            _ => self.digest(metadata, known),
        }
        self.let_go();
    }

    /// Observes the object an apply of `desired` returned. The apply forced our fields to
    /// desired's values, so their digests are desired's: nothing to parse. (A value the API server
    /// stored in another form would show as drift only after a restart, once.)
    pub fn observe_applied(&mut self, desired: &K) {
        self.ours = Some(Digests {
            object: object_digest(desired),
            metadata: metadata_digest(&self.metadata),
        });
        self.let_go();
    }

    /// What was observed of this version, for its echo.
    pub fn observation(&self) -> Observation {
        Observation { ours: self.ours }
    }

    fn take(&mut self, observed: Observation) {
        self.ours = observed.ours;
    }

    fn let_go(&mut self) {
        self.sent_spec = None;
        self.managed_fields = None;
        self.metadata.labels = None;
        self.metadata.annotations = None;
    }

    fn digest(&mut self, metadata_seen: u64, known: &mut KnownFields) {
        let entry = self
            .managed_fields
            .as_deref()
            .and_then(|m| our_fields(m.get()));
        let mut ours = known.split(entry, K::CONTENT);
        let spec = self
            .sent_spec
            .as_deref()
            .map(|spec| ours.spec_digests(spec.get(), &names(&self.metadata)))
            .unwrap_or_default();
        let metadata = ours
            .metadata()
            .and_then(|ours| ours.digest_of(&OurMetadata::of(&self.metadata)));
        self.ours = Some(Digests {
            object: map_digest([("metadata", metadata), (K::CONTENT, spec.spec)]),
            metadata: metadata_seen,
        });
    }

    /// True when applying `desired` could change this object.
    pub fn needs(&self, desired: &K) -> bool {
        self.ours
            .is_none_or(|ours| ours.object != object_digest(desired))
    }

    /// Whether someone changed this object, a later version of `old`, in a way that may concern
    /// us: its spec (the generation) or what of it is ours, or its owners.
    pub fn changed_from(&self, old: &Self) -> bool {
        self.metadata.generation != old.metadata.generation
            || self.ours.map(|o| o.object) != old.ours.map(|o| o.object)
            || self.metadata.owner_references != old.metadata.owner_references
    }

    /// `obj` as a watch would bring it and the cache keep it.
    #[cfg(test)]
    pub fn of(obj: &K) -> Self {
        let mut kept: Self = serde_json::from_str(&serde_json::to_string(obj).unwrap()).unwrap();
        kept.observe(None, None, &mut KnownFields::default());
        kept
    }
}

/// What was observed of one version of an object: what `observe` would find again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    ours: Option<Digests>,
}

/// The digest of what an apply of `desired` sets: the metadata it carries and the spec.
fn object_digest<K: Owned>(desired: &K) -> Option<u64> {
    let metadata = digest(&OurMetadata::of(desired.meta()));
    map_digest([("metadata", metadata), (K::CONTENT, desired.spec_digest())])
}

/// The strings that name an object, for `digest_naming`, in the order of their placeholders:
/// its name, and its owner's uid (the agent's save token).
pub fn names(metadata: &ObjectMeta) -> [&str; 2] {
    let owner = metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    [
        metadata.name.as_deref().unwrap_or_default(),
        owner.map_or("", |owner| &owner.uid),
    ]
}

/// The metadata fields an apply of ours sets, as the API server sends them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OurMetadata<'a> {
    labels: &'a Option<BTreeMap<String, String>>,
    annotations: &'a Option<BTreeMap<String, String>>,
    owner_references: &'a Option<Vec<OwnerReference>>,
}

impl<'a> OurMetadata<'a> {
    fn of(metadata: &'a ObjectMeta) -> Self {
        Self {
            labels: &metadata.labels,
            annotations: &metadata.annotations,
            owner_references: &metadata.owner_references,
        }
    }
}

/// A digest of the labels, annotations and owner references.
fn metadata_digest(metadata: &ObjectMeta) -> u64 {
    digest(&OurMetadata::of(metadata)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::{Value, json};

    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use crate::fixtures::memcached;
    use crate::resources;
    use crate::resources::MANAGER_NAME;

    /// A Deployment of `mc`'s members' template (a kind with a pod template, for what walks
    /// nested keyed lists), as the operator would apply one.
    fn workload(mc: &crate::api::Memcached, images: &resources::Images) -> Deployment {
        Deployment {
            metadata: resources::service(mc).metadata,
            spec: Some(DeploymentSpec {
                replicas: Some(mc.spec.size),
                selector: LabelSelector {
                    match_labels: Some(resources::selector_labels(mc)),
                    ..LabelSelector::default()
                },
                template: resources::pod_template(mc, images),
                ..DeploymentSpec::default()
            }),
            status: None,
        }
    }

    /// The FieldsV1 a server-side apply of `applied` records: every field it sets; list items
    /// of objects by their `uid` (or `name`, `containerPort`, `port`) key; scalar lists whole.
    fn fields_of(applied: &Value) -> Value {
        match applied {
            Value::Object(object) => Value::Object(
                object
                    .iter()
                    .map(|(k, v)| (format!("f:{k}"), fields_of(v)))
                    .collect(),
            ),
            Value::Array(items) if items.iter().all(Value::is_object) => Value::Object(
                items
                    .iter()
                    .map(|item| {
                        let key = [
                            "uid",
                            "name",
                            "containerPort",
                            "port",
                            "topologyKey",
                            "path",
                        ]
                        .into_iter()
                        .find_map(|k| item.get(k).map(|v| json!({ k: v })))
                        .unwrap();
                        (format!("k:{key}"), fields_of(item))
                    })
                    .collect(),
            ),
            _ => json!({}),
        }
    }

    /// A Deployment as the API server holds it after our apply of `desired`: server defaults
    /// in its spec, another tool's annotation in its metadata, and managedFields of ours and of
    /// its controller.
    fn as_stored(desired: &Deployment) -> Deployment {
        let applied = serde_json::to_value(desired).unwrap();
        let mut stored = applied.clone();
        let spec = &mut stored["spec"];
        spec["revisionHistoryLimit"] = json!(10);
        spec["progressDeadlineSeconds"] = json!(600);
        let pod = &mut spec["template"]["spec"];
        pod["dnsPolicy"] = json!("ClusterFirst");
        pod["restartPolicy"] = json!("Always");
        pod["schedulerName"] = json!("default-scheduler");
        let container = &mut pod["containers"][0];
        container["terminationMessagePath"] = json!("/dev/termination-log");
        container["imagePullPolicy"] = json!("IfNotPresent");
        stored["metadata"]["annotations"] = json!({"argocd.argoproj.io/tracking-id": "cache"});
        let mut stored: Deployment = serde_json::from_value(stored).unwrap();
        let metadata = &applied["metadata"];
        let ours = fields_of(&json!({
            "metadata": {"labels": metadata["labels"], "ownerReferences": metadata["ownerReferences"]},
            "spec": applied["spec"],
        }));
        stored.metadata.managed_fields = Some(vec![
            ManagedFieldsEntry {
                manager: Some(MANAGER_NAME.into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(ours)),
                ..Default::default()
            },
            ManagedFieldsEntry {
                manager: Some("kube-controller-manager".into()),
                operation: Some("Update".into()),
                subresource: Some("status".into()),
                fields_v1: Some(FieldsV1(json!({"f:status": {"f:replicas": {}}}))),
                ..Default::default()
            },
        ]);
        stored
    }

    fn pod_spec(deployment: &mut Deployment) -> &mut k8s_openapi::api::core::v1::PodSpec {
        let template = &mut deployment.spec.as_mut().unwrap().template;
        template.spec.as_mut().unwrap()
    }

    /// As the watch decodes it, before `observe`.
    fn decoded(obj: &Deployment) -> OwnedObject<Deployment> {
        serde_json::from_str(&serde_json::to_string(obj).unwrap()).unwrap()
    }

    fn images() -> resources::Images {
        resources::Images::new("memcached:1")
    }

    /// Our entry's fields in `stored`, to take one away as another manager's change would.
    fn our_entry(stored: &mut Deployment) -> &mut Value {
        &mut stored.metadata.managed_fields.as_mut().unwrap()[0]
            .fields_v1
            .as_mut()
            .unwrap()
            .0
    }

    #[test]
    fn an_object_as_stored_after_our_apply_needs_nothing_and_keeps_what_reconcile_reads() {
        let mc = memcached("cache", 3);
        let desired = workload(&mc, &images());
        let mut stored = as_stored(&desired);
        stored.metadata.generation = Some(1);

        let kept = OwnedObject::of(&stored);
        assert!(!kept.needs(&desired), "server defaults are not drift");
        assert!(kept.managed_fields.is_none() && kept.sent_spec.is_none());
        assert!(kept.metadata.labels.is_none() && kept.metadata.annotations.is_none());
        assert_eq!(
            kept.metadata.owner_references,
            stored.metadata.owner_references
        );
        assert!(kept.needs(&workload(&memcached("cache", 4), &images())));
        assert!(kept.needs(&workload(&mc, &resources::Images::new("memcached:2"))));
    }

    #[test]
    fn drift_by_another_manager_is_seen() {
        let mc = memcached("cache", 2);
        let desired = workload(&mc, &images());

        // `kubectl scale`: replicas changes hands and value.
        let mut scaled = as_stored(&desired);
        scaled.spec.as_mut().unwrap().replicas = Some(4);
        our_entry(&mut scaled)["f:spec"]
            .as_object_mut()
            .unwrap()
            .remove("f:replicas");
        assert!(OwnedObject::of(&scaled).needs(&desired));

        // `kubectl set image`: the image is someone else's now, at the same value or not.
        let mut reimaged = as_stored(&desired);
        our_entry(&mut reimaged)["f:spec"]["f:template"]["f:spec"]["f:containers"]
            ["k:{\"name\":\"memcached\"}"]
            .as_object_mut()
            .unwrap()
            .remove("f:image");
        assert!(OwnedObject::of(&reimaged).needs(&desired));

        // `kubectl label --overwrite`: our label's value is theirs.
        let mut relabelled = as_stored(&desired);
        our_entry(&mut relabelled)["f:metadata"]["f:labels"]
            .as_object_mut()
            .unwrap()
            .remove("f:app.kubernetes.io/instance");
        assert!(OwnedObject::of(&relabelled).needs(&desired));
    }

    #[test]
    fn a_field_of_ours_no_longer_wanted_is_drift_and_others_fields_are_not() {
        let mut mc = memcached("cache", 2);
        mc.spec.node_selector = Some([("disk".into(), "ssd".into())].into());
        let with_selector = OwnedObject::of(&as_stored(&workload(&mc, &images())));
        mc.spec.node_selector = None;
        let desired = workload(&mc, &images());
        assert!(with_selector.needs(&desired));

        let mut labelled = as_stored(&desired);
        labelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "theirs".into());
        pod_spec(&mut labelled).priority_class_name = Some("theirs".into());
        assert!(!OwnedObject::of(&labelled).needs(&desired));
    }

    #[test]
    fn a_status_update_reuses_the_digest() {
        let mc = memcached("cache", 1);
        let desired = workload(&mc, &images());
        let mut first = as_stored(&desired);
        first.metadata.generation = Some(1);
        first.metadata.uid = Some("d".into());
        let first = OwnedObject::of(&first);
        // A spec that differs at the same generation cannot come from the API server; here it
        // tells a reused digest from a new one.
        let other = workload(&mc, &resources::Images::new("memcached:2"));
        let mut sent = as_stored(&other);
        sent.metadata.generation = Some(1);
        sent.metadata.uid = Some("d".into());
        let observed = |sent: &Deployment| {
            let mut update = decoded(sent);
            update.observe(Some(&first), None, &mut KnownFields::default());
            update
        };
        let update = observed(&sent);
        assert!(!update.needs(&desired), "reused");
        assert!(!update.changed_from(&first));

        sent.metadata.generation = Some(2);
        assert!(
            observed(&sent).needs(&desired),
            "a new generation is digested afresh"
        );
        assert!(observed(&sent).changed_from(&first));

        sent.metadata.generation = Some(1);
        sent.metadata.uid = Some("recreated".into());
        assert!(
            observed(&sent).needs(&desired),
            "so is another object of the name"
        );

        sent.metadata.uid = Some("d".into());
        sent.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "theirs".into());
        assert!(observed(&sent).needs(&desired), "and new labels");
        assert!(!observed(&sent).needs(&other));
    }

    #[test]
    fn an_apply_response_and_its_echo_are_observed_as_a_full_digest_would_find_them() {
        let mc = memcached("cache", 3);
        let desired = workload(&mc, &images());
        let stored = as_stored(&desired);
        let mut applied = decoded(&stored);
        applied.observe_applied(&desired);
        let full = OwnedObject::of(&stored);
        let (ours, full_ours) = (applied.ours.unwrap(), full.ours.unwrap());
        assert_eq!(ours.object, full_ours.object);
        assert!(applied.sent_spec.is_none() && applied.metadata.labels.is_none());

        // The echo brings the same version: what the apply observed is taken, not parsed again
        // (here a spec that differs tells the one from the other).
        let other = as_stored(&workload(&memcached("cache", 5), &images()));
        let mut echo = decoded(&other);
        echo.observe(
            None,
            Some(applied.observation()),
            &mut KnownFields::default(),
        );
        assert!(!echo.needs(&desired));
    }

    #[test]
    fn a_watch_event_decodes_into_what_the_cache_keeps() {
        let mc = memcached("cache", 2);
        let desired = workload(&mc, &images());
        let stored = as_stored(&desired);
        // As the API server writes it (Go's WatchEvent): the type before the object, so that the
        // object is decoded in place rather than buffered, which a spec left as text needs.
        let line = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            serde_json::to_string(&stored).unwrap()
        );
        let event: kube::core::WatchEvent<OwnedObject<Deployment>> =
            serde_json::from_str(&line).unwrap();
        let kube::core::WatchEvent::Modified(mut kept) = event else {
            panic!("not a modification: {line}");
        };
        kept.observe(None, None, &mut KnownFields::default());
        assert!(!kept.needs(&desired));
    }

    #[test]
    fn a_list_page_decodes_and_an_absent_or_null_spec_is_applied() {
        let desired = resources::service(&memcached("cache", 1));
        let service = serde_json::to_value(&desired).unwrap();
        let page = format!(
            r#"{{"apiVersion":"v1","kind":"ServiceList","metadata":{{"resourceVersion":"9"}},"items":[{service},{{"metadata":{{"name":"a"}},"spec":null}},{{"metadata":{{"name":"b"}}}}]}}"#
        );
        let list: kube::core::ObjectList<OwnedObject<Service>> =
            serde_json::from_str(&page).unwrap();
        let mut items = list.items;
        for item in &mut items {
            item.observe(None, None, &mut KnownFields::default());
        }
        assert!(!items[0].needs(&desired));
        assert!(items[1].needs(&desired));
        assert!(items[2].needs(&desired));
    }

    #[test]
    fn an_object_without_our_entry_is_compared_whole() {
        let desired = workload(&memcached("cache", 1), &images());
        let mut stored = as_stored(&desired);
        stored.metadata.managed_fields.as_mut().unwrap().remove(0);
        assert!(
            OwnedObject::of(&stored).needs(&desired),
            "applied once, to make our entry"
        );
        assert!(!OwnedObject::of(&desired).needs(&desired));
    }

    #[test]
    fn changes_that_concern_us_are_told_from_those_that_do_not() {
        let desired = workload(&memcached("cache", 1), &images());
        let stored = as_stored(&desired);
        let kept = OwnedObject::of(&stored);
        let changed = |change: fn(&mut Deployment)| {
            let mut other = stored.clone();
            change(&mut other);
            OwnedObject::of(&other).changed_from(&kept)
        };
        assert!(!changed(|d| d.status = Some(Default::default())));
        assert!(!changed(|d| {
            d.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert("team".into(), "theirs".into());
        }));
        assert!(changed(|d| d.metadata.generation = Some(7)));
        assert!(changed(|d| d.metadata.owner_references = None));
        assert!(changed(|d| {
            d.metadata
                .labels
                .as_mut()
                .unwrap()
                .remove("app.kubernetes.io/instance");
        }));
    }

    /// A Memcached's Deployment, as applied and as the API server keeps it.
    fn applied(name: &str, uid: &str) -> (Deployment, Deployment) {
        let mut mc = memcached(name, 1);
        mc.metadata.uid = Some(uid.into());
        let desired = workload(&mc, &images());
        let mut stored = as_stored(&desired);
        stored.metadata.generation = Some(1);
        (desired, stored)
    }

    #[test]
    fn objects_alike_but_for_their_names_are_walked_once_and_each_digested_as_itself() {
        let mut known = KnownFields::default();
        let listed: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| applied(&format!("cache-{name}"), &format!("uid-{name}")))
            .collect();
        let observed: Vec<_> = listed
            .iter()
            .map(|(_, stored)| {
                let mut obj = decoded(stored);
                obj.observe(None, None, &mut known);
                obj
            })
            .collect();
        assert_eq!(known.specs_known(), 1, "one walk for the three");
        for (i, obj) in observed.iter().enumerate() {
            assert_eq!(obj.ours, OwnedObject::of(&listed[i].1).ours);
            for (j, (desired, _)) in listed.iter().enumerate() {
                assert_eq!(obj.needs(desired), i != j, "{i} against {j}'s");
            }
        }
    }

    #[test]
    fn drift_in_an_object_alike_to_one_seen_before_is_seen() {
        let mut known = KnownFields::default();
        let observe = |stored: &Deployment, known: &mut KnownFields| {
            let mut obj = decoded(stored);
            obj.observe(None, None, known);
            obj
        };
        let (_, first) = applied("cache-a", "uid-a");
        observe(&first, &mut known);

        let (desired, stored) = applied("cache-b", "uid-b");
        let mut pointed = stored.clone();
        let template = &mut pointed.spec.as_mut().unwrap().template;
        let labels = template.metadata.as_mut().unwrap().labels.as_mut().unwrap();
        labels.insert(resources::LABEL_INSTANCE.into(), "cache-a".into());
        assert!(
            observe(&pointed, &mut known).needs(&desired),
            "another's name"
        );

        // The save token in the template, with the owner left as it is.
        let mut token = stored.clone();
        let spec = serde_json::to_string(&token.spec).unwrap();
        token.spec = serde_json::from_str(&spec.replace("\"uid-b\"", "\"uid-a\"")).unwrap();
        let token = observe(&token, &mut known);
        assert!(token.needs(&desired), "another's uid");

        let mut image = stored.clone();
        pod_spec(&mut image).containers[0].image = Some("memcached:theirs".into());
        let image = observe(&image, &mut known);
        assert!(image.needs(&desired));
        assert!(!observe(&stored, &mut known).needs(&desired));
    }

    #[test]
    fn a_config_map_is_digested_by_its_data() {
        let mc = memcached("cache", 3);
        let mut applied = ConfigMap {
            metadata: resources::service(&mc).metadata,
            data: Some(BTreeMap::from([("layout.json".into(), "{}".into())])),
            ..ConfigMap::default()
        };
        let mut stored = serde_json::to_value(&applied).unwrap();
        stored["metadata"]["managedFields"] = json!([{
            "manager": MANAGER_NAME, "operation": "Apply", "fieldsType": "FieldsV1",
            "fieldsV1": fields_of(&json!({
                "metadata": {"labels": stored["metadata"]["labels"], "ownerReferences": stored["metadata"]["ownerReferences"]},
                "data": stored["data"],
            })),
        }]);
        let stored: OwnedObject<ConfigMap> = serde_json::from_value(stored).unwrap();
        let mut kept = stored.clone();
        kept.observe(None, None, &mut KnownFields::default());
        assert!(!kept.needs(&applied), "as applied");
        applied.data = Some(BTreeMap::from([(
            "layout.json".into(),
            "{\"members\": []}".into(),
        )]));
        assert!(kept.needs(&applied), "new data");
    }
}
