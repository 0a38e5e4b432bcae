//! Our managedFields entry: which of an object's fields our server-side apply owns (FieldsV1),
//! and the digest of those fields of the object, as `digest` would make it of them alone, read
//! from the object's text without building it.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::digest::{MapDigest, SeqDigest, digest, digest_naming, string_digest};
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

/// How much of a value our entry owns: all of it, or the parts a FieldsV1 node names (`f:<field>`
/// for a field, `k:<key json>` for a list item by its keys, `v:<json>` for a set item, `.` for
/// the node itself; `{}` stands for a whole leaf or atomic value).
#[derive(Clone, Copy, Debug)]
pub enum Ours<'f> {
    All,
    Parts(&'f Fields<'f>),
}

impl<'f> Ours<'f> {
    pub fn of(fields: &'f Fields<'f>) -> Self {
        if fields.0.iter().any(|(Key(name), _)| name != ".") {
            Self::Parts(fields)
        } else {
            Self::All
        }
    }

    /// The digest of the parts of the JSON `text` that are ours, as `digest` would make it of
    /// those parts alone, computed as the text is read.
    pub fn digest(self, text: &str) -> Option<u64> {
        self.digest_naming(text, &[])
    }

    /// The same, with `names` as `digest_naming` takes them.
    fn digest_naming(self, text: &str, names: &[&str]) -> Option<u64> {
        Walk { ours: self, names }
            .deserialize(&mut serde_json::Deserializer::from_str(text))
            .ok()
            .flatten()
    }

    /// The same of a value that serializes, as the API server would send it.
    pub fn digest_of<T: Serialize>(self, value: &T) -> Option<u64> {
        match self {
            Self::All => digest(value),
            Self::Parts(_) => self.digest(&serde_json::to_string(value).ok()?),
        }
    }

    /// What of the map entry `name` is ours, if any.
    fn field(self, name: &str) -> Option<Self> {
        match self {
            Self::All => Some(Self::All),
            Self::Parts(parts) => parts.field(name).map(Self::of),
        }
    }
}

/// A FieldsV1 node, borrowed from its text: its children by name, sorted.
#[derive(Debug, Default)]
pub struct Fields<'a>(Vec<(Key<'a>, Fields<'a>)>);

impl<'a> Fields<'a> {
    pub fn parse(text: &'a str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    pub(super) fn into_owned(self) -> Fields<'static> {
        Fields(
            self.0
                .into_iter()
                .map(|(Key(key), fields)| (Key(Cow::Owned(key.into_owned())), fields.into_owned()))
                .collect(),
        )
    }

    /// The child for the field `name` (`f:<name>`).
    pub fn field(&self, name: &str) -> Option<&Self> {
        // The order of `f:<name>` among the sorted names, without building it.
        let order = |Key(key): &Key| {
            let key = key.as_bytes();
            let prefix = &key[..key.len().min(2)];
            prefix
                .cmp(b"f:")
                .then_with(|| key[prefix.len()..].cmp(name.as_bytes()))
        };
        let at = self.0.binary_search_by(|(key, _)| order(key)).ok()?;
        Some(&self.0[at].1)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Entries(mut children) = Entries::deserialize(deserializer)?;
        children.sort_unstable_by(|(Key(a), _), (Key(b), _)| a.cmp(b));
        Ok(Fields(children))
    }
}

/// Digests our part of a value as it is read.
#[derive(Clone, Copy)]
struct Walk<'f, 'n> {
    ours: Ours<'f>,
    names: &'n [&'n str],
}

