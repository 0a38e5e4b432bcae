//! The Memcached controller: watches Memcacheds and what they own, and reconciles each one.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, future};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PartialObjectMeta};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt, discovery::ApiResource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, field, info, info_span, warn};

use crate::api::{Memcached, MemcachedStatus};
use crate::backoff::Backoff;
use crate::drift::needs_apply;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, ReconcileResult};
use crate::resources::{self, LABEL_INSTANCE, MANAGER_NAME, is_controlled_by};
use crate::status::{self, Observed};

/// While an object of our name belongs to someone else we cannot watch it (it is not ours), so
/// look again this often.
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
    pub pods: Store<PartialObjectMeta<Pod>>,
    pub recorder: Recorder,
    pub default_image: String,
    pub backoff: Arc<Backoff<ObjectRef<Memcached>>>,
    pub metrics: Arc<Metrics>,
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
        Err(e) => ctx.metrics.record(ReconcileResult::Error, Some(e.metric_label())),
    }
    result
}

async fn reconcile_inner(mc: &Memcached, ctx: &Context) -> Result<Action> {
    // 1. Fetch: the controller hands us the cached Memcached. One being deleted is left to the
    //    garbage collector, which removes what it owns through owner references.
    if mc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = mc.namespace().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);

    // Objects of our name that this Memcached does not control are left untouched, and nothing
    // else is written for it until they are gone.
    let existing_deployment = lookup(&deployments, &ctx.deployments, mc).await?;
    let existing_service = lookup(&services, &ctx.services, mc).await?;
    let conflict = [("Deployment", existing_deployment.as_ref().map(|d| &d.metadata)),
                    ("Service", existing_service.as_ref().map(|s| &s.metadata))]
        .into_iter()
        .find(|(_, meta)| meta.is_some_and(|m| !is_controlled_by(m, mc)))
        .map(|(kind, _)| status::conflict_message(kind, mc));

    let deployment = match &conflict {
        Some(_) => None,
        None => {
            // 2. Ensure the Deployment, and with it 3. its size: replicas = spec.size.
            let desired = resources::deployment(mc, &ctx.default_image);
            let deployment = ensure(ctx, mc, &deployments, existing_deployment, desired).await?;
            // 4. Ensure the headless Service.
            ensure(ctx, mc, &services, existing_service, resources::service(mc)).await?;
            Some(deployment)
        }
    };

    // 5. Report status.
    let observed = Observed {
        deployment: deployment.as_deref(),
        pods: pod_names(&ctx.pods, mc),
        conflict: conflict.clone(),
    };
    let new_status = status::desired_status(mc, &observed, &Time(k8s_openapi::jiff::Timestamp::now()));
    let was_degraded_by_conflict = mc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::DEGRADED && c.reason == status::RESOURCE_EXISTS && c.status == "True")
    });
    if mc.status.as_ref() != Some(&new_status) {
        patch_status(ctx, mc, &new_status).await?;
    }
    match conflict {
        Some(message) => {
            if !was_degraded_by_conflict {
                publish(ctx, mc, EventType::Warning, status::RESOURCE_EXISTS, "Reconcile", message).await;
            }
            Ok(Action::requeue(CONFLICT_RECHECK))
        }
        None => Ok(Action::await_change()),
    }
}

