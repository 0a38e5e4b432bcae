//! The Memcached controller: watches Memcacheds and what they own, and reconciles each one.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt, discovery::ApiResource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field, info, info_span, warn};

use crate::api::{Memcached, MemcachedStatus};
use crate::backoff::Backoff;
use crate::drift::needs_apply;
use crate::error::{Error, Result};
use crate::health::CacheSync;
use crate::metrics::{Metrics, ReconcileResult};
use crate::pod_index::PodIndex;
use crate::resources::{self, LABEL_INSTANCE, MANAGER_NAME, is_controlled_by};
use crate::status::{self, Blocked, Observed};
use crate::validation::{self, INVALID_SPEC};
use crate::workers::Workers;

/// While an object of our name belongs to someone else we cannot watch it (it is not ours), so
/// look again this often.
/// Retry delay for a reconcile that arrives before the owned caches are filled.
const CACHE_WAIT: Duration = Duration::from_millis(100);
const CONFLICT_RECHECK: Duration = Duration::from_secs(30);

/// Which namespaces the controller watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespaces(Vec<String>),
}

/// Settings of the controller, from flags and environment.
#[derive(Clone, Debug)]
pub struct Settings {
    pub scope: Scope,
    pub max_concurrent_reconciles: u16,
    /// memcached image for CRs that do not set `spec.image` (RELATED_IMAGE_MEMCACHED).
    pub default_image: String,
    /// Identity in events (the pod name when in a cluster).
    pub instance: String,
}

/// What a reconcile needs: the API client and the caches of owned objects.
pub struct Context {
    pub client: Client,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    pub pods: Arc<PodIndex>,
    pub reporter: Reporter,
    pub default_image: String,
    pub backoff: Arc<Backoff<ObjectRef<Memcached>>>,
    pub metrics: Arc<Metrics>,
    /// Whether this scope's caches have their first list.
    pub caches: Arc<CacheSync>,
}

/// Reconcile one Memcached: fetch, ensure Deployment (with replicas = size), ensure Service,
/// report status.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action> {
    let _running = ctx.metrics.start_reconcile();
    let key = ObjectRef::from_obj(&*mc);
    let result = reconcile_inner(&mc, &ctx).await;
    match &result {
        Ok(action) => {
            ctx.backoff.reset(&key);
            let label = if *action == Action::await_change() {
                ReconcileResult::Success
            } else {
                ReconcileResult::RequeueAfter
            };
            ctx.metrics.record(label, None);
        }
        Err(e) => ctx
            .metrics
            .record(ReconcileResult::Error, Some(e.metric_label())),
    }
    result
}

