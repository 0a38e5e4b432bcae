//! An update in place: the resize of a member's containers, the patch of its images, what it
//! records on the pod, and when memcached may go.
//!
//! memcached's `preStop` asks the agent beside it to save, and the kubelet stops the containers
//! of one patch one after another in no set order: a patch of both could stop the agent first,
//! leaving the save nobody to ask. So a member whose agent and memcached both change is patched
//! twice: the agent, then, once the member is back and available, memcached.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::resize::{Actuation, RESIZABLE, actuation, resize_patch};
use super::settings::{Values, annotated, without_settings};
use super::{IN_PLACE_ANNOTATION, TEMPLATE_ANNOTATION};
use crate::resources::{self, warm_restart};

/// What a member patched in place records (`IN_PLACE_ANNOTATION`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct InPlace {
    pub(super) revision: String,
    pub(super) restarts: BTreeMap<String, i32>,
    /// memcached has a change still to take, after this restart: its image after the agent's,
    /// or new settings after an image.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) memcached_next: bool,
    /// memcached restarts for new settings (a larger memory, other threads or connections): the
    /// agent makes that restart, not the kubelet. (`grows` on the pod: the memory came first.)
    #[serde(default, rename = "grows", skip_serializing_if = "std::ops::Not::not")]
    pub(super) settings: bool,
}

impl InPlace {
    pub(super) fn of(pod: &Pod) -> Option<InPlace> {
        serde_json::from_str(pod.annotations().get(IN_PLACE_ANNOTATION)?).ok()
    }
}

/// What a member records of the template it was made from (`TEMPLATE_ANNOTATION`), beyond what
/// the pod shows itself (its images, settings, labels and annotations): a digest of the rest of
/// the spec, which a running pod cannot take, and which of its labels and annotations came from
/// the template (the operator's own labels and the settings' annotations aside), so that one the
/// spec drops is removed and someone else's left. It replaces a ControllerRevision per
/// Memcached: an object, its write and its watch events for every new Memcached.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct Record {
    fixed: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    annotations: Vec<String>,
}

impl Record {
    /// The record of `template` (a pod template as JSON).
    pub(super) fn of(template: &Value) -> Record {
        Record::of_split(template, &without_settings(template).0)
    }

    /// The record of `template`, whose spec without its settings is `spec`.
    fn of_split(template: &Value, spec: &Value) -> Record {
        let keys = |map: &Value, leave: &dyn Fn(&str) -> bool| -> Vec<String> {
            let keys = map.as_object().into_iter().flat_map(|m| m.keys());
            keys.filter(|k| !leave(k)).cloned().collect()
        };
        let meta = &template["metadata"];
        Record {
            fixed: fixed_digest(spec),
            labels: keys(&meta["labels"], &|k| resources::OWN_LABELS.contains(&k)),
            annotations: keys(&meta["annotations"], &is_setting),
        }
    }

    fn of_pod(pod: &Pod) -> Option<Record> {
        serde_json::from_str(pod.annotations().get(TEMPLATE_ANNOTATION)?).ok()
    }

