//! The reconcile workers: at most N reconciles at once, started in the order they became due.
//!
//! kube-runtime's controller, once at its concurrency limit, parks due requests in a hash set and
//! next takes the first one it finds there: hash order, not arrival order, so under sustained
//! load a request can wait until the set has emptied. So the controller runs without a limit of
//! its own and every reconcile first waits for a worker here: tokio's semaphore is fair, so that
//! wait is FIFO, like controller-runtime's work queue.
//!
//! A trigger for an object whose reconcile is still waiting adds nothing (that reconcile reads the
//! caches when it starts, after the trigger's event is in them), but kube-runtime would hold it
//! in that hash set and scan the set on every poll. So triggers for waiting objects are dropped
//! before they reach it (`is_waiting`). README "Benchmark" has the figures behind both.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::lock;

pub struct Workers<K> {
    permits: Semaphore,
    stop: CancellationToken,
    waiting: Mutex<HashSet<K>>,
}

impl<K: Hash + Eq + Clone> Workers<K> {
    pub fn new(workers: u16, stop: CancellationToken) -> Self {
        Self {
            permits: Semaphore::new(usize::from(workers.max(1))),
            stop,
            waiting: Mutex::default(),
        }
    }

    /// Waits for a free worker for `key`, behind every reconcile that asked before. `None` once
    /// the controller is stopping: a reconcile that has not started is dropped, not drained (the
    /// next leader reconciles every object when it takes over).
    pub async fn start(&self, key: &K) -> Option<SemaphorePermit<'_>> {
        let _waiting = Waiting::new(self, key);
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => None,
            permit = self.permits.acquire() => permit.ok(),
        }
    }

    /// Whether a reconcile of `key` is waiting for a worker and has not read anything yet.
    pub fn is_waiting(&self, key: &K) -> bool {
        lock(&self.waiting).contains(key)
    }
}

/// Marks a key as waiting for as long as it lives, however the wait ends.
struct Waiting<'a, K: Hash + Eq + Clone> {
    workers: &'a Workers<K>,
    key: K,
}

impl<'a, K: Hash + Eq + Clone> Waiting<'a, K> {
    fn new(workers: &'a Workers<K>, key: &K) -> Self {
        lock(&workers.waiting).insert(key.clone());
        Self {
            workers,
            key: key.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> Drop for Waiting<'_, K> {
    fn drop(&mut self) {
        lock(&self.workers.waiting).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn waiting_reconciles_start_in_the_order_they_asked() {
        let workers = Arc::new(Workers::new(1, CancellationToken::new()));
        let started = Arc::new(Mutex::new(Vec::new()));
        let busy = workers.start(&-1).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (workers, started) = (workers.clone(), started.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = workers.start(&i).await.unwrap();
                started.lock().unwrap().push(i);
                tokio::task::yield_now().await;
            }));
            // Let task i queue up before task i + 1 asks.
            tokio::task::yield_now().await;
        }
        drop(busy);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*started.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn at_most_n_run_at_once() {
        let workers = Workers::new(2, CancellationToken::new());
        let a = workers.start(&"a").await;
        let b = workers.start(&"b").await;
        assert!(a.is_some() && b.is_some());
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), workers.start(&"c"));
        assert!(third.await.is_err(), "a third reconcile waits");
        drop(a);
        assert!(workers.start(&"c").await.is_some());
    }

    #[tokio::test]
    async fn queued_reconciles_are_dropped_on_shutdown() {
        let stop = CancellationToken::new();
        let workers = Arc::new(Workers::new(1, stop.clone()));
        let _busy = workers.start(&"busy").await.unwrap();
        let waiting = tokio::spawn({
            let workers = workers.clone();
            async move { workers.start(&"waiting").await.is_some() }
        });
        stop.cancel();
        assert!(
            !waiting.await.unwrap(),
            "a waiting reconcile gets no worker"
        );
        assert!(!workers.is_waiting(&"waiting"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_key_is_waiting_until_it_has_a_worker() {
        let workers = Arc::new(Workers::new(1, CancellationToken::new()));
        let busy = workers.start(&"busy").await.unwrap();
        assert!(
            !workers.is_waiting(&"busy"),
            "a running reconcile is not waiting"
        );
        let queued = tokio::spawn({
            let workers = workers.clone();
            async move {
                let _permit = workers.start(&"queued").await;
            }
        });
        tokio::task::yield_now().await;
        assert!(workers.is_waiting(&"queued"));
        drop(busy);
        queued.await.unwrap();
        assert!(!workers.is_waiting(&"queued"));
    }
}
