//! A budget for rollouts nobody asked for.
//!
//! When the operator itself changes the pod template (an upgrade with a new default image from
//! `RELATED_IMAGE_MEMCACHED`, or new pod settings), every Memcached's StatefulSet would roll at
//! the same moment, and every cache in the cluster would lose part of its keys at once. So such a
//! change starts only while fewer than `limit` owned StatefulSets (or Memcacheds whose members the
//! operator keeps itself) are rolling; the rest wait their turn. A change the Memcached's own spec
//! asked for (its generation moved) never waits.
//!
//! "Rolling" is what `kubectl rollout status` waits for: the StatefulSet controller has not yet
//! seen the spec, or not every replica is updated and available. A StatefulSet has no progress
//! deadline of its own, so one rolling for longer than a Deployment's default deadline stops
//! counting here: a stuck rollout does not hold a slot for ever.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use kube::ResourceExt;
use kube::runtime::watcher;

use super::owned::OwnedObject;
use crate::api::Memcached;
use operator_runtime::lock;
use operator_runtime::relisted::Relisted;

/// (namespace, name) of a StatefulSet.
type Key = (String, String);

/// How long a granted rollout counts before the watch shows it: the apply may have failed.
const RESERVATION: Duration = Duration::from_secs(30);
/// How long a rollout counts at most: a Deployment's default `progressDeadlineSeconds`.
const STUCK_AFTER: Duration = Duration::from_secs(600);

pub struct Rollouts {
    /// 0: no limit.
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Rolling, since when (as this process first saw it).
    rolling: Relisted<HashMap<Key, Instant>>,
    /// Granted, and not yet seen rolling by the watch.
    reserved: HashMap<Key, Instant>,
    /// Memcacheds whose members the operator keeps itself (no StatefulSet to watch), rolling
    /// since when, as their reconciles report them.
    members: HashMap<Key, Instant>,
}

impl Rollouts {
    pub fn new(limit: u16) -> Self {
        Self {
            limit: usize::from(limit),
            state: Mutex::default(),
        }
    }

    /// Keeps the set of rolling StatefulSets current from the StatefulSet watch.
    pub fn observe(&self, event: &watcher::Event<OwnedObject<StatefulSet>>) {
        let mut state = lock(&self.state);
        match event {
            // The watch now shows the rollout it granted, or shows it gone.
            watcher::Event::Apply(d) if is_rolling(d) => {
                state.reserved.remove(&key(d));
            }
            watcher::Event::Delete(d) => {
                state.reserved.remove(&key(d));
            }
            _ => {}
        }
        state.rolling.observe(event, update, |rolling, d| {
            rolling.remove(&key(d));
        });
    }

    /// Memcached `namespace/name` is gone: its members hold no slot.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.members(namespace, name, false);
    }

    /// Whether the members the operator keeps itself for Memcached `namespace/name` are
    /// rolling, as its reconcile counted them (`is_status_rolling`).
    pub fn members(&self, namespace: &str, name: &str, rolling: bool) {
        let key = (namespace.to_string(), name.to_string());
        let mut state = lock(&self.state);
        if rolling {
            state.reserved.remove(&key);
            state.members.entry(key).or_insert_with(Instant::now);
        } else {
            state.members.remove(&key);
        }
    }

    /// Whether a rollout of `mc`'s members for a reason its spec did not give (an operator
    /// upgrade) must wait because the budget is spent.
    pub fn must_wait(&self, mc: &Memcached) -> bool {
        !crate::status::spec_changed(mc)
            && !self.try_start(&mc.namespace().unwrap_or_default(), &mc.name_any())
    }

    /// Whether the StatefulSet `namespace/name` may start a rollout nobody asked for now. Granted
    /// means counted at once, before the watch shows it rolling, so concurrent reconciles cannot
    /// all take the last slot.
    pub fn try_start(&self, namespace: &str, name: &str) -> bool {
        self.try_start_at(namespace, name, Instant::now())
    }

    fn try_start_at(&self, namespace: &str, name: &str, now: Instant) -> bool {
        if self.limit == 0 {
            return true;
        }
        let mut state = lock(&self.state);
        let key = (namespace.to_string(), name.to_string());
        if state.rolling.live().contains_key(&key)
            || state.reserved.contains_key(&key)
            || state.members.contains_key(&key)
        {
            return true;
        }
        let State {
            rolling,
            reserved,
            members,
        } = &mut *state;
        let rolling = rolling.live();
        reserved.retain(|k, granted| {
            now.duration_since(*granted) < RESERVATION && !rolling.contains_key(k)
        });
        // Below the limit even counting the stuck ones: no need to walk them (a hot path while
        // an upgrade queues every Memcached).
        let at_limit = |rolling_count: usize| rolling_count + reserved.len() >= self.limit;
        if at_limit(rolling.len() + members.len())
            && at_limit(counted(rolling, now) + counted(members, now))
        {
            return false;
        }
        reserved.insert(key, now);
        true
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn rolling(&self) -> usize {
        let state = lock(&self.state);
        let now = Instant::now();
        counted(state.rolling.live(), now) + counted(&state.members, now) + state.reserved.len()
    }
}

