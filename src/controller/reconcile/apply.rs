//! Apply: the writes a plan asks for, in their order. The members of a release up to 0.6.0
//! are adopted first (nothing else is done with them meanwhile); then the generated Secret;
//! then the members and the objects beside them together (a write of an unchanged object is
//! skipped); then an update of the members, one step; then the autoscaler; then the binding.
//! A write refused or blocked by someone else's object ends as a reason for the report.

use std::net::SocketAddr;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::desired::{Desired, Proxy};
use super::observe::Seen;
use super::plan::{Plan, ProxyPlan, Sweep};
use crate::api::{AutoscalingStatus, Memcached};
use crate::controller::context::Context;
use crate::controller::ensure::{Announce, ensure, ensure_optional, kept};
use crate::controller::legacy::{self, Adoption};
use crate::controller::members::own::{self, Written};
use crate::controller::members::{self, Keeper, Updating};
use crate::controller::rollouts::Rollouts;
use crate::controller::{autoscale, binding, rollouts, secrets, sweep};
use crate::error::{Error, Result};
use crate::resources::proxy;
use crate::status::{self, Blocked};
use crate::watch::digest::digest;
use crate::watch::owned::OwnedObject;

/// How the writes went.
pub enum Step {
    /// The members of a release up to 0.6.0 are being adopted: the status stays as it was.
    Adopting,
    /// The namespace is being deleted: nothing to report.
    Gone,
    Applied(Box<Applied>),
}

/// What the writes came to, for the report.
pub struct Applied {
    /// The plan's reason, or a write's: nothing more was applied.
    pub blocked: Option<Blocked>,
    pub written: Written,
    /// The operator's own update waits for a rollout slot; the limit.
    pub rollout_queued: Option<usize>,
    pub updating: Option<Updating>,
    pub autoscaling: Option<AutoscalingStatus>,
    /// The binding Secret's name, while there is one.
    pub binding: Option<String>,
    pub unissued: Option<String>,
    /// The proxy's layout as written; None if it is off, or nothing was applied.
    pub proxy: Option<ProxyPlan>,
}

/// Makes the writes `plan` asks for.
pub async fn apply(ctx: &Context, mc: &Memcached, seen: &Seen, plan: Plan) -> Result<Step> {
    let Plan {
        mut blocked,
        desired,
        mut copied,
        unissued,
        generate,
        moves,
        proxy,
    } = plan;
    if blocked.is_none() {
        match legacy::step(ctx, mc, &seen.members).await? {
            Adoption::None => {}
            Adoption::Underway => return Ok(Step::Adopting),
            Adoption::Foreign(pod) => blocked = Some(foreign("Pod", &pod, mc)),
        }
    }
    if let (None, Some(name)) = (&blocked, &generate) {
        secrets::generate(&ctx.client, mc, name, &mut copied).await?;
    }
    let mut written = Written::default();
    let sweep = proxy.as_ref().and_then(|p| p.sweep.as_ref());
    if blocked.is_none() {
        let kept = async {
            tokio::try_join!(
                own::apply(ctx, mc, &seen.members, &moves),
                objects(ctx, mc, seen, desired, sweep)
            )
        };
        match kept.await {
            Ok((members, ())) => written = members,
            Err(Error::Foreign { kind }) => blocked = Some(foreign(&kind, &mc.name_any(), mc)),
            Err(error) if error.namespace_terminating() => {
                debug!(%error, "the namespace is being deleted");
                return Ok(Step::Gone);
            }
            Err(error) => blocked = Some(Blocked::refused(error)?),
        }
    }
    // Someone else's pod in a member's name: left alone, and said, as for a Service.
    if let (None, Some(pod)) = (&blocked, &written.foreign) {
        blocked = Some(foreign("Pod", pod, mc));
    }
    let rollout_queued = budget(&ctx.remembered.rollouts, mc, seen, &written);
    let quiet = blocked.is_none() && !written.any;
    // The members take the current template one at a time, in place where they can.
    let updating = match quiet && !written.waiting {
        true => {
            let keeper = Keeper {
                wait: proxy.as_ref().and_then(|p| p.members_wait),
                ..seen.members.keeper(mc)
            };
            members::update(ctx, mc, keeper).await?
        }
        false => None,
    };
    // Sized from the cache's own signals, while autoscaling is on; a blocked Memcached keeps
    // the last decision.
    let autoscaling = match quiet {
        true => autoscale::autoscale(ctx, mc).await?,
        false => last_autoscaling(mc),
    };
    // The binding applications mount; a blocked Memcached's stays as it was.
    let mut bound = binding::reported(mc);
    if quiet {
        match binding::ensure(&ctx.client, mc, &copied).await? {
            Ok(name) => bound = name,
            Err(why) => (blocked, bound) = (Some(why), None),
        }
    }
    let proxy = proxy.filter(|_| blocked.is_none());
    Ok(Step::Applied(Box::new(Applied {
        blocked,
        written,
        rollout_queued,
        updating,
        autoscaling,
        binding: bound,
        unissued,
        proxy,
    })))
}

