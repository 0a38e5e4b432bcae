//! Cuts already made (kept.rs), found again for objects that differ from one already cut only in
//! their names.
//!
//! Cutting a spec (parsing it and our managedFields entry, projecting one by the other, writing
//! the rest) was most of the CPU a restart spends filling its caches: every object arrives at
//! once, and at 10,000 Memcacheds of a few shapes there are a few distinct cuts. So a cut is
//! remembered by its spec with the name factored out and by the field set it was cut with.
//!
//! Found only where that is exact: the name appears in the spec (and in the cut) only as whole
//! string values, and not at all in the field set. Then two specs alike but for their names
//! differ in values that no field path or list key names, so the cut of one, with the names
//! swapped, is the cut of the other; anything else is cut afresh.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use super::shared_text::SharedText;
use operator_runtime::lock;

/// Enough for the shapes of Memcached a cluster has in practice; each entry holds a spec and a
/// field set as text (a few KiB). When full, all go: where most objects have shapes of their
/// own, remembering gains nothing.
const CAPACITY: usize = 64;

/// A cut and the `spec.replicas` read beside it.
#[derive(Clone, Debug)]
pub struct Cut {
    pub spec: SharedText,
    pub replicas: Option<i32>,
}

static CUTS: LazyLock<Mutex<HashMap<String, Cut>>> = LazyLock::new(Mutex::default);

/// The cut of `spec` by `fields` (our entry's `f:spec`, if any) for the object `name`: the one
/// made before for an object alike but for its name, or else `make`'s text and replicas,
/// remembered where finding them again is exact.
pub fn cut_once<'a>(
    spec: &str,
    fields: Option<&str>,
    name: &str,
    make: impl FnOnce() -> (Cow<'a, str>, Option<i32>),
) -> Cut {
    let key = key(spec, fields, name);
    if let Some(found) = key.as_ref().and_then(|key| lock(&CUTS).get(key).cloned()) {
        return found;
    }
    let (text, replicas) = make();
    let cut = Cut {
        spec: SharedText::new(&text, name),
        replicas,
    };
    if let Some(key) = key.filter(|_| only_as_values(&text, name)) {
        let mut cuts = lock(&CUTS);
        if cuts.len() >= CAPACITY {
            cuts.clear();
        }
        cuts.insert(key, cut.clone());
    }
    cut
}

/// The cut remembered for `spec` by `fields` for `name`, if any.
#[cfg(test)]
pub fn find(spec: &str, fields: &str, name: &str) -> Option<Cut> {
    lock(&CUTS).get(&key(spec, Some(fields), name)?).cloned()
}

/// The spec with the name factored out, then the field set; `None` where a cut found by it
/// might not be this object's.
fn key(spec: &str, fields: Option<&str>, name: &str) -> Option<String> {
    let fields = fields?;
    if name.is_empty() || fields.contains(name) || !only_as_values(spec, name) {
        return None;
    }
    let mut key = spec.replace(name, "\0");
    // JSON text has no raw control characters: the two parts cannot run into each other.
    key.push('\u{1}');
    key.push_str(fields);
    Some(key)
}

/// Whether every occurrence of `name` in the JSON `text` is a whole string value: `"name"` after
/// `:`, `,` or `[` and before `,`, `}` or `]` (a quote after those is never inside a string,
/// where quotes are escaped; and a name has no quotes).
fn only_as_values(text: &str, name: &str) -> bool {
    let bytes = text.as_bytes();
    text.match_indices(name).all(|(at, _)| {
        let end = at + name.len();
        at >= 2
            && bytes[at - 1] == b'"'
            && matches!(bytes[at - 2], b':' | b',' | b'[')
            && bytes.get(end) == Some(&b'"')
            && matches!(bytes.get(end + 1), Some(b',' | b'}' | b']'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_only_as_whole_values_is_factored() {
        let spec = r#"{"selector":{"instance":"web"},"names":["web","x"],"port":80}"#;
        assert!(only_as_values(spec, "web"));
        assert!(key(spec, Some(r#"{"f:selector":{}}"#), "web").is_some());
        let other = spec.replace("web", "api");
        assert_eq!(
            key(spec, Some("{}"), "web"),
            key(&other, Some("{}"), "api"),
            "alike but for the name"
        );
        assert_ne!(
            key(spec, Some("{}"), "web"),
            key(&other, Some(r#"{"f:port":{}}"#), "api")
        );
    }

    #[test]
    fn a_name_anywhere_else_is_not() {
        for (spec, name) in [
            (r#"{"web":1}"#, "web"),               // a key
            (r#"{"a":"web-1"}"#, "web"),           // part of a value
            (r#"{"replicas":1}"#, "1"),            // a number
            (r#"{"a":"{\"b\":\"web\"}"}"#, "web"), // inside an escaped string
            (r#"{"a":true}"#, "ru"),               // a literal
            (r#"{"a": "web"}"#, "web"),            // unusual spacing: not risked
        ] {
            assert!(!only_as_values(spec, name), "{spec} by {name}");
            assert_eq!(key(spec, Some("{}"), name), None);
        }
        assert_eq!(
            key(
                r#"{"a":"web"}"#,
                Some(r#"{"f:a":{"k:{\"n\":\"web\"}":{}}}"#),
                "web"
            ),
            None,
            "a field set that names it"
        );
    }
}
