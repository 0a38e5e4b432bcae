//! Object metadata as the watches decode it: managedFields left as text, or skipped.
//!
//! managedFields are most of an object's metadata (one entry per writer, each a tree of field
//! names), and decoding them into typed entries was a large share of the operator's allocations
//! on every event. Pods and Memcacheds never need them (`Meta<IgnoredAny>`); owned objects only
//! when their spec or metadata changed (see owned.rs), and then they are parsed from the text.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The type items of a `Resource` impl for a view of `$of` (the same kind, group, version and
/// plural), for the slimmer types the watches decode instead of k8s-openapi's.
macro_rules! resource_of {
    ($of:ty) => {
        type DynamicType = ();
        type Scope = k8s_openapi::NamespaceResourceScope;

        fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
            <$of as kube::Resource>::kind(dt)
        }

        fn group(dt: &()) -> std::borrow::Cow<'_, str> {
            <$of as kube::Resource>::group(dt)
        }

        fn version(dt: &()) -> std::borrow::Cow<'_, str> {
            <$of as kube::Resource>::version(dt)
        }

        fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
            <$of as kube::Resource>::plural(dt)
        }
    };
}
pub(crate) use resource_of;

/// The metadata fields the operator reads, and managedFields as `F`: text, or `IgnoredAny` to
/// skip them.
pub struct Meta<F = Box<RawValue>> {
    pub meta: ObjectMeta,
    pub managed_fields: Option<F>,
}

impl<F> Default for Meta<F> {
    fn default() -> Self {
        Self {
            meta: ObjectMeta::default(),
            managed_fields: None,
        }
    }
}

impl<'de, F: DeserializeOwned> Deserialize<'de> for Meta<F> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase", bound = "F: DeserializeOwned")]
        struct Wire<F> {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
            generation: Option<i64>,
            creation_timestamp: Option<Time>,
            deletion_timestamp: Option<Time>,
            labels: Option<BTreeMap<String, String>>,
            annotations: Option<BTreeMap<String, String>>,
            owner_references: Option<Vec<OwnerReference>>,
            finalizers: Option<Vec<String>>,
            managed_fields: Option<F>,
        }
        let wire = Wire::<F>::deserialize(deserializer)?;
        Ok(Self {
            meta: ObjectMeta {
                name: wire.name,
                namespace: wire.namespace,
                uid: wire.uid,
                resource_version: wire.resource_version,
                generation: wire.generation,
                creation_timestamp: wire.creation_timestamp,
                deletion_timestamp: wire.deletion_timestamp,
                labels: wire.labels,
                annotations: wire.annotations,
                owner_references: wire.owner_references,
                finalizers: wire.finalizers,
                ..ObjectMeta::default()
            },
            managed_fields: wire.managed_fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn what_is_read_is_decoded_and_managed_fields_wait() {
        let text = json!({
            "name": "cache", "namespace": "default", "uid": "u", "resourceVersion": "7",
            "generation": 2, "labels": {"a": "b"}, "annotations": {"c": "d"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                                 "name": "cache", "uid": "m", "controller": true}],
            "managedFields": [{"manager": "memcached-operator", "operation": "Apply",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}],
            "selfLink": "ignored"
        })
        .to_string();
        let meta: Meta = serde_json::from_str(&text).unwrap();
        let skipped: Meta<serde::de::IgnoredAny> = serde_json::from_str(&text).unwrap();
        assert_eq!(skipped.meta, meta.meta);
        let whole: ObjectMeta = serde_json::from_str(&text).unwrap();
        assert_eq!(
            meta.meta,
            ObjectMeta {
                managed_fields: None,
                self_link: None,
                ..whole.clone()
            }
        );
        let managed = serde_json::from_str(meta.managed_fields.unwrap().get()).unwrap();
        assert_eq!(whole.managed_fields, Some(managed));
    }
}
