//! The workers that take keys from the queue and reconcile them. They own what follows a
//! reconcile, as client-go's rate-limited queue does: when the key runs again, the per-key
//! backoff after a failure, the reconcile metrics, and a panic (a bug) caught and retried.

use std::fmt::Display;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use crate::backoff::Backoff;
use crate::metrics::{ControllerMetrics, ReconcileResult};
use crate::queue::Queue;

/// Retry delay after a reconcile panicked: the key's backoff, from this floor.
const PANIC_RETRY: Duration = Duration::from_secs(1);

/// What a reconcile asks of the worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing until a watch event queues the key again.
    AwaitChange,
    /// Run again after this delay: a recheck, not a failure.
    After(Duration),
    /// The reconcile failed: counted under `reason`, logged, and run again as `retry` says.
    Failed {
        reason: &'static str,
        message: String,
        retry: Retry,
    },
}

/// When a failed reconcile runs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// After the key's exponential backoff (5 ms doubling to 1000 s), which grows with each
    /// failure in a row and is reset by the next success.
    Backoff,
    /// After a fixed delay, leaving the backoff alone: the same request would get the same answer.
    After(Duration),
}

/// `count` workers taking keys from `queue`, once `leading` is true, until the queue is shut down
/// (keys not started are dropped; reconciles in flight finish).
pub struct Workers<K> {
    pub queue: Arc<Queue<K>>,
    pub metrics: Arc<ControllerMetrics>,
    pub backoff: Arc<Backoff<K>>,
    pub count: usize,
}

impl<K> Workers<K>
where
    K: Clone + Eq + Hash + Display + Send + Sync + 'static,
{
    /// Runs the workers until they have all ended.
    pub async fn run<F, Fut>(
        self,
        reconcile: F,
        leading: watch::Receiver<bool>,
        shutdown: CancellationToken,
    ) where
        F: Fn(K) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Next> + Send + 'static,
    {
        let workers: Vec<_> = (0..self.count.max(1))
            .map(|_| {
                tokio::spawn(worker(
                    self.queue.clone(),
                    self.metrics.clone(),
                    self.backoff.clone(),
                    reconcile.clone(),
                    leading.clone(),
                    shutdown.clone(),
                ))
            })
            .collect();
        for worker in future::join_all(workers).await {
            if let Err(error) = worker {
                error!(%error, "reconcile worker ended abnormally");
            }
        }
    }
}

