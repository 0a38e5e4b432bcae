//! The watch of one owned kind, and the steps every watch of the wiring takes with an event:
//! what the cache held before it, a failed watch logged, readiness released on the first list.

use std::sync::Arc;

use futures::{StreamExt, future};
use kube::Resource;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::debug;

use super::Shared;
use crate::controller::feed::Feed;
use crate::controller::known_fields::KnownFields;
use crate::controller::owned::{Owned, OwnedObject};
use crate::controller::triggers::OwnedTriggers;
use crate::resources;
use operator_runtime::cache::{self, Cache};
use operator_runtime::initial_list::InitialList;
use operator_runtime::readiness::{SyncGate, Unsynced};
use operator_runtime::watch_namespace::Scope;

/// What the cache held of the object an event brings, before the event is applied to it.
pub(super) fn cached_before<K: Resource>(
    cache: &Cache<K>,
    event: &watcher::Event<K>,
) -> Option<Arc<K>> {
    match event {
        watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => cache.get_for(obj),
        _ => None,
    }
}

/// The event, or `None` after logging a watch error (the watcher retries with backoff).
pub(super) fn watched<K>(
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
pub(super) fn released_on_first_list<K>(handle: &mut Option<Unsynced>, event: &watcher::Event<K>) {
    if matches!(event, watcher::Event::InitDone)
        && let Some(handle) = handle.take()
    {
        handle.release();
    }
}

/// What we own carries our label; the watch cache serves it.
pub(super) fn owned_watch_config(initial_list: InitialList) -> watcher::Config {
    initial_list.configure(
        watcher::Config::default()
            .labels(&resources::managed_by_selector())
            .any_semantic(),
    )
}

/// What the watches of one scope share.
pub(super) struct Watching<'a> {
    pub shared: &'a Shared,
    pub scope: &'a Scope,
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
        owned_watch(self.shared, self.scope, self.caches, feed, owned)
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

/// Watches owned objects by our label into a cache, and queues their Memcached: at high
/// priority when someone else changed what we set or deleted the object, else (an object just
/// created, our own write, or its status if `on_status`) at low.
fn owned_watch<K>(
    shared: &Shared,
    scope: &Scope,
    caches: &SyncGate,
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
    let mut unsynced = Some(caches.watch());
    let own_writes = shared.own_writes.clone();
    let mut known = KnownFields::default();
    let watch = watcher(
        scope.api::<OwnedObject<K>>(&shared.client),
        owned_watch_config(shared.initial_list),
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
