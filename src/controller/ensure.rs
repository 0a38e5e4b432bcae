//! The API calls that keep one owned object as a Memcached wants it: look it up (from the cache,
//! or with a read while someone else's object holds its name), apply it unless it already holds
//! what we want, delete one no longer wanted; and the Memcached's status patch.

use std::sync::Arc;

use kube::Client;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Resource, ResourceExt};

use super::context::Context;
use super::events::Change;
use crate::api::{Memcached, MemcachedStatus};
use crate::error::{Error, Result};
use crate::resources::{MANAGER_NAME, is_controlled_by};
use crate::status;
use crate::watch::known_fields::KnownFields;
use crate::watch::memcached::WatchedMemcached;
use crate::watch::owned::{Owned, OwnedObject};
use operator_runtime::cache::Cache;

/// An object only some specs want (the disruption budget, the NetworkPolicy, the
/// ServiceMonitor) as wanted: applied, or ours deleted when none is wanted any more. `api` is
/// None where the operator keeps none of the kind (its API not served, or not watchable).
pub async fn ensure_optional<K: Owned>(
    ctx: &Context,
    mc: &Memcached,
    api: Option<&Api<OwnedObject<K>>>,
    existing: Option<Arc<OwnedObject<K>>>,
    desired: Option<K>,
) -> Result<()> {
    let Some(api) = api else { return Ok(()) };
    match (desired, existing) {
        // Its creation follows from the members', which have the events.
        (Some(desired), existing) => {
            ensure(ctx, mc, api, existing, desired, Announce::Changes).await?;
        }
        (None, Some(existing)) if is_controlled_by(existing.meta(), mc) => {
            delete(ctx, mc, api, &existing, &Change::Deleted).await?;
        }
        (None, _) => {}
    }
    Ok(())
}

/// Deletes `existing` (this one only: its uid), with an event saying `change`; one already gone
/// is no error.
pub async fn delete<K: Owned>(
    ctx: &Context,
    mc: &Memcached,
    api: &Api<OwnedObject<K>>,
    existing: &OwnedObject<K>,
    change: &Change,
) -> Result<()> {
    let name = existing.name_any();
    match api.delete(&name, &only_this(existing.uid())).await {
        Ok(_) => ctx.events.applied(mc, existing, change),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(source) => {
            return Err(Error::Apply {
                kind: K::kind(&()).into_owned(),
                name,
                source,
            });
        }
    }
    Ok(())
}

/// The owned object of the Memcached's name, from the cache of labelled objects. A foreign
/// object of that name is never in that cache: `ensure` finds it by creating only if nothing of
/// that name exists, so the common path (nothing there) costs no read. While the status reports
/// one, it is looked up with a read instead, so each recheck costs one request and never a write
/// attempt on someone else's object.
pub async fn lookup<K: Owned>(
    api: &Api<OwnedObject<K>>,
    cache: &Cache<OwnedObject<K>>,
    mc: &Memcached,
) -> Result<Option<Arc<OwnedObject<K>>>> {
    lookup_named(api, cache, mc, &mc.name_any()).await
}

/// `lookup` of the object `name` (the proxy's are `<name>-proxy`).
pub async fn lookup_named<K: Owned>(
    api: &Api<OwnedObject<K>>,
    cache: &Cache<OwnedObject<K>>,
    mc: &Memcached,
    name: &str,
) -> Result<Option<Arc<OwnedObject<K>>>> {
    if let Some(cached) = cache.get(&mc.namespace().unwrap_or_default(), name) {
        return Ok(Some(cached));
    }
    if !reports_foreign_object(mc) {
        return Ok(None);
    }
    read(api, name).await
}

/// The API (in one namespace) and the cache of a kind the operator keeps.
pub type Kept<'a, K> = (Api<OwnedObject<K>>, &'a Cache<OwnedObject<K>>);

/// `Kept` in `ns`, where the operator keeps the kind (`cache` is None where it keeps none).
pub fn kept<'a, K: Owned>(
    client: &Client,
    ns: &str,
    cache: Option<&'a Cache<OwnedObject<K>>>,
) -> Option<Kept<'a, K>> {
    cache.map(|cache| (Api::namespaced(client.clone(), ns), cache))
}

/// An object only some specs want: looked up as `lookup` does while wanted; otherwise only ours
/// matter (to delete them), and ours are in the cache. Nothing where the kind is not kept.
pub async fn lookup_optional<K: Owned>(
    kept: Option<&Kept<'_, K>>,
    mc: &Memcached,
    wanted: bool,
) -> Result<Option<Arc<OwnedObject<K>>>> {
    lookup_optional_named(kept, mc, &mc.name_any(), wanted).await
}

