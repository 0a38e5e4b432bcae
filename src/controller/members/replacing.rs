//! The members an update replaced, until their replacements serve.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use operator_runtime::lock;

/// How long an evicted member's replacement counts as part of the update at most.
const REPLACEMENT_COUNTS: Duration = Duration::from_secs(600);

/// The members this process evicted for an update, per Memcached, until their replacements serve
/// (or, should they never, for as long as a rollout counts: rollouts.rs). Kept in memory: after a
/// restart the status counts such a member as out for another cause until it serves.
#[derive(Default)]
pub struct Replacing(Mutex<HashMap<(String, String), BTreeMap<String, Instant>>>);

impl Replacing {
    pub(super) fn of(&self, namespace: &str, memcached: &str) -> BTreeSet<String> {
        let mut all = lock(&self.0);
        let key = (namespace.to_string(), memcached.to_string());
        let Some(members) = all.get_mut(&key) else {
            return BTreeSet::new();
        };
        members.retain(|_, since| since.elapsed() < REPLACEMENT_COUNTS);
        let names = members.keys().cloned().collect();
        if members.is_empty() {
            all.remove(&key);
        }
        names
    }

    pub(super) fn evicted(&self, namespace: &str, memcached: &str, member: &str) {
        lock(&self.0)
            .entry((namespace.to_string(), memcached.to_string()))
            .or_default()
            .insert(member.to_string(), Instant::now());
    }

    /// These members serve: their replacement, if any, is over. The members still replacing.
    pub(super) fn served(
        &self,
        namespace: &str,
        memcached: &str,
        available: &[&str],
    ) -> BTreeSet<String> {
        let mut all = lock(&self.0);
        let key = (namespace.to_string(), memcached.to_string());
        let Some(members) = all.get_mut(&key) else {
            return BTreeSet::new();
        };
        members.retain(|name, _| !available.contains(&name.as_str()));
        let names = members.keys().cloned().collect();
        if members.is_empty() {
            all.remove(&key);
        }
        names
    }
}
