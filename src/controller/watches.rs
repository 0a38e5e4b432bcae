//! The wiring: per watch scope, the watches of Memcacheds and of what they own, the caches they
//! fill, the triggers they send, the leader gate and the workers that reconciles wait for.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::PartialObjectMeta;
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field, info, info_span, warn};

use super::Settings;
use super::events::Events;
use super::pod_index::PodIndex;
use super::reconcile::{Context, error_policy, reconcile};
use super::rollouts::Rollouts;
use super::workers::Workers;
use crate::api::Memcached;
use crate::backoff::Backoff;
use crate::health::{Caches, Unsynced};
use crate::metrics::Metrics;
use crate::resources::{self, LABEL_INSTANCE, MANAGER_NAME};
use crate::watch_namespace::Scope;

/// The controller, one per watch scope, sharing the metrics, backoff and workers. Its watches
/// are registered in `caches` before this returns, so readiness cannot pass before they exist;
/// the returned future runs them until `shutdown` is cancelled and in-flight reconciles finish.
///
/// Caches fill and stay current whether or not `leading` is true, so a follower that takes over
/// starts from warm caches (as controller-runtime's followers do); until then every reconcile is
/// skipped, and the moment `leading` turns true every cached Memcached is queued.
pub fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    caches: &Caches,
    shutdown: CancellationToken,
    leading: watch::Receiver<bool>,
) -> impl Future<Output = ()> + use<> {
    metrics.set_max_concurrent_reconciles(settings.max_concurrent_reconciles);
    let reporter = Reporter {
        controller: MANAGER_NAME.into(),
        instance: Some(settings.instance.clone()),
    };
    let shared = Shared {
        events: Events::new(client.clone(), reporter),
        client,
        default_image: settings.default_image.clone(),
        backoff: Arc::new(Backoff::default()),
        // One budget for every scope: an operator upgrade rolls all of them.
        rollouts: Arc::new(Rollouts::new(settings.max_concurrent_rollouts)),
        metrics,
        // One set of workers for every scope: the limit is the process's, as in controller-runtime.
        workers: Arc::new(Workers::new(
            settings.max_concurrent_reconciles,
            shutdown.clone(),
        )),
    };
    let controllers: Vec<_> = settings
        .watch_namespace
        .scopes()
        .into_iter()
        .map(|scope| scope_controller(&shared, scope, caches.subset(), &shutdown, &leading))
        .collect();
    async move {
        future::join_all(controllers).await;
    }
}

/// What every scope's controller shares.
struct Shared {
    client: Client,
    events: Events,
    default_image: String,
    backoff: Arc<Backoff<ObjectRef<Memcached>>>,
    rollouts: Arc<Rollouts>,
    metrics: Arc<Metrics>,
    workers: Arc<Workers<ObjectRef<Memcached>>>,
}