/// Failed reconciles retry with per-object exponential backoff.
pub fn error_policy(mc: Arc<Memcached>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next_delay(ObjectRef::from_obj(&*mc));
    warn!(memcached = %mc.name_any(), namespace = mc.namespace().unwrap_or_default(), error = %error,
          reason = error.metric_label(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The owned object of the Memcached's name: from the cache of labelled objects, else from the
/// API server, since a foreign object of that name (which the cache never holds) must be seen.
async fn lookup<K>(api: &Api<K>, cache: &Store<K>, mc: &Memcached) -> Result<Option<Arc<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = mc.name_any();
    if let Some(cached) = cache.get(&ObjectRef::new(&name).within(&mc.namespace().unwrap_or_default())) {
        return Ok(Some(cached));
    }
    match api.get_opt(&name).await {
        Ok(found) => Ok(found.map(Arc::new)),
        Err(source) => Err(Error::Read { kind: K::kind(&()).into_owned(), name, source }),
    }
}

/// Applies `desired` unless `existing` already holds it; returns the object as it now is.
async fn ensure<K>(ctx: &Context, mc: &Memcached, api: &Api<K>, existing: Option<Arc<K>>, desired: K) -> Result<Arc<K>>
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
        .patch(&name, &PatchParams::apply(MANAGER_NAME).force(), &Patch::Apply(&desired))
        .await
        .map_err(|source| Error::Apply { kind: kind.clone().into_owned(), name: name.clone(), source })?;
    let (reason, note) = change_note(&kind, existing.as_deref(), &applied, mc);
    info!(kind = %kind, name = %name, reason, "{note}");
    publish(ctx, mc, EventType::Normal, reason, "Apply", note).await;
    Ok(Arc::new(applied))
}

/// Event reason and text for an apply: created, scaled, or drift restored.
fn change_note<K: Resource + Serialize>(kind: &str, before: Option<&K>, after: &K, mc: &Memcached) -> (&'static str, String) {
    let name = after.name_any();
    let Some(before) = before else {
        return ("Created", format!("Created {kind} {name}"));
    };
    let replicas = |o: &K| serde_json::to_value(o).ok().and_then(|v| v["spec"]["replicas"].as_i64());
    match (replicas(before), replicas(after)) {
        (Some(old), Some(new)) if old != new && new == i64::from(mc.spec.size) && mc_size_changed(mc, old) => {
            ("Scaled", format!("Scaled {kind} {name} from {old} to {new} replicas"))
        }
        (Some(old), Some(new)) if old != new => {
            ("DriftRestored", format!("Restored {kind} {name} to {new} replicas (was changed to {old})"))
        }
        _ => ("Updated", format!("Updated {kind} {name} to match the Memcached spec")),
    }
}

/// Whether `old` replicas is what the Memcached last asked for, so a difference means the user
/// changed `spec.size` rather than someone scaling the Deployment behind our back.
fn mc_size_changed(mc: &Memcached, old: i64) -> bool {
    mc.status.as_ref().is_none_or(|s| i64::from(s.replicas) == old)
}

/// Names of the Memcached's pods, from the metadata-only pod cache.
fn pod_names(pods: &Store<PartialObjectMeta<Pod>>, mc: &Memcached) -> Vec<String> {
    let ns = mc.namespace();
    let name = mc.name_any();
    pods.state()
        .iter()
        .filter(|p| p.metadata.namespace == ns && p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.labels().get(LABEL_INSTANCE) == Some(&name))
        .map(|p| p.name_any())
        .collect()
}

async fn patch_status(ctx: &Context, mc: &Memcached, status: &MemcachedStatus) -> Result<()> {
    let api: Api<Memcached> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "status": status,
    });
    api.patch_status(&mc.name_any(), &PatchParams::apply(MANAGER_NAME).force(), &Patch::Apply(&patch))
        .await
        .map_err(|source| Error::Status { name: mc.name_any(), source })?;
    Ok(())
}

/// Events are best-effort: failing to record one must not fail the reconcile.
async fn publish(ctx: &Context, mc: &Memcached, type_: EventType, reason: &str, action: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &mc.object_ref(&())).await {
        warn!(%error, reason, "could not record event");
    }
}


