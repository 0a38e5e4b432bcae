//! A budget for rollouts nobody asked for.
//!
//! When the operator itself changes the pod template (an upgrade with a new default image from
//! `RELATED_IMAGE_MEMCACHED`, or new pod settings), every Memcached's Deployment would roll at
//! the same moment, and every cache in the cluster would lose part of its keys at once. So such a
//! change starts only while fewer than `limit` owned Deployments are rolling; the rest wait their
//! turn. A change the Memcached's own spec asked for (its generation moved) never waits.
//!
//! "Rolling" is what `kubectl rollout status` waits for: the Deployment controller has not yet
//! seen the spec, or not every replica is updated and available. A rollout past its progress
//! deadline stops counting, so a stuck one does not hold a slot for ever.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::runtime::watcher;

use super::owned::OwnedObject;
use operator_runtime::lock;
use operator_runtime::relisted::Relisted;

/// (namespace, name) of a Deployment.
type Key = (String, String);

/// How long a granted rollout counts before the watch shows it: the apply may have failed.
const RESERVATION: Duration = Duration::from_secs(30);

pub struct Rollouts {
    /// 0: no limit.
    limit: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    rolling: Relisted<HashSet<Key>>,
    /// Granted, and not yet seen rolling by the watch.
    reserved: HashMap<Key, Instant>,
}

impl Rollouts {
    pub fn new(limit: u16) -> Self {
        Self {
            limit: usize::from(limit),
            state: Mutex::default(),
        }
    }

    /// Keeps the set of rolling Deployments current from the Deployment watch.
    pub fn observe(&self, event: &watcher::Event<OwnedObject<Deployment>>) {
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

    /// Whether the Deployment `namespace/name` may start a rollout nobody asked for now. Granted
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
        if state.rolling.live().contains(&key) || state.reserved.contains_key(&key) {
            return true;
        }
        let State { rolling, reserved } = &mut *state;
        let rolling = rolling.live();
        reserved.retain(|k, granted| {
            now.duration_since(*granted) < RESERVATION && !rolling.contains(k)
        });
        if rolling.len() + reserved.len() >= self.limit {
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
        state.rolling.live().len() + state.reserved.len()
    }
}

fn key(d: &OwnedObject<Deployment>) -> Key {
    (d.namespace().unwrap_or_default(), d.name_any())
}

fn update(rolling: &mut HashSet<Key>, d: &OwnedObject<Deployment>) {
    if is_rolling(d) {
        rolling.insert(key(d));
    } else {
        rolling.remove(&key(d));
    }
}

/// `kubectl rollout status`'s test: the controller has not observed the spec, or replicas are
/// not all updated and available; a rollout past its progress deadline has failed, not rolling.
pub fn is_rolling(d: &OwnedObject<Deployment>) -> bool {
    let Some(status) = &d.status else {
        return true;
    };
    if d.metadata.generation > status.observed_generation {
        return true;
    }
    let past_deadline = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    if past_deadline {
        return false;
    }
    let desired = d.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    updated < desired
        || status.replicas.unwrap_or(0) > updated
        || status.available_replicas.unwrap_or(0) < updated
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};

    use super::*;
    use crate::fixtures::{deployment_with_status, memcached};

    fn deployment(name: &str, rolling: bool) -> OwnedObject<Deployment> {
        let mut d = deployment_with_status(&memcached(name, 2), 2, 2);
        if rolling {
            d.metadata.generation = Some(2);
        }
        d
    }

    #[test]
    fn a_rollout_starts_only_while_fewer_than_the_limit_are_rolling() {
        let rollouts = Rollouts::new(2);
        rollouts.observe(&watcher::Event::Apply(deployment("a", true)));
        rollouts.observe(&watcher::Event::Apply(deployment("b", false)));
        assert!(rollouts.try_start("default", "b"), "one of two slots taken");
        assert!(
            !rollouts.try_start("default", "c"),
            "a and b hold both slots, b from the moment it was granted"
        );
        assert!(
            rollouts.try_start("default", "a"),
            "one already rolling keeps its slot"
        );
        rollouts.observe(&watcher::Event::Apply(deployment("a", false)));
        assert!(
            rollouts.try_start("default", "c"),
            "a finished: its slot is free"
        );
    }

    #[test]
    fn a_grant_the_watch_never_confirms_lapses() {
        // The apply after the grant failed: nothing of the Deployment changed.
        let rollouts = Rollouts::new(1);
        let now = Instant::now();
        assert!(rollouts.try_start_at("default", "a", now));
        assert!(!rollouts.try_start_at("default", "b", now + RESERVATION / 2));
        assert!(rollouts.try_start_at("default", "b", now + RESERVATION));
    }

    #[test]
    fn a_deleted_or_stuck_deployment_frees_its_slot() {
        let rollouts = Rollouts::new(1);
        rollouts.observe(&watcher::Event::Apply(deployment("a", true)));
        assert!(!rollouts.try_start("default", "b"));
        rollouts.observe(&watcher::Event::Delete(deployment("a", true)));
        assert!(rollouts.try_start("default", "b"));

        let mut stuck = deployment("b", false);
        stuck
            .status
            .get_or_insert_with(DeploymentStatus::default)
            .updated_replicas = Some(1);
        assert!(is_rolling(&stuck));
        rollouts.observe(&watcher::Event::Apply(stuck.clone()));
        assert!(!rollouts.try_start("default", "c"), "b is rolling");
        stuck.status.as_mut().unwrap().conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            ..DeploymentCondition::default()
        }]);
        rollouts.observe(&watcher::Event::Apply(stuck));
        assert!(rollouts.try_start("default", "c"));
    }

    #[test]
    fn a_relist_replaces_what_was_rolling() {
        let rollouts = Rollouts::new(1);
        rollouts.observe(&watcher::Event::Apply(deployment("gone", true)));
        rollouts.observe(&watcher::Event::Init);
        assert_eq!(
            rollouts.rolling(),
            1,
            "the old set serves until the relist is done"
        );
        rollouts.observe(&watcher::Event::InitApply(deployment("b", false)));
        rollouts.observe(&watcher::Event::InitDone);
        assert_eq!(rollouts.rolling(), 0, "deleted during the gap: not rolling");
    }

    #[test]
    fn no_limit_grants_every_rollout() {
        let rollouts = Rollouts::new(0);
        for name in ["a", "b", "c"] {
            rollouts.observe(&watcher::Event::Apply(deployment(name, true)));
        }
        assert!(rollouts.try_start("default", "d"));
    }

    #[test]
    fn rolling_means_what_kubectl_rollout_status_waits_for() {
        let mut d = deployment("a", false);
        assert!(!is_rolling(&d), "observed and all updated and available");
        d.status.as_mut().unwrap().available_replicas = Some(1);
        assert!(is_rolling(&d), "an updated pod not yet available");
        let mut d = deployment("a", false);
        d.status.as_mut().unwrap().replicas = Some(3);
        assert!(is_rolling(&d), "an old pod still running");
    }
}
