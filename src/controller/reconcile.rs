//! Reconcile one Memcached, in the tutorial's steps: fetch it, ensure its members and size, its
//! Service, report status. The builders in `resources` are pure; this module makes the calls.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::context::Context;
use super::ensure::{
    Announce, Kept, StatusPatch, ensure, ensure_optional, kept, lookup, lookup_optional,
    patch_status,
};
use super::legacy::{self, Adoption};
use super::members::own;
use super::outcome::Outcome;
use super::owned::OwnedObject;
use super::secrets::{self, Secrets};
use super::{autoscale, binding, members, rollouts};
use crate::api::Memcached;
use crate::certificate::Certificate;
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
        existing_service,
        existing_budget,
        existing_policy,
        existing_monitor,
        existing_certificate,
    ) = tokio::try_join!(
        lookup(&services, &ctx.services, mc),
        // One we no longer want is deleted only if it is ours, and ours are in the cache.
        lookup_optional(Some(&budgets), mc, desired_budget.is_some()),
        lookup_optional(policies.as_ref(), mc, desired_policy.is_some()),
        lookup_optional(monitors.as_ref(), mc, desired_monitor.is_some()),
        lookup_optional(certificates.as_ref(), mc, desired_certificate.is_some()),
    )?;
    let mut blocked = blocked(
        mc,
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
    // The members of a release up to 0.6.0 are handed over before anything is done with them.
    if blocked.is_none() {
        let stateful_set = ctx
            .legacy_stateful_sets
            .get_for(mc)
            .filter(|sts| is_controlled_by(&sts.metadata, mc));
        match legacy::step(ctx, mc, stateful_set.as_deref()).await? {
            Adoption::None => {}
            Adoption::Underway => return Ok(Outcome::Converged),
            Adoption::Foreign(pod) => {
                blocked = Some(Blocked::ResourceExists {
                    message: status::named_conflict_message("Pod", &pod, mc),
                });
            }
        }
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

    let own_members = match &blocked {
        Some(Blocked::ResourceExists { .. }) => None,
        Some(_) => Some(own::observe(ctx, mc)),
        None => {
            // 2. Ensure the members, and with them 3. their number: spec.size.
            // 4. Ensure the headless Service, the disruption budget and the network policy.
            let others = async {
                tokio::try_join!(
                    ensure(
                        ctx,
                        mc,
                        &services,
                        existing_service,
                        resources::service(mc),
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
            // Nothing to wait for: a pod of a member's name that is not ours is refused by its
            // create.
            match tokio::try_join!(own::ensure(ctx, mc), others) {
                Ok((members, _)) => Some(members),
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
                    Some(own::observe(ctx, mc))
                }
            }
        }
    };

    // Someone else's pod in a member's name: left alone, and said, as for a Service.
    if let Some(pod) = own_members.as_ref().and_then(|o| o.foreign.as_deref())
        && blocked.is_none()
    {
        blocked = Some(Blocked::ResourceExists {
            message: status::named_conflict_message("Pod", pod, mc),
        });
    }

    // The members take the current template one at a time, in place where they can.
    let members_written = own_members.as_ref().is_some_and(|o| o.written);
    let mut rollout_queued = None;
    if let Some(own) = &own_members {
        // The rollout budget counts the Memcacheds whose members are rolling.
        let rolling = !own.waiting && rollouts::is_rolling(mc.spec.size, &own.counts);
        ctx.rollouts.members(&ns, &mc.name_any(), rolling);
        if own.waiting {
            rollout_queued = Some(ctx.rollouts.limit());
        }
    }
    let keeper = own_members
        .as_ref()
        .filter(|own| !own.waiting)
        .map(|own| own.keeper(mc));
    let updating = match (&blocked, keeper) {
        (None, Some(keeper)) if !members_written => members::update(ctx, mc, keeper).await?,
        _ => None,
    };

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

    // 6. Report status, unless members were just written: their watch events queue a status
    //    refresh, which sees what the writes started, and the queue serves it after the spec
    //    changes that users wait for.
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
    // Members that could not be created say why themselves.
    let creation_refused = own_members.as_ref().and_then(|o| o.refused.clone());
    let observed = Observed {
        members: own_members.as_ref().map(|o| o.counts),
        creation_refused: creation_refused.as_deref(),
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
            _ if creation_refused.is_some() => Outcome::PodsMissing,
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

/// Why nothing may be applied: an object of our name that this Memcached does not control is
/// left untouched, and a spec that cannot work is not applied (the pods running now keep serving).
fn blocked(
    mc: &Memcached,
    service: Option<&ObjectMeta>,
    budget: Option<&ObjectMeta>,
    policy: Option<&ObjectMeta>,
    monitor: Option<&ObjectMeta>,
    certificate: Option<&ObjectMeta>,
) -> Option<Blocked> {
    let foreign = [
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