/// `lookup_optional` of the object `name`.
pub async fn lookup_optional_named<K: Owned>(
    kept: Option<&Kept<'_, K>>,
    mc: &Memcached,
    name: &str,
    wanted: bool,
) -> Result<Option<Arc<OwnedObject<K>>>> {
    let Some((api, cache)) = kept else {
        return Ok(None);
    };
    match wanted {
        true => lookup_named(api, cache, mc, name).await,
        false => Ok(cache.get(&mc.namespace().unwrap_or_default(), name)),
    }
}

fn reports_foreign_object(mc: &Memcached) -> bool {
    mc.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == status::DEGRADED && c.reason == status::Reason::ResourceExists.as_str()
        })
    })
}

async fn read<K: Owned>(
    api: &Api<OwnedObject<K>>,
    name: &str,
) -> Result<Option<Arc<OwnedObject<K>>>> {
    match api.get_opt(name).await {
        Ok(found) => Ok(found.map(|mut found| {
            found.observe(None, None, &mut KnownFields::default());
            Arc::new(found)
        })),
        Err(source) => Err(Error::Read {
            kind: K::kind(&()).into_owned(),
            name: name.to_string(),
            source,
        }),
    }
}

/// Which applies get a Normal event.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    Always,
    /// Changes to an existing object only.
    Changes,
}

/// A resourceVersion no object has (etcd's first write is revision 2): an apply that carries it
/// creates the object when there is none, and fails with a conflict when there is one.
const NO_OBJECT_HAS_THIS_VERSION: &str = "1";

/// Applies `desired` unless `existing` already holds it. With
/// nothing cached, the apply only creates: if an object of that name exists, it is read, and
/// left alone (`Error::Foreign`) unless this Memcached controls it.
pub async fn ensure<K: Owned>(
    ctx: &Context,
    mc: &Memcached,
    api: &Api<OwnedObject<K>>,
    existing: Option<Arc<OwnedObject<K>>>,
    desired: K,
    announce: Announce,
) -> Result<()> {
    let name = desired.name_any();
    let existing = match existing {
        Some(existing) => Some(existing),
        None => {
            let mut create = desired.clone();
            create.meta_mut().resource_version = Some(NO_OBJECT_HAS_THIS_VERSION.into());
            match apply(api, &create).await {
                Ok(created) => {
                    ctx.own_writes.record(None, &created);
                    if announce == Announce::Always {
                        ctx.events.applied(mc, &created, &Change::Created);
                    }
                    return Ok(());
                }
                Err(Error::Apply {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 409 => {}
                Err(error) => return Err(error),
            }
            match read(api, &name).await? {
                Some(found) if !is_controlled_by(found.meta(), mc) => {
                    return Err(Error::Foreign {
                        kind: K::kind(&()).into_owned(),
                    });
                }
                // Ours, and not in the cache yet; or gone again, and then applied as new.
                found => found,
            }
        }
    };
    if let Some(existing) = &existing
        && !existing.needs(&desired)
    {
        return Ok(());
    }
    let applied = apply(api, &desired).await?;
    ctx.own_writes.record(existing.as_deref(), &applied);
    let change = match existing {
        Some(_) => Change::Updated,
        None => Change::Created,
    };
    if announce == Announce::Always || change != Change::Created {
        ctx.events.applied(mc, &applied, &change);
    }
    Ok(())
}

/// Applies `desired`; returns the object as the cache keeps it.
async fn apply<K: Owned>(api: &Api<OwnedObject<K>>, desired: &K) -> Result<OwnedObject<K>> {
    let name = desired.name_any();
    let mut applied = api
        .patch(
            &name,
            &PatchParams::apply(MANAGER_NAME).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(|source| Error::Apply {
            kind: K::kind(&()).into_owned(),
            name,
            source,
        })?;
    applied.observe_applied(desired);
    Ok(applied)
}

#[derive(Debug, PartialEq, Eq)]
pub enum StatusPatch {
    /// Written: the Memcached's resourceVersion after the write.
    Written(Option<String>),
    /// Deleted since the cache saw it: the garbage collector's deletions of what it owned can
    /// reach their watches before its own deletion reaches ours. Nothing is left to report on,
    /// and nothing failed.
    Gone,
}

pub async fn patch_status(
    client: &Client,
    mc: &Memcached,
    status: &MemcachedStatus,
) -> Result<StatusPatch> {
    // The answer is decoded as the watch decodes Memcacheds (managedFields skipped): nothing
    // reads it, the watch brings the new version to the cache.
    let api: Api<WatchedMemcached> =
        Api::namespaced(client.clone(), &mc.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": Memcached::api_version(&()),
        "kind": Memcached::kind(&()),
        "status": status,
    });
    match api
        .patch_status(
            &mc.name_any(),
            &PatchParams::apply(MANAGER_NAME).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(written) => Ok(StatusPatch::Written(written.resource_version())),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(StatusPatch::Gone),
        Err(source) => Err(Error::Status {
            name: mc.name_any(),
            source,
        }),
    }
}

/// A delete of this object only (its uid): one that replaced it meanwhile is not ours to delete.
pub fn only_this(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}
