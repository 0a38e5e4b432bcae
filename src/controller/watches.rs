//! The wiring: per watch scope, the watches of Memcacheds and of what they own, the caches they
//! fill and the triggers they queue; the leader gate; and the workers that take keys from the
//! queue and reconcile them (see queue.rs for its semantics).
//!
//! Not kube-runtime's `Controller`: its scheduler polls every pending reconcile on every wake,
//! O(waiting) per event, which at 10,000 Memcacheds cost more CPU than the reconciles did.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use super::Settings;
use super::context::Context;
use super::events::Events;
use super::feed::{Feed, Key, queue_all_on_leading};
use super::hpa_index::{HpaIndex, HpaSeen};
use super::legacy;
use super::outcome;
use super::own_writes::OwnWrites;
use super::pod_index::{PodIndex, PodMeta};
use super::reconcile::reconcile;
use super::rollouts::Rollouts;
use super::triggers::{self, OwnedTriggers};
use super::watched_memcached::{WatchedMemcached, parse_event};
use crate::api::Memcached;
use crate::metrics::Metrics;
use crate::resources::MANAGER_NAME;
use operator_runtime::backoff::Backoff;
use operator_runtime::cache::{self, Cache};
use operator_runtime::initial_list::InitialList;
use operator_runtime::queue::Queue;
use operator_runtime::readiness::SyncGate;
use operator_runtime::watch_namespace::Scope;
use operator_runtime::workers::{Next, Workers};

mod owned_watch;
use owned_watch::{Watching, cached_before, owned_watch_config, released_on_first_list, watched};

/// How often the in-flight work gauges are refreshed (client-go's interval).
const UNFINISHED_WORK_INTERVAL: Duration = Duration::from_millis(500);

/// The controller, one watch set per scope, sharing the metrics, backoff, queue and workers.
/// Its watches are registered in `caches` before this returns, so readiness cannot pass before
/// they exist; the returned future runs them until `shutdown` is cancelled and the reconciles
/// in flight have finished.
///
/// SyncGate fill and stay current whether or not `leading` is true, so a follower that takes over
/// starts from warm caches (as controller-runtime's followers do); until then no worker takes a
/// key, and the moment `leading` turns true every cached Memcached is queued.
pub fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    caches: &SyncGate,
    shutdown: CancellationToken,
    leading: watch::Receiver<bool>,
) -> impl Future<Output = ()> + use<> {
    metrics
        .controller
        .set_max_concurrent_reconciles(settings.max_concurrent_reconciles);
    let queue = Arc::new(Queue::new(Some(metrics.controller.queue())));
    let shared = Shared::new(client, &settings, metrics, queue.clone());
    let (scopes, watches): (Vec<_>, Vec<_>) = settings
        .watch_namespace
        .scopes()
        .into_iter()
        .enumerate()
        .map(|(index, scope)| scope_watches(&shared, index, scope, caches.subset(), &leading))
        .unzip();
    let scopes = Arc::new(scopes);
    let workers = Workers {
        queue: queue.clone(),
        metrics: shared.metrics.controller.clone(),
        backoff: Arc::new(Backoff::default()),
        count: usize::from(settings.max_concurrent_reconciles),
    };
    async move {
        let mut background: Vec<JoinHandle<()>> = watches.into_iter().flatten().collect();
        for (index, scope) in scopes.iter().enumerate() {
            background.push(tokio::spawn(queue_all_on_leading(
                leading.clone(),
                scope.ctx.caches.clone(),
                scope.memcacheds.clone(),
                queue.clone(),
                index,
            )));
        }
        background.extend(queue_upkeep(&queue, &shutdown));
        // One set of workers for every scope: the limit is the process's, as in controller-runtime.
        let reconcile = move |key: Key| {
            let scopes = scopes.clone();
            async move { reconcile_now(&scopes[key.scope], &key.memcached).await }
        };
        workers.run(reconcile, leading, shutdown).await;
        for task in background {
            task.abort();
        }
        info!("controller stopped");
    }
}

/// The queue's in-flight work gauges, kept current; and the queue shut down with the process.
fn queue_upkeep(queue: &Arc<Queue<Key>>, shutdown: &CancellationToken) -> [JoinHandle<()>; 2] {
    let gauges = tokio::spawn({
        let queue = queue.clone();
        async move {
            let mut every = tokio::time::interval(UNFINISHED_WORK_INTERVAL);
            loop {
                every.tick().await;
                queue.update_unfinished_work();
            }
        }
    });
    let stop = tokio::spawn({
        let (queue, shutdown) = (queue.clone(), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            queue.shut_down();
        }
    });
    [gauges, stop]
}

