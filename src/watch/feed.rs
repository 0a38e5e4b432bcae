//! How watch events become queued reconciles: a queue key per scope and Memcached; nothing
//! queued before this process leads and the scope's caches are filled (then every cached
//! Memcached at once); a relist's triggers held until its end; status refreshes settled.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::triggers::{self, Trigger};
use crate::api::Memcached;
use operator_runtime::cache::Cache;
use operator_runtime::queue::{Priority, Queue};
use operator_runtime::readiness::SyncGate;

/// A queued reconcile: the watch scope (index into the scopes) and the Memcached. Shared: the
/// queue holds a key in several of its sets at once.
pub type Key = Arc<ScopedKey>;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ScopedKey {
    pub scope: usize,
    pub memcached: ObjectRef<Memcached>,
}

impl fmt::Display for ScopedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.memcached.fmt(f)
    }
}

pub fn scoped(scope: usize, memcached: ObjectRef<Memcached>) -> Key {
    Arc::new(ScopedKey { scope, memcached })
}

/// How long a status refresh waits for further events of the same Memcached to join it.
const STATUS_SETTLE: Duration = Duration::from_millis(500);

/// Queues the reconciles one watch's events call for, once the event is in the caches those
/// reconciles read. The triggers of a relist wait for its end, since until then the store still
/// holds the previous list.
///
/// Nothing is queued before this process leads and the scope's caches are filled: then
/// `queue_all_on_leading` queues every Memcached, with whatever earlier events changed in the
/// caches, so earlier triggers would only be reconciles that find the caches unfilled and retry.
pub struct Feed {
    queue: Arc<Queue<Key>>,
    scope: usize,
    caches: SyncGate,
    leading: watch::Receiver<bool>,
    relist: Option<Vec<Trigger>>,
}

impl Feed {
    pub fn new(
        queue: Arc<Queue<Key>>,
        scope: usize,
        caches: &SyncGate,
        leading: &watch::Receiver<bool>,
    ) -> Self {
        Self {
            queue,
            scope,
            caches: caches.clone(),
            leading: leading.clone(),
            relist: None,
        }
    }

    fn add(&self, key: ObjectRef<Memcached>, priority: Priority) {
        if !(*self.leading.borrow() && self.caches.synced()) {
            return;
        }
        match priority {
            Priority::High => self.queue.add(scoped(self.scope, key), priority),
            // A rollout moves pods through several states within a
            // second; one reconcile after them reports the same as one per state, with fewer
            // status writes in the way of the changes users wait for.
            Priority::Low => self
                .queue
                .add_after(scoped(self.scope, key), STATUS_SETTLE, priority),
        }
    }

    pub fn fire<K>(&mut self, event: &watcher::Event<K>, trigger: Option<Trigger>) {
        match event {
            watcher::Event::Init => self.relist = Some(Vec::new()),
            watcher::Event::InitDone => {
                for (key, priority) in self.relist.take().unwrap_or_default() {
                    self.add(key, priority);
                }
            }
            _ => {
                let Some((key, priority)) = trigger else {
                    return;
                };
                match (&mut self.relist, event) {
                    (Some(relist), watcher::Event::InitApply(_)) => relist.push((key, priority)),
                    _ => self.add(key, priority),
                }
            }
        }
    }
}

/// Once `leading` is true and the scope's caches are filled, queues every cached Memcached:
/// triggers that came before were held, not processed, and a relist may have found changes no
/// event announced. A store is empty until its first list is complete, so queueing at
/// leadership alone could miss some.
pub async fn queue_all_on_leading(
    leading: watch::Receiver<bool>,
    caches: SyncGate,
    memcacheds: Cache<Memcached>,
    queue: Arc<Queue<Key>>,
    scope: usize,
) {
    if Box::pin(became_leader(leading, caches))
        .next()
        .await
        .is_none()
    {
        return;
    }
    for mc in memcacheds.state() {
        queue.add(scoped(scope, triggers::key_of(&mc)), Priority::Low);
    }
}

/// Yields once, when `leading` is true and the scope's caches are filled.
fn became_leader(
    mut leading: watch::Receiver<bool>,
    caches: SyncGate,
) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::once(async move {
        let gained = leading.wait_for(|l| *l).await.is_ok();
        caches.wait_synced().await;
        gained
    })
    .filter(|gained| future::ready(*gained))
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use operator_runtime::cache;

    #[tokio::test]
    async fn every_cached_memcached_is_queued_once_leading_with_filled_caches() {
        let (leading_tx, leading) = watch::channel(false);
        let caches = SyncGate::default();
        let filling = caches.watch();
        let (memcacheds, mut writer) = cache::new::<Memcached>();
        for name in ["a", "b"] {
            writer.apply_watcher_event(&watcher::Event::Apply(memcached(name, 1)));
        }
        let queue = Arc::new(Queue::new(None));
        let queueing = tokio::spawn(queue_all_on_leading(
            leading,
            caches.clone(),
            memcacheds,
            queue.clone(),
            0,
        ));
        let soon = Duration::from_millis(200);
        assert!(
            tokio::time::timeout(soon, queue.get()).await.is_err(),
            "a follower queues nothing"
        );
        leading_tx.send_replace(true);
        assert!(
            tokio::time::timeout(soon, queue.get()).await.is_err(),
            "not while a cache of the scope is still filling"
        );
        filling.release();
        queueing.await.unwrap();
        let mut queued = Vec::new();
        for _ in 0..2 {
            let (key, priority) = queue.get().await.unwrap();
            assert_eq!(priority, Priority::Low);
            queued.push(key.memcached.name.clone());
            queue.done(&key);
        }
        queued.sort();
        assert_eq!(queued, ["a", "b"]);
    }
}
