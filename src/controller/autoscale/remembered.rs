//! What the autoscaler remembers per Memcached, in this process.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;

use crate::api::Memcached;
use crate::autoscaling::History;
use operator_runtime::lock;

/// What the autoscaler remembers per Memcached, in this process: the readings' history and the
/// size it set last (the status may not show it yet when the size's own watch event comes).
#[derive(Default)]
pub struct Autoscaler(Mutex<HashMap<ObjectRef<Memcached>, Remembered>>);

#[derive(Default)]
pub(super) struct Remembered {
    pub(super) history: History,
    pub(super) size: Option<i32>,
    /// The Memcached's generation after the autoscaler's last write of spec.size.
    pub(super) generation: Option<i64>,
}

/// What this process knows of the size to keep, against the Memcached read.
pub(super) enum Kept {
    /// Its own write of spec.size is the Memcached's latest spec change: that size (its status
    /// may not say so yet).
    Latest(i32),
    /// The Memcached was read before that write reached the cache: nothing to judge.
    Stale,
    /// Someone changed the spec since (or nothing was written here): the status says.
    Unknown,
}

impl Autoscaler {
    pub fn forget(&self, key: &ObjectRef<Memcached>) {
        lock(&self.0).remove(key);
    }

    pub(super) fn kept(&self, mc: &Memcached) -> Kept {
        let all = lock(&self.0);
        let Some(r) = all.get(&ObjectRef::from_obj(mc)) else {
            return Kept::Unknown;
        };
        match (r.size, r.generation) {
            (_, Some(written)) if mc.metadata.generation < Some(written) => Kept::Stale,
            (Some(size), Some(written)) if mc.metadata.generation == Some(written) => {
                Kept::Latest(size)
            }
            _ => Kept::Unknown,
        }
    }

    /// The autoscaler wrote `size` into spec.size.
    pub(super) fn wrote(&self, mc: &Memcached, size: i32) {
        let mut all = lock(&self.0);
        let r = all.entry(ObjectRef::from_obj(mc)).or_default();
        r.size = Some(size);
        r.generation = mc.metadata.generation.map(|g| g + 1);
    }

    pub(super) fn take(&self, mc: &Memcached) -> Remembered {
        lock(&self.0)
            .remove(&ObjectRef::from_obj(mc))
            .unwrap_or_default()
    }

    pub(super) fn keep(&self, mc: &Memcached, remembered: Remembered) {
        lock(&self.0).insert(ObjectRef::from_obj(mc), remembered);
    }
}
