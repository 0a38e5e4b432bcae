//! What /readyz answers: whether the API server answers and every watch has its first list.
//!
//! Readiness never waits for leadership: with a single replica, a rolling update would deadlock
//! if the new pod had to lead before it counted as ready while the old one held the lease.
//! It waits for the watch caches instead, so a leader never acts on a partial view: each watch
//! takes an [`Unsynced`] handle when it is built and releases it on its first complete list.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Readiness {
    watches: SyncGate,
}

/// Why /readyz answers 503.
#[derive(Debug, PartialEq, Eq)]
pub enum NotReady {
    ApiUnreachable(String),
    CachesNotSynced,
}

impl Readiness {
    /// Every watch cache of the process: watches register here (or in a [`SyncGate::subset`]).
    pub fn watches(&self) -> &SyncGate {
        &self.watches
    }

    /// Readiness given whether the API server answered.
    pub fn readiness(&self, api: Result<(), String>) -> Result<(), NotReady> {
        api.map_err(NotReady::ApiUnreachable)?;
        if !self.watches.synced() {
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

/// A set of watch caches that is synced once each of them has had its first complete list.
/// Subsets (one per watch scope) count in their parent too, so the controller can ask whether its
/// own scope is synced while readiness asks about the whole process.
#[derive(Clone, Default)]
pub struct SyncGate {
    pending: Arc<AtomicUsize>,
    /// Woken whenever a handle of this set is released.
    released: Arc<Notify>,
    parent: Option<Box<SyncGate>>,
}

impl SyncGate {
    /// A set whose watches also count in this one.
    pub fn subset(&self) -> SyncGate {
        SyncGate {
            pending: Arc::default(),
            released: Arc::default(),
            parent: Some(Box::new(self.clone())),
        }
    }

    /// One more watch: the set (and its parents) is not synced until the handle is released.
    pub fn watch(&self) -> Unsynced {
        self.each(|set| {
            set.pending.fetch_add(1, Ordering::SeqCst);
        });
        Unsynced(self.clone())
    }

    pub fn synced(&self) -> bool {
        self.pending.load(Ordering::SeqCst) == 0
    }

    /// Returns once every watch of the set has had its first list.
    pub async fn wait_synced(&self) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.synced() {
                return;
            }
            released.await;
        }
    }

    fn each(&self, f: impl Fn(&SyncGate)) {
        let mut set = Some(self);
        while let Some(s) = set {
            f(s);
            set = s.parent.as_deref();
        }
    }
}

/// A watch whose cache has not had its first complete list. Released once, by value; a watch
/// that ends before its first list never counts as synced.
#[must_use = "readiness waits until this handle is released"]
pub struct Unsynced(SyncGate);

impl Unsynced {
    pub fn release(self) {
        self.0.each(|set| {
            set.pending.fetch_sub(1, Ordering::SeqCst);
            set.released.notify_waiters();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_the_api_answers_and_no_watch_is_filling() {
        let h = Readiness::default();
        assert_eq!(h.readiness(Ok(())), Ok(()));
        assert!(matches!(
            h.readiness(Err("refused".into())),
            Err(NotReady::ApiUnreachable(_))
        ));
    }

    #[test]
    fn ready_once_every_watch_has_its_first_list() {
        let h = Readiness::default();
        let memcacheds = h.watches().watch();
        let pods = h.watches().watch();
        assert_eq!(h.readiness(Ok(())), Err(NotReady::CachesNotSynced));
        memcacheds.release();
        assert_eq!(h.readiness(Ok(())), Err(NotReady::CachesNotSynced));
        pods.release();
        assert_eq!(h.readiness(Ok(())), Ok(()));
    }

    #[test]
    fn a_scope_is_synced_on_its_own_watches_and_counts_in_the_process() {
        let h = Readiness::default();
        let (a, b) = (h.watches().subset(), h.watches().subset());
        let in_a = a.watch();
        let in_b = b.watch();
        in_a.release();
        assert!(a.synced());
        assert!(!b.synced());
        assert_eq!(h.readiness(Ok(())), Err(NotReady::CachesNotSynced));
        in_b.release();
        assert_eq!(h.readiness(Ok(())), Ok(()));
    }
}
