//! The wiring: per watch scope, the watch layer's watches and caches and the reconcile's context;
//! the leader gate; and the workers that take keys from the queue and reconcile them (see
//! queue.rs for its semantics).
//!
//! Not kube-runtime's `Controller`: its scheduler polls every pending reconcile on every wake,
//! O(waiting) per event, which at 10,000 Memcacheds cost more CPU than the reconciles did.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use super::Settings;
use super::context::{Config, Context, Shared};
use super::events::Events;
use super::outcome;
use super::reconcile::reconcile;
use super::rollouts::Rollouts;
use crate::api::Memcached;
use crate::metrics::Metrics;
use crate::resources::MANAGER_NAME;
use crate::watch::feed::{Feed, Key, queue_all_on_leading};
use crate::watch::own_writes::OwnWrites;
use crate::watch::{Kept, Watching};
use operator_runtime::backoff::Backoff;
use operator_runtime::cache::Cache;
use operator_runtime::initial_list::InitialList;
use operator_runtime::queue::Queue;
use operator_runtime::readiness::SyncGate;
use operator_runtime::watch_namespace::Scope;
use operator_runtime::workers::{Next, Workers};

/// How often the in-flight work gauges are refreshed (client-go's interval).
const UNFINISHED_WORK_INTERVAL: Duration = Duration::from_millis(500);

/// The clients the controller writes with (see manager.rs).
pub struct Clients {
    pub api: Client,
    /// Without kube's retry of a 429: evictions the disruption budget refuses.
    pub evictions: Client,
}

/// The controller, one watch set per scope, sharing the metrics, backoff, queue and workers.
/// Its watches are registered in `caches` before this returns, so readiness cannot pass before
/// they exist; the returned future runs them until `shutdown` is cancelled and the reconciles
/// in flight have finished.
///
/// SyncGate fill and stay current whether or not `leading` is true, so a follower that takes over
/// starts from warm caches (as controller-runtime's followers do); until then no worker takes a
/// key, and the moment `leading` turns true every cached Memcached is queued.
pub fn run(
    clients: Clients,
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
    let wiring = Wiring::new(clients, &settings, metrics, queue.clone());
    let (scopes, watches): (Vec<_>, Vec<_>) = settings
        .watch_namespace
        .scopes()
        .into_iter()
        .enumerate()
        .map(|(index, scope)| scope_watches(&wiring, index, scope, caches.subset(), &leading))
        .unzip();
    let scopes = Arc::new(scopes);
    let workers = Workers {
        queue: queue.clone(),
        metrics: wiring.shared.metrics.controller.clone(),
        backoff: Arc::new(Backoff::default()),
        count: usize::from(settings.max_concurrent_reconciles),
    };
    async move {
        let mut background: Vec<JoinHandle<()>> = watches.into_iter().flatten().collect();
        for (index, scope) in scopes.iter().enumerate() {
            background.push(tokio::spawn(queue_all_on_leading(
                leading.clone(),
                scope.ctx.cached.synced.clone(),
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
struct Wiring {
    shared: Shared,
    kept: Kept,
    initial_list: InitialList,
    queue: Arc<Queue<Key>>,
}

impl Wiring {
    fn new(
        Clients {
            api: client,
            evictions,
        }: Clients,
        settings: &Settings,
        metrics: Arc<Metrics>,
        queue: Arc<Queue<Key>>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER_NAME.into(),
            instance: Some(settings.instance.clone()),
        };
        let shared = Shared {
            events: Events::new(client.clone(), reporter),
            client,
            evictions,
            own_writes: Arc::new(OwnWrites::default()),
            rollouts: Arc::new(Rollouts::new(settings.max_concurrent_rollouts)),
            metrics,
            config: Config {
                images: settings.images.clone(),
                operator_namespace: settings.operator_namespace.clone(),
            },
        };
        let kept = Kept {
            network_policies: settings.network_policies,
            service_monitors: settings.service_monitors,
            certificates: settings.certificates,
            autoscalers: settings.autoscalers,
        };
        Wiring {
            shared,
            kept,
            initial_list: settings.initial_list,
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
    wiring: &Wiring,
    index: usize,
    scope: Scope,
    caches: SyncGate,
    leading: &watch::Receiver<bool>,
) -> (ScopeState, Vec<JoinHandle<()>>) {
    let shared = &wiring.shared;
    // Each watch queues through a feed of its own (it holds that watch's relist).
    let feed = || Feed::new(wiring.queue.clone(), index, &caches, leading);
    let w = Watching {
        client: &shared.client,
        initial_list: wiring.initial_list,
        own_writes: &shared.own_writes,
        scope: &scope,
        caches: &caches,
    };
    let events = shared.events.clone();
    let report = move |meta: &ObjectMeta, error: String| events.invalid(meta, error);
    let invalid = shared.metrics.invalid_objects.clone();
    let (memcacheds, mc_watch) = w.memcacheds(feed(), invalid, report);
    let (ctx, mut tasks) = Context::watching(shared, &w, wiring.kept, feed);
    tasks.push(tokio::spawn(mc_watch));
    let ctx = Arc::new(ctx);
    (ScopeState { memcacheds, ctx }, tasks)
}