async fn reconcile_inner(mc: &Memcached, ctx: &Context) -> Result<Action> {
    // 1. Fetch: the controller hands us the cached Memcached. One being deleted is left to the
    //    garbage collector, which removes what it owns through owner references.
    if mc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // The controller only waits for the Memcached cache; status read from half-filled owned
    // caches would be wrong.
    if !ctx.caches.all_synced() {
        return Ok(Action::requeue(CACHE_WAIT));
    }
    let ns = mc.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);

    // Objects of our name that this Memcached does not control are left untouched, and nothing
    // else is written for it until they are gone. Nor is a spec that cannot work applied: the
    // pods running now keep serving.
    // Independent requests go out together: a reconcile's latency is its longest chain of
    // round trips, and under load each one costs tens of milliseconds.
    let (existing_deployment, existing_service) = tokio::try_join!(
        lookup(&deployments, &ctx.deployments, mc),
        lookup(&services, &ctx.services, mc),
    )?;
    let owned = [
        (
            "Deployment",
            existing_deployment.as_ref().map(|d| &d.metadata),
        ),
        ("Service", existing_service.as_ref().map(|s| &s.metadata)),
    ];
    let blocked = owned
        .into_iter()
        .find(|(_, meta)| meta.is_some_and(|m| !is_controlled_by(m, mc)))
        .map(|(kind, _)| Blocked {
            reason: status::RESOURCE_EXISTS,
            message: status::conflict_message(kind, mc),
        })
        .or_else(|| {
            validation::validate(&mc.spec).err().map(|message| Blocked {
                reason: INVALID_SPEC,
                message,
            })
        });

    let deployment = match &blocked {
        Some(b) if b.reason == status::RESOURCE_EXISTS => None,
        Some(_) => existing_deployment,
        None => {
            // 2. Ensure the Deployment, and with it 3. its size: replicas = spec.size.
            // 4. Ensure the headless Service, at the same time.
            let desired = resources::deployment(mc, &ctx.default_image);
            let (deployment, _) = tokio::try_join!(
                ensure(ctx, mc, &deployments, existing_deployment, desired),
                ensure(ctx, mc, &services, existing_service, resources::service(mc)),
            )?;
            Some(deployment)
        }
    };

    // 5. Report status.
    let observed = Observed {
        deployment: deployment.as_deref(),
        pods: ctx
            .pods
            .pods_of(&mc.namespace().unwrap_or_default(), &mc.name_any()),
        blocked: blocked.clone(),
    };
    let new_status =
        status::desired_status(mc, &observed, &Time(k8s_openapi::jiff::Timestamp::now()));
    if mc.status.as_ref() != Some(&new_status) {
        patch_status(ctx, mc, &new_status).await?;
    }
    let Some(Blocked { reason, message }) = blocked else {
        return Ok(Action::await_change());
    };
    // Warn once per cause, not on every recheck.
    let already_warned = mc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::DEGRADED && c.status == "True" && c.reason == reason)
    });
    if !already_warned {
        publish(
            ctx,
            mc,
            None,
            EventType::Warning,
            reason,
            "Reconcile",
            message,
        );
    }
    Ok(if reason == status::RESOURCE_EXISTS {
        // We cannot watch what is not ours, so look again later.
        Action::requeue(CONFLICT_RECHECK)
    } else {
        // A spec change triggers the next reconcile.
        Action::await_change()
    })
}

/// Failed reconciles retry with per-object exponential backoff.
pub fn error_policy(mc: Arc<Memcached>, error: &Error, ctx: Arc<Context>) -> Action {
    Action::requeue(retry_delay(&mc, error, &ctx))
}

fn retry_delay(mc: &Memcached, error: &Error, ctx: &Context) -> Duration {
    let delay = ctx.backoff.next_delay(ObjectRef::from_obj(mc));
    warn!(memcached = %mc.name_any(), namespace = mc.namespace().unwrap_or_default(), error = %error,
          reason = error.metric_label(), retry_in = ?delay, "reconcile failed");
    delay
}

/// The owned object of the Memcached's name: from the cache of labelled objects, else from the
/// API server, since a foreign object of that name (which the cache never holds) must be seen.
async fn lookup<K>(api: &Api<K>, cache: &Store<K>, mc: &Memcached) -> Result<Option<Arc<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = mc.name_any();
    if let Some(cached) =
        cache.get(&ObjectRef::new(&name).within(&mc.namespace().unwrap_or_default()))
    {
        return Ok(Some(cached));
    }
    match api.get_opt(&name).await {
        Ok(found) => Ok(found.map(Arc::new)),
        Err(source) => Err(Error::Read {
            kind: K::kind(&()).into_owned(),
            name,
            source,
        }),
    }
}