async fn worker<K, F, Fut>(
    queue: Arc<Queue<K>>,
    metrics: Arc<ControllerMetrics>,
    backoff: Arc<Backoff<K>>,
    reconcile: F,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) where
    K: Clone + Eq + Hash + Display + Send + Sync + 'static,
    F: Fn(K) -> Fut,
    Fut: Future<Output = Next>,
{
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => return,
        led = leading.wait_for(|l| *l) => if led.is_err() { return },
    }
    while let Some((key, priority)) = queue.get().await {
        let started = Instant::now();
        let next = {
            let _running = metrics.start_reconcile();
            AssertUnwindSafe(reconcile(key.clone()))
                .catch_unwind()
                .await
        };
        queue.observe_work(started.elapsed());
        let again = match next {
            Err(_panic) => {
                metrics.record(ReconcileResult::Error, Some("panic"));
                let delay = backoff.next_delay(key.clone()).max(PANIC_RETRY);
                error!(%key, retry_in = ?delay, "reconcile panicked; retrying with backoff");
                queue.note_retry();
                Some(delay)
            }
            Ok(Next::AwaitChange) => {
                backoff.reset(&key);
                metrics.record(ReconcileResult::Success, None);
                None
            }
            Ok(Next::After(delay)) => {
                backoff.reset(&key);
                metrics.record(ReconcileResult::RequeueAfter, None);
                Some(delay)
            }
            Ok(Next::Failed {
                reason,
                message,
                retry,
            }) => {
                metrics.record(ReconcileResult::Error, Some(reason));
                let delay = match retry {
                    Retry::Backoff => backoff.next_delay(key.clone()),
                    Retry::After(delay) => delay,
                };
                warn!(%key, reason, error = %message, retry_in = ?delay, "reconcile failed");
                queue.note_retry();
                Some(delay)
            }
        };
        if let Some(delay) = again {
            queue.add_after(key.clone(), delay, priority);
        }
        queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;
    use crate::queue::Priority;

    /// Workers (leading) over a queue holding `keys`; each run of a key takes the next answer of
    /// its script (then `AwaitChange`). Returns each run's key and start, once `runs` have started.
    async fn run_scripted(
        scripts: Vec<(&'static str, Vec<Next>)>,
        runs: usize,
    ) -> (Vec<(&'static str, Instant)>, Arc<ControllerMetrics>) {
        let metrics = Arc::new(ControllerMetrics::new("test", "test"));
        let queue = Arc::new(Queue::new(Some(metrics.queue())));
        for (key, _) in &scripts {
            queue.add(*key, Priority::High);
        }
        let scripts = Arc::new(Mutex::new(scripts));
        let (started, mut starts) = mpsc::unbounded_channel();
        let reconcile = move |key: &'static str| {
            let (scripts, started) = (scripts.clone(), started.clone());
            async move {
                started.send((key, Instant::now())).unwrap();
                let next = {
                    let mut scripts = scripts.lock().unwrap();
                    let script = &mut scripts.iter_mut().find(|(k, _)| *k == key).unwrap().1;
                    match script.is_empty() {
                        true => Next::AwaitChange,
                        false => script.remove(0),
                    }
                };
                match next {
                    Next::Failed {
                        reason: "panic", ..
                    } => panic!("a bug"),
                    next => next,
                }
            }
        };
        let (_leading, leading) = watch::channel(true);
        let workers = Workers {
            queue: queue.clone(),
            metrics: metrics.clone(),
            backoff: Arc::new(Backoff::default()),
            count: 2,
        };
        let running = tokio::spawn(workers.run(reconcile, leading, CancellationToken::new()));
        let mut seen = Vec::new();
        while seen.len() < runs {
            seen.push(starts.recv().await.unwrap());
        }
        queue.shut_down();
        running.await.unwrap();
        (seen, metrics)
    }

    fn failed(retry: Retry) -> Next {
        Next::Failed {
            reason: "apply",
            message: "etcd is sad".into(),
            retry,
        }
    }

    /// Milliseconds between the runs of `key`.
    fn gaps(runs: &[(&str, Instant)], key: &str) -> Vec<f64> {
        let times: Vec<_> = runs
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|r| r.1)
            .collect();
        times
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failures_retry_after_a_backoff_that_grows_per_key() {
        let (runs, metrics) = run_scripted(
            vec![
                ("a", vec![failed(Retry::Backoff); 3]),
                ("b", vec![failed(Retry::Backoff)]),
            ],
            6,
        )
        .await;
        let a = gaps(&runs, "a");
        assert!(
            (4.5..=6.6).contains(&a[0])
                && (9.0..=12.1).contains(&a[1])
                && (18.0..=23.1).contains(&a[2]),
            "5, 10, 20 ms with jitter: {a:?}"
        );
        let b = gaps(&runs, "b");
        assert!((4.5..=6.6).contains(&b[0]), "backoff is per key: {b:?}");
        let text = metrics.render();
        for line in [
            r#"controller_runtime_reconcile_errors_total{controller="test"} 4"#,
            r#"test_reconcile_errors_total{controller="test",reason="apply"} 4"#,
            r#"workqueue_retries_total{controller="test",name="test"} 4"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_retry_leaves_the_backoff_alone_and_success_resets_it() {
        let script = vec![
            failed(Retry::Backoff),
            failed(Retry::After(Duration::from_secs(300))),
            failed(Retry::Backoff),
            Next::After(Duration::from_secs(1)),
            failed(Retry::Backoff),
        ];
        let (runs, metrics) = run_scripted(vec![("a", script)], 6).await;
        let a = gaps(&runs, "a");
        assert!((4.5..=6.6).contains(&a[0]), "{a:?}");
        assert!(
            (300_000.0..=300_001.0).contains(&a[1]),
            "the fixed delay: {a:?}"
        );
        assert!(
            (9.0..=12.1).contains(&a[2]),
            "the backoff went on from 5 ms: {a:?}"
        );
        assert!((1000.0..=1001.0).contains(&a[3]), "a recheck: {a:?}");
        assert!(
            (4.5..=6.6).contains(&a[4]),
            "reset by the recheck's success: {a:?}"
        );
        assert!(metrics.render().contains(
            r#"controller_runtime_reconcile_total{controller="test",result="requeue_after"} 1"#
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_is_retried_no_sooner_than_a_second_and_counted() {
        let panics = Next::Failed {
            reason: "panic",
            message: String::new(),
            retry: Retry::Backoff,
        };
        let (runs, metrics) = run_scripted(vec![("a", vec![panics])], 2).await;
        assert!(gaps(&runs, "a")[0] >= 1000.0);
        assert!(
            metrics
                .render()
                .contains(r#"test_reconcile_errors_total{controller="test",reason="panic"} 1"#)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_key_is_taken_before_leading() {
        let queue = Arc::new(Queue::new(None));
        queue.add("a", Priority::High);
        let (started, mut starts) = mpsc::unbounded_channel();
        let reconcile = move |key: &'static str| {
            let started = started.clone();
            async move {
                started.send(key).unwrap();
                Next::AwaitChange
            }
        };
        let (leading_tx, leading) = watch::channel(false);
        let workers = Workers {
            queue: queue.clone(),
            metrics: Arc::new(ControllerMetrics::new("test", "test")),
            backoff: Arc::new(Backoff::default()),
            count: 1,
        };
        let running = tokio::spawn(workers.run(reconcile, leading, CancellationToken::new()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(starts.try_recv().is_err(), "a follower reconciles nothing");
        leading_tx.send_replace(true);
        assert_eq!(starts.recv().await, Some("a"));
        queue.shut_down();
        running.await.unwrap();
    }
}
