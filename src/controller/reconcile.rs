//! Reconcile one Memcached, in four phases: observe (every read), plan (pure: what blocks it,
//! the objects it should have, the members' moves), apply (the writes) and report (status,
//! events, metrics, what the worker does next).

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::autoscale;
use super::context::Context;
use super::outcome::Outcome;
use crate::api::Memcached;
use crate::error::Result;

mod apply;
mod desired;
mod observe;
mod plan;
mod report;

/// Reconciles one Memcached; what follows (a recheck, a retry) is the worker's, from the outcome.
pub async fn reconcile(mc: &Memcached, ctx: &Context) -> Result<Outcome> {
    // One being deleted is left to the garbage collector, which removes what it owns through
    // owner references.
    if mc.metadata.deletion_timestamp.is_some() {
        forget(ctx, &ObjectRef::from_obj(mc));
        return Ok(Outcome::Gone);
    }
    if !ctx.cached.synced.synced() {
        return Ok(Outcome::CachesFilling);
    }
    // While autoscaling is on, a size set by hand is put back before anything is sized from it.
    if autoscale::put_back(ctx, mc).await? {
        return Ok(Outcome::Converged);
    }
    let desired = desired::desired(
        mc,
        ctx.config.operator_namespace.as_deref(),
        &ctx.config.images,
    );
    let seen = observe::observe(ctx, mc, &desired).await?;
    let plan = plan::plan(mc, &seen, desired);
    let applied = apply::apply(ctx, mc, &seen, plan).await;
    // Whatever was created is announced, the reconcile done or not.
    ctx.events.announce_created(mc);
    match applied? {
        apply::Step::Adopting => Ok(Outcome::Converged),
        apply::Step::Gone => Ok(Outcome::Gone),
        apply::Step::Applied(applied) => report::report(ctx, mc, seen, *applied).await,
    }
}

/// Nothing of the Memcached `key` is kept: it is gone, or going.
pub fn forget(ctx: &Context, key: &ObjectRef<Memcached>) {
    let ns = key.namespace.as_deref().unwrap_or_default();
    ctx.metrics.forget_memcached(ns, &key.name);
    ctx.remembered.rollouts.forget(ns, &key.name);
    ctx.events.forget(key);
    ctx.remembered.autoscaler.forget(key);
    ctx.remembered.statuses.forget(key);
}

/// The span of one reconcile: the Memcached, and the trace it belongs to.
pub fn span(mc: &Memcached) -> tracing::Span {
    let span = tracing::info_span!(
        "reconcile",
        namespace = tracing::field::Empty,
        memcached = tracing::field::Empty,
        trace_id = tracing::field::Empty
    );
    span.record("namespace", mc.namespace().unwrap_or_default());
    span.record("memcached", mc.name_any());
    if let Some(id) = span.in_scope(operator_runtime::telemetry::current_trace_id) {
        span.record("trace_id", id);
    }
    span
}

#[cfg(test)]
mod tests;
