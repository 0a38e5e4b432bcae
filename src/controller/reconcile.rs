//! Reconcile one Memcached, in the tutorial's steps: fetch it, ensure its members and size, its
//! Service, report status. The builders in `resources` are pure; this module makes the calls.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::context::Context;
use super::ensure::{
    Announce, Ensured, Kept, StatusPatch, ensure, ensure_optional, kept, lookup, lookup_optional,
    patch_status,
};
use super::members::{adoption, own};
use super::outcome::Outcome;
use super::owned::OwnedObject;
use super::secrets::{self, Secrets};
use super::{autoscale, binding, creation, members, migration, rollouts};
use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::config::Members;
use crate::error::{Error, Refusal, Result};
use crate::resources::binding::Copied;
use crate::resources::{self, is_controlled_by};
use crate::service_monitor::ServiceMonitor;
use crate::status::{self, Blocked, Observed};
use crate::validation;

/// Past the moment a member is available: a Ready condition's time is whole seconds.
const AVAILABLE_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Reconciles one Memcached; what follows (a recheck, a retry) is the worker's, from the outcome.
pub async fn reconcile(mc: &Memcached, ctx: &Context) -> Result<Outcome> {
    // 1. Fetch: the controller hands us the cached Memcached. One being deleted is left to the
    //    garbage collector, which removes what it owns through owner references.
    if mc.metadata.deletion_timestamp.is_some() {
        forget(ctx, &ObjectRef::from_obj(mc));
        return Ok(Outcome::Gone);
    }
    if !ctx.caches.synced() {
        return Ok(Outcome::CachesFilling);
    }
    // While autoscaling is on, a size set by hand is put back before anything is sized from it.
    if autoscale::put_back(ctx, mc).await? {
        return Ok(Outcome::Converged);
    }
    let ns = mc.namespace().unwrap_or_default();
    let stateful_sets: Api<OwnedObject<StatefulSet>> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<OwnedObject<Service>> = Api::namespaced(ctx.client.clone(), &ns);
    let budgets: Kept<PodDisruptionBudget> = (
        Api::namespaced(ctx.client.clone(), &ns),
        &ctx.pod_disruption_budgets,
    );
    let desired_budget = resources::pod_disruption_budget(mc);
    // Only where this process may watch them.
    let policies: Option<Kept<NetworkPolicy>> = kept(ctx, &ns, ctx.network_policies.as_ref());
    let desired_policy = resources::network_policy(mc, ctx.operator_namespace.as_deref());
    // Only where the cluster serves them (and so they are watched).
    let monitors: Option<Kept<ServiceMonitor>> = kept(ctx, &ns, ctx.service_monitors.as_ref());
    let desired_monitor = resources::service_monitor(mc);
    // Only where the cluster serves cert-manager's API and this process may watch it.
    let certificates: Option<Kept<Certificate>> = kept(ctx, &ns, ctx.certificates.as_ref());
    let desired_certificate = resources::tls::certificate(mc);
    // Independent requests go out together: a reconcile's latency is its longest chain of
    // round trips.
    let (
        existing_stateful_set,
        existing_service,
        existing_budget,
        existing_policy,
        existing_monitor,
        existing_certificate,
    ) = tokio::try_join!(
        lookup(&stateful_sets, &ctx.stateful_sets, mc),
        lookup(&services, &ctx.services, mc),
        // One we no longer want is deleted only if it is ours, and ours are in the cache.
        lookup_optional(Some(&budgets), mc, desired_budget.is_some()),
        lookup_optional(policies.as_ref(), mc, desired_policy.is_some()),
        lookup_optional(monitors.as_ref(), mc, desired_monitor.is_some()),
        lookup_optional(certificates.as_ref(), mc, desired_certificate.is_some()),
    )?;
    // 0.6.0's StatefulSet deleted for its members' adoption: the status stays until it is gone.
    if adoption::releasing(ctx, mc, existing_stateful_set.as_deref()) {
        return Ok(Outcome::Converged);
    }
    let mut blocked = blocked(
        mc,
        existing_stateful_set.as_deref().map(|d| &d.metadata),
        existing_service.as_deref().map(|s| &s.metadata),
        existing_budget.as_deref().map(|b| &b.metadata),
        existing_policy.as_deref().map(|p| &p.metadata),
        existing_monitor.as_deref().map(|m| &m.metadata),
        existing_certificate.as_deref().map(|c| &c.metadata),
    );
    // A policy asked for that this process may not keep: nothing applied, rather than pods
    // running without the policy the user counts on.
    if blocked.is_none() && desired_policy.is_some() && policies.is_none() {
        blocked = Some(Blocked::Refused {
            refusal: Refusal::Forbidden,
            message: status::NETWORK_POLICIES_FORBIDDEN.to_string(),
        });
    }
    // Likewise a certificate from cert-manager where this process cannot keep one.
    if blocked.is_none() && desired_certificate.is_some() && certificates.is_none() {
        blocked = Some(Blocked::InvalidSpec {
            message: status::CERTIFICATES_UNAVAILABLE.to_string(),
        });
    }
    // The Secrets the pods will mount (auth, TLS) must be there and usable first.
    let (mut copied, mut unissued) = (Copied::default(), None);
    if blocked.is_none() {
        match secrets::check(ctx, mc).await? {
            Secrets::Usable {
                copied: c,
                unissued: u,
            } => (copied, unissued) = (c, u),
            Secrets::Unusable(why) => blocked = Some(why),
        }
    }

    let mut legacy = migration::legacy(ctx, mc);
    let mut rollout_queued = None;
    let mut stateful_set_written = false;
    // Members the operator keeps itself, where it does and this Memcached has neither a
    // StatefulSet nor a Deployment of before.
    let keeps_pods =
        ctx.members == Members::Pods && existing_stateful_set.is_none() && legacy.is_none();
    let mut own_members = None;
    let stateful_set = match &blocked {
        Some(Blocked::ResourceExists { .. }) => None,
        Some(_) if keeps_pods => {
            own_members = Some(own::observe(ctx, mc));
            None
        }
        Some(_) => existing_stateful_set,
        None => {
            // 2. Ensure the StatefulSet, and with it 3. its size: replicas = spec.size.
            // 4. Ensure the headless Service, the disruption budget and the network policy.
            let new = existing_stateful_set.is_none() && existing_service.is_none();
            let service = resources::service(mc);
            let others = async {
                tokio::try_join!(
                    ensure(
                        ctx,
                        mc,
                        &services,
                        existing_service,
                        service,
                        Announce::Always
                    ),
                    ensure_optional(ctx, mc, Some(&budgets.0), existing_budget, desired_budget),
                    ensure_optional(
                        ctx,
                        mc,
                        policies.as_ref().map(|(api, _)| api),
                        existing_policy,
                        desired_policy
                    ),
                    ensure_optional(
                        ctx,
                        mc,
                        monitors.as_ref().map(|(api, _)| api),
                        existing_monitor,
                        desired_monitor
                    ),
                    ensure_optional(
                        ctx,
                        mc,
                        certificates.as_ref().map(|(api, _)| api),
                        existing_certificate,
                        desired_certificate
                    ),
                )
            };
            let stateful_set = ensure_stateful_set(
                ctx,
                mc,
                &stateful_sets,
                existing_stateful_set.clone(),
                legacy.is_some(),
            );
            let applied = if keeps_pods {
                // Nothing to wait for: a pod of a member's name that is not ours is refused
                // by its create.
                tokio::try_join!(own::ensure(ctx, mc), others).map(|(members, _)| {
                    own_members = Some(members);
                    (None, false)
                })
            } else if new {
                // A new Memcached (or one whose objects someone else holds): the StatefulSet
                // first, so that nothing is created while its name is someone else's.
                async {
                    let stateful_set = stateful_set.await?;
                    others.await?;
                    Ok(stateful_set)
                }
                .await
            } else {
                tokio::try_join!(stateful_set, others).map(|(stateful_set, _)| stateful_set)
            };
            match applied {
                Ok((stateful_set, queued)) => {
                    rollout_queued = queued.then(|| ctx.rollouts.limit());
                    stateful_set_written = stateful_set.as_ref().is_some_and(|s| s.written);
                    stateful_set.map(|s| s.object)
                }
                Err(Error::Foreign { kind }) => {
                    blocked = Some(Blocked::ResourceExists {
                        message: status::conflict_message(&kind, mc),
                    });
                    None
                }
                Err(error) if error.namespace_terminating() => {
                    debug!(%error, "the namespace is being deleted");
                    return Ok(Outcome::Gone);
                }
                Err(error) => {
                    blocked = Some(Blocked::refused(error)?);
                    own_members = keeps_pods.then(|| own::observe(ctx, mc));
                    existing_stateful_set
                }
            }
        }
    };

    // Someone else's pod in a member's name: left alone, and said, as for a StatefulSet.
    if let Some(pod) = own_members.as_ref().and_then(|o| o.foreign.as_deref())
        && blocked.is_none()
    {
        blocked = Some(Blocked::ResourceExists {
            message: status::named_conflict_message("Pod", pod, mc),
        });
    }

    // The Deployment of before leaves once the StatefulSet serves in its place.
    if let Some(old) = legacy.clone()
        && blocked.is_none()
        && migration::done(mc, stateful_set.as_deref())
    {
        migration::finish(ctx, mc, &old).await?;
        legacy = None;
    }

    // The members take the StatefulSet's template one at a time, in place where they can.
    let members_written = stateful_set_written || own_members.as_ref().is_some_and(|o| o.written);
    if let Some(own) = &own_members {
        // No StatefulSet's watch tells the rollout budget of these members: their count does.
        let rolling = !own.waiting && rollouts::is_status_rolling(mc.spec.size, &own.status);
        ctx.rollouts.members(&ns, &mc.name_any(), rolling);
        if own.waiting {
            rollout_queued = Some(ctx.rollouts.limit());
        }
    }
    let keeper = match (&own_members, stateful_set.as_deref()) {
        (Some(own), _) if own.waiting => None,
        (Some(own), _) => Some(own.keeper(mc)),
        (None, Some(sts)) => members::Keeper::stateful_set(sts),
        (None, None) => None,
    };
    let updating = match (&blocked, keeper) {
        (None, Some(keeper)) if !members_written => members::update(ctx, mc, keeper).await?,
        _ => None,
    };

    // 0.6.0's members, once all run the current template, are the operator's (adoption.rs).
    let quiet = (blocked.is_none() && legacy.is_none() && !members_written)
        && (updating.is_none() && rollout_queued.is_none());
    if quiet && adoption::release(ctx, mc, stateful_set.as_deref()).await? {
        return Ok(Outcome::Converged);
    }

    // 5. Size from the cache's own signals, while autoscaling is on; a blocked Memcached keeps
    //    the last decision.
    let autoscaling = match &blocked {
        None if !members_written => autoscale::autoscale(ctx, mc).await?,
        _ => mc
            .status
            .as_ref()
            .and_then(|s| s.autoscaling.clone())
            .filter(|_| autoscale::enabled(mc)),
    };

    // 6. Report status, unless the StatefulSet was just written: its watch event queues a
    //    status refresh, which sees the rollout the write started, and the queue serves it after
    //    the spec changes that users wait for.
    if members_written && blocked.is_none() {
        ctx.events.unblocked(mc);
        return Ok(Outcome::Converged);
    }
    let pods = ctx.pods.pods_of(&ns, &mc.name_any());
    // The binding applications mount; a blocked Memcached's stays as it was.
    let mut bound = binding::reported(mc);
    if blocked.is_none() {
        match binding::ensure(ctx, mc, &copied).await? {
            Ok(name) => bound = name,
            Err(why) => (blocked, bound) = (Some(why), None),
        }
    }
    // Pods the StatefulSet wants and does not run: its events may say why. Members of our own
    // that could not be created say why themselves.
    let (pods_missing, creation_refused) = match (&own_members, stateful_set.as_deref()) {
        (Some(own), _) => (own.refused.is_some(), own.refused.clone()),
        (None, Some(sts)) => {
            let missing = creation::pods_missing(sts, &pods.names);
            let refused = match &blocked {
                None if missing => creation::refused(ctx, sts).await?,
                _ => None,
            };
            (missing, refused)
        }
        (None, None) => (false, None),
    };
    let observed = Observed {
        stateful_set: match &own_members {
            Some(own) => Some(own.seen()),
            None => stateful_set.as_deref().map(OwnedObject::seen),
        },
        creation_refused: creation_refused.as_deref(),
        legacy_ready: legacy.as_deref().map(migration::legacy_ready),
        update: updating.map(|u| u.kind),
        autoscaling,
        pods: pods.names,
        troubles: pods.troubles,
        blocked: blocked.clone(),
        rollout_queued,
        binding: bound,
        unissued,
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (new_status, trouble) = status::desired_status_and_trouble(mc, &observed, &now);
    if mc.status.as_ref() != Some(&new_status)
        && patch_status(ctx, mc, &new_status).await? == StatusPatch::Gone
    {
        forget(ctx, &ObjectRef::from_obj(mc));
        return Ok(Outcome::Gone);
    }
    ctx.metrics
        .set_conditions(&ns, &mc.name_any(), &new_status.conditions);
    ctx.metrics.autoscaling.set(
        &ns,
        &mc.name_any(),
        mc.spec.autoscaling_on(),
        new_status.autoscaling.as_ref(),
    );
    ctx.events.troubled(mc, trouble.as_ref());
    let Some(blocked) = blocked else {
        ctx.events.unblocked(mc);
        return Ok(match (rollout_queued, updating) {
            (Some(_), _) => Outcome::WaitingForRolloutSlot,
            (None, Some(updating)) => Outcome::UpdatingMembers(updating.recheck),
            // Its controller retries with no change to watch: look again.
            _ if pods_missing => Outcome::PodsMissing,
            _ if let Some(soon) = own_members.as_ref().and_then(|o| o.available_in) => {
                // The watch tells when a pod is Ready, not when it has been for long enough.
                Outcome::MembersBecomingAvailable(soon + AVAILABLE_MARGIN)
            }
            _ if autoscale::enabled(mc) => Outcome::Autoscaling,
            _ if resources::binding::copies_secrets(mc) => Outcome::CopyingSecrets,
            _ => Outcome::Converged,
        });
    };
    ctx.events.blocked(mc, &blocked);
    Ok(Outcome::Blocked(blocked))
}

/// Nothing of the Memcached `key` is kept: it is gone, or going.
pub fn forget(ctx: &Context, key: &ObjectRef<Memcached>) {
    let ns = key.namespace.as_deref().unwrap_or_default();
    ctx.metrics.forget_memcached(ns, &key.name);
    ctx.rollouts.forget(ns, &key.name);
    ctx.events.forget(key);
    ctx.autoscaler.forget(key);
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

/// The StatefulSet as the spec wants it, unless that would start a rollout that must wait for
/// the budget (then the StatefulSet as it is, if any, and true). Creating it beside a
/// Deployment of before (`legacy`) is such a rollout too.
async fn ensure_stateful_set(
    ctx: &Context,
    mc: &Memcached,
    api: &Api<OwnedObject<StatefulSet>>,
    existing: Option<Arc<OwnedObject<StatefulSet>>>,
    legacy: bool,
) -> Result<(Option<Ensured<StatefulSet>>, bool)> {
    let desired = resources::stateful_set(mc, &ctx.images);
    // Converged (the common case): nothing to apply, nothing to wait for.
    let rolls = match &existing {
        None => legacy,
        Some(existing) => existing.needs(&desired) && existing.template_needs(&desired),
    };
    if rolls && ctx.rollouts.must_wait(mc) {
        return Ok((existing.map(Ensured::unchanged), true));
    }
    let applied = ensure(ctx, mc, api, existing, desired, Announce::Always).await?;
    Ok((Some(applied), false))
}

/// Why nothing may be applied: an object of our name that this Memcached does not control is
/// left untouched, and a spec that cannot work is not applied (the pods running now keep serving).
fn blocked(
    mc: &Memcached,
    stateful_set: Option<&ObjectMeta>,
    service: Option<&ObjectMeta>,
    budget: Option<&ObjectMeta>,
    policy: Option<&ObjectMeta>,
    monitor: Option<&ObjectMeta>,
    certificate: Option<&ObjectMeta>,
) -> Option<Blocked> {
    let foreign = [
        ("StatefulSet", stateful_set),
        ("Service", service),
        ("PodDisruptionBudget", budget),
        ("NetworkPolicy", policy),
        ("ServiceMonitor", monitor),
        ("Certificate", certificate),
    ]
    .into_iter()
    .find(|(_, meta)| meta.is_some_and(|m| !is_controlled_by(m, mc)));
    if let Some((kind, _)) = foreign {
        return Some(Blocked::ResourceExists {
            message: status::conflict_message(kind, mc),
        });
    }
    validation::validate(&mc.spec)
        .err()
        .map(|message| Blocked::InvalidSpec { message })
}

#[cfg(test)]
mod tests;