/// The objects beside the members: applied where they differ, deleted where no longer wanted.
/// `sweep`: the members to sweep before the proxy's layout changes.
async fn objects(
    ctx: &Context,
    mc: &Memcached,
    seen: &Seen,
    desired: Desired,
    sweep: Option<&Sweep>,
) -> Result<()> {
    let ns = mc.namespace().unwrap_or_default();
    let services: Api<OwnedObject<Service>> = Api::namespaced(ctx.client.clone(), &ns);
    let budgets = kept(&ctx.client, &ns, Some(&ctx.cached.budgets)).map(|(api, _)| api);
    let policies = kept(&ctx.client, &ns, ctx.cached.network_policies.as_ref()).map(|(api, _)| api);
    let monitors = kept(&ctx.client, &ns, ctx.cached.service_monitors.as_ref()).map(|(api, _)| api);
    let certificates = kept(&ctx.client, &ns, ctx.cached.certificates.as_ref()).map(|(api, _)| api);
    let service = seen.service.clone();
    tokio::try_join!(
        // Boxed: its futures would grow every reconcile's, and the debug build's stack.
        Box::pin(proxy(ctx, mc, seen, desired.proxy, sweep)),
        ensure(
            ctx,
            mc,
            &services,
            service,
            desired.service,
            Announce::Always
        ),
        ensure_optional(
            ctx,
            mc,
            budgets.as_ref(),
            seen.budget.clone(),
            desired.budget
        ),
        ensure_optional(
            ctx,
            mc,
            policies.as_ref(),
            seen.policy.clone(),
            desired.policy
        ),
        ensure_optional(
            ctx,
            mc,
            monitors.as_ref(),
            seen.monitor.clone(),
            desired.monitor
        ),
        ensure_optional(
            ctx,
            mc,
            certificates.as_ref(),
            seen.certificate.clone(),
            desired.certificate
        ),
    )?;
    Ok(())
}

/// The proxy's objects (`spec.proxy`), applied where they differ, deleted when it is turned
/// off. Its Service is ours to delete too, unlike the members'. Before its layout changes, the
/// members are swept against the layout in force.
async fn proxy(
    ctx: &Context,
    mc: &Memcached,
    seen: &Seen,
    desired: Proxy,
    sweep: Option<&Sweep>,
) -> Result<()> {
    let ns = mc.namespace().unwrap_or_default();
    let deployments: Api<OwnedObject<Deployment>> = Api::namespaced(ctx.client.clone(), &ns);
    let services: Api<OwnedObject<Service>> = Api::namespaced(ctx.client.clone(), &ns);
    let config_maps: Api<OwnedObject<ConfigMap>> = Api::namespaced(ctx.client.clone(), &ns);
    let budgets: Api<OwnedObject<PodDisruptionBudget>> = Api::namespaced(ctx.client.clone(), &ns);
    // The layout before the Deployment: the proxy's first pods mount it.
    let new_layout = match (&seen.proxy.config_map, &desired.config_map) {
        (Some(kept), Some(wanted)) => kept.needs(wanted).then(|| layout_digest(wanted)),
        _ => None,
    };
    if let Some(sweep) = sweep {
        sweep_members(ctx, mc, sweep).await;
    }
    ensure_optional(
        ctx,
        mc,
        Some(&config_maps),
        seen.proxy.config_map.clone(),
        desired.config_map,
    )
    .await?;
    if let Some(digest) = new_layout {
        nudge_proxies(ctx, mc, &digest).await;
    }
    tokio::try_join!(
        ensure_optional(
            ctx,
            mc,
            Some(&deployments),
            seen.proxy.deployment.clone(),
            desired.deployment
        ),
        ensure_optional(
            ctx,
            mc,
            Some(&services),
            seen.proxy.service.clone(),
            desired.service
        ),
        ensure_optional(
            ctx,
            mc,
            Some(&budgets),
            seen.proxy.budget.clone(),
            desired.budget
        ),
    )?;
    Ok(())
}

