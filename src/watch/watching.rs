//! The watches of one scope: of the Memcacheds, of each kind they own, of their pods and of the
//! HorizontalPodAutoscalers; each fills its cache and queues what changed through its feed. And
//! the steps every watch takes with an event: what the cache held before it, a failed watch
//! logged, readiness released on the first list.

use std::sync::Arc;

use futures::{StreamExt, future};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus::IntGauge;
use tokio::task::JoinHandle;
use tracing::debug;

use super::feed::Feed;
use super::hpa_index::{HpaIndex, HpaSeen};
use super::known_fields::KnownFields;
use super::memcached::{WatchedMemcached, parse_event};
use super::own_writes::OwnWrites;
use super::owned::{Owned, OwnedObject};
use super::pod_index::{PodIndex, PodMeta};
use super::triggers::{self, OwnedTriggers};
use super::{Cached, Kept};
use crate::api::Memcached;
use crate::resources;
use operator_runtime::cache::{self, Cache};
use operator_runtime::initial_list::InitialList;
use operator_runtime::protobuf_watch;
use operator_runtime::readiness::{SyncGate, Unsynced};
use operator_runtime::watch_namespace::Scope;

/// What the cache held of the object an event brings, before the event is applied to it.
fn cached_before<K: Resource>(cache: &Cache<K>, event: &watcher::Event<K>) -> Option<Arc<K>> {
    match event {
        watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => cache.get_for(obj),
        _ => None,
    }
}

/// The event, or `None` after logging a watch error (the watcher retries with backoff).
fn watched<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    kind: &str,
) -> Option<watcher::Event<K>> {
    match event {
        Ok(event) => Some(event),
        Err(error) => {
            debug!(kind, %error, "watch failed; retrying");
            None
        }
    }
}

/// Releases a watch's readiness handle on its first complete list, once the list is in the
/// cache.
///
/// Not `Store::wait_until_ready`: in kube 5 it is one shared oneshot receiver that keeps only the
/// last waiter's waker.
fn released_on_first_list<K>(handle: &mut Option<Unsynced>, event: &watcher::Event<K>) {
    if matches!(event, watcher::Event::InitDone)
        && let Some(handle) = handle.take()
    {
        handle.release();
    }
}

/// What we own carries our label; the watch cache serves it.
fn owned_watch_config(initial_list: InitialList) -> watcher::Config {
    initial_list.configure(
        watcher::Config::default()
            .labels(&resources::managed_by_selector())
            .any_semantic(),
    )
}

/// What the watches of one scope share.
pub struct Watching<'a> {
    pub client: &'a Client,
    pub initial_list: InitialList,
    /// The operator's writes, told apart from drift as their echoes arrive.
    pub own_writes: &'a Arc<OwnWrites>,
    pub scope: &'a Scope,
    /// Each watch holds one of its handles until its first list is in its cache.
    pub caches: &'a SyncGate,
}

impl Watching<'_> {
    /// `owned_watch` of a kind.
    pub fn owned<K: Owned>(
        &self,
        feed: Feed,
        owned: OwnedTriggers<K>,
    ) -> (
        Cache<OwnedObject<K>>,
        impl Future<Output = ()> + Send + 'static + use<K>,
    ) {
        owned_watch(self, feed, owned)
    }

    /// `owned_watch` of a kind the operator keeps only where `kept` (served, and watchable by
    /// it).
    pub fn optional<K: Owned>(
        &self,
        kept: bool,
        feed: Feed,
        owned: OwnedTriggers<K>,
    ) -> (
        Option<Cache<OwnedObject<K>>>,
        Option<impl Future<Output = ()> + Send + 'static + use<K>>,
    ) {
        kept.then(|| self.owned(feed, owned)).unzip()
    }
}

