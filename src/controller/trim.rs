//! What the caches keep of an owned object: only what a reconcile reads.
//!
//! A reconcile reads an owned object's metadata (name, owner, labels, generation), its status,
//! and, to tell drift, the fields this operator applies. So the spec is cut down, as the object
//! enters the cache, to the fields our managedFields entry lists (server defaults and other
//! managers' fields go), and managedFields themselves go. A field someone else changed has moved
//! to their entry, so it is missing from what is kept, and `needs_apply` sees drift, as it would
//! have seen the changed value. `spec.replicas` is kept whoever owns it: the event that reports a
//! restored size names the size it found.
//!
//! A Deployment's spec changes only with its generation, so a status update (most events) reuses
//! the spec already cut, without converting the object.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::resources::MANAGER_NAME;
use crate::service_monitor::ServiceMonitor;

pub trait Trim: Resource + Serialize + DeserializeOwned + Sized {
    /// Takes `old`'s (already cut) spec when the spec cannot have changed since.
    fn reuse_spec(&mut self, old: &Self) -> bool;
}

impl Trim for Deployment {
    fn reuse_spec(&mut self, old: &Self) -> bool {
        reuse_by_generation(&self.metadata, &mut self.spec, old.meta(), &old.spec)
    }
}

impl Trim for ServiceMonitor {
    fn reuse_spec(&mut self, old: &Self) -> bool {
        let unchanged = self.metadata.generation.is_some()
            && self.metadata.generation == old.metadata.generation;
        if unchanged {
            self.spec.clone_from(&old.spec);
        }
        unchanged
    }
}

impl Trim for PodDisruptionBudget {
    fn reuse_spec(&mut self, old: &Self) -> bool {
        reuse_by_generation(&self.metadata, &mut self.spec, old.meta(), &old.spec)
    }
}

/// The spec of an object whose generation moves with every spec change is `old`'s while the
/// generation is the same.
fn reuse_by_generation<S: Clone>(
    meta: &ObjectMeta,
    spec: &mut Option<S>,
    old_meta: &ObjectMeta,
    old_spec: &Option<S>,
) -> bool {
    let unchanged = meta.generation.is_some() && meta.generation == old_meta.generation;
    if unchanged {
        spec.clone_from(old_spec);
    }
    unchanged
}

impl Trim for Service {
    fn reuse_spec(&mut self, _: &Self) -> bool {
        // No generation to tell a spec change by; Service events are rare.
        false
    }
}

/// Cuts `obj` down to what a reconcile reads; `old` is the cached version it replaces.
pub fn trim<K: Trim>(obj: &mut K, old: Option<&K>) {
    if !old.is_some_and(|old| obj.reuse_spec(old)) {
        cut_spec(obj);
    }
    obj.meta_mut().managed_fields = None;
}

/// Keeps the spec fields our apply owns, and `replicas`. Leaves the object whole when it has no
/// entry of ours (it is then applied once, which creates one) or cannot be cut.
fn cut_spec<K: Trim>(obj: &mut K) {
    let ours = obj.meta().managed_fields.iter().flatten().find(|entry| {
        entry.manager.as_deref() == Some(MANAGER_NAME)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    });
    let Some(fields) = ours
        .and_then(|entry| entry.fields_v1.as_ref())
        .and_then(|f| f.0.get("f:spec"))
    else {
        return;
    };
    let Ok(mut value) = serde_json::to_value(&*obj) else {
        return;
    };
    let Some(spec) = value.get("spec") else {
        return;
    };
    let mut cut = project(spec, fields);
    if let (Some(replicas), Value::Object(cut)) = (spec.get("replicas"), &mut cut) {
        cut.insert("replicas".into(), replicas.clone());
    }
    value["spec"] = cut;
    if let Ok(trimmed) = serde_json::from_value(value) {
        *obj = trimmed;
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

    #[test]
    fn a_cut_deployment_shows_no_drift_and_keeps_what_reconcile_reads() {
        let mc = memcached("cache", 3);
        let desired = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        let mut stored = as_stored(&desired);
        stored.status = deployment_with_status(&mc, 3, 3).status;
        stored.metadata.generation = Some(1);
        let whole = serde_json::to_string(&stored).unwrap().len();
        assert!(!needs_apply(&desired, &stored));

        let mut cut = stored.clone();
        trim(&mut cut, None);
        assert!(!needs_apply(&desired, &cut), "no drift from the cut");
        assert_eq!(cut.metadata.managed_fields, None);
        assert_eq!(cut.status, stored.status);
        assert_eq!(
            cut.metadata.owner_references,
            stored.metadata.owner_references
        );
        let pod = cut.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.dns_policy, None, "server defaults are dropped");
        assert_eq!(pod.containers[0].termination_message_path, None);
        let kept = serde_json::to_string(&cut).unwrap().len();
        assert!(kept * 3 < whole * 2, "{kept} of {whole} bytes kept");
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
        let mut cut = stored.clone();
        trim(&mut cut, None);
        assert!(needs_apply(&desired, &cut));
        assert_eq!(
            Change::between(Some(&cut), &desired, &{
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
        let mut cut = stored;
        trim(&mut cut, None);
        assert!(needs_apply(&desired, &cut));
    }

    #[test]
    fn a_status_update_reuses_the_cut_spec() {
        let mc = memcached("cache", 1);
        let desired = resources::deployment(&mc, &resources::Images::new("memcached:1"));
        let mut first = as_stored(&desired);
        first.metadata.generation = Some(1);
        trim(&mut first, None);
        let mut update = as_stored(&desired);
        update.metadata.generation = Some(1);
        update.spec.as_mut().unwrap().paused = Some(false);
        update.status = deployment_with_status(&mc, 1, 1).status;
        trim(&mut update, Some(&first));
        assert_eq!(update.spec, first.spec);
        assert_eq!(update.status, deployment_with_status(&mc, 1, 1).status);

        let mut changed = as_stored(&desired);
        changed.metadata.generation = Some(2);
        changed.spec.as_mut().unwrap().paused = Some(true);
        trim(&mut changed, Some(&first));
        assert_eq!(
            changed.spec.as_ref().unwrap().paused,
            None,
            "a new generation is cut afresh (paused is not ours)"
        );
    }

    #[test]
    fn an_object_without_our_entry_is_kept_whole() {
        let mc = memcached("cache", 1);
        let mut stored = as_stored(&resources::deployment(
            &mc,
            &resources::Images::new("memcached:1"),
        ));
        stored.metadata.managed_fields.as_mut().unwrap().remove(0);
        let mut cut = stored.clone();
        trim(&mut cut, None);
        assert_eq!(cut.spec, stored.spec);
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
