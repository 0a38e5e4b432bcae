//! What the caches keep of an owned object: only what a reconcile reads.
//!
//! A reconcile reads an owned object's metadata (name, owner, labels, generation), its status,
//! and, to tell drift, the fields this operator applies. So the watches decode owned objects
//! into `Kept`, which holds the spec as JSON text, never as typed structs (a typed Deployment
//! with its pod template is most of ten kilobytes). As an object enters the cache its spec is
//! cut to the fields our managedFields entry lists (server defaults and other managers' fields
//! go), and managedFields themselves go. A field someone else changed has moved to their entry,
//! so it is missing from what is kept, and `needs_apply` sees drift, as it would have seen the
//! changed value. `spec.replicas` is kept whoever owns it: the event that reports a restored
//! size names the size it found.
//!
//! A spec that changes only with the generation is not even parsed on a status update (most
//! events): the cut already kept is reused. Nor is the spec of an object alike but for its name
//! to one already cut (cuts.rs), which is most objects when a restart lists them all. Cuts are
//! held once for all objects whose cuts differ only in their names (shared_text.rs), and so are
//! labels and annotations (a map's B-tree node is half a kilobyte even for one entry); of a
//! Deployment's status conditions only failures are kept: nothing reads the others.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::cuts;
use super::meta::{Meta, resource_of};
use super::shared_text::SharedText;
use crate::api::Memcached;
use crate::drift::needs_apply_to_ours;
use crate::resources::MANAGER_NAME;
use crate::service_monitor::ServiceMonitor;
use crate::status;

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
    /// keeps the cut spec).
    const GENERATION_TRACKS_SPEC: bool = true;

    /// Drops from a decoded status what nothing reads.
    fn slim(_status: &mut Self::Status) {}
}

impl Kept<Deployment> {
    /// What the status reads of it.
    pub fn seen(&self) -> status::DeploymentSeen<'_> {
        status::DeploymentSeen {
            generation: self.metadata.generation,
            status: self.status.as_ref(),
        }
    }
}

impl Owned for Deployment {
    type Status = DeploymentStatus;

    fn slim(status: &mut DeploymentStatus) {
        if let Some(conditions) = &mut status.conditions {
            conditions.retain(status::is_deployment_failure);
            if conditions.is_empty() {
                status.conditions = None;
            }
        }
    }
}

impl Owned for PodDisruptionBudget {
    // The disruption controller's counts; nothing here reads them.
    type Status = IgnoredAny;
}

impl Owned for ServiceMonitor {
    type Status = IgnoredAny;
}

impl Owned for Service {
    type Status = IgnoredAny;
    // Services have no generation.
    const GENERATION_TRACKS_SPEC: bool = false;
}

/// An owned object as the caches keep it (see the module's doc).
#[derive(Clone, Debug)]
pub struct Kept<K: Owned> {
    pub metadata: ObjectMeta,
    /// `spec.replicas`, whoever owns it.
    pub replicas: Option<i32>,
    /// The spec fields our apply owns, as JSON (all of the spec when no entry is ours: such an
    /// object is applied once, which creates one); set by `trim`.
    spec: SharedText,
    /// `metadata.labels` and `metadata.annotations`, moved out by `trim`.
    labels: SharedText,
    annotations: SharedText,
    /// The spec and managedFields as sent, until `trim` cuts the one by the other.
    sent_spec: Option<Box<RawValue>>,
    managed_fields: Option<Box<RawValue>>,
    pub status: Option<K::Status>,
    /// The Memcached spec this version was last found to match (see `needs_for`).
    matched: Matched,
    kind: PhantomData<fn() -> K>,
}

/// A digest of a Memcached's uid and generation, which fix what it wants of its objects; 0 for
/// none.
#[derive(Debug, Default)]
struct Matched(AtomicU64);

impl Matched {
    fn digest(mc: &Memcached) -> Option<u64> {
        let uid = mc.metadata.uid.as_deref()?;
        let generation = mc.metadata.generation?;
        let mut hasher = DefaultHasher::new();
        (uid, generation).hash(&mut hasher);
        Some(hasher.finish().max(1))
    }
}