/// One scope's watches and controller, built now, run when awaited.
fn scope_controller(
    shared: &Shared,
    scope: Scope,
    caches: Caches,
    shutdown: &CancellationToken,
    leading: &watch::Receiver<bool>,
) -> impl Future<Output = ()> + use<> {
    let client = &shared.client;
    let workers = shared.workers.clone();

    let invalid = shared.metrics.invalid_objects.clone();
    let events = shared.events.clone();
    let (mc_reader, mc_writer) = reflector::store::<Memcached>();
    let memcacheds = watcher(
        raw_memcacheds(client, &scope),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .inspect(released_on_first_list(caches.watch()))
    .filter_map(move |event| {
        let report = |obj: &DynamicObject, error: String| events.invalid(obj, error);
        future::ready(event.map(|e| parse_event(e, &invalid, report)).transpose())
    })
    .modify(drop_managed_fields)
    .reflect(mc_writer)
    .applied_objects()
    // Status writes do not change the generation, so the controller does not wake itself.
    .predicate_filter(predicates::generation, Default::default())
    .filter(unless_waiting(workers.clone(), |mc: &Memcached| {
        Some(ObjectRef::from_obj(mc))
    }));

    let rollouts = shared.rollouts.clone();
    let (deployments, deployment_events) =
        owned_stream::<Deployment>(scope.api(client), caches.watch(), move |event| {
            rollouts.observe(event)
        });
    let (services, service_events) =
        owned_stream::<Service>(scope.api(client), caches.watch(), |_| {});
    let (budgets, budget_events) =
        owned_stream::<PodDisruptionBudget>(scope.api(client), caches.watch(), |_| {});
    let deployment_events =
        deployment_events.filter(unless_waiting(workers.clone(), controller_of::<Deployment>));
    let service_events =
        service_events.filter(unless_waiting(workers.clone(), controller_of::<Service>));
    // The disruption controller rewrites a budget's status whenever a pod's readiness changes;
    // the pod watch already reports that, so only spec changes (and creation) trigger.
    let budget_events = budget_events
        .predicate_filter(predicates::generation, Default::default())
        .filter(unless_waiting(
            workers.clone(),
            controller_of::<PodDisruptionBudget>,
        ));

    let pods = Arc::new(PodIndex::default());
    let pod_events = watcher(
        scope.api::<PartialObjectMeta<Pod>>(client),
        owned_watch_config(),
    )
    .default_backoff()
    .inspect(released_on_first_list(caches.watch()))
    .inspect({
        let pods = pods.clone();
        move |event| {
            if let Ok(event) = event {
                pods.observe(event);
            }
        }
    })
    .touched_objects()
    .filter(unless_waiting(workers.clone(), memcached_of_pod));

    let synced = caches.clone();
    let ctx = Arc::new(Context {
        client: client.clone(),
        deployments,
        services,
        pod_disruption_budgets: budgets,
        pods,
        rollouts: shared.rollouts.clone(),
        events: shared.events.clone(),
        default_image: shared.default_image.clone(),
        backoff: shared.backoff.clone(),
        metrics: shared.metrics.clone(),
        caches,
    });
    let shutdown = shutdown.clone();
    let leading = leading.clone();
    let latest = mc_reader.clone();
    // No concurrency limit here: `workers` is the limit, and keeps the order (see workers.rs).
    let controller = Controller::for_stream(memcacheds, mc_reader)
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .owns_stream(budget_events)
        .watches_stream(pod_events, |pod| memcached_of_pod(&pod))
        .reconcile_all_on(became_leader(leading.clone(), synced))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(
            move |mc, ctx| {
                let leader = *leading.borrow();
                let (workers, latest) = (workers.clone(), latest.clone());
                async move {
                    if !leader {
                        return Ok(Action::await_change());
                    }
                    let key = ObjectRef::from_obj(&*mc);
                    let Some(_worker) = workers.start(&key).await else {
                        return Ok(Action::await_change());
                    };
                    // It may have changed (or gone) while it waited: reconcile it as it is now.
                    let Some(mc) = latest.get(&key) else {
                        return Ok(Action::await_change());
                    };
                    // Boxed: thousands may wait for a worker, each as small as it can be.
                    Box::pin(reconcile(mc.clone(), ctx))
                        .instrument(reconcile_span(&mc))
                        .await
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|result| {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile trigger failed");
            }
            future::ready(())
        });
    async move {
        controller.await;
        info!(scope = scope.name(), "controller stopped");
    }
}

fn reconcile_span(mc: &Memcached) -> tracing::Span {
    let span = info_span!(
        "reconcile",
        namespace = field::Empty,
        memcached = field::Empty,
        trace_id = field::Empty
    );
    span.record("namespace", mc.namespace().unwrap_or_default());
    span.record("memcached", mc.name_any());
    if let Some(id) = span.in_scope(crate::telemetry::current_trace_id) {
        span.record("trace_id", id);
    }
    span
}

/// Memcacheds as raw objects, so that one that does not parse is skipped (see `parse_event`)
/// instead of breaking the watch for all the others.
fn raw_memcacheds(client: &Client, scope: &Scope) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        &Memcached::group(&()),
        &Memcached::version(&()),
        &Memcached::kind(&()),
    );
    scope.api_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, &Memcached::plural(&())),
    )
}

