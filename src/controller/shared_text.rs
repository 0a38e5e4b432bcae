//! Cut specs, labels and annotations as the caches keep them (see kept.rs), held once for all
//! objects that share them.
//!
//! Memcacheds of the same spec own Deployments and Services whose cut specs and labels differ
//! only where the object's name appears (the instance label, selectors). With the name factored
//! out, they are one text, and 10,000 Memcacheds of a few shapes keep a few texts instead of
//! 10,000.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

use operator_runtime::lock;

/// Stands for the object's name in a factored text. JSON text holds no raw NUL (it is written
/// `\u0000`), so factoring is undone exactly.
const NAME: char = '\0';

/// JSON text with the object's name factored out, shared by every object whose text factors to
/// the same.
#[derive(Clone, Debug)]
pub struct SharedText(Arc<str>);

impl SharedText {
    /// `text` of the object named `name`.
    pub fn new(text: &str, name: &str) -> Self {
        if name.is_empty() || !text.contains(name) {
            return Self(lock(&TEXTS).intern(text));
        }
        Self(lock(&TEXTS).intern(&text.replace(name, "\0")))
    }

    /// The spec of an absent or empty `spec`.
    pub fn empty() -> Self {
        static EMPTY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("{}"));
        Self(EMPTY.clone())
    }

    /// The text of the object named `name`.
    pub fn text(&self, name: &str) -> Cow<'_, str> {
        if self.0.contains(NAME) {
            Cow::Owned(self.0.replace(NAME, name))
        } else {
            Cow::Borrowed(&self.0)
        }
    }
}

/// Equal for the same object: texts of different objects compare with their names factored out.
impl PartialEq for SharedText {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

/// Every shared text.
static TEXTS: LazyLock<Mutex<Texts>> = LazyLock::new(Mutex::default);

#[derive(Default)]
struct Texts {
    texts: HashSet<Arc<str>>,
    /// How many were left by the last sweep.
    swept: usize,
}

impl Texts {
    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.texts.get(text) {
            return shared.clone();
        }
        // Texts no object holds any more go once the set has doubled since the last sweep:
        // amortised O(1) a text, and at most about twice the live texts kept.
        if self.texts.len() >= 2 * self.swept.max(32) {
            self.texts.retain(|t| Arc::strong_count(t) > 1);
            self.swept = self.texts.len();
        }
        let shared: Arc<str> = Arc::from(text);
        self.texts.insert(shared.clone());
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"{"selector":{"matchLabels":{"app.kubernetes.io/instance":"cache-a"}},"template":{"metadata":{"name":"cache-a-x"}}}"#;

    #[test]
    fn objects_that_differ_only_in_name_share_one_text() {
        let a = SharedText::new(SPEC, "cache-a");
        let b = SharedText::new(&SPEC.replace("cache-a", "cache-b"), "cache-b");
        assert!(Arc::ptr_eq(&a.0, &b.0), "one text for both");
        assert_eq!(a.text("cache-a"), SPEC);
        assert_eq!(b.text("cache-b"), SPEC.replace("cache-a", "cache-b"));
    }

    #[test]
    fn a_different_spec_is_a_different_text() {
        let one = SharedText::new(r#"{"replicas":1,"name":"cache-c"}"#, "cache-c");
        let two = SharedText::new(r#"{"replicas":2,"name":"cache-c"}"#, "cache-c");
        assert_ne!(one, two);
        assert_eq!(
            one,
            SharedText::new(r#"{"replicas":1,"name":"cache-c"}"#, "cache-c")
        );
    }

    #[test]
    fn a_name_inside_other_words_round_trips() {
        // The name "a" is in "app" and "cache-a": factoring replaces all, restoring puts all back.
        let text = r#"{"app":"cache-a","a":"a\u0000"}"#;
        assert_eq!(SharedText::new(text, "a").text("a"), text);
        assert_eq!(SharedText::new(text, "").text(""), text);
        assert_eq!(SharedText::empty().text("x"), "{}");
    }

    #[test]
    fn texts_no_object_holds_are_swept() {
        let before = lock(&TEXTS).texts.len();
        for i in 0..1000 {
            drop(SharedText::new(&format!(r#"{{"swept":{i}}}"#), "x"));
        }
        let held: Vec<_> = (0..10)
            .map(|i| SharedText::new(&format!(r#"{{"held":{i}}}"#), "x"))
            .collect();
        let after = lock(&TEXTS).texts.len();
        assert!(
            after < before + 200,
            "1,000 dropped texts were not swept: {before} → {after}"
        );
        for (i, spec) in held.iter().enumerate() {
            assert_eq!(spec.text("x"), format!(r#"{{"held":{i}}}"#));
        }
    }
}