impl Clone for Matched {
    fn clone(&self) -> Self {
        Self(AtomicU64::new(self.0.load(Ordering::Relaxed)))
    }
}

/// Decodes the spec in place as text. That needs serde_json's own deserializer reading the
/// object, not a buffered copy: kube decodes a watch event (serde's adjacent tagging) in place
/// when its `type` comes before its `object`, which is how the API server writes it (Go's
/// WatchEvent struct: Type, then Object).
impl<'de, K: Owned> Deserialize<'de> for Kept<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The wire form: the spec left as text, to be cut (or dropped for the cut already kept).
        #[derive(Deserialize)]
        struct Wire<S> {
            #[serde(default)]
            metadata: Meta,
            spec: Option<Box<RawValue>>,
            status: Option<S>,
        }
        let mut wire = Wire::<K::Status>::deserialize(deserializer)?;
        if let Some(status) = &mut wire.status {
            K::slim(status);
        }
        Ok(Self {
            metadata: wire.metadata.meta,
            managed_fields: wire.metadata.managed_fields,
            replicas: None,
            spec: SharedText::empty(),
            labels: SharedText::empty(),
            annotations: SharedText::empty(),
            sent_spec: wire.spec,
            status: wire.status,
            matched: Matched::default(),
            kind: PhantomData,
        })
    }
}

impl<K: Owned> Resource for Kept<K> {
    resource_of!(K);

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<K: Owned> Kept<K> {
    /// Cuts the object down to what a reconcile reads; `old` is the cached version it replaces.
    pub fn trim(&mut self, old: Option<&Self>) {
        match old {
            Some(old)
                if K::GENERATION_TRACKS_SPEC
                    && self.metadata.generation.is_some()
                    && self.metadata.generation == old.metadata.generation
                    && self.metadata.uid == old.metadata.uid =>
            {
                self.spec = old.spec.clone();
                self.replicas = old.replicas;
            }
            _ => self.cut_spec(),
        }
        self.sent_spec = None;
        self.managed_fields = None;
        let metadata = &mut self.metadata;
        let name = metadata.name.as_deref().unwrap_or_default();
        self.labels = shared_map(metadata.labels.take(), name);
        self.annotations = shared_map(metadata.annotations.take(), name);
    }

    /// Whether the labels or owner references differ from `other`'s, a version of the same
    /// object.
    pub fn ownership_differs(&self, other: &Self) -> bool {
        self.labels != other.labels
            || self.metadata.labels != other.metadata.labels
            || self.metadata.owner_references != other.metadata.owner_references
    }

    /// The metadata as sent, labels and annotations back in place.
    fn full_metadata(&self) -> Value {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let mut metadata = serde_json::to_value(&self.metadata).unwrap_or_default();
        if let Value::Object(fields) = &mut metadata {
            for (field, shared) in [("labels", &self.labels), ("annotations", &self.annotations)] {
                if !fields.contains_key(field)
                    && let Ok(map @ Value::Object(_)) = serde_json::from_str(&shared.text(name))
                {
                    fields.insert(field.into(), map);
                }
            }
        }
        metadata
    }

    /// Keeps the spec fields our apply owns, and `replicas`.
    fn cut_spec(&mut self) {
        let Some(sent) = &self.sent_spec else {
            return;
        };
        let sent = sent.get();
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let fields = self
            .managed_fields
            .as_deref()
            .and_then(|m| our_spec_fields(m.get()));
        let made = cuts::cut_once(sent, fields, name, || cut(sent, fields));
        self.spec = made.spec;
        self.replicas = made.replicas;
    }

    /// The spec as kept (as sent, before `trim`).
    pub fn spec(&self) -> Value {
        let text = match &self.sent_spec {
            Some(sent) => Cow::Borrowed(sent.get()),
            None => self
                .spec
                .text(self.metadata.name.as_deref().unwrap_or_default()),
        };
        serde_json::from_str(&text).unwrap_or_default()
    }

    /// Whether the spec as kept differs from `other`'s, a version of the same object.
    pub fn spec_differs(&self, other: &Self) -> bool {
        self.spec != other.spec
    }

    /// The object as a server-side apply would compare: what `desired` is compared with.
    pub fn as_value(&self) -> Value {
        serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": self.full_metadata(),
            "spec": self.spec(),
        })
    }

    /// True when applying `desired` could change this object.
    pub fn needs(&self, desired: &K) -> bool {
        needs_apply_to_ours(desired, &self.as_value())
    }

    /// `needs` for `desired` made from `mc`. What a Memcached wants is fixed by its uid and
    /// generation, so once this version of the object matched them, the status refreshes that
    /// follow (most reconciles) skip the comparison.
    pub fn needs_for(&self, desired: &K, mc: &Memcached) -> bool {
        let digest = Matched::digest(mc);
        if digest.is_some_and(|d| self.matched.0.load(Ordering::Relaxed) == d) {
            return false;
        }
        let needs = self.needs(desired);
        if let (false, Some(digest)) = (needs, digest) {
            self.matched.0.store(digest, Ordering::Relaxed);
        }
        needs
    }

    /// `obj` as a watch would bring it and the cache keep it.
    #[cfg(test)]
    pub fn of(obj: &K) -> Self {
        let mut kept: Self = serde_json::from_str(&serde_json::to_string(obj).unwrap()).unwrap();
        kept.trim(None);
        kept
    }
}