impl Walk<'_, '_> {
    fn field(self, name: &str) -> Option<Self> {
        let ours = self.ours.field(name)?;
        Some(Self { ours, ..self })
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<u64>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_> {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Option<u64>, E> {
        Ok(digest(&v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Option<u64>, E> {
        Ok(digest(&v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(digest(&v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Option<u64>, E> {
        Ok(digest(&v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<u64>, E> {
        Ok(string_digest(v, self.names))
    }

    fn visit_unit<E>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
        let mut digest = MapDigest::default();
        while let Some(Key(key)) = map.next_key()? {
            match self.field(&key) {
                Some(ours) => digest.entry(&key, map.next_value_seed(ours)?),
                None => _ = map.next_value::<IgnoredAny>()?,
            }
        }
        Ok(digest.finish())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
        let mut digest = SeqDigest::default();
        match self.ours {
            Ours::All => {
                while let Some(item) = seq.next_element_seed(self)? {
                    digest.add(item);
                }
            }
            Ours::Parts(parts) => {
                let items = ListedItems::of(parts);
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    if let Some(item) = items.digest(item.get(), self.names) {
                        digest.add(item);
                    }
                }
            }
        }
        Ok(digest.finish())
    }
}

/// The items of a list our entry names: by their keys (`k:`), or whole (`v:`, a set's items).
struct ListedItems<'f> {
    keyed: Vec<(Map<String, Value>, Ours<'f>)>,
    set: Vec<Value>,
}

impl<'f> ListedItems<'f> {
    fn of(parts: &'f Fields<'f>) -> Self {
        let mut items = Self {
            keyed: Vec::new(),
            set: Vec::new(),
        };
        for (Key(name), sub) in &parts.0 {
            if let Some(keys) = name.strip_prefix("k:") {
                items
                    .keyed
                    .extend(serde_json::from_str(keys).ok().map(|k| (k, Ours::of(sub))));
            } else if let Some(item) = name.strip_prefix("v:") {
                items.set.extend(serde_json::from_str(item).ok());
            }
        }
        items
    }

    /// The digest of our part of the item `text`, when our entry names it (`None` when not, and
    /// `Some(None)` for an item named and empty).
    fn digest(&self, text: &str, names: &[&str]) -> Option<Option<u64>> {
        if !self.keyed.is_empty()
            && let Ok(Entries::<&RawValue>(fields)) = serde_json::from_str(text)
            && let Some((keys, ours)) = self.keyed.iter().find(|(keys, _)| {
                keys.iter().all(|(key, value)| {
                    fields.iter().any(|(Key(k), v)| {
                        k == key
                            && serde_json::from_str::<Value>(v.get()).is_ok_and(|v| v == *value)
                    })
                })
            })
        {
            // The keys identify the item, whether or not they are listed.
            let mut digest = MapDigest::default();
            for (Key(key), value) in &fields {
                let ours = if keys.contains_key(key.as_ref()) {
                    Some(Ours::All)
                } else {
                    ours.field(key)
                };
                if let Some(ours) = ours {
                    digest.entry(key, ours.digest_naming(value.get(), names));
                }
            }
            return Some(digest.finish());
        }
        if !self.set.is_empty()
            && let Ok(item) = serde_json::from_str::<Value>(text)
            && self.set.contains(&item)
        {
            return Some(digest_naming(&item, names));
        }
        None
    }
}

/// A map key as read: borrowed from the text unless it has escapes.
#[derive(Debug)]
pub(super) struct Key<'a>(pub(super) Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A JSON object's entries in their order, the keys borrowed from the text.
pub(super) struct Entries<'a, V>(pub(super) Vec<(Key<'a>, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<'de, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<'de, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor(PhantomData))
    }
}

/// What the cache keeps of a spec as sent: the digest of our part of it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecDigests {
    pub spec: Option<u64>,
}

impl SpecDigests {
    /// Of the spec `text` of an object called `name`; `ours`, what of it is ours (`None`: none
    /// of it).
    pub(super) fn of(text: &str, ours: Option<Ours>, names: &[&str]) -> Self {
        SpecSeed(ours.map(|ours| Walk { ours, names }))
            .deserialize(&mut serde_json::Deserializer::from_str(text))
            .unwrap_or_default()
    }
}

struct SpecSeed<'f, 'n>(Option<Walk<'f, 'n>>);

impl<'de> DeserializeSeed<'de> for SpecSeed<'_, '_> {
    type Value = SpecDigests;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<SpecDigests, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for SpecSeed<'_, '_> {
    type Value = SpecDigests;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a spec")
    }

    fn visit_unit<E>(self) -> Result<SpecDigests, E> {
        Ok(SpecDigests::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpecDigests, A::Error> {
        let mut spec = SpecDigests::default();
        let mut entries = MapDigest::default();
        while let Some(Key(key)) = map.next_key()? {
            let Some(ours) = self.0.and_then(|ours| ours.field(&key)) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value = map.next_value_seed(ours)?;
            entries.entry(&key, value);
        }
        spec.spec = entries.finish();
        Ok(spec)
    }
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
            Ours::of(&Fields::parse(&fields.to_string()).unwrap()).digest(&value.to_string()),
            digest(&json!({"finalizers": ["a"], "args": ["-m", "64"],
                           "ports": [{"port": 1, "name": "x"}]}))
        );
    }

    #[test]
    fn escaped_names_and_fields_in_any_order_are_read_as_their_values() {
        let fields = Fields::parse(r#"{"f:c":{},".":{},"f:ab":{}}"#).unwrap();
        assert_eq!(
            Ours::of(&fields).digest(r#"{"a\u0062":1,"c":2,"d":3}"#),
            digest(&json!({"ab": 1, "c": 2}))
        );
        assert_eq!(
            Ours::of(&Fields::parse(r#"{".":{}}"#).unwrap()).digest("[1]"),
            digest(&[1])
        );
    }

    #[test]
    fn a_named_walk_digests_as_the_named_serializer() {
        let value = json!({"serviceName": "a", "uid": "1", "x": ["a", {"a": "a"}]});
        let fields = json!({"f:serviceName": {}, "f:uid": {}, "f:x": {}}).to_string();
        let fields = Fields::parse(&fields).unwrap();
        let names = ["a", "1"];
        assert_eq!(
            Ours::of(&fields).digest_naming(&value.to_string(), &names),
            digest_naming(&value, &names)
        );
        assert_ne!(digest_naming(&value, &names), digest(&value));
        assert_eq!(
            digest_naming(&value, &names),
            digest_naming(
                &json!({"serviceName": "b", "uid": "2", "x": ["b", {"a": "b"}]}),
                &["b", "2"]
            )
        );
    }
}