/// Rollouts that hold a slot at `now`: those not yet stuck.
fn counted(rolling: &HashMap<Key, Instant>, now: Instant) -> usize {
    rolling
        .values()
        .filter(|since| now.saturating_duration_since(**since) < STUCK_AFTER)
        .count()
}

fn key(d: &OwnedObject<StatefulSet>) -> Key {
    (d.namespace().unwrap_or_default(), d.name_any())
}

fn update(rolling: &mut HashMap<Key, Instant>, d: &OwnedObject<StatefulSet>) {
    if is_rolling(d) {
        rolling.entry(key(d)).or_insert_with(Instant::now);
    } else {
        rolling.remove(&key(d));
    }
}

/// `kubectl rollout status`'s test: the controller has not observed the spec, or replicas are
/// not all updated and available.
pub fn is_rolling(d: &OwnedObject<StatefulSet>) -> bool {
    let Some(status) = &d.status else {
        return true;
    };
    if d.metadata.generation > status.observed_generation {
        return true;
    }
    is_status_rolling(d.replicas.unwrap_or(1), status)
}

/// The same test of a status, counted by a StatefulSet's controller or by the operator for the
/// members it keeps itself: `desired` replicas not all updated and available.
pub fn is_status_rolling(desired: i32, status: &StatefulSetStatus) -> bool {
    let updated = status.updated_replicas.unwrap_or(0);
    updated < desired
        || status.replicas > updated
        || status.available_replicas.unwrap_or(0) < updated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{memcached, stateful_set_with_status};

    fn stateful_set(name: &str, rolling: bool) -> OwnedObject<StatefulSet> {
        let mut d = stateful_set_with_status(&memcached(name, 2), 2, 2);
        if rolling {
            d.metadata.generation = Some(2);
        }
        d
    }

    #[test]
    fn a_rollout_starts_only_while_fewer_than_the_limit_are_rolling() {
        let rollouts = Rollouts::new(2);
        rollouts.observe(&watcher::Event::Apply(stateful_set("a", true)));
        rollouts.observe(&watcher::Event::Apply(stateful_set("b", false)));
        assert!(rollouts.try_start("default", "b"), "one of two slots taken");
        assert!(
            !rollouts.try_start("default", "c"),
            "a and b hold both slots, b from the moment it was granted"
        );
        assert!(
            rollouts.try_start("default", "a"),
            "one already rolling keeps its slot"
        );
        rollouts.observe(&watcher::Event::Apply(stateful_set("a", false)));
        assert!(
            rollouts.try_start("default", "c"),
            "a finished: its slot is free"
        );
    }

    #[test]
    fn a_grant_the_watch_never_confirms_lapses() {
        // The apply after the grant failed: nothing of the StatefulSet changed.
        let rollouts = Rollouts::new(1);
        let now = Instant::now();
        assert!(rollouts.try_start_at("default", "a", now));
        assert!(!rollouts.try_start_at("default", "b", now + RESERVATION / 2));
        assert!(rollouts.try_start_at("default", "b", now + RESERVATION));
    }

    #[test]
    fn a_deleted_or_stuck_stateful_set_frees_its_slot() {
        let rollouts = Rollouts::new(1);
        rollouts.observe(&watcher::Event::Apply(stateful_set("a", true)));
        assert!(!rollouts.try_start("default", "b"));
        rollouts.observe(&watcher::Event::Delete(stateful_set("a", true)));
        assert!(rollouts.try_start("default", "b"));

        // b's update never gets past its first member.
        let mut stuck = stateful_set("b", false);
        stuck.status.as_mut().unwrap().updated_replicas = Some(1);
        assert!(is_rolling(&stuck));
        let before = Instant::now();
        rollouts.observe(&watcher::Event::Apply(stuck.clone()));
        let after = Instant::now();
        assert!(!rollouts.try_start("default", "c"), "b is rolling");
        assert!(
            !rollouts.try_start_at(
                "default",
                "c",
                before + STUCK_AFTER - Duration::from_secs(1)
            ),
            "b still counts just before it is taken for stuck"
        );
        // Seen again later, still rolling: its clock is not reset.
        std::thread::sleep(Duration::from_millis(2));
        rollouts.observe(&watcher::Event::Apply(stuck));
        assert!(
            rollouts.try_start_at("default", "c", after + STUCK_AFTER),
            "rolling for STUCK_AFTER since the watch first saw it: b no longer holds the slot"
        );
    }

    #[test]
    fn a_relist_replaces_what_was_rolling() {
        let rollouts = Rollouts::new(1);
        rollouts.observe(&watcher::Event::Apply(stateful_set("gone", true)));
        rollouts.observe(&watcher::Event::Init);
        assert_eq!(
            rollouts.rolling(),
            1,
            "the old set serves until the relist is done"
        );
        rollouts.observe(&watcher::Event::InitApply(stateful_set("b", false)));
        rollouts.observe(&watcher::Event::InitDone);
        assert_eq!(rollouts.rolling(), 0, "deleted during the gap: not rolling");
    }

    #[test]
    fn members_kept_by_the_operator_hold_a_slot_while_their_reconciles_count_them_rolling() {
        let rollouts = Rollouts::new(1);
        assert!(rollouts.try_start("default", "a"), "granted");
        rollouts.members("default", "a", true);
        assert!(!rollouts.try_start("default", "b"), "a rolls");
        assert!(rollouts.try_start("default", "a"), "a keeps its slot");
        assert_eq!(rollouts.rolling(), 1, "counted once, not also as reserved");
        rollouts.members("default", "a", false);
        assert!(rollouts.try_start("default", "b"), "a is done");
    }

    #[test]
    fn no_limit_grants_every_rollout() {
        let rollouts = Rollouts::new(0);
        for name in ["a", "b", "c"] {
            rollouts.observe(&watcher::Event::Apply(stateful_set(name, true)));
        }
        assert!(rollouts.try_start("default", "d"));
    }

    #[test]
    fn rolling_means_what_kubectl_rollout_status_waits_for() {
        let mut d = stateful_set("a", false);
        assert!(!is_rolling(&d), "observed and all updated and available");
        d.status.as_mut().unwrap().available_replicas = Some(1);
        assert!(is_rolling(&d), "an updated pod not yet available");
        let mut d = stateful_set("a", false);
        d.status.as_mut().unwrap().updated_replicas = Some(1);
        assert!(is_rolling(&d), "a member not yet updated");
        let mut d = stateful_set("a", false);
        d.status.as_mut().unwrap().replicas = 3;
        assert!(is_rolling(&d), "a member more than wanted still running");
    }
}