/// The spec as sent, cut to `fields` (all of it without), and its `replicas`.
fn cut<'a>(sent: &'a str, fields: Option<&str>) -> (Cow<'a, str>, Option<i32>) {
    let Ok(spec) = serde_json::from_str::<Value>(sent) else {
        return (Cow::Borrowed(sent), None);
    };
    let replicas = spec.get("replicas");
    let count = replicas
        .and_then(Value::as_i64)
        .and_then(|r| i32::try_from(r).ok());
    let Some(fields) = fields.and_then(|f| serde_json::from_str::<Value>(f).ok()) else {
        return (Cow::Borrowed(sent), count);
    };
    let mut cut = project(&spec, &fields);
    if let (Some(replicas), Value::Object(cut)) = (replicas, &mut cut) {
        cut.insert("replicas".into(), replicas.clone());
    }
    (Cow::Owned(cut.to_string()), count)
}

/// The spec fields our apply owns: our managedFields entry's `f:spec`, borrowed from the text of
/// the entries, none of them decoded (the other managers' entries, the controllers' status
/// fields, are most of the text).
fn our_spec_fields(managed_fields: &str) -> Option<&str> {
    #[derive(Deserialize)]
    struct Entry<'a> {
        #[serde(borrow)]
        manager: Option<Cow<'a, str>>,
        #[serde(borrow)]
        operation: Option<Cow<'a, str>>,
        #[serde(borrow)]
        subresource: Option<Cow<'a, str>>,
        #[serde(rename = "fieldsV1", borrow)]
        fields_v1: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Fields<'a> {
        #[serde(rename = "f:spec", borrow)]
        spec: Option<&'a RawValue>,
    }
    let entries: Vec<Entry> = serde_json::from_str(managed_fields).ok()?;
    let ours = entries.into_iter().find(|entry| {
        entry.manager.as_deref() == Some(MANAGER_NAME)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    })?;
    let fields: Fields = serde_json::from_str(ours.fields_v1?.get()).ok()?;
    Some(fields.spec?.get())
}

/// A label or annotation map as shared text; the empty text for none.
fn shared_map(map: Option<BTreeMap<String, String>>, name: &str) -> SharedText {
    match map {
        Some(map) if !map.is_empty() => {
            SharedText::new(&serde_json::to_string(&map).unwrap_or_default(), name)
        }
        _ => SharedText::empty(),
    }
}

