//! Our managedFields entry: which of an object's fields our server-side apply owns (FieldsV1),
//! and the digest of those fields of the object, as `digest` would make it of them alone.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::digest::{digest, map_digest, seq_digest};
use crate::resources::MANAGER_NAME;

/// Our managedFields entry's fields, borrowed from the text of the entries, none of them
/// decoded (the other managers' entries, the controllers' status fields, are most of the
/// text).
pub fn our_fields(managed_fields: &str) -> Option<&str> {
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
    let entries: Vec<Entry> = serde_json::from_str(managed_fields).ok()?;
    let ours = entries.into_iter().find(|entry| {
        entry.manager.as_deref() == Some(MANAGER_NAME)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.as_deref().unwrap_or_default().is_empty()
    })?;
    Some(ours.fields_v1?.get())
}

/// Whether a FieldsV1 node names parts of its value (else it stands for the whole value).
pub fn has_children(fields: &Value) -> bool {
    fields
        .as_object()
        .is_some_and(|fields| fields.keys().any(|k| k != "."))
}

/// The digest of the parts of `value` that `fields` (managedFields' FieldsV1: `f:<field>` for a
/// field, `k:<key json>` for a list item by its keys, `v:<json>` for a set item, `.` for the node
/// itself, `{}` for a whole leaf or atomic value) names, as `digest` would make it of those parts.
pub fn projected_digest(value: &Value, fields: &Value) -> Option<u64> {
    if !has_children(fields) {
        return digest(value);
    }
    match value {
        Value::Object(object) => map_digest(projected_entries(object, fields)),
        Value::Array(items) => seq_digest(items.iter().filter_map(|item| {
            fields.as_object()?.iter().find_map(|(key, sub)| {
                if let Some(keys) = key.strip_prefix("k:") {
                    let keys: Map<String, Value> = serde_json::from_str(keys).ok()?;
                    if !keys.iter().all(|(k, v)| item.get(k) == Some(v)) {
                        return None;
                    }
                    // The keys identify the item, whether or not they are listed.
                    let (Value::Object(item), true) = (item, has_children(sub)) else {
                        return Some(projected_digest(item, sub));
                    };
                    let mut entries: Vec<_> = projected_entries(item, sub)
                        .into_iter()
                        .filter(|(name, _)| !keys.contains_key(*name))
                        .collect();
                    entries.extend(
                        item.iter()
                            .filter(|(k, _)| keys.contains_key(*k))
                            .map(|(k, v)| (k.as_str(), digest(v))),
                    );
                    Some(map_digest(entries))
                } else if let Some(set_item) = key.strip_prefix("v:") {
                    let set_item: Value = serde_json::from_str(set_item).ok()?;
                    (set_item == *item).then(|| digest(item))
                } else {
                    None
                }
            })
        })),
        leaf => digest(leaf),
    }
}

/// The entries of `object` that `fields` names, each with its projected digest.
pub fn projected_entries<'a>(
    object: &'a Map<String, Value>,
    fields: &Value,
) -> Vec<(&'a str, Option<u64>)> {
    let Some(fields) = fields.as_object() else {
        return Vec::new();
    };
    fields
        .iter()
        .filter_map(|(key, sub)| {
            let (name, child) = object.get_key_value(key.strip_prefix("f:")?)?;
            Some((name.as_str(), projected_digest(child, sub)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn set_items_keyed_items_and_atomic_lists_are_projected() {
        let value = json!({"finalizers": ["a", "b"], "args": ["-m", "64"], "other": 1,
                           "ports": [{"port": 1, "name": "x", "theirs": true}, {"port": 2}]});
        let fields = json!({"f:finalizers": {"v:\"a\"": {}}, "f:args": {},
                            "f:ports": {"k:{\"port\":1}": {".": {}, "f:name": {}}}});
        assert_eq!(
            projected_digest(&value, &fields),
            digest(&json!({"finalizers": ["a"], "args": ["-m", "64"],
                           "ports": [{"port": 1, "name": "x"}]}))
        );
    }
}
