//! The work queue the reconcile workers pull from, with client-go's semantics (controller-runtime
//! uses the same queue): a dirty set of keys waiting, a processing set, FIFO order, delayed adds
//! for requeues and backoff, and N workers that each take one key at a time. Every operation is
//! O(1) amortized (delayed adds O(log n)), whatever the number of keys waiting.
//!
//! - A key is never handed to two workers at once; a key added while it is processed is handed
//!   out once more after `done`, so a change that arrives mid-reconcile is never lost.
//! - A key waiting is queued once, however often it is added.
//! - Two priorities: `High` (spec changes, drift on owned objects) is served before `Low` (status
//!   refreshes from pod and status events), but after `HIGH_BURST` high keys in a row a waiting
//!   low one goes next, so status is never starved. A waiting low key added again as high moves up.
//! - After `shut_down`, `get` returns `None` at once: keys not started are dropped, keys being
//!   processed finish (the workers drain), and adds are ignored.
//! - `get` first gives the runtime's other tasks a turn. A reconcile that finds nothing to write
//!   never waits, so a worker taking key after key would hold the thread until the queue is empty:
//!   a leader's first pass over 10,000 Memcacheds would hold off the watches, the probes and the
//!   lease renewal until it ended.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lock;
use crate::metrics::QueueMetrics;

/// How urgent a key's next reconcile is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Something to report: pods or the Deployment's status moved on.
    Low,
    /// Something to do: the spec changed, or an owned object drifted or went away.
    High,
}

/// High keys served in a row before a waiting low key gets its turn.
const HIGH_BURST: u32 = 8;

pub struct Queue<K> {
    state: Mutex<State<K>>,
    /// Wakes a worker waiting in `get` when a key becomes ready, or all of them at shutdown.
    ready: Notify,
    metrics: Option<QueueMetrics>,
}

struct Waiting {
    priority: Priority,
    since: Instant,
}

struct State<K> {
    /// Keys to be processed (again), whether queued or still being processed.
    dirty: HashMap<K, Waiting>,
    /// Keys being processed, with when they were handed out.
    processing: HashMap<K, Instant>,
    /// FIFOs per priority. A key can be in `low` as a stale entry after it moved up to `high`, or
    /// after it was taken: entries are checked against `dirty` when taken.
    high: VecDeque<K>,
    low: VecDeque<K>,
    high_in_a_row: u32,
    /// Delayed adds, earliest first; `due` has each key's earliest time, and heap entries that
    /// do not match it are stale.
    delayed: BinaryHeap<Reverse<Delayed<K>>>,
    due: HashMap<K, (Instant, Priority)>,
    sequence: u64,
    shutting_down: bool,
}

/// A delayed add, ordered by time and then by arrival (never by key).
struct Delayed<K> {
    at: Instant,
    sequence: u64,
    key: K,
}

impl<K> PartialEq for Delayed<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}

impl<K> Eq for Delayed<K> {}

impl<K> PartialOrd for Delayed<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Delayed<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

impl<K: Hash + Eq + Clone> Queue<K> {
    pub fn new(metrics: Option<QueueMetrics>) -> Self {
        Self {
            state: Mutex::new(State {
                dirty: HashMap::new(),
                processing: HashMap::new(),
                high: VecDeque::new(),
                low: VecDeque::new(),
                high_in_a_row: 0,
                delayed: BinaryHeap::new(),
                due: HashMap::new(),
                sequence: 0,
                shutting_down: false,
            }),
            ready: Notify::new(),
            metrics,
        }
    }

