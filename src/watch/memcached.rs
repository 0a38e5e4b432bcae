//! Memcacheds as the watch decodes them: one that does not fit the schema (stored while the schema
//! was looser) is kept aside with the error, instead of failing the whole list or watch.
//!
//! The object's text is held once and parsed once into the typed Memcached; only an object that
//! fails is parsed again, for the metadata its Warning names. Like `OwnedObject`, holding the text
//! needs the watch event's `type` before its `object`, as the API server writes it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::watcher;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use tracing::warn;

use super::meta::{Meta, resource_of};
use crate::api::{Memcached, MemcachedSpec, MemcachedStatus};

#[derive(Clone, Debug)]
pub enum WatchedMemcached {
    Valid(Box<Memcached>),
    /// The error names the field that does not fit.
    Invalid {
        metadata: Box<ObjectMeta>,
        error: String,
    },
}

impl<'de> Deserialize<'de> for WatchedMemcached {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Held as text, not a `Value` tree: parsing it below is the only decode of a valid one.
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Ok(Self::parse(raw.get()))
    }
}

impl WatchedMemcached {
    fn parse(text: &str) -> Self {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Meta<IgnoredAny>,
            spec: MemcachedSpec,
            status: Option<MemcachedStatus>,
        }
        let mut de = serde_json::Deserializer::from_str(text);
        match serde_path_to_error::deserialize::<_, Wire>(&mut de) {
            Ok(wire) => {
                let mut metadata = wire.metadata.meta;
                // Not kept: nothing reads a Memcached's own labels or annotations (its pods take
                // `spec.podLabels`), and `kubectl apply` leaves a copy of the whole object in one.
                metadata.labels = None;
                metadata.annotations = None;
                Self::Valid(Box::new(Memcached {
                    metadata,
                    spec: wire.spec,
                    status: wire.status,
                }))
            }
            Err(e) => {
                #[derive(Deserialize, Default)]
                struct Named {
                    #[serde(default)]
                    metadata: ObjectMeta,
                }
                let Named { mut metadata } = serde_json::from_str(text).unwrap_or_default();
                metadata.managed_fields = None;
                Self::Invalid {
                    metadata: Box::new(metadata),
                    error: format!("{}: {}", e.path(), e.inner()),
                }
            }
        }
    }
}

impl Resource for WatchedMemcached {
    resource_of!(Memcached);

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Valid(mc) => &mc.metadata,
            Self::Invalid { metadata, .. } => metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Valid(mc) => &mut mc.metadata,
            Self::Invalid { metadata, .. } => metadata,
        }
    }
}