/// What every scope's watches and reconciles share.
struct Shared {
    client: Client,
    events: Events,
    images: crate::resources::Images,
    operator_namespace: Option<String>,
    service_monitors: bool,
    network_policies: bool,
    certificates: bool,
    autoscalers: bool,
    initial_list: InitialList,
    own_writes: Arc<OwnWrites>,
    rollouts: Arc<Rollouts>,
    metrics: Arc<Metrics>,
    queue: Arc<Queue<Key>>,
}

impl Shared {
    fn new(
        client: Client,
        settings: &Settings,
        metrics: Arc<Metrics>,
        queue: Arc<Queue<Key>>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER_NAME.into(),
            instance: Some(settings.instance.clone()),
        };
        Shared {
            events: Events::new(client.clone(), reporter),
            client,
            images: settings.images.clone(),
            operator_namespace: settings.operator_namespace.clone(),
            service_monitors: settings.service_monitors,
            network_policies: settings.network_policies,
            certificates: settings.certificates,
            autoscalers: settings.autoscalers,
            initial_list: settings.initial_list,
            own_writes: Arc::new(OwnWrites::default()),
            // One budget for every scope: an operator upgrade rolls all of them.
            rollouts: Arc::new(Rollouts::new(settings.max_concurrent_rollouts)),
            metrics,
            queue,
        }
    }
}

/// What a worker needs to reconcile a key of one scope.
struct ScopeState {
    memcacheds: Cache<Memcached>,
    ctx: Arc<Context>,
}

/// Reconciles the Memcached as the cache holds it now: changes that arrived while it waited are
/// in it, and a Memcached deleted meanwhile is skipped.
async fn reconcile_now(scope: &ScopeState, key: &ObjectRef<Memcached>) -> Next {
    let namespace = key.namespace.as_deref().unwrap_or_default();
    let Some(mc) = scope.memcacheds.get(namespace, &key.name) else {
        // Deleted: nothing of it is kept (its series, any rollout slot its members held).
        super::reconcile::forget(&scope.ctx, key);
        return Next::AwaitChange;
    };
    let span = super::reconcile::span(&mc);
    // Boxed: the reconcile's future is large, and workers' own futures stay small.
    match Box::pin(reconcile(&mc, &scope.ctx)).instrument(span).await {
        Ok(outcome) => outcome.next(),
        Err(error) => outcome::failed(&error),
    }
}

/// One scope's caches, reconcile context and running watch tasks; its watches count for
/// readiness from now on.
fn scope_watches(
    shared: &Shared,
    index: usize,
    scope: Scope,
    caches: SyncGate,
    leading: &watch::Receiver<bool>,
) -> (ScopeState, Vec<JoinHandle<()>>) {
    let client = &shared.client;
    let queue = &shared.queue;

    // Each watch queues through a feed of its own (it holds that watch's relist).
    let feed = || Feed::new(queue.clone(), index, &caches, leading);
    let (memcacheds, mc_watch) = memcached_watch(shared, &scope, &caches, feed());

    let w = Watching {
        shared,
        scope: &scope,
        caches: &caches,
    };
    let (legacy_stateful_sets, legacy_watch) = w.owned(feed(), legacy::cache::triggers());
    let (services, service_watch) = w.owned(feed(), OwnedTriggers::services());
    // The disruption controller rewrites a budget's status whenever a pod's readiness changes;
    // the pod watch already reports that, so a status change triggers nothing.
    let (budgets, budget_watch) = w.owned(feed(), OwnedTriggers::budgets());
    // Watched only where this process may (a watch it may not run fails forever), and where
    // the API is served (likewise).
    let (network_policies, network_policy_watch) = w.optional(
        shared.network_policies,
        feed(),
        OwnedTriggers::network_policies(),
    );
    let (service_monitors, monitor_watch) = w.optional(
        shared.service_monitors,
        feed(),
        OwnedTriggers::service_monitors(),
    );
    let (certificates, certificate_watch) =
        w.optional(shared.certificates, feed(), OwnedTriggers::certificates());
    let (pods, pod_watch) = pod_watch(shared, &scope, &caches, feed());
    // HorizontalPodAutoscalers, all of them (they are not ours), where this process may watch
    // them: one that targets an autoscaled Memcached stops the operator's autoscaler.
    let (hpas, hpa_watch) = shared
        .autoscalers
        .then(|| hpa_watch(shared, &scope, &caches, feed()))
        .unzip();

    let ctx = Arc::new(Context {
        client: client.clone(),
        legacy_stateful_sets,
        services,
        pod_disruption_budgets: budgets,
        network_policies,
        service_monitors,
        certificates,
        pods,
        own_writes: shared.own_writes.clone(),
        rollouts: shared.rollouts.clone(),
        replacing: Default::default(),
        autoscaler: Default::default(),
        hpas,
        events: shared.events.clone(),
        images: shared.images.clone(),
        operator_namespace: shared.operator_namespace.clone(),
        metrics: shared.metrics.clone(),
        caches,
    });
    let mut tasks = vec![
        tokio::spawn(mc_watch),
        tokio::spawn(legacy_watch),
        tokio::spawn(service_watch),
        tokio::spawn(budget_watch),
        tokio::spawn(pod_watch),
    ];
    tasks.extend(monitor_watch.map(tokio::spawn));
    tasks.extend(network_policy_watch.map(tokio::spawn));
    tasks.extend(certificate_watch.map(tokio::spawn));
    tasks.extend(hpa_watch.map(tokio::spawn));
    (ScopeState { memcacheds, ctx }, tasks)
}