    /// Queues `key` unless it is already waiting (then it may only move up in priority).
    pub fn add(&self, key: K, priority: Priority) {
        let mut state = lock(&self.state);
        if self.add_locked(&mut state, key, priority, Instant::now()) {
            self.update_depth(&state);
            drop(state);
            self.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`. A key already delayed keeps the earlier of the two times; a
    /// key already waiting (and not being processed) at this priority or higher is left as it
    /// is: it runs sooner, with whatever changed by then.
    pub fn add_after(&self, key: K, delay: Duration, priority: Priority) {
        if delay.is_zero() {
            return self.add(key, priority);
        }
        let at = Instant::now() + delay;
        let mut state = lock(&self.state);
        if state.shutting_down {
            return;
        }
        let waiting = state
            .dirty
            .get(&key)
            .is_some_and(|w| w.priority >= priority)
            && !state.processing.contains_key(&key);
        if waiting {
            return;
        }
        let earliest = match state.due.get(&key) {
            Some(&(due, p)) if due <= at => {
                state.due.insert(key, (due, p.max(priority)));
                return;
            }
            Some(&(_, p)) => (at, p.max(priority)),
            None => (at, priority),
        };
        state.due.insert(key.clone(), earliest);
        state.sequence += 1;
        let sequence = state.sequence;
        state.delayed.push(Reverse(Delayed { at, sequence, key }));
        drop(state);
        // A worker waiting in `get` may be sleeping until a later time.
        self.ready.notify_one();
    }

    /// The next key to process, once there is one; `None` once shut down. The caller must call
    /// `done` with it when finished.
    pub async fn get(&self) -> Option<(K, Priority)> {
        tokio::task::yield_now().await;
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            // Registered before the state is read, so an add after the read wakes this worker.
            notified.as_mut().enable();
            let next_due = {
                let mut state = lock(&self.state);
                if state.shutting_down {
                    return None;
                }
                let now = Instant::now();
                let promoted = self.promote_due(&mut state, now);
                let taken = self.take(&mut state, now);
                self.update_depth(&state);
                if let Some(taken) = taken {
                    if promoted > 1 {
                        drop(state);
                        // Other workers may be asleep until a time that has passed, or for good.
                        self.ready.notify_one();
                    }
                    return Some(taken);
                }
                state.delayed.peek().map(|Reverse(d)| d.at)
            };
            match next_due {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` as processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut state = lock(&self.state);
        state.processing.remove(key);
        let requeue = !state.shutting_down
            && match state.dirty.get(key) {
                Some(waiting) => {
                    let priority = waiting.priority;
                    state.queue_of(priority).push_back(key.clone());
                    true
                }
                None => false,
            };
        if requeue {
            self.update_depth(&state);
            drop(state);
            self.ready.notify_one();
        }
    }

    /// Stops handing out keys: workers waiting in `get` get `None`, and so does every later call.
    pub fn shut_down(&self) {
        let mut state = lock(&self.state);
        state.shutting_down = true;
        state.dirty.clear();
        state.high.clear();
        state.low.clear();
        state.delayed.clear();
        state.due.clear();
        self.update_depth(&state);
        drop(state);
        self.ready.notify_waiters();
    }

    /// Counts a requeue after a failure, as controller-runtime's rate-limited adds do.
    pub fn note_retry(&self) {
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
    }

    /// Records how long one key took to process.
    pub fn observe_work(&self, took: Duration) {
        if let Some(m) = &self.metrics {
            m.work_duration.observe(took.as_secs_f64());
        }
    }

    /// Sets the in-flight gauges from the keys being processed now: the seconds they have run
    /// in all, and the longest. Called periodically, as client-go does every 500 ms.
    pub fn update_unfinished_work(&self) {
        let Some(m) = &self.metrics else {
            return;
        };
        let state = lock(&self.state);
        let now = Instant::now();
        let running = state
            .processing
            .values()
            .map(|started| now.saturating_duration_since(*started).as_secs_f64());
        let (total, longest) = running.fold((0.0, 0.0_f64), |(t, l), s| (t + s, l.max(s)));
        m.unfinished_work.set(total);
        m.longest_running.set(longest);
    }

    /// Keys waiting to be handed out (not counting delayed ones).
    #[cfg(test)]
    fn len(&self) -> usize {
        let state = lock(&self.state);
        state.depth()
    }

    /// Returns whether a worker may need waking.
    fn add_locked(&self, state: &mut State<K>, key: K, priority: Priority, now: Instant) -> bool {
        if state.shutting_down {
            return false;
        }
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
        let processing = state.processing.contains_key(&key);
        match state.dirty.entry(key.clone()) {
            Entry::Occupied(mut waiting) => {
                let waiting = waiting.get_mut();
                if priority <= waiting.priority {
                    return false;
                }
                waiting.priority = priority;
                if processing {
                    // `done` queues it at its new priority.
                    return false;
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(Waiting {
                    priority,
                    since: now,
                });
                if processing {
                    return false;
                }
            }
        }
        state.queue_of(priority).push_back(key);
        true
    }

    /// Moves delayed keys whose time has come into the queue; returns how many.
    fn promote_due(&self, state: &mut State<K>, now: Instant) -> usize {
        let mut promoted = 0;
        while state.delayed.peek().is_some_and(|Reverse(d)| d.at <= now) {
            let Some(Reverse(Delayed { at, key, .. })) = state.delayed.pop() else {
                break;
            };
            if let Some(&(due, priority)) = state.due.get(&key)
                && due == at
            {
                state.due.remove(&key);
                if self.add_locked(state, key, priority, now) {
                    promoted += 1;
                }
            }
        }
        promoted
    }

    fn take(&self, state: &mut State<K>, now: Instant) -> Option<(K, Priority)> {
        loop {
            let low_turn = !state.low.is_empty()
                && (state.high.is_empty() || state.high_in_a_row >= HIGH_BURST);
            let (key, from) = if low_turn {
                (state.low.pop_front()?, Priority::Low)
            } else {
                (state.high.pop_front()?, Priority::High)
            };
            // Stale entries: taken already (not dirty), being processed (queued again by
            // `done`), or moved up to the high FIFO.
            let valid = !state.processing.contains_key(&key)
                && state.dirty.get(&key).is_some_and(|w| w.priority == from);
            if !valid {
                continue;
            }
            let waiting = state.dirty.remove(&key)?;
            state.high_in_a_row = match from {
                Priority::High => state.high_in_a_row + 1,
                Priority::Low => 0,
            };
            state.processing.insert(key.clone(), now);
            if let Some(m) = &self.metrics {
                m.queue_duration
                    .observe(now.saturating_duration_since(waiting.since).as_secs_f64());
            }
            return Some((key, from));
        }
    }

    fn update_depth(&self, state: &State<K>) {
        if let Some(m) = &self.metrics {
            m.depth.set(state.depth() as i64);
        }
    }
}

impl<K: Hash + Eq> State<K> {
    fn queue_of(&mut self, priority: Priority) -> &mut VecDeque<K> {
        match priority {
            Priority::High => &mut self.high,
            Priority::Low => &mut self.low,
        }
    }

    /// Keys waiting to be handed out: dirty and not being processed. O(workers).
    fn depth(&self) -> usize {
        let dirty_in_process = self
            .processing
            .keys()
            .filter(|k| self.dirty.contains_key(*k))
            .count();
        self.dirty.len() - dirty_in_process
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use Priority::{High, Low};

    fn queue() -> Arc<Queue<&'static str>> {
        Arc::new(Queue::new(None))
    }

    /// Takes the next key without waiting.
    async fn next(q: &Queue<&'static str>) -> Option<(&'static str, Priority)> {
        tokio::time::timeout(Duration::from_millis(20), q.get())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn keys_come_out_in_the_order_they_were_added_once_each() {
        let q = queue();
        for k in ["a", "b", "a", "c", "b"] {
            q.add(k, Low);
        }
        assert_eq!(q.len(), 3);
        for want in ["a", "b", "c"] {
            let (k, _) = next(&q).await.unwrap();
            assert_eq!(k, want);
            q.done(&k);
        }
        assert_eq!(next(&q).await, None);
    }

    #[tokio::test]
    async fn a_key_is_never_processed_by_two_workers_at_once() {
        let q = queue();
        q.add("a", Low);
        let (a, _) = next(&q).await.unwrap();
        q.add("a", Low);
        q.add("a", High);
        assert_eq!(next(&q).await, None, "held while it is processed");
        q.done(&a);
        assert_eq!(
            next(&q).await,
            Some(("a", High)),
            "once more after, at the higher priority"
        );
        q.done(&"a");
        assert_eq!(next(&q).await, None, "only once more");
    }

    #[tokio::test]
    async fn concurrent_workers_never_share_a_key_and_lose_no_add() {
        let q = Arc::new(Queue::<u32>::new(None));
        let running = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let processed = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let (q, running, processed) = (q.clone(), running.clone(), processed.clone());
            workers.push(tokio::spawn(async move {
                while let Some((k, _)) = q.get().await {
                    assert!(running.lock().unwrap().insert(k), "{k} taken twice");
                    tokio::task::yield_now().await;
                    running.lock().unwrap().remove(&k);
                    processed.fetch_add(1, Ordering::SeqCst);
                    q.done(&k);
                }
            }));
        }
        for round in 0..50u32 {
            for k in 0..10 {
                q.add(k, if round % 2 == 0 { Low } else { High });
            }
            tokio::task::yield_now().await;
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while q.len() > 0 || !lock(&q.state).processing.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the queue empties");
        q.shut_down();
        for w in workers {
            w.await.unwrap();
        }
        let n = processed.load(Ordering::SeqCst);
        assert!((10..=500).contains(&n), "{n}");
    }

    #[tokio::test]
    async fn taking_keys_gives_other_tasks_a_turn() {
        let queue = Arc::new(Queue::new(None));
        for i in 0..100 {
            queue.add(format!("cache-{i}"), Priority::Low);
        }
        let taken = Arc::new(AtomicUsize::new(0));
        // One thread, as the operator runs: a worker whose reconciles never wait.
        let worker = tokio::spawn({
            let (queue, taken) = (queue.clone(), taken.clone());
            async move {
                while taken.load(Ordering::Relaxed) < 100 {
                    let (key, _) = queue.get().await.unwrap();
                    taken.fetch_add(1, Ordering::Relaxed);
                    queue.done(&key);
                }
            }
        });
        let probe = tokio::spawn({
            let taken = taken.clone();
            async move { taken.load(Ordering::Relaxed) }
        });
        let seen = probe.await.unwrap();
        assert!(seen < 5, "another task waited for {seen} keys");
        worker.await.unwrap();
    }

    #[tokio::test]
    async fn high_goes_first_but_low_is_not_starved() {
        let q = queue();
        q.add("low-1", Low);
        q.add("low-2", Low);
        let highs: Vec<&'static str> = (0..20)
            .map(|i| &*Box::leak(format!("high-{i}").into_boxed_str()))
            .collect();
        for h in &highs {
            q.add(h, High);
        }
        let mut order = Vec::new();
        while let Some((k, _)) = next(&q).await {
            order.push(k);
            q.done(&k);
        }
        let position = |k| order.iter().position(|o| *o == k).unwrap();
        assert_eq!(position("high-0"), 0);
        assert_eq!(position("low-1"), HIGH_BURST as usize);
        assert_eq!(position("low-2"), 2 * HIGH_BURST as usize + 1);
        assert_eq!(order.len(), 22);
    }

    #[tokio::test]
    async fn a_waiting_low_key_added_as_high_moves_up_once() {
        let q = queue();
        q.add("a", Low);
        q.add("b", Low);
        q.add("b", High);
        assert_eq!(next(&q).await, Some(("b", High)));
        q.done(&"b");
        assert_eq!(next(&q).await, Some(("a", Low)));
        q.done(&"a");
        assert_eq!(next(&q).await, None, "the stale low entry of b is skipped");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_adds_wait_and_keep_the_earliest_time() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10), Low);
        q.add_after("a", Duration::from_secs(5), Low);
        q.add_after("a", Duration::from_secs(20), High);
        let started = Instant::now();
        let (k, p) = q.get().await.unwrap();
        assert_eq!((k, p), ("a", High));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        q.done(&k);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(next(&q).await, None, "the later times were merged");
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_key_already_waiting_is_not_queued_twice() {
        let q = queue();
        q.add_after("a", Duration::from_secs(1), Low);
        q.add("a", Low);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(next(&q).await, Some(("a", Low)));
        q.done(&"a");
        assert_eq!(next(&q).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_add_of_a_waiting_key_adds_nothing() {
        let q = queue();
        q.add("a", Low);
        q.add_after("a", Duration::from_secs(1), Low);
        assert_eq!(next(&q).await, Some(("a", Low)));
        q.done(&"a");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(next(&q).await, None, "the waiting run covered it");
        q.add("b", Low);
        let (b, _) = next(&q).await.unwrap();
        q.add_after("b", Duration::from_secs(1), Low);
        q.done(&b);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            next(&q).await,
            Some(("b", Low)),
            "a key being processed may have read the caches before the change: it runs again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn per_item_backoff_delays_only_that_item() {
        let q = queue();
        let backoff = crate::backoff::Backoff::default();
        q.add("ok", Low);
        q.add_after("failing", backoff.next_delay("failing"), Low);
        q.add_after("failing", backoff.next_delay("failing"), Low);
        assert_eq!(next(&q).await.map(|t| t.0), Some("ok"));
        q.done(&"ok");
        let started = Instant::now();
        assert_eq!(q.get().await.map(|t| t.0), Some("failing"));
        let waited = started.elapsed();
        // The first delay is 4.5-5.5 ms and the second 9-11 ms (jitter); tokio's timer rounds a
        // deadline up to the next millisecond.
        assert!(
            waited < Duration::from_millis(9),
            "the first delay, not the second: {waited:?}"
        );
    }

    #[tokio::test]
    async fn shutdown_wakes_idle_workers_and_lets_running_ones_finish() {
        let q = queue();
        q.add("running", Low);
        let (running, _) = next(&q).await.unwrap();
        q.add("queued", Low);
        q.add("running", Low);
        let idle = tokio::spawn({
            let q = q.clone();
            async move {
                // Takes "queued", then waits.
                let (k, _) = q.get().await.unwrap();
                q.done(&k);
                q.get().await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), idle)
                .await
                .unwrap()
                .unwrap(),
            None
        );
        q.done(&running);
        assert_eq!(next(&q).await, None, "no key after shutdown");
        q.add("late", High);
        assert_eq!(q.len(), 0, "adds after shutdown are ignored");
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_gauges_show_a_stuck_reconcile_before_it_ends() {
        let metrics = crate::metrics::ControllerMetrics::new("memcached", "memcached_operator");
        let q = Queue::new(Some(metrics.queue()));
        let gauges = |m: &crate::metrics::ControllerMetrics| {
            let text = m.render();
            let value = |name: &str| {
                text.lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.rsplit(' ').next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            };
            (
                value("workqueue_unfinished_work_seconds{"),
                value("workqueue_longest_running_processor_seconds{"),
            )
        };
        q.add("stuck", Low);
        let (stuck, _) = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        q.add("quick", Low);
        let (quick, _) = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        q.update_unfinished_work();
        assert_eq!(gauges(&metrics), (5.0, 4.0), "4 s and 1 s in flight");
        q.done(&quick);
        q.done(&stuck);
        q.update_unfinished_work();
        assert_eq!(gauges(&metrics), (0.0, 0.0));
    }

    #[tokio::test]
    async fn metrics_count_adds_depth_and_waits() {
        let metrics = crate::metrics::ControllerMetrics::new("memcached", "memcached_operator");
        let q = Queue::new(Some(metrics.queue()));
        q.add("a", Low);
        q.add("a", Low);
        q.add("b", High);
        let text = metrics.render();
        for line in [
            r#"workqueue_adds_total{controller="memcached",name="memcached"} 3"#,
            r#"workqueue_depth{controller="memcached",name="memcached"} 2"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        let (k, _) = q.get().await.unwrap();
        q.done(&k);
        q.add_after("a", Duration::from_secs(60), Low);
        q.note_retry();
        let text = metrics.render();
        for line in [
            r#"workqueue_depth{controller="memcached",name="memcached"} 1"#,
            r#"workqueue_queue_duration_seconds_count{controller="memcached",name="memcached"} 1"#,
            r#"workqueue_retries_total{controller="memcached",name="memcached"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
    }
}
