//! The Memcached controller: the reconcile (the tutorial's steps), the events it records, and
//! the watches and workers that drive it.

mod events;
mod pod_index;
mod reconcile;
pub(crate) mod rollouts;
mod watches;
mod workers;

pub use events::Events;
pub use reconcile::{Context, error_policy, reconcile};
pub use rollouts::Rollouts;
pub use watches::{parse_event, run};

use crate::watch_namespace::WatchNamespace;

/// Settings of the controller, from flags and environment.
#[derive(Clone, Debug)]
pub struct Settings {
    pub watch_namespace: WatchNamespace,
    pub max_concurrent_reconciles: u16,
    /// Deployments that may roll at once for a pod template change of the operator's own.
    pub max_concurrent_rollouts: u16,
    /// memcached image for CRs that do not set `spec.image` (RELATED_IMAGE_MEMCACHED).
    pub default_image: String,
    /// Identity in events (the pod name when in a cluster).
    pub instance: String,
}

/// The controller's shared maps and sets hold nothing a panic can leave worse than a stale entry
/// or a repeated event, so a poisoned lock is used as is rather than stopping every reconcile.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
