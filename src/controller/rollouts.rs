//! A budget for rollouts nobody asked for.
//!
//! When the operator itself changes the pod template (an upgrade with a new default image from
//! `RELATED_IMAGE_MEMCACHED`, or new pod settings), every Memcached's members would be updated
//! at the same moment, and every cache in the cluster would lose part of its keys at once. So such
//! a change starts only while fewer than `limit` Memcacheds are rolling; the rest wait their turn.
//! A change the Memcached's own spec asked for (its generation moved) never waits.
//!
//! "Rolling" is what `kubectl rollout status` waits for: not every member updated and
//! available, as each reconcile counts them. One rolling for longer than a Deployment's default
//! progress deadline stops counting here: a stuck rollout does not hold a slot for ever.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::Memcached;
use crate::status::Members;
use operator_runtime::lock;

/// (namespace, name) of a Memcached.
type Key = (String, String);

/// How long a granted rollout counts before its reconcile reports it rolling: its writes may
/// have failed.
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
    /// Granted, and not yet reported rolling.
    reserved: HashMap<Key, Instant>,
    /// Memcacheds whose members are rolling, since when, as their reconciles report them.
    rolling: HashMap<Key, Instant>,
}

impl Rollouts {
    pub fn new(limit: u16) -> Self {
        Self {
            limit: usize::from(limit),
            state: Mutex::default(),
        }
    }

    /// Memcached `namespace/name` is gone: its members hold no slot.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.members(namespace, name, false);
    }

    /// Whether the members of Memcached `namespace/name` are rolling, as its reconcile counted
    /// them (`is_rolling`).
    pub fn members(&self, namespace: &str, name: &str, rolling: bool) {
        let key = (namespace.to_string(), name.to_string());
        let mut state = lock(&self.state);
        if rolling {
            state.reserved.remove(&key);
            state.rolling.entry(key).or_insert_with(Instant::now);
        } else {
            state.rolling.remove(&key);
        }
    }

    /// Whether a rollout of `mc`'s members for a reason its spec did not give (an operator
    /// upgrade) must wait because the budget is spent.
    pub fn must_wait(&self, mc: &Memcached) -> bool {
        !crate::status::spec_changed(mc)
            && !self.try_start(&mc.namespace().unwrap_or_default(), &mc.name_any())
    }

    /// Whether Memcached `namespace/name` may start a rollout nobody asked for now. Granted
    /// means counted at once, before its reconcile reports it rolling, so concurrent reconciles
    /// cannot all take the last slot.
    pub fn try_start(&self, namespace: &str, name: &str) -> bool {
        self.try_start_at(namespace, name, Instant::now())
    }

    fn try_start_at(&self, namespace: &str, name: &str, now: Instant) -> bool {
        if self.limit == 0 {
            return true;
        }
        let mut state = lock(&self.state);
        let key = (namespace.to_string(), name.to_string());
        if state.rolling.contains_key(&key) || state.reserved.contains_key(&key) {
            return true;
        }
        let State { reserved, rolling } = &mut *state;
        reserved.retain(|k, granted| {
            now.duration_since(*granted) < RESERVATION && !rolling.contains_key(k)
        });
        // Below the limit even counting the stuck ones: no need to walk them (a hot path while
        // an upgrade queues every Memcached).
        let at_limit = |rolling_count: usize| rolling_count + reserved.len() >= self.limit;
        if at_limit(rolling.len()) && at_limit(counted(rolling, now)) {
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
        counted(&state.rolling, Instant::now()) + state.reserved.len()
    }
}

/// Rollouts that hold a slot at `now`: those not yet stuck.
fn counted(rolling: &HashMap<Key, Instant>, now: Instant) -> usize {
    rolling
        .values()
        .filter(|since| now.saturating_duration_since(**since) < STUCK_AFTER)
        .count()
}

/// `kubectl rollout status`'s test of `desired` members: not all updated and available.
pub fn is_rolling(desired: i32, members: &Members) -> bool {
    members.updated < desired
        || members.replicas > members.updated
        || members.available < members.updated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(replicas: i32, updated: i32, available: i32) -> Members {
        Members {
            replicas,
            ready: available,
            available,
            updated,
        }
    }

    #[test]
    fn a_rollout_starts_only_while_fewer_than_the_limit_are_rolling() {
        let rollouts = Rollouts::new(2);
        rollouts.members("default", "a", true);
        assert!(rollouts.try_start("default", "b"), "one of two slots taken");
        assert!(
            !rollouts.try_start("default", "c"),
            "a and b hold both slots, b from the moment it was granted"
        );
        assert!(
            rollouts.try_start("default", "a"),
            "one already rolling keeps its slot"
        );
        rollouts.members("default", "a", false);
        assert!(
            rollouts.try_start("default", "c"),
            "a finished: its slot is free"
        );
    }

    #[test]
    fn a_grant_never_reported_rolling_lapses() {
        // The writes after the grant failed: nothing of the members changed.
        let rollouts = Rollouts::new(1);
        let now = Instant::now();
        assert!(rollouts.try_start_at("default", "a", now));
        assert!(!rollouts.try_start_at("default", "b", now + RESERVATION / 2));
        assert!(rollouts.try_start_at("default", "b", now + RESERVATION));
    }

    #[test]
    fn a_deleted_or_stuck_memcached_frees_its_slot() {
        let rollouts = Rollouts::new(1);
        rollouts.members("default", "a", true);
        assert!(!rollouts.try_start("default", "b"));
        rollouts.forget("default", "a");
        assert!(rollouts.try_start("default", "b"));

        // b's update never gets past its first member.
        let before = Instant::now();
        rollouts.members("default", "b", true);
        assert!(!rollouts.try_start("default", "c"), "b is rolling");
        assert!(
            !rollouts.try_start_at(
                "default",
                "c",
                before + STUCK_AFTER - Duration::from_secs(1)
            ),
            "b still counts just before it is taken for stuck"
        );
        // Reported again later, still rolling: its clock is not reset.
        let after = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        rollouts.members("default", "b", true);
        assert!(
            rollouts.try_start_at("default", "c", after + STUCK_AFTER),
            "rolling for STUCK_AFTER since first reported: b no longer holds the slot"
        );
    }

    #[test]
    fn a_rolling_memcached_holds_its_slot_counted_once() {
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
            rollouts.members("default", name, true);
        }
        assert!(rollouts.try_start("default", "d"));
    }

    #[test]
    fn rolling_means_what_kubectl_rollout_status_waits_for() {
        assert!(
            !is_rolling(2, &counts(2, 2, 2)),
            "all updated and available"
        );
        assert!(
            is_rolling(2, &counts(2, 2, 1)),
            "an updated member not yet available"
        );
        assert!(is_rolling(2, &counts(2, 1, 1)), "a member not yet updated");
        assert!(
            is_rolling(2, &counts(3, 2, 2)),
            "a member more than wanted still running"
        );
    }
}
