//! What a watch has read of our entries and specs before, to find again for the next object
//! (see `KnownFields`).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde_json::value::RawValue;

use super::digest::hasher;
use super::managed_fields::{Entries, Fields, Key, Ours, SpecDigests};

/// What a watch has read of our entries and specs, to find again for the next object. A
/// restart lists thousands of objects that one release applied alike, which differ in our
/// entry only in its metadata part (the owner's uid) and in their specs only in the strings
/// that name them. So our entry's spec part is parsed once per text, and a spec's digests
/// (which hold those names as placeholders, see digest.rs) are found again by its text with
/// the names factored out: a restart walks one spec per shape, not one per object.
#[derive(Debug, Default)]
pub struct KnownFields(HashMap<Box<str>, Known>);

/// One text of our entry's spec part, parsed, and the digests of the specs read with it, by
/// `shape`.
#[derive(Debug)]
pub struct Known {
    fields: Fields<'static>,
    specs: HashMap<u64, SpecDigests>,
}

impl KnownFields {
    /// A watch sees as many texts as releases and optional parts (auth, TLS, monitoring) its
    /// objects were applied with, and as many specs as sizes; past this many, it starts over.
    const MOST: usize = 32;

    /// Our entry's `fields` (FieldsV1 text; `None` without an entry), split into what of the
    /// metadata and of the spec is ours; `content` names the spec's field (a ConfigMap's is
    /// `data`).
    pub fn split<'k, 't>(&'k mut self, fields: Option<&'t str>, content: &str) -> OurParts<'k, 't> {
        let top = fields.and_then(|text| serde_json::from_str::<Entries<&RawValue>>(text).ok());
        // With no entry of ours, or one that names nothing, all of it counts.
        let Some(Entries(top)) = top.filter(|Entries(top)| top.iter().any(|(Key(k), _)| k != "."))
        else {
            return OurParts::All;
        };
        let part = |name: &str| {
            top.iter()
                .find(|(Key(key), _)| key.strip_prefix("f:") == Some(name))
                .map(|(_, text)| text.get())
        };
        let metadata = part("metadata").and_then(Fields::parse);
        let Some(text) = part(content) else {
            return OurParts::Parts {
                metadata,
                spec: None,
            };
        };
        if !self.0.contains_key(text) {
            // As a whole entry that does not parse, all of it counts.
            let Some(fields) = Fields::parse(text) else {
                return OurParts::All;
            };
            if self.0.len() >= Self::MOST {
                self.0.clear();
            }
            let specs = HashMap::new();
            let fields = fields.into_owned();
            self.0.insert(text.into(), Known { fields, specs });
        }
        let spec = self.0.get_mut(text).map(|known| (text, known));
        OurParts::Parts { metadata, spec }
    }
}

impl Known {
    /// `fields`, the text this was parsed from.
    fn spec_digests(&mut self, fields: &str, text: &str, names: &[&str]) -> SpecDigests {
        let ours = Some(Ours::of(&self.fields));
        // Which list items are ours is decided by their values (`k:` keys, `v:` items): an
        // entry that names the object cannot be shared.
        let named = names
            .iter()
            .any(|name| !name.is_empty() && fields.contains(name));
        let Some(shape) = shape(text, names).filter(|_| !named) else {
            return SpecDigests::of(text, ours, names);
        };
        if let Some(found) = self.specs.get(&shape) {
            return *found;
        }
        let digests = SpecDigests::of(text, ours, names);
        if self.specs.len() >= KnownFields::MOST {
            self.specs.clear();
        }
        self.specs.insert(shape, digests);
        digests
    }
}