/// Applies `desired` unless `existing` already holds it; returns the object as it now is.
async fn ensure<K>(
    ctx: &Context,
    mc: &Memcached,
    api: &Api<K>,
    existing: Option<Arc<K>>,
    desired: K,
) -> Result<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    if let Some(existing) = &existing
        && !needs_apply(&desired, existing.as_ref())
    {
        return Ok(existing.clone());
    }
    let kind = K::kind(&());
    let name = desired.name_any();
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(MANAGER_NAME).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(|source| Error::Apply {
            kind: kind.clone().into_owned(),
            name: name.clone(),
            source,
        })?;
    let (reason, note) = change_note(&kind, existing.as_deref(), &applied, mc);
    info!(kind = %kind, name = %name, reason, "{note}");
    publish(
        ctx,
        mc,
        Some(applied.object_ref(&())),
        EventType::Normal,
        reason,
        "Apply",
        note,
    );
    Ok(Arc::new(applied))
}

/// Event reason and text for an apply: created, scaled, or drift restored.
fn change_note<K: Resource + Serialize>(
    kind: &str,
    before: Option<&K>,
    after: &K,
    mc: &Memcached,
) -> (&'static str, String) {
    let name = after.name_any();
    let Some(before) = before else {
        return ("Created", format!("Created {kind} {name}"));
    };
    let replicas = |o: &K| {
        serde_json::to_value(o)
            .ok()
            .and_then(|v| v["spec"]["replicas"].as_i64())
    };
    match (replicas(before), replicas(after)) {
        (Some(old), Some(new)) if old != new && spec_changed(mc) => (
            "Scaled",
            format!("Scaled {kind} {name} from {old} to {new} replicas"),
        ),
        (Some(old), Some(new)) if old != new => (
            "DriftRestored",
            format!("Restored {kind} {name} to {new} replicas (was changed to {old})"),
        ),
        _ => (
            "Updated",
            format!("Updated {kind} {name} to match the Memcached spec"),
        ),
    }
}

/// Whether the spec changed since the last status was written: then a replica difference is the
/// user's new size, not someone scaling the Deployment behind our back.
fn spec_changed(mc: &Memcached) -> bool {
    mc.status.as_ref().and_then(|s| s.observed_generation) != mc.metadata.generation
}

async fn patch_status(ctx: &Context, mc: &Memcached, status: &MemcachedStatus) -> Result<()> {
    let api: Api<Memcached> =
        Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "status": status,
    });
    api.patch_status(
        &mc.name_any(),
        &PatchParams::apply(MANAGER_NAME).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| Error::Status {
        name: mc.name_any(),
        source,
    })?;
    Ok(())
}

/// Records an event on the Memcached, `related` to the owned object it concerns. Best-effort:
/// failing to record one must not fail the reconcile. Sent in the background, as client-go's
/// recorder does: a worker does not wait a round trip for it (one in three of a changing
/// reconcile's). An event still in flight when the process exits is lost.
///
/// A fresh Recorder each time: kube's Recorder folds events with the same reason into one series
/// whatever their note, so "Scaled from 3 to 5" then "from 5 to 2" would show the first text
/// twice. We only record real changes, so there is no flood to fold.
fn publish(
    ctx: &Context,
    mc: &Memcached,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: related,
    };
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let regarding = mc.object_ref(&());
    tokio::spawn(async move {
        if let Err(error) = recorder.publish(&event, &regarding).await {
            warn!(%error, reason = event.reason, "could not record event");
        }
    });
}

