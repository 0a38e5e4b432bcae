//! Reconcile one Memcached, in the tutorial's steps: fetch it, ensure its Deployment, ensure its
//! size, ensure its Service, report status. Desired objects come from the pure builders in
//! `resources`; this module makes the API calls.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Api, ResourceExt};
use tracing::debug;

use super::binding;
use super::context::Context;
use super::ensure::{
    Announce, Ensured, Kept, StatusPatch, ensure, ensure_optional, kept, lookup, lookup_optional,
    patch_status,
};
use super::outcome::Outcome;
use super::owned::OwnedObject;
use super::secrets::{self, Secrets};
use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::error::{Error, Refusal, Result};
use crate::resources::binding::Copied;
use crate::resources::{self, is_controlled_by};
use crate::service_monitor::ServiceMonitor;
use crate::status::{self, Blocked, Observed};
use crate::validation;

/// Reconciles one Memcached; what follows (a recheck, a retry) is the worker's, from the outcome.
pub async fn reconcile(mc: &Memcached, ctx: &Context) -> Result<Outcome> {
    // 1. Fetch: the controller hands us the cached Memcached. One being deleted is left to the
    //    garbage collector, which removes what it owns through owner references.
    if mc.metadata.deletion_timestamp.is_some() {
        ctx.metrics
            .forget_memcached(&mc.namespace().unwrap_or_default(), &mc.name_any());
        ctx.events.forget(mc);
        return Ok(Outcome::Gone);
    }
    if !ctx.caches.synced() {
        return Ok(Outcome::CachesFilling);
    }
    let ns = mc.namespace().unwrap_or_default();
    let deployments: Api<OwnedObject<Deployment>> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<OwnedObject<Service>> = Api::namespaced(ctx.client.clone(), &ns);
    let budgets: Kept<PodDisruptionBudget> = (
        Api::namespaced(ctx.client.clone(), &ns),
        &ctx.pod_disruption_budgets,
    );
    let desired_budget = resources::pod_disruption_budget(mc);
    // Only where this process may watch them.
    let policies: Option<Kept<NetworkPolicy>> = kept(ctx, &ns, ctx.network_policies.as_ref());
    let desired_policy = resources::network_policy(mc);
    // Only where the cluster serves them (and so they are watched).
    let monitors: Option<Kept<ServiceMonitor>> = kept(ctx, &ns, ctx.service_monitors.as_ref());
    let desired_monitor = resources::service_monitor(mc);
    // Only where the cluster serves cert-manager's API and this process may watch it.
    let certificates: Option<Kept<Certificate>> = kept(ctx, &ns, ctx.certificates.as_ref());
    let desired_certificate = resources::tls::certificate(mc);
    // Independent requests go out together: a reconcile's latency is its longest chain of
    // round trips.
    let (
        existing_deployment,
        existing_service,
        existing_budget,
        existing_policy,
        existing_monitor,
        existing_certificate,
    ) = tokio::try_join!(
        lookup(&deployments, &ctx.deployments, mc),
        lookup(&services, &ctx.services, mc),
        // One we no longer want is deleted only if it is ours, and ours are in the cache.
        lookup_optional(Some(&budgets), mc, desired_budget.is_some()),
        lookup_optional(policies.as_ref(), mc, desired_policy.is_some()),
        lookup_optional(monitors.as_ref(), mc, desired_monitor.is_some()),
        lookup_optional(certificates.as_ref(), mc, desired_certificate.is_some()),
    )?;
    let mut blocked = blocked(
        mc,
        existing_deployment.as_deref().map(|d| &d.metadata),
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

    let mut rollout_queued = None;
    let mut deployment_written = false;
    let deployment = match &blocked {
        Some(Blocked::ResourceExists { .. }) => None,
        Some(_) => existing_deployment,
        None => {
            // 2. Ensure the Deployment, and with it 3. its size: replicas = spec.size.
            // 4. Ensure the headless Service, the disruption budget and the network policy.
            let new = existing_deployment.is_none() && existing_service.is_none();
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
            let deployment = ensure_deployment(ctx, mc, &deployments, existing_deployment.clone());
            let applied = if new {
                // A new Memcached (or one whose objects someone else holds): the Deployment
                // first, so that nothing is created while its name is someone else's.
                async {
                    let deployment = deployment.await?;
                    others.await?;
                    Ok(deployment)
                }
                .await
            } else {
                tokio::try_join!(deployment, others).map(|(deployment, _)| deployment)
            };
            match applied {
                Ok((deployment, queued)) => {
                    rollout_queued = queued.then(|| ctx.rollouts.limit());
                    deployment_written = deployment.written;
                    Some(deployment.object)
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
                    existing_deployment
                }
            }
        }
    };

    // 5. Report status, unless the Deployment was just written: its watch event queues a
    //    status refresh, which sees the rollout the write started, and the queue serves it after
    //    the spec changes that users wait for.
    if deployment_written && blocked.is_none() {
        ctx.events.unblocked(mc);
        return Ok(Outcome::Converged);
    }
    let pods = ctx.pods.pods_of(&ns, &mc.name_any());
    // The binding applications mount, with the members as they are now; a blocked Memcached's
    // stays as it was.
    let mut bound = binding::reported(mc);
    if blocked.is_none() {
        match binding::ensure(ctx, mc, &pods.addresses, &copied).await? {
            Ok(name) => bound = name,
            Err(why) => (blocked, bound) = (Some(why), None),
        }
    }
    let observed = Observed {
        deployment: deployment.as_deref().map(OwnedObject::seen),
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
        ctx.metrics.forget_memcached(&ns, &mc.name_any());
        ctx.events.forget(mc);
        return Ok(Outcome::Gone);
    }
    ctx.metrics
        .set_conditions(&ns, &mc.name_any(), &new_status.conditions);
    ctx.events.troubled(mc, trouble.as_ref());
    let Some(blocked) = blocked else {
        ctx.events.unblocked(mc);
        return Ok(match rollout_queued {
            Some(_) => Outcome::WaitingForRolloutSlot,
            None if resources::binding::copies_secrets(mc) => Outcome::CopyingSecrets,
            None => Outcome::Converged,
        });
    };
    ctx.events.blocked(mc, &blocked);
    Ok(Outcome::Blocked(blocked))
}

/// The Deployment as the spec wants it, unless that would start a rollout that must wait for
/// the budget (then the Deployment as it is, and true).
async fn ensure_deployment(
    ctx: &Context,
    mc: &Memcached,
    api: &Api<OwnedObject<Deployment>>,
    existing: Option<Arc<OwnedObject<Deployment>>>,
) -> Result<(Ensured<Deployment>, bool)> {
    let desired = resources::deployment(mc, &ctx.images);
    // Converged (the common case): nothing to apply, nothing to wait for.
    if let Some(existing) = &existing
        && existing.needs(&desired)
        && rollout_must_wait(ctx, mc, existing, &desired)
    {
        return Ok((Ensured::unchanged(existing.clone()), true));
    }
    let applied = ensure(ctx, mc, api, existing, desired, Announce::Always).await?;
    Ok((applied, false))
}

/// Whether applying `desired` would roll the pods for a reason the Memcached's spec did not
/// give (an operator upgrade) while the rollout budget is spent; see rollouts.rs.
fn rollout_must_wait(
    ctx: &Context,
    mc: &Memcached,
    existing: &OwnedObject<Deployment>,
    desired: &Deployment,
) -> bool {
    if status::spec_changed(mc) || !existing.template_needs(desired) {
        return false;
    }
    !ctx.rollouts
        .try_start(&mc.namespace().unwrap_or_default(), &mc.name_any())
}

/// Why nothing may be applied: an object of our name that this Memcached does not control is
/// left untouched, and a spec that cannot work is not applied (the pods running now keep serving).
fn blocked(
    mc: &Memcached,
    deployment: Option<&ObjectMeta>,
    service: Option<&ObjectMeta>,
    budget: Option<&ObjectMeta>,
    policy: Option<&ObjectMeta>,
    monitor: Option<&ObjectMeta>,
    certificate: Option<&ObjectMeta>,
) -> Option<Blocked> {
    let foreign = [
        ("Deployment", deployment),
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
