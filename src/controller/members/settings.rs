//! The settings a member's memcached takes in place (memory, threads, connections), in the forms
//! a template has had.
//!
//! Since 0.6.0 memcached takes `-m` from a pod annotation, and since 0.9.0 `-t` and `-c` too
//! (`warm_restart::SETTINGS`), so that another value is a restart in the same pod; before, they
//! were literal arguments (`-t` and `-c` only when set) and the cache's `emptyDir` had a
//! `sizeLimit` of the memory. A member made before keeps its form for its life (a pod's args and
//! volumes cannot change): two forms of the same values are the same member, so an operator
//! upgrade does not replace it, but only a setting its memcached reads from an annotation can
//! change in place.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use crate::resources::warm_restart as wr;
use crate::resources::{self, agent};

/// Each setting's value, by flag.
pub(super) type Values = BTreeMap<&'static str, i64>;

/// `template` with the settings left out of its spec, whichever form they have, and their
/// values (memcached's defaults for `-t` and `-c` left unset). The spec is for comparing with
/// another template's, nothing else.
pub(super) fn without_settings(template: &Value) -> (Value, Values) {
    let annotations = &template["metadata"]["annotations"];
    let mut spec = template["spec"].clone();
    let mut values = Values::new();
    for container in spec["containers"].as_array_mut().into_iter().flatten() {
        if container["name"] == resources::MEMCACHED_CONTAINER {
            if let Some(args) = container["args"].as_array_mut() {
                for setting in wr::SETTINGS {
                    let value = take_flag(args, setting.flag).map(|value| {
                        match value.as_str() == Some(&setting.arg()) {
                            true => annotations[setting.annotation].clone(),
                            false => value,
                        }
                    });
                    let default = setting.default.map(i64::from);
                    if let Some(value) = value.as_ref().and_then(number).or(default) {
                        values.insert(setting.flag, value);
                    }
                }
            }
            retain(&mut container["env"], |e| {
                !wr::SETTINGS.iter().any(|s| e["name"] == s.env)
            });
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
    (spec, values)
}

/// `template` without the settings, in either form, nor their annotations: what tells two
/// templates of the same members apart besides the settings' form (the adoption's check that
/// a 0.6.0 member template holds the operator's, legacy.rs).
pub(in crate::controller) fn without_any_settings(template: &Value) -> Value {
    let mut template = template.clone();
    template["spec"] = without_settings(&template).0;
    if let Some(annotations) = template["metadata"]["annotations"].as_object_mut() {
        for setting in wr::SETTINGS {
            annotations.remove(setting.annotation);
        }
    }
    template
}

/// Removes `flag` and the argument after it from `args`; that argument.
fn take_flag(args: &mut Vec<Value>, flag: &str) -> Option<Value> {
    let at = args.iter().position(|a| a == flag)?;
    let value = (at + 1 < args.len()).then(|| args.remove(at + 1));
    args.remove(at);
    value
}

fn number(value: &Value) -> Option<i64> {
    value.as_str()?.parse().ok()
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

/// The settings `pod`'s memcached takes from its annotations, with the values it runs with or
/// would after a restart (those of the earlier form, literal, cannot change in place).
pub(super) fn annotated(pod: &Pod) -> Values {
    let args = pod
        .spec
        .as_ref()
        .and_then(|s| {
            s.containers
                .iter()
                .find(|c| c.name == resources::MEMCACHED_CONTAINER)
        })
        .and_then(|c| c.args.as_deref())
        .unwrap_or_default();
    wr::SETTINGS
        .iter()
        .filter(|s| args.contains(&s.arg()))
        .filter_map(|s| Some((s.flag, pod.annotations().get(s.annotation)?.parse().ok()?)))
        .collect()
}