/// Turns a watch event of watched Memcacheds (valid or not) into one of Memcacheds, dropping (and reporting) those
/// that do not parse, so that one malformed object cannot break the watch for all the others.
pub fn parse_event(
    event: watcher::Event<WatchedMemcached>,
    invalid: &prometheus::IntGauge,
    report: impl Fn(&ObjectMeta, String),
) -> Option<watcher::Event<Memcached>> {
    let parse = |obj: WatchedMemcached| match obj {
        WatchedMemcached::Valid(mc) => Some(*mc),
        WatchedMemcached::Invalid { metadata, error } => {
            invalid.inc();
            let name = format!(
                "{}/{}",
                metadata.namespace.as_deref().unwrap_or_default(),
                metadata.name.as_deref().unwrap_or_default()
            );
            warn!(memcached = %name, %error, "skipping Memcached that does not match the API schema");
            report(&metadata, error);
            None
        }
    };
    Some(match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(parse(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(parse(o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(parse(o)?),
        watcher::Event::Init => {
            invalid.set(0);
            watcher::Event::Init
        }
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use kube::core::WatchEvent;
    use serde_json::json;

    use super::*;

    /// As the API server writes it (Go's WatchEvent): the type before the object, so that the
    /// object is decoded in place rather than buffered, which holding it as text needs.
    fn watched(obj: serde_json::Value) -> WatchedMemcached {
        let line = format!(r#"{{"type":"ADDED","object":{obj}}}"#);
        match serde_json::from_str::<WatchEvent<WatchedMemcached>>(&line).unwrap() {
            WatchEvent::Added(o) => o,
            other => panic!("{other:?}"),
        }
    }

    fn memcached(name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {
                "name": name, "namespace": "default", "uid": "u1", "generation": 2,
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": spec,
            "status": {"nodes": ["a"]}
        })
    }

    #[test]
    fn a_memcached_decodes_whole_without_managed_fields_labels_or_annotations() {
        let mut applied = memcached("good", json!({"size": 3}));
        applied["metadata"]["labels"] = json!({"team": "web"});
        applied["metadata"]["annotations"] = json!({
            "kubectl.kubernetes.io/last-applied-configuration": applied.to_string()
        });
        let WatchedMemcached::Valid(mc) = watched(applied) else {
            panic!("a valid Memcached was refused")
        };
        assert_eq!(mc.name_any(), "good");
        assert_eq!(mc.metadata.generation, Some(2));
        assert_eq!(mc.spec.size, 3);
        assert_eq!(mc.status.unwrap().nodes, vec!["a".to_string()]);
        assert!(mc.metadata.managed_fields.is_none());
        assert!(mc.metadata.labels.is_none());
        assert!(mc.metadata.annotations.is_none());
    }

    #[test]
    fn a_list_page_with_one_malformed_memcached_keeps_the_others() {
        let page = json!({
            "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "9"},
            "items": [
                memcached("bad", json!({"size": "three"})),
                memcached("good", json!({"size": 1})),
                memcached("nospec", serde_json::Value::Null),
            ]
        })
        .to_string();
        let list: kube::core::ObjectList<WatchedMemcached> = serde_json::from_str(&page).unwrap();
        let errors: Vec<_> = list
            .items
            .iter()
            .map(|o| match o {
                WatchedMemcached::Valid(mc) => (mc.name_any(), String::new()),
                WatchedMemcached::Invalid { metadata, error } => {
                    (metadata.name.clone().unwrap(), error.clone())
                }
            })
            .collect();
        assert_eq!(errors[0].0, "bad");
        assert!(errors[0].1.starts_with("spec.size"), "{errors:?}");
        assert_eq!(errors[1], ("good".to_string(), String::new()));
        assert_eq!(errors[2].0, "nospec");
        assert!(errors[2].1.contains("spec"), "{errors:?}");
    }

    #[test]
    fn malformed_memcached_is_skipped_without_breaking_the_watch() {
        let invalid = prometheus::IntGauge::new("x", "x").unwrap();
        let good = watched(memcached("good", json!({"size": 1})));
        let bad = watched(memcached("bad", json!({"size": "three"})));
        let reported = std::cell::RefCell::new(Vec::new());
        let report = |meta: &ObjectMeta, error: String| {
            reported
                .borrow_mut()
                .push((meta.name.clone().unwrap(), meta.uid.clone(), error));
        };
        assert!(parse_event(watcher::Event::InitApply(bad.clone()), &invalid, report).is_none());
        assert!(parse_event(watcher::Event::Apply(bad), &invalid, report).is_none());
        assert_eq!(invalid.get(), 2);
        let reported = reported.into_inner();
        assert_eq!(reported.len(), 2, "each is reported");
        assert!(
            reported[0].0 == "bad"
                && reported[0].1.as_deref() == Some("u1")
                && reported[0].2.contains("size"),
            "{reported:?}"
        );
        match parse_event(watcher::Event::Apply(good), &invalid, |_, _| {}) {
            Some(watcher::Event::Apply(mc)) => assert_eq!(mc.spec.size, 1),
            other => panic!("good object lost: {other:?}"),
        }
        assert!(matches!(
            parse_event(watcher::Event::Init, &invalid, |_, _| {}),
            Some(watcher::Event::Init)
        ));
        assert_eq!(invalid.get(), 0, "a relist recounts invalid objects");
    }
}