/// Turns a watch event of raw objects into one of Memcacheds, dropping objects that do not parse
/// so that one malformed object cannot break the watch for all the others.
pub fn parse_event(
    event: watcher::Event<DynamicObject>,
    invalid: &prometheus::IntGauge,
) -> Option<watcher::Event<Memcached>> {
    let parse = |obj: DynamicObject| {
        let name = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
        match obj.try_parse::<Memcached>() {
            Ok(mc) => Some(mc),
            Err(error) => {
                invalid.inc();
                warn!(memcached = %name, %error, "skipping Memcached that does not match the API schema");
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

/// Runs the controller until `shutdown` is cancelled, then lets in-flight reconciles finish.
/// One controller a watched namespace (or one for all), sharing the metrics, backoff and workers.
///
/// Caches fill and stay current whether or not `leading` is true, so a follower that takes over
/// starts from warm caches (as controller-runtime's followers do); until then every reconcile is
/// skipped, and the moment `leading` turns true every cached Memcached is queued.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Arc<crate::health::Health>,
    shutdown: CancellationToken,
    leading: watch::Receiver<bool>,
) {
    metrics.set_max_concurrent_reconciles(settings.max_concurrent_reconciles);
    let reporter = Reporter {
        controller: MANAGER_NAME.into(),
        instance: Some(settings.instance.clone()),
    };
    let backoff = Arc::new(Backoff::default());
    let namespaces: Vec<Option<String>> = match &settings.scope {
        Scope::All => vec![None],
        Scope::Namespaces(list) => list.iter().cloned().map(Some).collect(),
    };
    health.expect_caches(namespaces.len() * CACHES_PER_SCOPE);
    // One set of workers for every scope: the limit is the process's, as in controller-runtime.
    let workers = Arc::new(Workers::new(
        settings.max_concurrent_reconciles,
        shutdown.clone(),
    ));
    let controllers = namespaces.into_iter().map(|ns| {
        let ctx = ContextParts {
            client: client.clone(),
            reporter: reporter.clone(),
            default_image: settings.default_image.clone(),
            backoff: backoff.clone(),
            metrics: metrics.clone(),
            health: health.clone(),
            workers: workers.clone(),
        };
        run_scope(ctx, ns, shutdown.clone(), leading.clone())
    });
    future::join_all(controllers).await;
}

struct ContextParts {
    client: Client,
    reporter: Reporter,
    default_image: String,
    backoff: Arc<Backoff<ObjectRef<Memcached>>>,
    metrics: Arc<Metrics>,
    health: Arc<crate::health::Health>,
    workers: Arc<Workers<ObjectRef<Memcached>>>,
}

fn api_in<K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>>(
    client: &Client,
    ns: Option<&str>,
) -> Api<K> {
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Caches each scope fills from a watch: Memcacheds, Deployments, Services, Pods.
const CACHES_PER_SCOPE: usize = 4;

/// Reports a watch's first complete list to the readiness state.
///
/// Not `Store::wait_until_ready`: in kube 5 it is one shared oneshot receiver that keeps only the
/// last waiter's waker, and the controller already waits on the Memcached store, so a second
/// waiter can leave one of the two asleep for good.
fn synced_once<K>(sync: Arc<CacheSync>) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
    let mut seen = false;
    move |event| {
        if !seen && matches!(event, Ok(watcher::Event::InitDone)) {
            seen = true;
            sync.synced();
        }
    }
}

/// Yields once, when `leading` turns true (at once if it already is).
fn became_leader(mut leading: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::once(async move { leading.wait_for(|l| *l).await.is_ok() })
        .filter(|gained| future::ready(*gained))
        .map(|_| ())
}

/// managedFields are most of a cached object's size (one entry per writer: us, the
/// kube-controller-manager, the kubelet) and nothing here reads them.
fn drop_managed_fields<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
}

/// Watches owned objects by our label into a cache, and yields them as reconcile triggers.
fn owned_stream<K>(
    api: Api<K>,
    sync: &Arc<CacheSync>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default()
        .labels(&resources::managed_by_selector())
        .any_semantic();
    let stream = watcher(api, config)
        .default_backoff()
        .inspect(synced_once(sync.clone()))
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

async fn run_scope(
    parts: ContextParts,
    ns: Option<String>,
    shutdown: CancellationToken,
    leading: watch::Receiver<bool>,
) {
    let client = &parts.client;
    let ns = ns.as_deref();

    let gvk = GroupVersionKind::gvk(
        &Memcached::group(&()),
        &Memcached::version(&()),
        &Memcached::kind(&()),
    );
    let ar = ApiResource::from_gvk_with_plural(&gvk, &Memcached::plural(&()));
    let raw: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let invalid = parts.metrics.invalid_objects.clone();
    let (mc_reader, mc_writer) = reflector::store::<Memcached>();
    let sync = &Arc::new(CacheSync::new(CACHES_PER_SCOPE, parts.health.clone()));
    let memcacheds = watcher(raw, watcher::Config::default().any_semantic())
        .default_backoff()
        .inspect(synced_once(sync.clone()))
        .filter_map(move |event| future::ready(event.map(|e| parse_event(e, &invalid)).transpose()))
        .modify(drop_managed_fields)
        .reflect(mc_writer)
        .applied_objects()
        // Status writes do not change the generation, so the controller does not wake itself.
        .predicate_filter(predicates::generation, Default::default())
        .filter(unless_waiting(parts.workers.clone(), |mc: &Memcached| {
            Some(ObjectRef::from_obj(mc))
        }));

    let (deployments, deployment_events) = owned_stream::<Deployment>(api_in(client, ns), sync);
    let (services, service_events) = owned_stream::<Service>(api_in(client, ns), sync);
    let deployment_events = deployment_events.filter(unless_waiting(
        parts.workers.clone(),
        controller_of::<Deployment>,
    ));
    let service_events = service_events.filter(unless_waiting(
        parts.workers.clone(),
        controller_of::<Service>,
    ));
    let pods = Arc::new(PodIndex::default());
    let pod_config = watcher::Config::default()
        .labels(&resources::managed_by_selector())
        .any_semantic();
    let pod_events = watcher(api_in::<PartialObjectMeta<Pod>>(client, ns), pod_config)
        .default_backoff()
        .inspect(synced_once(sync.clone()))
        .inspect({
            let pods = pods.clone();
            move |event| {
                if let Ok(event) = event {
                    pods.observe(event);
                }
            }
        })
        .touched_objects()
        .filter(unless_waiting(parts.workers.clone(), memcached_of_pod));

    let ctx = Arc::new(Context {
        client: client.clone(),
        deployments,
        services,
        pods,
        reporter: parts.reporter,
        default_image: parts.default_image,
        backoff: parts.backoff,
        metrics: parts.metrics,
        caches: sync.clone(),
    });
    let scope = ns.unwrap_or("*").to_string();
    let shutdown_signal = shutdown.clone();
    let latest = mc_reader.clone();
    let workers = parts.workers;
    // No concurrency limit here: `workers` is the limit, and keeps the order (see workers.rs).
    Controller::for_stream(memcacheds, mc_reader)
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .watches_stream(pod_events, |pod| memcached_of_pod(&pod))
        .reconcile_all_on(became_leader(leading.clone()))
        .graceful_shutdown_on(async move { shutdown_signal.cancelled().await })
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
                    // Boxed: thousands may wait for a worker, each as small as it can be.
                    Box::pin(reconcile(mc, ctx)).instrument(span).await
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
        })
        .await;
    info!(scope, "controller stopped");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;
    use serde_json::json;

    use super::*;
    use crate::fixtures::apiserver::{self, ApiServer};
    use crate::fixtures::{deployment_with_status, memcached};
    use crate::status::{AVAILABLE, DEGRADED, RESOURCE_EXISTS};

    const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/cache";
    const SERVICE: &str = "/api/v1/namespaces/default/services/cache";
    const STATUS: &str =
        "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

    /// Runs a reconcile against a scripted API server; the script must consume every request.
    async fn scenario<F>(
        mc: Memcached,
        ctx: Arc<Context>,
        api: ApiServer,
        script: impl FnOnce(ApiServer) -> F,
    ) -> Result<Action>
    where
        F: Future<Output = ApiServer> + Send + 'static,
    {
        let server = tokio::spawn(script(api));
        let result = tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(mc), ctx))
            .await
            .expect("reconcile sent a request the script did not expect");
        server.await.expect("the script's assertions hold");
        result
    }

    /// Splits requests answered in any order into event creations and the one status apply.
    fn events_and_status(seen: Vec<apiserver::Seen>) -> (Vec<apiserver::Seen>, apiserver::Seen) {
        let (mut status, events): (Vec<_>, Vec<_>) =
            seen.into_iter().partition(|r| r.path() == STATUS);
        assert!(
            events
                .iter()
                .all(|e| (e.method.as_str(), e.path()) == ("POST", EVENTS))
        );
        assert_eq!(status.len(), 1, "one status apply");
        (events, status.remove(0))
    }

    fn condition(body: &serde_json::Value, type_: &str) -> (String, String) {
        let c = body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap();
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
        )
    }

    #[tokio::test]
    async fn new_cr_gets_deployment_service_events_and_status() {
        let (ctx, api, _caches) = apiserver::context();
        let mc = memcached("cache", 3);
        let action = scenario(mc.clone(), ctx, api, |mut api| async move {
            api.not_found(DEPLOYMENT).await;
            api.not_found(SERVICE).await;
            let apply = api.echo("PATCH", DEPLOYMENT).await;
            assert!(
                apply
                    .path_and_query
                    .contains("fieldManager=memcached-operator")
            );
            assert!(apply.path_and_query.contains("force=true"));
            assert_eq!(apply.body["spec"]["replicas"], 3);
            assert_eq!(
                apply.body["metadata"]["ownerReferences"][0]["uid"],
                "uid-cache"
            );
            // The Service apply goes out with the Deployment's, before either answer's event.
            let svc = api.echo("PATCH", SERVICE).await;
            assert_eq!(svc.body["spec"]["clusterIP"], "None");
            // Then the status, with the events going out in the background.
            let (events, status) = events_and_status(api.echo_any_order(3, &mc).await);
            let mut events: Vec<_> = events.into_iter().map(|e| e.body).collect();
            events.sort_by_key(|e| e["note"].to_string());
            let described: Vec<_> = events
                .iter()
                .map(|e| {
                    (
                        e["reason"].clone(),
                        e["note"].clone(),
                        e["related"]["kind"].clone(),
                    )
                })
                .collect();
            assert_eq!(
                described,
                [
                    (
                        json!("Created"),
                        json!("Created Deployment cache"),
                        json!("Deployment")
                    ),
                    (
                        json!("Created"),
                        json!("Created Service cache"),
                        json!("Service")
                    ),
                ]
            );
            assert_eq!(condition(&status.body, AVAILABLE).0, "False");
            assert_eq!(status.body["status"]["observedGeneration"], 1);
            api
        })
        .await
        .unwrap();
        assert_eq!(action, Action::await_change());
    }

    /// Fills the caches as after a converged reconcile of `mc`, and gives `mc` the status the
    /// operator wrote then.
    fn converged(mc: &mut Memcached, caches: &mut apiserver::Caches) {
        let d = deployment_with_status(mc, mc.spec.size, mc.spec.size);
        caches.add_deployment(d.clone());
        caches.add_service(resources::service(mc));
        let observed = Observed {
            deployment: Some(&d),
            ..Default::default()
        };
        mc.status = Some(status::desired_status(
            mc,
            &observed,
            &crate::fixtures::time(0),
        ));
    }

    #[tokio::test]
    async fn converged_cr_makes_no_requests() {
        let (ctx, api, mut caches) = apiserver::context();
        let mut mc = memcached("cache", 3);
        converged(&mut mc, &mut caches);
        let action = scenario(mc, ctx, api, |api| async move { api })
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
    }

    #[tokio::test]
    async fn size_change_scales_the_deployment() {
        let (ctx, api, mut caches) = apiserver::context();
        let mut mc = memcached("cache", 3);
        converged(&mut mc, &mut caches);
        mc.spec.size = 5;
        mc.metadata.generation = Some(2);

        scenario(mc.clone(), ctx, api, |mut api| async move {
            let apply = api.echo("PATCH", DEPLOYMENT).await;
            assert_eq!(apply.body["spec"]["replicas"], 5);
            let (events, status) = events_and_status(api.echo_any_order(2, &mc).await);
            let [event] = &events[..] else {
                panic!("one event, not {}", events.len())
            };
            assert_eq!(event.body["reason"], "Scaled");
            assert_eq!(
                event.body["note"],
                "Scaled Deployment cache from 3 to 5 replicas"
            );
            assert_eq!(status.body["status"]["observedGeneration"], 2);
            assert_eq!(condition(&status.body, AVAILABLE).0, "False");
            api
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn foreign_deployment_is_left_untouched_with_a_warning() {
        let (ctx, api, _caches) = apiserver::context();
        let mc = memcached("cache", 1);
        let mut foreign = resources::deployment(&mc, "someone/else");
        foreign.metadata.owner_references = None;
        foreign.metadata.labels = None;
        let foreign = serde_json::to_value(&foreign).unwrap();
        let action = scenario(mc.clone(), ctx, api, |mut api| async move {
            api.expect("GET", DEPLOYMENT, StatusCode::OK, move |_| foreign)
                .await;
            api.not_found(SERVICE).await;
            let status = api.echo_status(STATUS, &mc).await;
            assert_eq!(
                condition(&status.body, DEGRADED),
                ("True".into(), RESOURCE_EXISTS.into())
            );
            let event = api.echo("POST", EVENTS).await;
            assert_eq!(
                (event.body["type"].as_str(), event.body["reason"].as_str()),
                (Some("Warning"), Some(RESOURCE_EXISTS))
            );
            api
        })
        .await
        .unwrap();
        assert_eq!(action, Action::requeue(CONFLICT_RECHECK));
    }

    #[tokio::test]
    async fn api_error_backs_off_per_object() {
        let (ctx, api, _caches) = apiserver::context();
        let mc = memcached("cache", 1);
        let server_error = |_: &serde_json::Value| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is sad"});
        let err = scenario(mc.clone(), ctx.clone(), api, |mut api| async move {
            api.not_found(DEPLOYMENT).await;
            api.not_found(SERVICE).await;
            api.expect(
                "PATCH",
                DEPLOYMENT,
                StatusCode::INTERNAL_SERVER_ERROR,
                server_error,
            )
            .await;
            api
        })
        .await
        .unwrap_err();
        assert_eq!(err.metric_label(), "apply");

        let delays: Vec<Duration> = (0..3).map(|_| retry_delay(&mc, &err, &ctx)).collect();
        let ms: Vec<f64> = delays.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        assert!(
            (4.5..=5.5).contains(&ms[0])
                && (9.0..=11.0).contains(&ms[1])
                && (18.0..=22.0).contains(&ms[2]),
            "{ms:?}"
        );
        let other = memcached("other", 1);
        assert!(
            retry_delay(&other, &err, &ctx) <= Duration::from_micros(5500),
            "backoff is per object"
        );
        assert!(
            ctx.metrics
                .render()
                .contains(r#"controller_runtime_reconcile_errors_total{controller="memcached"} 1"#)
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
        assert!(parse_event(watcher::Event::InitApply(bad.clone()), &invalid).is_none());
        assert!(parse_event(watcher::Event::Apply(bad), &invalid).is_none());
        assert_eq!(invalid.get(), 2);
        match parse_event(watcher::Event::Apply(good), &invalid) {
            Some(watcher::Event::Apply(mc)) => assert_eq!(mc.spec.size, 1),
            other => panic!("good object lost: {other:?}"),
        }
        assert!(matches!(
            parse_event(watcher::Event::Init, &invalid),
            Some(watcher::Event::Init)
        ));
        assert_eq!(invalid.get(), 0, "a relist recounts invalid objects");
    }
}
