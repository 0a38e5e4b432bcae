//! Liveness and readiness state behind /healthz and /readyz.
//!
//! Readiness never waits for leadership: with a single replica, a rolling update would deadlock
//! if the new pod had to lead before it counted as ready while the old one held the lease.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::Client;

#[derive(Default)]
pub struct Health {
    leading: AtomicBool,
    /// Watch caches that have not completed their first list yet (set when the controller starts).
    caches_pending: AtomicUsize,
    controller_started: AtomicBool,
}

/// Why /readyz answers 503.
#[derive(Debug, PartialEq, Eq)]
pub enum NotReady {
    ApiUnreachable(String),
    CachesNotSynced,
}

impl Health {
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
    }

    pub fn expect_caches(&self, caches: usize) {
        self.caches_pending.store(caches, Ordering::SeqCst);
        self.controller_started.store(true, Ordering::SeqCst);
    }

    pub fn cache_synced(&self) {
        let _ = self
            .caches_pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Whether every watch cache the controller expects has its first list.
    pub fn caches_synced(&self) -> bool {
        self.caches_pending.load(Ordering::SeqCst) == 0
    }

    /// Readiness given whether the API server answered: a follower only needs the API server;
    /// the leader also needs its caches synced, so it does not act on a partial view.
    pub fn readiness(&self, api: Result<(), String>) -> Result<(), NotReady> {
        api.map_err(NotReady::ApiUnreachable)?;
        let reconciling =
            self.leading.load(Ordering::SeqCst) || self.controller_started.load(Ordering::SeqCst);
        if reconciling && self.caches_pending.load(Ordering::SeqCst) > 0 {
            return Err(NotReady::CachesNotSynced);
        }
        Ok(())
    }

    pub async fn check(&self, client: &Client) -> Result<(), NotReady> {
        let api =
            match tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer within 2s".to_string()),
            };
        self.readiness(api)
    }
}

/// First-list progress of one watch scope's caches. Reconciling before the owned caches are
/// filled would report a wrong status (no pods yet) and correct it a moment later: two needless
/// writes per object after every restart.
pub struct CacheSync {
    pending: AtomicUsize,
    health: std::sync::Arc<Health>,
}

impl CacheSync {
    pub fn new(caches: usize, health: std::sync::Arc<Health>) -> Self {
        Self {
            pending: AtomicUsize::new(caches),
            health,
        }
    }

    /// One cache has its first complete list.
    pub fn synced(&self) {
        if self
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.health.cache_synced();
        }
    }

    pub fn all_synced(&self) -> bool {
        self.pending.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follower_is_ready_when_the_api_answers() {
        let h = Health::default();
        assert_eq!(h.readiness(Ok(())), Ok(()));
        assert!(matches!(
            h.readiness(Err("refused".into())),
            Err(NotReady::ApiUnreachable(_))
        ));
    }

    #[test]
    fn reconciling_process_is_ready_once_every_cache_synced() {
        let h = Health::default();
        h.set_leading(true);
        h.expect_caches(2);
        assert_eq!(h.readiness(Ok(())), Err(NotReady::CachesNotSynced));
        h.cache_synced();
        assert_eq!(h.readiness(Ok(())), Err(NotReady::CachesNotSynced));
        h.cache_synced();
        assert_eq!(h.readiness(Ok(())), Ok(()));
        h.cache_synced();
        assert_eq!(
            h.readiness(Ok(())),
            Ok(()),
            "extra sync signals do not wrap around"
        );
    }

    #[test]
    fn a_scope_is_synced_once_each_of_its_caches_is() {
        let h = std::sync::Arc::new(Health::default());
        h.expect_caches(2);
        let scope = CacheSync::new(2, h.clone());
        scope.synced();
        assert!(!scope.all_synced());
        scope.synced();
        scope.synced();
        assert!(scope.all_synced());
        assert_eq!(
            h.readiness(Ok(())),
            Ok(()),
            "each cache is reported to readiness once"
        );
    }
}