/// Turns a watch event of raw objects into one of Memcacheds, dropping objects that do not parse
/// so that one malformed object cannot break the watch for all the others.
pub fn parse_event(event: watcher::Event<DynamicObject>, invalid: &prometheus::IntGauge) -> Option<watcher::Event<Memcached>> {
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
/// One controller a watched namespace (or one for all), sharing the metrics and backoff.
pub async fn run(client: Client, settings: Settings, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    metrics.set_max_concurrent_reconciles(settings.max_concurrent_reconciles);
    let reporter = Reporter { controller: MANAGER_NAME.into(), instance: Some(settings.instance.clone()) };
    let recorder = Recorder::new(client.clone(), reporter);
    let backoff = Arc::new(Backoff::default());
    let namespaces: Vec<Option<String>> = match &settings.scope {
        Scope::All => vec![None],
        Scope::Namespaces(list) => list.iter().cloned().map(Some).collect(),
    };
    let controllers = namespaces.into_iter().map(|ns| {
        let ctx = ContextParts {
            client: client.clone(),
            recorder: recorder.clone(),
            default_image: settings.default_image.clone(),
            backoff: backoff.clone(),
            metrics: metrics.clone(),
        };
        run_scope(ctx, ns, settings.max_concurrent_reconciles, shutdown.clone())
    });
    future::join_all(controllers).await;
}

struct ContextParts {
    client: Client,
    recorder: Recorder,
    default_image: String,
    backoff: Arc<Backoff<ObjectRef<Memcached>>>,
    metrics: Arc<Metrics>,
}

fn api_in<K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>>(client: &Client, ns: Option<&str>) -> Api<K> {
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Watches owned objects by our label into a cache, and yields them as reconcile triggers.
fn owned_stream<K>(api: Api<K>) -> (Store<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&resources::managed_by_selector()).any_semantic();
    let stream = watcher(api, config).default_backoff().reflect(writer).applied_objects();
    (reader, stream)
}

async fn run_scope(parts: ContextParts, ns: Option<String>, concurrency: u16, shutdown: CancellationToken) {
    let client = &parts.client;
    let ns = ns.as_deref();

    let gvk = GroupVersionKind::gvk(&Memcached::group(&()), &Memcached::version(&()), &Memcached::kind(&()));
    let ar = ApiResource::from_gvk_with_plural(&gvk, &Memcached::plural(&()));
    let raw: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let invalid = parts.metrics.invalid_objects.clone();
    let (mc_reader, mc_writer) = reflector::store::<Memcached>();
    let memcacheds = watcher(raw, watcher::Config::default().any_semantic())
        .default_backoff()
        .filter_map(move |event| future::ready(event.map(|e| parse_event(e, &invalid)).transpose()))
        .reflect(mc_writer)
        .applied_objects()
        // Status writes do not change the generation, so the controller does not wake itself.
        .predicate_filter(predicates::generation, Default::default());

    let (deployments, deployment_events) = owned_stream::<Deployment>(api_in(client, ns));
    let (services, service_events) = owned_stream::<Service>(api_in(client, ns));
    let (pod_reader, pod_writer) = reflector::store();
    let pod_config = watcher::Config::default().labels(&resources::managed_by_selector()).any_semantic();
    let pod_events = watcher(api_in::<PartialObjectMeta<Pod>>(client, ns), pod_config)
        .default_backoff()
        .reflect(pod_writer)
        .touched_objects();

    let ctx = Arc::new(Context {
        client: client.clone(),
        deployments,
        services,
        pods: pod_reader,
        recorder: parts.recorder,
        default_image: parts.default_image,
        backoff: parts.backoff,
        metrics: parts.metrics,
    });
    let scope = ns.unwrap_or("*").to_string();
    let shutdown_signal = shutdown.clone();
    Controller::for_stream(memcacheds, mc_reader)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .watches_stream(pod_events, |pod: PartialObjectMeta<Pod>| {
            let ns = pod.namespace()?;
            let instance = pod.labels().get(LABEL_INSTANCE)?;
            Some(ObjectRef::<Memcached>::new(instance).within(&ns))
        })
        .graceful_shutdown_on(async move { shutdown_signal.cancelled().await })
        .run(
            |mc, ctx| {
                let span = info_span!("reconcile", namespace = field::Empty, memcached = field::Empty);
                span.record("namespace", mc.namespace().unwrap_or_default());
                span.record("memcached", mc.name_any());
                reconcile(mc, ctx).instrument(span)
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