/// A hash of the spec `text` with each string value that is exactly one of `names` taken as
/// its placeholder: specs of one shape have the same spec digests (as far as 64-bit hashes
/// tell, as with every digest here). `None` where that would not be exact: with escapes in the
/// text, where a string's text is not its value (the API server writes none in our specs), or
/// with a name that is not a DNS name or uid (none is).
fn shape(text: &str, names: &[&str]) -> Option<u64> {
    let plain = |name: &&str| {
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    };
    if text.contains('\\') || !names.iter().all(plain) {
        return None;
    }
    // Without escapes, a quote starts or ends a string, and a name holds no quote, comma, colon
    // or bracket, so `"<name>"` is one whole string; a map key (a colon follows) is read as
    // itself.
    let mut found: Vec<(usize, usize, usize)> = Vec::new();
    for (placeholder, name) in names.iter().enumerate() {
        if name.is_empty() || names[..placeholder].contains(name) {
            continue;
        }
        let token = format!("\"{name}\"");
        found.extend(
            text.match_indices(&token)
                .map(|(at, _)| (at, at + token.len(), placeholder))
                .filter(|&(_, end, _)| !text[end..].trim_start().starts_with(':')),
        );
    }
    found.sort_unstable();
    let mut hasher = hasher();
    let mut from = 0;
    for (at, end, placeholder) in found {
        text[from..at].hash(&mut hasher);
        placeholder.hash(&mut hasher);
        from = end;
    }
    text[from..].hash(&mut hasher);
    Some(hasher.finish())
}

/// Our parts of an object (see `KnownFields::split`).
pub enum OurParts<'k, 't> {
    All,
    Parts {
        metadata: Option<Fields<'t>>,
        /// The spec part's text, and what was read with it.
        spec: Option<(&'t str, &'k mut Known)>,
    },
}

impl OurParts<'_, '_> {
    pub fn metadata(&self) -> Option<Ours<'_>> {
        match self {
            Self::All => Some(Ours::All),
            Self::Parts { metadata, .. } => metadata.as_ref().map(Ours::of),
        }
    }

    /// The digests of our part of the spec `text`, of an object named by `names`.
    pub fn spec_digests(&mut self, text: &str, names: &[&str]) -> SpecDigests {
        match self {
            Self::All => SpecDigests::of(text, Some(Ours::All), names),
            Self::Parts { spec: None, .. } => SpecDigests::of(text, None, names),
            Self::Parts {
                spec: Some((fields, known)),
                ..
            } => known.spec_digests(fields, text, names),
        }
    }
}

#[cfg(test)]
impl KnownFields {
    /// How many spec digests are kept, for all texts of our entry.
    pub fn specs_known(&self) -> usize {
        self.0.values().map(|known| known.specs.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_shape_is_the_text_with_the_names_as_placeholders() {
        let spec = |name: &str, uid: &str, size: u32| {
            json!({"serviceName": name, "replicas": size, "token": uid,
                   "labels": {"instance": name}})
            .to_string()
        };
        let names = |name, uid| [name, uid];
        let a = shape(&spec("a", "1", 1), &names("a", "1"));
        assert!(a.is_some());
        assert_eq!(a, shape(&spec("b", "2", 1), &names("b", "2")));
        assert_ne!(a, shape(&spec("b", "2", 2), &names("b", "2")), "size");
        assert_ne!(
            a,
            shape(&spec("a", "1", 1), &names("b", "2")),
            "other names"
        );
        assert_ne!(
            a,
            shape(&spec("a", "1", 1), &names("a", "2")),
            "the uid where the name is"
        );
        // Only whole strings are names; a key is itself; escapes and odd names are not factored.
        assert_eq!(shape(r#"[",x"]"#, &names(",x", "")), None);
        assert_ne!(
            shape(r#"["a-x"]"#, &names("a", "")),
            shape(r#"["b-x"]"#, &names("b", ""))
        );
        assert_ne!(
            shape(r#"{"a":"a"}"#, &names("a", "")),
            shape(r#"{"b":"b"}"#, &names("b", ""))
        );
        assert_eq!(shape(r#"{"a":"a\"b"}"#, &names("a", "")), None);
    }

    #[test]
    fn an_entry_that_names_the_object_is_not_shared() {
        // Our entry owns the item "a" of a set: object a's item is ours, b's is not, though
        // their specs have one shape.
        let entry = r#"{"f:spec":{"f:x":{"v:\"a\"":{}}}}"#;
        let mut known = KnownFields::default();
        let mut digests = |spec: &str, name: &str| {
            known
                .split(Some(entry), "spec")
                .spec_digests(spec, &[name, ""])
        };
        let a = digests(r#"{"x":["a"]}"#, "a");
        let b = digests(r#"{"x":["b"]}"#, "b");
        assert!(a.spec.is_some());
        assert_eq!(b.spec, None);
    }
}