impl Watching<'_> {
    /// The caches of what the reconciles read: the objects of each kind the operator keeps
    /// (the optional ones only where `kept` says), the pods, the HorizontalPodAutoscalers; with
    /// the tasks of their watches, each queueing through a feed of its own from `feed`.
    pub fn cached(&self, kept: Kept, feed: impl Fn() -> Feed) -> (Cached, Vec<JoinHandle<()>>) {
        let (services, service_watch) = self.owned(feed(), OwnedTriggers::services());
        // The disruption controller rewrites a budget's status whenever a pod's readiness
        // changes; the pod watch already reports that, so a status change triggers nothing.
        let (budgets, budget_watch) = self.owned(feed(), OwnedTriggers::budgets());
        let (deployments, deployment_watch) = self.owned(feed(), OwnedTriggers::deployments());
        let (config_maps, config_map_watch) = self.owned(feed(), OwnedTriggers::config_maps());
        // Watched only where this process may (a watch it may not run fails forever), and where
        // the API is served (likewise).
        let (network_policies, network_policy_watch) = self.optional(
            kept.network_policies,
            feed(),
            OwnedTriggers::network_policies(),
        );
        let (service_monitors, monitor_watch) = self.optional(
            kept.service_monitors,
            feed(),
            OwnedTriggers::service_monitors(),
        );
        let (certificates, certificate_watch) =
            self.optional(kept.certificates, feed(), OwnedTriggers::certificates());
        let (pods, pod_watch) = self.pods(feed());
        // All of them (they are not ours): one that targets an autoscaled Memcached stops the
        // operator's autoscaler.
        let (hpas, hpa_watch) = kept.autoscalers.then(|| self.hpas(feed())).unzip();
        let mut tasks = vec![
            tokio::spawn(service_watch),
            tokio::spawn(budget_watch),
            tokio::spawn(deployment_watch),
            tokio::spawn(config_map_watch),
            tokio::spawn(pod_watch),
        ];
        tasks.extend(monitor_watch.map(tokio::spawn));
        tasks.extend(network_policy_watch.map(tokio::spawn));
        tasks.extend(certificate_watch.map(tokio::spawn));
        tasks.extend(hpa_watch.map(tokio::spawn));
        let cached = Cached {
            services,
            budgets,
            deployments,
            config_maps,
            network_policies,
            service_monitors,
            certificates,
            pods,
            hpas,
            synced: self.caches.clone(),
        };
        (cached, tasks)
    }

    /// The Memcacheds: their cache, and the watch that keeps it and queues spec changes. One
    /// that does not parse is counted in `invalid` and given to `report`, and skipped.
    pub fn memcacheds<R>(
        &self,
        mut feed: Feed,
        invalid: IntGauge,
        report: R,
    ) -> (Cache<Memcached>, impl Future<Output = ()> + use<R>)
    where
        R: Fn(&ObjectMeta, String) + Send + 'static,
    {
        let (memcacheds, mut writer) = cache::new::<Memcached>();
        let mut unsynced = Some(self.caches.watch());
        let cached = memcacheds.clone();
        let watch = watcher(
            self.scope.api::<WatchedMemcached>(self.client),
            self.initial_list
                .configure(watcher::Config::default().any_semantic()),
        )
        .default_backoff()
        .filter_map(move |event| {
            future::ready(event.map(|e| parse_event(e, &invalid, &report)).transpose())
        })
        .for_each(move |event| {
            if let Some(event) = watched(event, "Memcached") {
                let before = cached_before(&cached, &event);
                let trigger = triggers::spec_change(before.as_deref(), &event);
                writer.apply_watcher_event(&event);
                released_on_first_list(&mut unsynced, &event);
                feed.fire(&event, trigger);
            }
            future::ready(())
        });
        (memcacheds, watch)
    }

    /// The pods, indexed by Memcached; each change queues its Memcached's status refresh.
    fn pods(&self, mut feed: Feed) -> (Arc<PodIndex>, impl Future<Output = ()> + use<>) {
        let pods = Arc::new(PodIndex::default());
        let mut unsynced = Some(self.caches.watch());
        let index = pods.clone();
        // In protobuf: the encoding the control plane's own pod watchers share (protobuf_watch).
        let watch = protobuf_watch::watcher::<PodMeta>(
            self.client.clone(),
            self.scope
                .api::<PodMeta>(self.client)
                .resource_url()
                .to_owned(),
            owned_watch_config(self.initial_list),
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

    /// The HorizontalPodAutoscalers by the Memcached they target.
    fn hpas(&self, mut feed: Feed) -> (Arc<HpaIndex>, impl Future<Output = ()> + use<>) {
        let hpas = Arc::new(HpaIndex::default());
        let mut unsynced = Some(self.caches.watch());
        let index = hpas.clone();
        let watch = watcher(
            self.scope.api::<HpaSeen>(self.client),
            self.initial_list
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
}

/// Watches owned objects by our label into a cache, and queues their Memcached: at high
/// priority when someone else changed what we set or deleted the object, else (an object just
/// created, our own write, or its status if `on_status`) at low.
fn owned_watch<K>(
    w: &Watching,
    mut feed: Feed,
    owned: OwnedTriggers<K>,
) -> (
    Cache<OwnedObject<K>>,
    impl Future<Output = ()> + Send + 'static + use<K>,
)
where
    K: Owned,
{
    let (reader, mut writer) = cache::new();
    let cache = reader.clone();
    let mut unsynced = Some(w.caches.watch());
    let own_writes = w.own_writes.clone();
    let mut known = KnownFields::default();
    let watch = watcher(
        w.scope.api::<OwnedObject<K>>(w.client),
        owned_watch_config(w.initial_list),
    )
    .default_backoff()
    .for_each(move |event| {
        if let Some(mut event) = watched(event, &K::kind(&())) {
            let old = cached_before(&cache, &event);
            let mut ours = false;
            match &mut event {
                watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                    let echo = own_writes.echo_of(&*obj);
                    ours = echo.is_some();
                    obj.observe(old.as_deref(), echo, &mut known);
                }
                watcher::Event::Init => own_writes.forget(),
                watcher::Event::Delete(_) | watcher::Event::InitDone => {}
            }
            let trigger = owned.trigger(old.as_deref(), &event, ours);
            writer.apply_watcher_event(&event);
            released_on_first_list(&mut unsynced, &event);
            feed.fire(&event, trigger);
        }
        future::ready(())
    });
    (reader, watch)
}