/// The Memcacheds of `scope`: their cache, and the watch that keeps it and queues spec changes.
fn memcached_watch(
    shared: &Shared,
    scope: &Scope,
    caches: &SyncGate,
    mut feed: Feed,
) -> (Cache<Memcached>, impl Future<Output = ()> + use<>) {
    let invalid = shared.metrics.invalid_objects.clone();
    let events = shared.events.clone();
    let (memcacheds, mut writer) = cache::new::<Memcached>();
    let mut unsynced = Some(caches.watch());
    let cached = memcacheds.clone();
    let watch = watcher(
        scope.api::<WatchedMemcached>(&shared.client),
        shared
            .initial_list
            .configure(watcher::Config::default().any_semantic()),
    )
    .default_backoff()
    .filter_map(move |event| {
        let report = |meta: &ObjectMeta, error: String| events.invalid(meta, error);
        future::ready(event.map(|e| parse_event(e, &invalid, report)).transpose())
    })
    .for_each(move |event| {
        if let Some(event) = watched(event, "Memcached") {
            let trigger = triggers::spec_change(cached_before(&cached, &event).as_deref(), &event);
            writer.apply_watcher_event(&event);
            released_on_first_list(&mut unsynced, &event);
            feed.fire(&event, trigger);
        }
        future::ready(())
    });
    (memcacheds, watch)
}

/// The pods of `scope`, indexed by Memcached; each change queues its Memcached's status refresh.
fn pod_watch(
    shared: &Shared,
    scope: &Scope,
    caches: &SyncGate,
    mut feed: Feed,
) -> (Arc<PodIndex>, impl Future<Output = ()> + use<>) {
    let pods = Arc::new(PodIndex::default());
    let mut unsynced = Some(caches.watch());
    let index = pods.clone();
    let watch = watcher(
        scope.api::<PodMeta>(&shared.client),
        owned_watch_config(shared.initial_list),
    )
    .default_backoff()
    .for_each(move |event| {
        if let Some(event) = watched(event, "Pod") {
            index.observe(&event);
            released_on_first_list(&mut unsynced, &event);
            let trigger = triggers::pod_change(&event);
            feed.fire(&event, trigger);
        }
        future::ready(())
    });
    (pods, watch)
}

/// The HorizontalPodAutoscalers of `scope` by the Memcached they target.
fn hpa_watch(
    shared: &Shared,
    scope: &Scope,
    caches: &SyncGate,
    mut feed: Feed,
) -> (Arc<HpaIndex>, impl Future<Output = ()> + use<>) {
    let hpas = Arc::new(HpaIndex::default());
    let mut unsynced = Some(caches.watch());
    let index = hpas.clone();
    let watch = watcher(
        scope.api::<HpaSeen>(&shared.client),
        shared
            .initial_list
            .configure(watcher::Config::default().any_semantic()),
    )
    .default_backoff()
    .for_each(move |event| {
        if let Some(event) = watched(event, "HorizontalPodAutoscaler") {
            let triggers = index.observe(&event);
            released_on_first_list(&mut unsynced, &event);
            if triggers.is_empty() {
                feed.fire(&event, None);
            }
            for trigger in triggers {
                feed.fire(&event, Some(trigger));
            }
        }
        future::ready(())
    });
    (hpas, watch)
}