/// Turns a watch event of raw objects into one of Memcacheds, dropping objects that do not parse
/// so that one malformed object cannot break the watch for all the others.
pub fn parse_event(
    event: watcher::Event<DynamicObject>,
    invalid: &prometheus::IntGauge,
    report: impl Fn(&DynamicObject, String),
) -> Option<watcher::Event<Memcached>> {
    let parse = |obj: DynamicObject| {
        let name = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
        match parse_memcached(&obj) {
            Ok(mc) => Some(mc),
            Err(error) => {
                invalid.inc();
                warn!(memcached = %name, %error, "skipping Memcached that does not match the API schema");
                report(&obj, error.to_string());
                None
            }
        }
    };
    Some(match event {
        watcher::Event::Apply(o) => watcher::Event::Apply(parse(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(parse(o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(parse(o)?),
        watcher::Event::Init => {
            invalid.set(0);
            watcher::Event::Init
        }
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

/// A Memcached from a raw object; the error names the field that does not fit the schema.
fn parse_memcached(obj: &DynamicObject) -> Result<Memcached, String> {
    let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

/// Releases a watch's readiness handle on its first complete list.
///
/// Not `Store::wait_until_ready`: in kube 5 it is one shared oneshot receiver that keeps only the
/// last waiter's waker, and the controller already waits on the Memcached store, so a second
/// waiter can leave one of the two asleep for good.
fn released_on_first_list<K>(
    handle: Unsynced,
) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
    let mut handle = Some(handle);
    move |event| {
        if matches!(event, Ok(watcher::Event::InitDone))
            && let Some(handle) = handle.take()
        {
            handle.release();
        }
    }
}

/// Yields once, when `leading` is true and the scope's caches are filled: then every cached
/// Memcached is queued. Triggers that came before were dropped by the leader gate, and a store
/// is empty until its first list is complete, so queueing at leadership alone could miss them.
fn became_leader(
    mut leading: watch::Receiver<bool>,
    caches: Caches,
) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::once(async move {
        let gained = leading.wait_for(|l| *l).await.is_ok();
        caches.wait_synced().await;
        gained
    })
    .filter(|gained| future::ready(*gained))
    .map(|_| ())
}

/// managedFields are most of a cached object's size (one entry per writer: us, the
/// kube-controller-manager, the kubelet) and nothing here reads them.
fn drop_managed_fields<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// What we own carries our label; the watch cache serves it.
fn owned_watch_config() -> watcher::Config {
    watcher::Config::default()
        .labels(&resources::managed_by_selector())
        .any_semantic()
}

/// Watches owned objects by our label into a cache, shows each event to `observe`, and yields
/// the objects as reconcile triggers.
fn owned_stream<K>(
    api: Api<K>,
    unsynced: Unsynced,
    observe: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, owned_watch_config())
        .default_backoff()
        .inspect(released_on_first_list(unsynced))
        .inspect(move |event| {
            if let Ok(event) = event {
                observe(event);
            }
        })
        .modify(drop_managed_fields)
        .reflect(writer)
        .applied_objects();
    (reader, stream)
}

/// The Memcached a pod belongs to, by its instance label.
fn memcached_of_pod(pod: &PartialObjectMeta<Pod>) -> Option<ObjectRef<Memcached>> {
    let ns = pod.namespace()?;
    let instance = pod.labels().get(LABEL_INSTANCE)?;
    Some(ObjectRef::new(instance).within(&ns))
}

/// The Memcached that controls an owned object.
fn controller_of<K: Resource>(obj: &K) -> Option<ObjectRef<Memcached>> {
    let ns = obj.namespace()?;
    let owner = obj
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Memcached::kind(&()))?;
    Some(ObjectRef::new(&owner.name).within(&ns))
}

/// Drops triggers for a Memcached whose reconcile is still waiting for a worker: it will read
/// the caches, with this change in them, when it starts (see workers.rs).
fn unless_waiting<K>(
    workers: Arc<Workers<ObjectRef<Memcached>>>,
    target: impl Fn(&K) -> Option<ObjectRef<Memcached>>,
) -> impl FnMut(&Result<K, watcher::Error>) -> future::Ready<bool> {
    move |item| {
        let redundant =
            matches!(item, Ok(obj) if target(obj).is_some_and(|key| workers.is_waiting(&key)));
        future::ready(!redundant)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn everything_is_queued_once_leading_with_filled_caches() {
        let (leading_tx, leading) = watch::channel(false);
        let caches = Caches::default();
        let memcacheds = caches.watch();
        let mut queued = Box::pin(became_leader(leading, caches));
        let soon = std::time::Duration::from_millis(200);
        leading_tx.send_replace(true);
        assert!(
            tokio::time::timeout(soon, queued.next()).await.is_err(),
            "not while the Memcached cache is still filling"
        );
        memcacheds.release();
        assert_eq!(
            tokio::time::timeout(soon, queued.next()).await,
            Ok(Some(()))
        );
    }

    #[test]
    fn malformed_memcached_is_skipped_without_breaking_the_watch() {
        let invalid = prometheus::IntGauge::new("x", "x").unwrap();
        let good: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": "good", "namespace": "default"}, "spec": {"size": 1}
        }))
        .unwrap();
        let bad: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": "bad", "namespace": "default"}, "spec": {"size": "three"}
        }))
        .unwrap();
        let reported = std::cell::RefCell::new(Vec::new());
        let report = |obj: &DynamicObject, error: String| {
            reported.borrow_mut().push((obj.name_any(), error));
        };
        assert!(parse_event(watcher::Event::InitApply(bad.clone()), &invalid, report).is_none());
        assert!(parse_event(watcher::Event::Apply(bad), &invalid, report).is_none());
        assert_eq!(invalid.get(), 2);
        let reported = reported.into_inner();
        assert_eq!(reported.len(), 2, "each is reported");
        assert!(
            reported[0].0 == "bad" && reported[0].1.contains("size"),
            "{reported:?}"
        );
        match parse_event(watcher::Event::Apply(good), &invalid, |_, _| {}) {
            Some(watcher::Event::Apply(mc)) => assert_eq!(mc.spec.size, 1),
            other => panic!("good object lost: {other:?}"),
        }
        assert!(matches!(
            parse_event(watcher::Event::Init, &invalid, |_, _| {}),
            Some(watcher::Event::Init)
        ));
        assert_eq!(invalid.get(), 0, "a relist recounts invalid objects");
    }
}