    /// The annotation's value.
    pub(super) fn annotation(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// The template a member was made from, as an update compares it with the current one.
#[derive(Debug)]
pub(super) struct Made {
    /// The template, or what the pod shows of it: the spec, and the labels and annotations it
    /// set.
    template: Value,
    /// Its settings' values.
    values: Values,
    /// The digest of what a running pod cannot take (`beyond_in_place`).
    fixed: String,
}

impl Made {
    /// From the template itself (kept in a ControllerRevision by releases before 0.9.0).
    pub(super) fn from_template(template: Value) -> Made {
        let (spec, values) = without_settings(&template);
        Made {
            fixed: fixed_digest(&spec),
            template,
            values,
        }
    }

    /// From the member itself and its record, if it has one; `new` is the current template,
    /// whose labels and annotations the pod's are compared with.
    pub(super) fn of_pod(pod: &Pod, new: &Value) -> Option<Made> {
        let record = Record::of_pod(pod)?;
        let set = |theirs: &BTreeMap<String, String>, recorded: &[String], part: &str| {
            let set: serde_json::Map<String, Value> = theirs
                .iter()
                .filter(|(k, _)| {
                    recorded.contains(k)
                        || new["metadata"][part].get(k.as_str()).is_some()
                        || is_setting(k)
                })
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            Value::Object(set)
        };
        let template = json!({
            "metadata": {
                "labels": set(pod.labels(), &record.labels, "labels"),
                "annotations": set(pod.annotations(), &record.annotations, "annotations"),
            },
            "spec": serde_json::to_value(pod.spec.as_ref()?).ok()?,
        });
        Some(Made {
            values: without_settings(&template).1,
            template,
            fixed: record.fixed,
        })
    }
}

/// Whether `annotation` is one a member's memcached takes a setting from.
fn is_setting(annotation: &str) -> bool {
    warm_restart::SETTINGS
        .iter()
        .any(|s| s.annotation == annotation)
}

/// A digest of `spec` (a template's, its settings left out) without what a running pod can
/// take; FNV-1a over its JSON, whose maps are sorted: stable across processes and releases.
fn fixed_digest(spec: &Value) -> String {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(&serde_json::to_vec(&beyond_in_place(spec)).expect("JSON serialises"));
    format!("{:016x}", hasher.finish())
}

/// How a member takes the update now.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Move {
    /// In place, by this patch of its images, which writes this record.
    Patch(Value, InPlace),
    /// In place: first its containers' CPU and memory, by this patch of its `resize`
    /// subresource.
    Resize(Value),
    /// In place, once the kubelet has applied its resize.
    AwaitResize,
    /// In place, once its agent is back from a restart (a spec change that came meanwhile):
    /// memcached's save needs it.
    AwaitAgent,
    /// By a new pod: more than a running pod can take changed.
    Evict,
}

/// How `pod` moves from the template it was `made` from to the `new` one (of `revision`) now.
pub(super) fn next_move(pod: &Pod, made: &Made, new: &Value, revision: &str) -> Move {
    let Some((record, patch)) = in_place(pod, made, new, revision) else {
        return Move::Evict;
    };
    // The resize first, applied before anything restarts: a larger memory's limit is raised
    // before memcached restarts larger.
    if let Some(resize) = resize_patch(pod, new) {
        return Move::Resize(resize);
    }
    match actuation(pod) {
        Actuation::Infeasible => Move::Evict,
        Actuation::Pending => Move::AwaitResize,
        Actuation::Applied
            if restarts_memcached(&record) && (!agent_can_save(pod) || settings_pending(pod)) =>
        {
            Move::AwaitAgent
        }
        Actuation::Applied => Move::Patch(patch, record),
    }
}

/// The patch that brings `pod` from the template it was `made` from to the `new` one in place,
/// if only images, settings its memcached reads from annotations (a larger memory, threads,
/// connections: settings.rs), containers' CPU and memory (a resize before it, resize.rs) and the
/// pod's labels and annotations differ between them; it records the `revision` it moves to and the restart
/// counts of the containers it restarts. What the pod already has is left out; memcached's image
/// waits for a patch of its own while the agent's changes, and new settings for the images'.
pub(super) fn restart_patch(pod: &Pod, made: &Made, new: &Value, revision: &str) -> Option<Value> {
    in_place(pod, made, new, revision).map(|(_, patch)| patch)
}

/// `restart_patch`, and the record it writes on the pod. The pod's record of its template is
/// the new one's from then on.
fn in_place(pod: &Pod, made: &Made, new: &Value, revision: &str) -> Option<(InPlace, Value)> {
    let old = &made.template;
    let (new_spec, new_values) = without_settings(new);
    let recorded = Record::of_split(new, &new_spec);
    if made.fixed != recorded.fixed {
        return None;
    }
    let settings = new_settings(&annotated(pod), &made.values, &new_values)?;
    let (mut containers, mut restarts) = new_images(pod, old, new, "containers");
    let (init_containers, _) = new_images(pod, old, new, "initContainers");
    // The agent serves memcached's save.
    let mut memcached_next = restarts.contains_key(resources::agent::CONTAINER)
        && restarts.contains_key(resources::MEMCACHED_CONTAINER);
    if memcached_next {
        restarts.remove(resources::MEMCACHED_CONTAINER);
        containers.retain(|c| c["name"] != resources::MEMCACHED_CONTAINER);
    }
    let labels = changed_map(&old["metadata"]["labels"], &new["metadata"]["labels"]);
    let mut annotations = changed_map(
        &old["metadata"]["annotations"],
        &new["metadata"]["annotations"],
    );
    // The pod's own annotations, not its revision's: a deferred change is still to make.
    annotations.retain(|k, _| !is_setting(k));
    if !settings.is_empty() {
        if restarts.is_empty() {
            for (annotation, value) in &settings {
                annotations.insert(annotation.to_string(), json!(value.to_string()));
            }
            let memcached = resources::MEMCACHED_CONTAINER;
            restarts.insert(memcached.to_string(), container_restarts(pod, memcached));
        } else {
            memcached_next = true;
        }
    }
    let record = InPlace {
        revision: revision.to_string(),
        settings: !settings.is_empty() && !memcached_next,
        restarts,
        memcached_next,
    };
    annotations.insert(
        IN_PLACE_ANNOTATION.to_string(),
        json!(serde_json::to_string(&record).ok()?),
    );
    let recorded = recorded.annotation();
    if pod.annotations().get(TEMPLATE_ANNOTATION) != Some(&recorded) {
        annotations.insert(TEMPLATE_ANNOTATION.to_string(), json!(recorded));
    }
    let mut spec = serde_json::Map::new();
    if !containers.is_empty() {
        spec.insert("containers".into(), Value::Array(containers));
    }
    if !init_containers.is_empty() {
        spec.insert("initContainers".into(), Value::Array(init_containers));
    }
    let patch = json!({
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": spec,
    });
    Some((record, patch))
}

/// The settings' annotations `pod` takes to move from `old` values to `new` ones, by the values
/// its memcached takes from annotations (`now`); None if it cannot in place: a setting of the
/// literal form changed, or a smaller memory (memcached refuses its file at a smaller `-m`).
fn new_settings(now: &Values, old: &Values, new: &Values) -> Option<BTreeMap<&'static str, i64>> {
    let mut changes = BTreeMap::new();
    for setting in warm_restart::SETTINGS {
        let wanted = new.get(setting.flag);
        match now.get(setting.flag) {
            None if old.get(setting.flag) == wanted => {}
            None => return None,
            Some(now) if Some(now) == wanted => {}
            Some(now) => {
                let wanted = *wanted?;
                if setting == warm_restart::MEMORY && wanted < *now {
                    return None;
                }
                changes.insert(setting.annotation, wanted);
            }
        }
    }
    Some(changes)
}

