//! What a kube-rs operator runs on besides its reconcile, one module a concern. Nothing here
//! knows which resource the operator manages.

pub mod admin;
pub mod backoff;
pub mod cache;
pub mod initial_list;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod protobuf;
pub mod protobuf_watch;
pub mod queue;
pub mod readiness;
pub mod relisted;
pub mod shutdown;
pub mod telemetry;
pub mod watch_namespace;
pub mod workers;

/// The kernel's host name (a pod's name inside Kubernetes).
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// Locks a mutex whose data a panic can leave no worse than stale (a cache entry, a queued key):
/// a poisoned lock is used as is rather than stopping every worker.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
