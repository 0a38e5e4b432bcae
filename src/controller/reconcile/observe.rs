//! Observe: every read of a reconcile, before it writes anything. The owned objects come from
//! the caches (or a read while the status reports someone else's object in the name); the
//! Secrets the pods mount are read; the members are what the pod watch shows.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::desired::{self, Desired};
use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::controller::context::Context;
use crate::controller::ensure::{kept, lookup, lookup_optional, lookup_optional_named};
use crate::controller::members::own;
use crate::controller::secrets::{self, Mounts};
use crate::error::{Error, Result};
use crate::resources::proxy;
use crate::service_monitor::ServiceMonitor;
use crate::status::pods::PodTrouble;
use crate::watch::owned::OwnedObject;

/// What one reconcile read of the cluster for a Memcached.
pub struct Seen {
    pub service: Option<Arc<OwnedObject<Service>>>,
    pub budget: Option<Arc<OwnedObject<PodDisruptionBudget>>>,
    pub policy: Option<Arc<OwnedObject<NetworkPolicy>>>,
    pub monitor: Option<Arc<OwnedObject<ServiceMonitor>>>,
    pub certificate: Option<Arc<OwnedObject<Certificate>>>,
    pub proxy: SeenProxy,
    /// Whether this process may keep NetworkPolicies (it may watch them).
    pub keeps_policies: bool,
    /// Whether this process may keep cert-manager's Certificates (served and watchable).
    pub keeps_certificates: bool,
    /// The Secrets the pods mount.
    pub secrets: Mounts,
    pub members: own::Seen,
    /// Names of the Memcached's pods not being deleted, and what those not Ready say.
    pub pods: Vec<String>,
    pub troubles: Vec<PodTrouble>,
    /// When it looked.
    pub now: Timestamp,
}

/// The proxy's objects as they are (`spec.proxy`).
#[derive(Default)]
pub struct SeenProxy {
    pub deployment: Option<Arc<OwnedObject<Deployment>>>,
    pub service: Option<Arc<OwnedObject<Service>>>,
    pub config_map: Option<Arc<OwnedObject<ConfigMap>>>,
    pub budget: Option<Arc<OwnedObject<PodDisruptionBudget>>>,
    /// Why the wanted image cannot run the proxy, as a pod that failed its check told.
    pub refused_image: Option<String>,
}

/// Reads what a reconcile of `mc` decides from; `desired` says which optional objects are
/// wanted (one not wanted is looked for in the cache only, to delete it if it is ours).
pub async fn observe(ctx: &Context, mc: &Memcached, desired: &Desired) -> Result<Seen> {
    let ns = mc.namespace().unwrap_or_default();
    let services: Api<OwnedObject<Service>> = Api::namespaced(ctx.client.clone(), &ns);
    let budgets = kept(&ctx.client, &ns, Some(&ctx.cached.budgets));
    let policies = kept(&ctx.client, &ns, ctx.cached.network_policies.as_ref());
    let monitors = kept(&ctx.client, &ns, ctx.cached.service_monitors.as_ref());
    let certificates = kept(&ctx.client, &ns, ctx.cached.certificates.as_ref());
    // Independent requests go out together: a reconcile's latency is its longest chain of
    // round trips.
    let (service, budget, policy, monitor, certificate, proxy, secrets) = tokio::try_join!(
        lookup(&services, &ctx.cached.services, mc),
        lookup_optional(budgets.as_ref(), mc, desired.budget.is_some()),
        lookup_optional(policies.as_ref(), mc, desired.policy.is_some()),
        lookup_optional(monitors.as_ref(), mc, desired.monitor.is_some()),
        lookup_optional(certificates.as_ref(), mc, desired.certificate.is_some()),
        Box::pin(proxy(ctx, mc, &desired.proxy)),
        secrets::read_mounted(&ctx.client, mc),
    )?;
    let pods = ctx.cached.pods.pods_of(&ns, &mc.name_any());
    Ok(Seen {
        service,
        budget,
        policy,
        monitor,
        certificate,
        proxy,
        keeps_policies: policies.is_some(),
        keeps_certificates: certificates.is_some(),
        secrets,
        members: own::observe(&ctx.cached.pods, &ctx.config.images, mc),
        pods: pods.names,
        troubles: pods.troubles,
        now: Timestamp::now(),
    })
}

/// The proxy's objects: looked up while it is wanted, else only ours in the caches (to delete).
async fn proxy(ctx: &Context, mc: &Memcached, desired: &desired::Proxy) -> Result<SeenProxy> {
    let ns = mc.namespace().unwrap_or_default();
    let name = proxy::name(mc);
    let wanted = desired.deployment.is_some();
    let (deployments, services, config_maps, budgets) = (
        kept(&ctx.client, &ns, Some(&ctx.cached.deployments)),
        kept(&ctx.client, &ns, Some(&ctx.cached.services)),
        kept(&ctx.client, &ns, Some(&ctx.cached.config_maps)),
        kept(&ctx.client, &ns, Some(&ctx.cached.budgets)),
    );
    let (deployment, service, config_map, budget) = tokio::try_join!(
        lookup_optional_named(deployments.as_ref(), mc, &name, wanted),
        lookup_optional_named(services.as_ref(), mc, &name, wanted),
        lookup_optional_named(config_maps.as_ref(), mc, &name, wanted),
        lookup_optional_named(budgets.as_ref(), mc, &name, desired.budget.is_some()),
    )?;
    let refused_image = match (&deployment, proxy::spec(mc)) {
        (Some(kept), Some(spec)) if !settled(kept, spec.replicas) => {
            let memcached_image = crate::resources::image(mc, &ctx.config.images.memcached);
            proxy::refused_by(mc, memcached_image, &proxy_pods(ctx, mc).await?)
        }
        _ => None,
    };
    Ok(SeenProxy {
        deployment,
        service,
        config_map,
        budget,
        refused_image,
    })
}

/// Whether the Deployment runs just its `n` pods, all of its current template and Ready: no
/// rollout under way (one stalled on a new image leaves the old pods Ready).
fn settled(kept: &OwnedObject<Deployment>, n: i32) -> bool {
    kept.status
        .as_ref()
        .is_some_and(|s| s.ready_replicas >= n && s.updated_replicas >= n && s.replicas == n)
}

/// The proxy's pods, listed only while its Deployment is not settled: whether one failed the
/// check of its image is read from them.
async fn proxy_pods(ctx: &Context, mc: &Memcached) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let selector = proxy::selector_string(mc);
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| Error::Read {
            kind: "Pod".to_string(),
            name: selector.clone(),
            source,
        })?;
    Ok(listed.items)
}