/// The parts of `value` that `fields` (managedFields' FieldsV1: `f:<field>` for a field,
/// `k:<key json>` for a list item by its keys, `v:<json>` for a set item, `.` for the node
/// itself, `{}` for a whole leaf or atomic value) names.
pub fn project(value: &Value, fields: &Value) -> Value {
    let Value::Object(fields) = fields else {
        return value.clone();
    };
    let children = fields.keys().any(|k| k != ".");
    if !children {
        return value.clone();
    }
    match value {
        Value::Object(object) => {
            let mut kept = Map::new();
            for (key, sub) in fields {
                if let Some(name) = key.strip_prefix("f:")
                    && let Some(child) = object.get(name)
                {
                    kept.insert(name.to_string(), project(child, sub));
                }
            }
            Value::Object(kept)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter_map(|item| {
                    fields.iter().find_map(|(key, sub)| {
                        if let Some(keys) = key.strip_prefix("k:") {
                            let keys: Map<String, Value> = serde_json::from_str(keys).ok()?;
                            let matches = keys.iter().all(|(k, v)| item.get(k) == Some(v));
                            matches.then(|| {
                                let mut kept = project(item, sub);
                                // The keys identify the item, whether or not they are listed.
                                if let Value::Object(kept) = &mut kept {
                                    for (k, v) in keys {
                                        kept.insert(k, v);
                                    }
                                }
                                kept
                            })
                        } else if let Some(set_item) = key.strip_prefix("v:") {
                            let set_item: Value = serde_json::from_str(set_item).ok()?;
                            (set_item == *item).then(|| item.clone())
                        } else {
                            None
                        }
                    })
                })
                .collect(),
        ),
        leaf => leaf.clone(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    use super::*;
    use crate::controller::events::Change;
    use crate::drift::needs_apply;
    use crate::fixtures::{deployment_with_status, memcached};
    use crate::resources;

    /// The FieldsV1 a server-side apply of `applied` records: every field it sets; list items
    /// of objects by their `name` (or `containerPort`, `port`) key; scalar lists whole.
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
                        let key = ["name", "containerPort", "port", "topologyKey"]
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
    /// in its spec, and managedFields of ours and of the Deployment controller.
    fn as_stored(desired: &Deployment) -> Deployment {
        let mut stored = serde_json::to_value(desired).unwrap();
        let spec = &mut stored["spec"];
        spec["progressDeadlineSeconds"] = json!(600);
        spec["revisionHistoryLimit"] = json!(10);
        let pod = &mut spec["template"]["spec"];
        pod["dnsPolicy"] = json!("ClusterFirst");
        pod["restartPolicy"] = json!("Always");
        pod["schedulerName"] = json!("default-scheduler");
        let container = &mut pod["containers"][0];
        container["terminationMessagePath"] = json!("/dev/termination-log");
        container["imagePullPolicy"] = json!("IfNotPresent");
        let mut stored: Deployment = serde_json::from_value(stored).unwrap();
        let ours = fields_of(&json!({"spec": serde_json::to_value(&desired.spec).unwrap()}));
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

    /// As the watch decodes it, before `trim`.
    fn decoded(obj: &Deployment) -> Kept<Deployment> {
        serde_json::from_str(&serde_json::to_string(obj).unwrap()).unwrap()
    }

    #[test]
    fn deployments_of_memcacheds_alike_but_for_their_names_keep_one_cut() {
        let images = resources::Images::new("memcached:1");
        let a = Kept::of(&as_stored(&resources::deployment(
            &memcached("cache-a", 2),
            &images,
        )));
        let b = Kept::of(&as_stored(&resources::deployment(
            &memcached("cache-b", 2),
            &images,
        )));
        let c = Kept::of(&as_stored(&resources::deployment(
            &memcached("cache-c", 3),
            &images,
        )));
        assert_eq!(a.spec, b.spec, "one text for both");
        assert_ne!(a.spec, c.spec, "another size, another text");
        let selector = |k: &Kept<Deployment>| k.spec()["selector"]["matchLabels"].clone();
        assert_eq!(selector(&a)["app.kubernetes.io/instance"], "cache-a");
        assert_eq!(selector(&b)["app.kubernetes.io/instance"], "cache-b");
        assert!(!a.needs(&resources::deployment(&memcached("cache-a", 2), &images)));
        assert!(b.needs(&resources::deployment(&memcached("cache-b", 3), &images)));
    }

    #[test]
    fn a_cut_found_again_is_the_cut_made_afresh_whatever_the_name() {
        let images = resources::Images::new("memcached:1");
        let sent = |name: &str| {
            let stored = as_stored(&resources::deployment(&memcached(name, 2), &images));
            let entries = serde_json::to_string(&stored.metadata.managed_fields).unwrap();
            let fields = our_spec_fields(&entries).unwrap().to_string();
            let spec = serde_json::to_string(&stored.spec).unwrap();
            (stored, spec, fields)
        };
        Kept::of(&sent("cache-a").0);
        let (_, spec, fields) = sent("cache-b");
        assert!(
            cuts::find(&spec, &fields, "cache-b").is_some(),
            "found for a name alike"
        );
        // Names that are also keys, values, numbers and literals of the spec.
        for name in [
            "cache-b",
            "memcached",
            "2",
            "1",
            "a",
            "e",
            "app",
            "cache",
            "true",
            "tcp",
        ] {
            let (stored, spec, fields) = sent(name);
            let kept = Kept::of(&stored);
            let (afresh, replicas) = cut(&spec, Some(&fields));
            assert_eq!(
                kept.spec(),
                serde_json::from_str::<Value>(&afresh).unwrap(),
                "{name}"
            );
            assert_eq!(kept.replicas, replicas, "{name}");
            assert_eq!(replicas, Some(2));
        }
    }

    #[test]
    fn labels_and_annotations_are_shared_and_a_changed_label_is_drift() {
        let images = resources::Images::new("memcached:1");
        let stored = |name: &str| {
            let mut d = as_stored(&resources::deployment(&memcached(name, 2), &images));
            d.metadata.annotations =
                Some([("deployment.kubernetes.io/revision".into(), "1".into())].into());
            d
        };
        let (a, b) = (Kept::of(&stored("cache-a")), Kept::of(&stored("cache-b")));
        assert_eq!(a.labels, b.labels, "one labels text for both");
        assert_eq!(a.annotations, b.annotations);
        assert!(a.metadata.labels.is_none() && a.metadata.annotations.is_none());
        let metadata = a.as_value()["metadata"].clone();
        assert_eq!(metadata["labels"]["app.kubernetes.io/instance"], "cache-a");
        assert_eq!(
            metadata["annotations"]["deployment.kubernetes.io/revision"],
            "1"
        );
        assert!(!a.needs(&resources::deployment(&memcached("cache-a", 2), &images)));
        assert!(!a.ownership_differs(&Kept::of(&stored("cache-a"))));

        let mut relabelled = stored("cache-a");
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app.kubernetes.io/instance".into(), "someone-else".into());
        let relabelled = Kept::of(&relabelled);
        assert!(a.ownership_differs(&relabelled));
        assert!(relabelled.needs(&resources::deployment(&memcached("cache-a", 2), &images)));
    }

    #[test]
    fn a_match_holds_only_for_the_memcached_spec_it_was_found_for() {
        let images = resources::Images::new("memcached:1");
        let mut mc = memcached("cache", 2);
        mc.metadata.generation = Some(1);
        let kept = Kept::of(&as_stored(&resources::deployment(&mc, &images)));
        for _ in 0..2 {
            assert!(!kept.needs_for(&resources::deployment(&mc, &images), &mc));
        }
        let mut resized = mc.clone();
        resized.spec.size = 3;
        resized.metadata.generation = Some(2);
        assert!(kept.needs_for(&resources::deployment(&resized, &images), &resized));
        let mut recreated = resized.clone();
        recreated.metadata.uid = Some("another".into());
        recreated.metadata.generation = Some(1);
        assert!(
            kept.needs_for(&resources::deployment(&recreated, &images), &recreated),
            "a new Memcached of the same name and generation is compared again"
        );
        assert!(!kept.needs_for(&resources::deployment(&mc, &images), &mc));
    }

    #[test]
    fn of_a_deployment_status_the_counts_and_the_failures_are_kept() {
        use k8s_openapi::api::apps::v1::DeploymentCondition;
        let condition = |type_: &str, status: &str, reason: &str| DeploymentCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{type_} is {status}")),
            ..Default::default()
        };
        let mc = memcached("cache", 3);
        let mut stored = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        stored.status = Some(DeploymentStatus {
            replicas: Some(3),
            ready_replicas: Some(2),
            conditions: Some(vec![
                condition("Available", "True", "MinimumReplicasAvailable"),
                condition("Progressing", "True", "NewReplicaSetAvailable"),
            ]),
            ..Default::default()
        });
        let healthy = Kept::of(&stored).status.unwrap();
        assert_eq!(
            (healthy.replicas, healthy.ready_replicas),
            (Some(3), Some(2))
        );
        assert_eq!(healthy.conditions, None, "healthy conditions are not kept");

        let failing = vec![
            condition("Available", "False", "MinimumReplicasUnavailable"),
            condition("Progressing", "False", "ProgressDeadlineExceeded"),
            condition("ReplicaFailure", "True", "FailedCreate"),
        ];
        stored.status.as_mut().unwrap().conditions = Some(failing.clone());
        let kept = Kept::of(&stored).status.unwrap().conditions.unwrap();
        assert_eq!(kept, failing[1..], "the failures, whole");
    }

    #[test]
    fn a_cut_deployment_shows_no_drift_and_keeps_what_reconcile_reads() {
        let mc = memcached("cache", 3);
        let desired = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        let mut stored = as_stored(&desired);
        stored.status = Some(deployment_with_status(&mc, 3, 3).status.unwrap());
        stored.metadata.generation = Some(1);
        assert!(!needs_apply(&desired, &stored));

        let cut = Kept::of(&stored);
        assert!(!cut.needs(&desired), "no drift from the cut");
        assert!(cut.managed_fields.is_none() && cut.sent_spec.is_none());
        assert_eq!(cut.status, stored.status);
        assert_eq!(cut.replicas, Some(3));
        assert_eq!(
            cut.metadata.owner_references,
            stored.metadata.owner_references
        );
        let pod = &cut.spec()["template"]["spec"];
        assert_eq!(pod.get("dnsPolicy"), None, "server defaults are dropped");
        assert_eq!(pod["containers"][0].get("terminationMessagePath"), None);
        let mut whole = serde_json::to_value(&stored).unwrap();
        whole.as_object_mut().unwrap().remove("status");
        let (kept, whole) = (cut.as_value().to_string().len(), whole.to_string().len());
        assert!(kept * 3 < whole * 2, "{kept} of {whole} bytes kept");
    }

    #[test]
    fn a_watch_event_decodes_into_what_the_cache_keeps() {
        let mc = memcached("cache", 2);
        let stored = as_stored(&resources::deployment(
            &mc,
            &resources::Images::new("memcached:1"),
        ));
        // As the API server writes it (Go's WatchEvent): the type before the object, so that the
        // object is decoded in place rather than buffered, which a spec left as text needs.
        let line = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            serde_json::to_string(&stored).unwrap()
        );
        let event: kube::core::WatchEvent<Kept<Deployment>> = serde_json::from_str(&line).unwrap();
        let kube::core::WatchEvent::Modified(mut kept) = event else {
            panic!("not a modification: {line}");
        };
        assert_eq!(kept.spec(), serde_json::to_value(&stored.spec).unwrap());
        kept.trim(None);
        assert_eq!(kept.spec(), Kept::of(&stored).spec());
        assert_eq!(kept.replicas, Some(2));
    }

    #[test]
    fn drift_by_another_manager_is_seen_in_the_cut() {
        let mc = memcached("cache", 2);
        let desired = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        let mut stored = as_stored(&desired);
        // `kubectl scale`: replicas changes hands and value.
        stored.spec.as_mut().unwrap().replicas = Some(4);
        let entry = &mut stored.metadata.managed_fields.as_mut().unwrap()[0];
        entry.fields_v1.as_mut().unwrap().0["f:spec"]
            .as_object_mut()
            .unwrap()
            .remove("f:replicas");
        let cut = Kept::of(&stored);
        assert!(cut.needs(&desired));
        assert_eq!(
            Change::between(Some(&cut), &Kept::of(&desired), &{
                let mut seen = mc.clone();
                seen.status = Some(Default::default());
                seen.status.as_mut().unwrap().observed_generation = Some(1);
                seen
            }),
            Change::DriftRestored { was: 4, to: 2 }
        );

        // `kubectl set image`: the image is someone else's now.
        let mut stored = as_stored(&desired);
        stored
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("theirs:2".into());
        let entry = &mut stored.metadata.managed_fields.as_mut().unwrap()[0];
        entry.fields_v1.as_mut().unwrap().0["f:spec"]["f:template"]["f:spec"]["f:containers"]
            ["k:{\"name\":\"memcached\"}"]
            .as_object_mut()
            .unwrap()
            .remove("f:image");
        assert!(Kept::of(&stored).needs(&desired));
    }

    #[test]
    fn a_status_update_reuses_the_cut_spec() {
        let mc = memcached("cache", 1);
        let desired = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        let mut first = as_stored(&desired);
        first.metadata.generation = Some(1);
        first.metadata.uid = Some("d".into());
        let first = Kept::of(&first);
        let image = |kept: &Kept<Deployment>| {
            kept.spec()["template"]["spec"]["containers"][0]["image"].clone()
        };
        // A spec that differs at the same generation cannot come from the API server; here it
        // tells a reused cut from a new one.
        let mut sent = as_stored(&resources::deployment(
            &mc,
            &resources::Images::new("memcached:2"),
        ));
        sent.metadata.generation = Some(1);
        sent.metadata.uid = Some("d".into());
        sent.status = deployment_with_status(&mc, 1, 1).status;
        let mut update = decoded(&sent);
        update.trim(Some(&first));
        assert!(!update.spec_differs(&first));
        assert_eq!(image(&update), "memcached:1");
        assert_eq!(update.status, deployment_with_status(&mc, 1, 1).status);

        sent.metadata.generation = Some(2);
        let mut changed = decoded(&sent);
        changed.trim(Some(&first));
        assert_eq!(
            image(&changed),
            "memcached:2",
            "a new generation is cut afresh"
        );

        sent.metadata.generation = Some(1);
        sent.metadata.uid = Some("recreated".into());
        let mut recreated = decoded(&sent);
        recreated.trim(Some(&first));
        assert_eq!(
            image(&recreated),
            "memcached:2",
            "so is another object of the name"
        );
    }

    #[test]
    fn a_list_page_decodes_and_an_absent_or_null_spec_is_empty() {
        let service = serde_json::to_value(resources::service(&memcached("cache", 1))).unwrap();
        let page = format!(
            r#"{{"apiVersion":"v1","kind":"ServiceList","metadata":{{"resourceVersion":"9"}},"items":[{service},{{"metadata":{{"name":"a"}},"spec":null}},{{"metadata":{{"name":"b"}}}}]}}"#
        );
        let list: kube::core::ObjectList<Kept<Service>> = serde_json::from_str(&page).unwrap();
        let mut items = list.items;
        for item in &mut items {
            item.trim(None);
        }
        assert_eq!(items[0].spec(), service["spec"]);
        assert_eq!(items[1].spec(), json!({}));
        assert_eq!(items[2].spec(), json!({}));
    }

    #[test]
    fn an_object_without_our_entry_is_kept_whole() {
        let mc = memcached("cache", 1);
        let mut stored = as_stored(&resources::deployment(
            &mc,
            &resources::Images::new("memcached:1"),
        ));
        stored.metadata.managed_fields.as_mut().unwrap().remove(0);
        assert_eq!(
            Kept::of(&stored).spec(),
            serde_json::to_value(&stored.spec).unwrap()
        );
    }

    #[test]
    fn set_items_and_atomic_lists_are_projected() {
        let value = json!({"finalizers": ["a", "b"], "args": ["-m", "64"], "other": 1});
        let fields = json!({"f:finalizers": {"v:\"a\"": {}}, "f:args": {}});
        assert_eq!(
            project(&value, &fields),
            json!({"finalizers": ["a"], "args": ["-m", "64"]})
        );
    }
}
