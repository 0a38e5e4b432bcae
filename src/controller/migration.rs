//! The move from the Deployment that releases up to 0.2.0 gave each Memcached to its
//! StatefulSet, once. The StatefulSet is created beside the Deployment (their pods carry the same
//! labels, so the Service sends clients to both) and the Deployment is deleted once the
//! StatefulSet's members are all available: `size` pods serve throughout. Its members start
//! empty: this move costs the cache once.
//!
//! Creating the StatefulSet is a rollout nobody asked for, so it waits for a slot of the rollout
//! budget (rollouts.rs) as the operator's other pod template changes do.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::{Api, ResourceExt};
use serde::Deserialize;

use super::context::Context;
use super::ensure::delete;
use super::events::Change;
use super::owned::OwnedObject;
use crate::api::Memcached;
use crate::error::Result;
use crate::resources::is_controlled_by;

/// What is read of a Deployment's status: how many of its pods are Ready.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LegacyStatus {
    pub ready_replicas: Option<i32>,
}

/// The Deployment this Memcached had before its StatefulSet, if it still has one.
pub fn legacy(ctx: &Context, mc: &Memcached) -> Option<Arc<OwnedObject<Deployment>>> {
    ctx.legacy_deployments
        .get_for(mc)
        .filter(|d| is_controlled_by(&d.metadata, mc))
}

/// Pods of the Deployment that are Ready.
pub fn legacy_ready(legacy: &OwnedObject<Deployment>) -> i32 {
    legacy
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// Whether the StatefulSet serves in the Deployment's place: it has seen its spec and all its
/// members are available.
pub fn done(mc: &Memcached, sts: Option<&OwnedObject<StatefulSet>>) -> bool {
    sts.and_then(|s| Some((s.metadata.generation, s.status.as_ref()?)))
        .is_some_and(|(generation, status)| {
            status.observed_generation >= generation
                && status.available_replicas.unwrap_or(0) >= mc.spec.size
                && status.updated_replicas.unwrap_or(0) >= mc.spec.size
        })
}

/// Deletes the Deployment of before (this one only: its uid), and its pods with it.
pub async fn finish(ctx: &Context, mc: &Memcached, legacy: &OwnedObject<Deployment>) -> Result<()> {
    let api = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    delete(ctx, mc, &api, legacy, &Change::Replaced).await
}