/// The images of `list` that changed from `old` to `new` and that `pod` does not run yet, as a
/// patch's items; with each changed container's restart count before (an init container's new
/// image takes effect only in a new pod: nothing restarts).
fn new_images(
    pod: &Pod,
    old: &Value,
    new: &Value,
    list: &str,
) -> (Vec<Value>, BTreeMap<String, i32>) {
    let (mut patched, mut restarts) = (Vec::new(), BTreeMap::new());
    let pairs = old["spec"][list]
        .as_array()
        .into_iter()
        .flatten()
        .zip(new["spec"][list].as_array().into_iter().flatten());
    for (before, after) in pairs {
        let name = after["name"].as_str().unwrap_or_default();
        if before["image"] == after["image"]
            || after["image"].as_str() == running_image(pod, list, name)
        {
            continue;
        }
        patched.push(json!({"name": name, "image": after["image"]}));
        if list == "containers" {
            restarts.insert(name.to_string(), container_restarts(pod, name));
        }
    }
    (patched, restarts)
}

/// A pod spec without what a running pod can take: its containers' images, and the CPU and
/// memory of its (not init) containers, which the `resize` subresource changes.
fn beyond_in_place(spec: &Value) -> Value {
    let mut spec = spec.clone();
    for list in ["containers", "initContainers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            if let Some(c) = container.as_object_mut() {
                c.remove("image");
            }
            if list == "containers" {
                for part in ["requests", "limits"] {
                    if let Some(map) = container["resources"][part].as_object_mut() {
                        for name in RESIZABLE {
                            map.remove(name);
                        }
                    }
                }
            }
        }
    }
    spec
}

/// The merge patch of a string map from `old` to `new`: changed and added keys, removed as null.
fn changed_map(old: &Value, new: &Value) -> serde_json::Map<String, Value> {
    let empty = serde_json::Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut patch: serde_json::Map<String, Value> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    patch
}

/// The image `pod`'s container `name` (of `list`, as a template names it) runs.
fn running_image<'p>(pod: &'p Pod, list: &str, name: &str) -> Option<&'p str> {
    let spec = pod.spec.as_ref()?;
    let containers = match list {
        "containers" => &spec.containers,
        _ => spec.init_containers.as_ref()?,
    };
    containers.iter().find(|c| c.name == name)?.image.as_deref()
}

/// Whether the update `record`s restarts memcached: by its image, or by the agent for new
/// settings.
fn restarts_memcached(record: &InPlace) -> bool {
    record.restarts.contains_key(resources::MEMCACHED_CONTAINER)
}

/// Whether an agent patched in place (the first of two patches) is back, so that memcached's
/// `preStop` finds it to save: it has restarted and runs. A pod whose agent is not restarting for
/// a patch of ours goes as before: a member out for another cause is updated at once, and an
/// agent down for another cause could hold its member's update for ever.
fn agent_can_save(pod: &Pod) -> bool {
    let name = resources::agent::CONTAINER;
    let Some(before) = InPlace::of(pod).and_then(|i| i.restarts.get(name).copied()) else {
        return true;
    };
    container_status(pod, name).is_some_and(|s| s.restart_count > before && s.ready)
}

/// Whether the agent is about to restart memcached for new settings: until then, another
/// restart of memcached (a new image's `preStop` save) would race it, and the file saved at the
/// old size could be started at the new one, empty. Not with the agent down: it cannot.
fn settings_pending(pod: &Pod) -> bool {
    let memcached = resources::MEMCACHED_CONTAINER;
    let Some(record) = InPlace::of(pod).filter(|r| r.settings) else {
        return false;
    };
    let pending = record.restarts.get(memcached).is_some_and(|before| {
        container_status(pod, memcached).is_some_and(|s| s.restart_count <= *before)
    });
    let agent_up = container_status(pod, resources::agent::CONTAINER).is_some_and(|s| s.ready);
    pending && agent_up
}

fn container_restarts(pod: &Pod, name: &str) -> i32 {
    container_status(pod, name).map_or(0, |s| s.restart_count)
}

fn container_status<'p>(pod: &'p Pod, name: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == name)
}

/// Whether a container patched in place has not restarted yet.
pub(super) fn restart_pending(pod: &Pod) -> bool {
    let Some(InPlace {
        restarts: before, ..
    }) = InPlace::of(pod)
    else {
        return false;
    };
    before
        .iter()
        .any(|(name, count)| container_status(pod, name).is_none_or(|s| s.restart_count <= *count))
}
