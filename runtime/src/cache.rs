//! The caches the watches fill and the reconciles read: each object held once, found by the
//! namespace and name it carries.
//!
//! Not kube's reflector `Store`: its map is keyed by an `ObjectRef`, a second copy of the
//! object's name and namespace plus its resourceVersion and uid (96 bytes and four small
//! allocations an object, beside the table's slot). Here the table's slots hold only the `Arc`,
//! and a lookup compares the names the objects carry. A relist is built aside and swapped in
//! whole, as in kube's store: until it is complete, the previous list serves.

use std::hash::BuildHasher;
use std::sync::{Arc, PoisonError, RwLock};

use hashbrown::{DefaultHashBuilder, HashTable};
use kube::Resource;
use kube::runtime::watcher;

use crate::relisted::Relisted;

/// A read handle on one watch's cache.
pub struct Cache<K> {
    objects: Arc<RwLock<Relisted<Objects<K>>>>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            objects: self.objects.clone(),
        }
    }
}

/// The watch's side: the only writer.
pub struct Writer<K> {
    objects: Arc<RwLock<Relisted<Objects<K>>>>,
}

/// An empty cache and its writer.
pub fn new<K>() -> (Cache<K>, Writer<K>) {
    let objects = Arc::new(RwLock::new(Relisted::default()));
    (
        Cache {
            objects: objects.clone(),
        },
        Writer { objects },
    )
}

impl<K: Resource> Cache<K> {
    /// The object of that name, as last watched.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.live().get(namespace, name).cloned()
    }

    /// The object with `other`'s namespace and name (`other` of this kind or another: an owned
    /// object takes its owner's name).
    pub fn get_for(&self, other: &impl Resource) -> Option<Arc<K>> {
        let (namespace, name) = key_of(other);
        self.get(namespace, name)
    }

    /// Every object, as last watched.
    pub fn state(&self) -> Vec<Arc<K>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.live().table.iter().cloned().collect()
    }
}

impl<K: Resource + Clone> Writer<K> {
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        let mut objects = self.objects.write().unwrap_or_else(PoisonError::into_inner);
        objects.observe(
            event,
            |objects, obj| objects.insert(Arc::new(obj.clone())),
            Objects::remove,
        );
    }
}

struct Objects<K> {
    table: HashTable<Arc<K>>,
    hasher: DefaultHashBuilder,
}

impl<K> Default for Objects<K> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
        }
    }
}

fn key_of<R: Resource>(obj: &R) -> (&str, &str) {
    let meta = obj.meta();
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<K: Resource> Objects<K> {
    fn hash(&self, key: (&str, &str)) -> u64 {
        self.hasher.hash_one(key)
    }

    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<K>> {
        let key = (namespace, name);
        self.table.find(self.hash(key), |o| key_of(&**o) == key)
    }

    fn insert(&mut self, obj: Arc<K>) {
        let hash = self.hash(key_of(&*obj));
        let same = |o: &Arc<K>| key_of(&**o) == key_of(&*obj);
        if let Some(slot) = self.table.find_mut(hash, same) {
            *slot = obj;
            return;
        }
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, obj, |o| hasher.hash_one(key_of(&**o)));
    }

    fn remove(&mut self, obj: &K) {
        let key = key_of(obj);
        if let Ok(entry) = self
            .table
            .find_entry(self.hash(key), |o| key_of(&**o) == key)
        {
            entry.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn object(namespace: &str, name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn version(cache: &Cache<ConfigMap>, namespace: &str, name: &str) -> Option<String> {
        cache
            .get(namespace, name)
            .and_then(|o| o.metadata.resource_version.clone())
    }

    #[test]
    fn an_object_is_found_by_namespace_and_name_as_last_watched() {
        let (cache, mut writer) = new();
        writer.apply_watcher_event(&watcher::Event::Apply(object("a", "cache", "1")));
        writer.apply_watcher_event(&watcher::Event::Apply(object("b", "cache", "2")));
        writer.apply_watcher_event(&watcher::Event::Apply(object("a", "cache", "3")));
        assert_eq!(version(&cache, "a", "cache").as_deref(), Some("3"));
        assert_eq!(version(&cache, "b", "cache").as_deref(), Some("2"));
        assert_eq!(cache.get("c", "cache"), None);
        assert_eq!(cache.state().len(), 2);

        writer.apply_watcher_event(&watcher::Event::Delete(object("a", "cache", "4")));
        assert_eq!(cache.get("a", "cache"), None);
        assert_eq!(version(&cache, "b", "cache").as_deref(), Some("2"));
    }

    #[test]
    fn a_relist_replaces_the_cache_whole_once_complete() {
        let (cache, mut writer) = new();
        writer.apply_watcher_event(&watcher::Event::Apply(object("a", "gone", "1")));
        writer.apply_watcher_event(&watcher::Event::Apply(object("a", "kept", "1")));

        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(object("a", "kept", "5")));
        assert_eq!(
            version(&cache, "a", "kept").as_deref(),
            Some("1"),
            "the previous list serves until the relist is complete"
        );
        assert!(cache.get("a", "gone").is_some());

        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(version(&cache, "a", "kept").as_deref(), Some("5"));
        assert_eq!(cache.get("a", "gone"), None, "not in the relist");
    }
}
