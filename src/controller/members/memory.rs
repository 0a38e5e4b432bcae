//! memcached's memory size in a member's pod, in the two forms a template has had.
//!
//! Since 0.6.0 memcached takes `-m` from a pod annotation (`warm_restart::MEMORY_ANNOTATION`),
//! so that a larger cache is a restart in the same pod; before, `-m` was a literal argument and
//! the cache's `emptyDir` had a `sizeLimit` of it. A member made before keeps its form for its
//! life (a pod's args and volumes cannot change): the two forms of one size are the same
//! member, so an operator upgrade does not replace it, but only the new form can grow in place.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use crate::resources::{self, agent, warm_restart as wr};

/// `template` with memcached's memory size left out of its spec, whichever form it has, and
/// that size. The spec is for comparing with another template's, nothing else.
pub(super) fn without_memory(template: &Value) -> (Value, Option<i64>) {
    let annotated = template["metadata"]["annotations"][wr::MEMORY_ANNOTATION]
        .as_str()
        .and_then(|v| v.parse().ok());
    let mut spec = template["spec"].clone();
    let mut size = None;
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        if container["name"] == resources::MEMCACHED_CONTAINER {
            let args = container["args"].as_array_mut();
            if let Some(at) = args
                .as_ref()
                .and_then(|a| a.iter().position(|v| v == "-m"))
                .map(|i| i + 1)
                && let Some(args) = args
                && let Some(value) = args.get_mut(at)
            {
                size = match value.as_str() {
                    Some(wr::MEMORY_ARG) => annotated,
                    other => other.and_then(|v| v.parse().ok()),
                };
                *value = Value::Null;
            }
            retain(&mut container["env"], |e| e["name"] != wr::MEMORY_ENV);
        } else if container["name"] == agent::CONTAINER {
            retain(&mut container["args"], |a| {
                !a.as_str()
                    .is_some_and(|a| a.starts_with(wr::MEMORY_FILE_FLAG))
            });
            retain(&mut container["volumeMounts"], |m| {
                m["name"] != wr::MEMORY_VOLUME
            });
            // The agent's view of the cache's file was read-only.
            for mount in container["volumeMounts"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if mount["name"] == wr::VOLUME
                    && let Some(m) = mount.as_object_mut()
                {
                    m.remove("readOnly");
                }
            }
        }
    }
    retain(&mut spec["volumes"], |v| v["name"] != wr::MEMORY_VOLUME);
    for volume in spec["volumes"].as_array_mut().into_iter().flatten() {
        if volume["name"] == wr::VOLUME
            && let Some(dir) = volume["emptyDir"].as_object_mut()
        {
            dir.remove("sizeLimit");
        }
    }
    (spec, size)
}

/// Keeps the items of a list for which `keep` holds; drops the list if none is left.
fn retain(list: &mut Value, keep: impl Fn(&Value) -> bool) {
    if let Some(items) = list.as_array_mut() {
        items.retain(keep);
        if items.is_empty() {
            *list = Value::Null;
        }
    }
}

/// The memory size `pod`'s memcached runs with, or would after a restart, if it takes it from
/// the annotation (None for the earlier form, which cannot grow in place).
pub(super) fn annotated(pod: &Pod) -> Option<i64> {
    let memcached = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == resources::MEMCACHED_CONTAINER)?;
    memcached
        .args
        .iter()
        .flatten()
        .any(|a| a == wr::MEMORY_ARG)
        .then(|| pod.annotations().get(wr::MEMORY_ANNOTATION)?.parse().ok())
        .flatten()
}