/// Sweeps the members `sweep` names against the layout in force, on the addresses the proxy
/// reaches them at (logged in there with auth: proxy::fronted). Best effort: a member that
/// cannot be swept is warned about and the layout changes all the same, since a change of
/// members (the autoscaler's too) must not wait on one member; what that member holds for
/// others may read back old after a later change.
async fn sweep_members(ctx: &Context, mc: &Memcached, sweep: &Sweep) {
    let name = mc.name_any();
    let addresses = ctx
        .cached
        .pods
        .addresses_of(&mc.namespace().unwrap_or_default(), &name);
    let port = u16::try_from(proxy::backend_port(mc)).unwrap_or_default();
    let at = |n: i32| {
        let ip = addresses.get(&format!("{name}-{n}")).copied();
        ip.map(|ip| SocketAddr::new(ip, port))
    };
    for n in &sweep.members {
        let member = format!("{name}-{n}");
        let (in_force, place) = sweep.owners_of(*n);
        let owners: Vec<_> = in_force.into_iter().map(at).collect();
        let swept = match at(*n) {
            Some(addr) => sweep::sweep(addr, place, &owners, sweep.keep_moved).await,
            None => Err(std::io::Error::other("it has no address")),
        };
        match swept {
            Ok(swept) => info!(
                %member,
                kept = swept.kept,
                moved = swept.moved,
                deleted = swept.deleted,
                "swept before the proxy's layout changes"
            ),
            Err(error) => ctx.events.sweep_failed(mc, &member, &error),
        }
    }
}

/// The kubelet refreshes a mounted ConfigMap when it syncs the pod, once a minute unless the
/// pod changes: annotating the proxy's pods with the new layout's digest has it do so at once,
/// and their agents load the layout within seconds. Best effort: the periodic sync still
/// comes.
async fn nudge_proxies(ctx: &Context, mc: &Memcached, digest: &str) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let selector = proxy::selector_string(mc);
    let listed = match pods
        .list_metadata(&ListParams::default().labels(&selector))
        .await
    {
        Ok(listed) => listed,
        Err(error) => return warn!(%error, "cannot list the proxy's pods to refresh their layout"),
    };
    let patch = json!({"metadata": {"annotations": {proxy::LAYOUT_ANNOTATION: digest}}});
    for pod in listed.items {
        let name = pod.name_any();
        if let Err(error) = pods
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(pod = %name, %error, "cannot annotate a proxy's pod with its new layout");
        }
    }
}

/// A short digest of the layout the ConfigMap holds.
fn layout_digest(config_map: &ConfigMap) -> String {
    format!("{:016x}", digest(&config_map.data).unwrap_or_default())
}

/// Keeps the rollout budget's count of `mc` (rolling or not); the limit while `mc`'s update
/// waits for a slot.
fn budget(rollouts: &Rollouts, mc: &Memcached, seen: &Seen, written: &Written) -> Option<usize> {
    let rolling = !written.waiting && rollouts::is_rolling(mc.spec.size, &seen.members.counts);
    rollouts.members(&mc.namespace().unwrap_or_default(), &mc.name_any(), rolling);
    written.waiting.then(|| rollouts.limit())
}

fn last_autoscaling(mc: &Memcached) -> Option<AutoscalingStatus> {
    mc.status
        .as_ref()
        .and_then(|s| s.autoscaling.clone())
        .filter(|_| autoscale::enabled(mc))
}

fn foreign(kind: &str, name: &str, mc: &Memcached) -> Blocked {
    Blocked::ResourceExists {
        message: status::named_conflict_message(kind, name, mc),
    }
}
