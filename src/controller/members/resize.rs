//! A member's CPU and memory changed in place: the patch of its pod's `resize` subresource, and
//! whether the kubelet has applied it.
//!
//! The API server accepts a resize; the kubelet applies it later, defers it (no room on the node
//! now) or finds it infeasible. A larger memory must not restart memcached before its limit is
//! raised, so a member counts as out of service until the kubelet has applied its resize, and
//! its next patch waits for that.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};

use crate::validation::quantity_bytes;

/// The resources the `resize` subresource changes.
pub(super) const RESIZABLE: [&str; 2] = ["cpu", "memory"];

/// The patch of `pod`'s `resize` subresource that gives its containers the `new` template's CPU
/// and memory requests and limits, where its own spec differs (its spec, not its revision's
/// template: an earlier update may have resized it already). One the template no longer names
/// stays as the pod has it: the API server fills a pod's requests from its limits, and refuses a
/// resize that removes one.
pub(super) fn resize_patch(pod: &Pod, new: &Value) -> Option<Value> {
    let spec = pod.spec.as_ref()?;
    let containers: Vec<Value> = new["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|wanted| {
            let have = spec.containers.iter().find(|c| wanted["name"] == *c.name)?;
            let have = serde_json::to_value(&have.resources).unwrap_or_default();
            let resources = changed(&wanted["resources"], &have)?;
            Some(json!({"name": wanted["name"], "resources": resources}))
        })
        .collect();
    (!containers.is_empty()).then(|| json!({"spec": {"containers": containers}}))
}

/// The CPU and memory requests and limits of `wanted` that `have` lacks or holds otherwise.
fn changed(wanted: &Value, have: &Value) -> Option<Map<String, Value>> {
    let mut resources = Map::new();
    for part in ["requests", "limits"] {
        let mut changed = Map::new();
        for name in RESIZABLE {
            if let Some(value) = wanted[part].get(name)
                && have[part].get(name) != Some(value)
            {
                changed.insert(name.to_string(), value.clone());
            }
        }
        if !changed.is_empty() {
            resources.insert(part.to_string(), Value::Object(changed));
        }
    }
    (!resources.is_empty()).then_some(resources)
}

/// Where the kubelet is with a pod's resize.
#[derive(Debug, PartialEq)]
pub(super) enum Actuation {
    Applied,
    /// Accepted and not applied yet, or deferred until the node has room.
    Pending,
    /// The node cannot take it: only a new pod can.
    Infeasible,
}

pub(super) fn actuation(pod: &Pod) -> Actuation {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    for c in conditions
        .into_iter()
        .flatten()
        .filter(|c| c.status == "True")
    {
        match (c.type_.as_str(), c.reason.as_deref()) {
            ("PodResizePending", Some("Infeasible")) => return Actuation::Infeasible,
            ("PodResizePending" | "PodResizeInProgress", _) => return Actuation::Pending,
            _ => {}
        }
    }
    // Before the kubelet has seen a resize it sets no condition; the memory its containers
    // report tells (CPU is left out: the kubelet reports it rounded to what cgroups hold).
    if memory_differs(pod) {
        Actuation::Pending
    } else {
        Actuation::Applied
    }
}

/// Whether a container's memory request or limit in `pod`'s spec differs from what its status
/// reports, by more than a page (a cgroup's limit is a whole number of pages). A container that
/// reports no resources (a node without in-place resize) is taken as it is.
fn memory_differs(pod: &Pod) -> bool {
    let (Some(spec), Some(status)) = (pod.spec.as_ref(), pod.status.as_ref()) else {
        return false;
    };
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    spec.containers.iter().any(|c| {
        let Some(reported) = statuses
            .iter()
            .find(|s| s.name == c.name)
            .and_then(|s| s.resources.as_ref())
        else {
            return false;
        };
        let Some(wanted) = c.resources.as_ref() else {
            return false;
        };
        [
            (&wanted.requests, &reported.requests),
            (&wanted.limits, &reported.limits),
        ]
        .into_iter()
        .any(|(wanted, reported)| {
            let bytes = |map: &Option<BTreeMap<String, Quantity>>| {
                quantity_bytes(map.as_ref()?.get("memory")?)
            };
            match (bytes(wanted), bytes(reported)) {
                (Some(wanted), Some(reported)) => (wanted - reported).abs() > 4096.0,
                _ => false,
            }
        })
    })
}
