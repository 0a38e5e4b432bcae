//! What a reconcile reads and shares, in parts: the API client, the scope's caches (the watch
//! layer's), what the controller remembers between reconciles, and how it reports. A phase
//! takes the context; a step of it takes the parts it uses.

use std::sync::Arc;

use kube::Client;
use tokio::task::JoinHandle;

use super::autoscale::remembered::Autoscaler;
use super::events::Events;
use super::legacy::cache as legacy;
use super::members::replacing::Replacing;
use super::rollouts::Rollouts;
use super::status_writes::StatusWrites;
use crate::metrics::Metrics;
use crate::resources::Images;
use crate::watch::feed::Feed;
use crate::watch::own_writes::OwnWrites;
use crate::watch::{Cached, Kept, Watching};

/// What a reconcile needs.
pub struct Context {
    pub client: Client,
    /// For evictions: a 429 (the disruption budget allows none now) comes back at once.
    pub evictions: Client,
    /// The scope's caches of owned objects, pods and HorizontalPodAutoscalers.
    pub cached: Cached,
    /// The members' workloads of releases up to 0.6.0, until each is adopted.
    pub legacy: legacy::Cache,
    /// Our writes to owned objects, so that their watches do not take them for drift.
    pub own_writes: Arc<OwnWrites>,
    pub remembered: Remembered,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub config: Config,
}

/// What the controller remembers of Memcacheds between reconciles (the rest it reads again).
pub struct Remembered {
    /// The rollout slots of the operator's own updates, one budget for every scope.
    pub rollouts: Arc<Rollouts>,
    /// Members evicted for an update whose replacements do not serve yet.
    pub replacing: Replacing,
    /// What the autoscaler remembers of each autoscaled Memcached.
    pub autoscaler: Autoscaler,
    /// The status last written per Memcached, until its watch brings it back.
    pub statuses: StatusWrites,
}

/// The operator's own settings that shape the objects it builds.
#[derive(Clone, Debug)]
pub struct Config {
    /// Images for CRs that name none.
    pub images: Images,
    /// Where this operator runs, when in a cluster: its pods are let through a Memcached's
    /// NetworkPolicy to read the members' `stats`.
    pub operator_namespace: Option<String>,
}

/// What the contexts of every scope share.
#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    pub evictions: Client,
    pub own_writes: Arc<OwnWrites>,
    /// One budget for every scope: an operator upgrade rolls all of them.
    pub rollouts: Arc<Rollouts>,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub config: Config,
}

impl Context {
    /// One scope's context: the watch layer's caches of the scope (the optional kinds where
    /// `kept`), and the workloads of before, watched here until the last is adopted; with the
    /// tasks of their watches, each queueing through a feed of its own.
    pub fn watching(
        shared: &Shared,
        w: &Watching,
        kept: Kept,
        feed: impl Fn() -> Feed,
    ) -> (Context, Vec<JoinHandle<()>>) {
        let (legacy, legacy_watch) = w.owned(feed(), legacy::triggers());
        let (cached, mut tasks) = w.cached(kept, feed);
        tasks.push(tokio::spawn(legacy_watch));
        let ctx = Context {
            client: shared.client.clone(),
            evictions: shared.evictions.clone(),
            cached,
            legacy,
            own_writes: shared.own_writes.clone(),
            remembered: Remembered {
                rollouts: shared.rollouts.clone(),
                replacing: Default::default(),
                autoscaler: Default::default(),
                statuses: Default::default(),
            },
            events: shared.events.clone(),
            metrics: shared.metrics.clone(),
            config: shared.config.clone(),
        };
        (ctx, tasks)
    }
}
