//! Plan: what a reconcile will do, from what it observed. Pure: no client, no clock. What
//! blocks the Memcached and why, the objects it should have (built once), the Secrets to
//! generate and the members' moves.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::desired::Desired;
use super::observe::Seen;
use crate::api::Memcached;
use crate::controller::members::own::{self, Moves};
use crate::controller::secrets::{self, Secrets};
use crate::error::Refusal;
use crate::resources::binding::Copied;
use crate::resources::{self, is_controlled_by};
use crate::status::{self, Blocked};
use crate::validation;

/// What a reconcile will do.
pub struct Plan {
    /// Why nothing may be applied: the pods running now keep serving.
    pub blocked: Option<Blocked>,
    pub desired: Desired,
    /// What the binding repeats of the Secrets the pods mount.
    pub copied: Copied,
    /// The certificate Secret cert-manager has not issued yet: the pods wait for it.
    pub unissued: Option<String>,
    /// The credentials Secret to generate.
    pub generate: Option<String>,
    pub moves: Moves,
    /// The proxy's layout, while it is on.
    pub proxy: Option<ProxyPlan>,
}

/// The plan for `mc` from what was `seen`.
pub fn plan(mc: &Memcached, seen: &Seen, mut desired: Desired) -> Plan {
    let mut blocked = blocked(mc, seen, &desired);
    let ready = |n| seen.members.is_ready(mc, n);
    let updating = !seen.members.all_updated();
    let zone = |n| seen.members.zone(mc, n);
    let proxy = proxy::layout(mc, ready, seen.now)
        .map(|p| p.holding(mc, updating, seen.now).in_zones(mc, zone, ready));
    desired.proxy.config_map = proxy
        .as_ref()
        .map(|p| resources::proxy::config_map(mc, &p.layout));
    let keep = proxy.as_ref().map_or(mc.spec.size, |p| p.keep);
    // The Secrets matter only to what would be applied.
    let (copied, unissued, generate) = match (&blocked, secrets::judge(mc, &seen.secrets)) {
        (Some(_), _) => Default::default(),
        (None, Secrets::Unusable(why)) => {
            blocked = Some(why);
            Default::default()
        }
        (
            None,
            Secrets::Usable {
                copied,
                unissued,
                generate,
            },
        ) => (copied, unissued, generate),
    };
    Plan {
        blocked,
        moves: own::moves(mc, &seen.members, keep),
        proxy,
        desired,
        copied,
        unissued,
        generate,
    }
}

/// Why nothing may be applied, in this order: an object of our name that this Memcached does
/// not control is left untouched; a spec that cannot work is not applied; a policy or
/// certificate asked for that this process cannot keep (rather than pods running without what
/// the user counts on). Then (`plan`) Secrets the pods cannot mount.
fn blocked(mc: &Memcached, seen: &Seen, desired: &Desired) -> Option<Blocked> {
    let name = mc.name_any();
    let proxy = crate::resources::proxy::name(mc);
    // The proxy's names are someone else's business while it is not wanted (another Memcached
    // may be called `<name>-proxy`).
    let proxied = desired.proxy.deployment.is_some();
    let proxy_budget = desired.proxy.budget.is_some();
    let foreign: [(&str, &str, Option<&ObjectMeta>); 9] = [
        (
            "Service",
            &name,
            seen.service.as_deref().map(|o| &o.metadata),
        ),
        (
            "PodDisruptionBudget",
            &name,
            seen.budget.as_deref().map(|o| &o.metadata),
        ),
        (
            "NetworkPolicy",
            &name,
            seen.policy.as_deref().map(|o| &o.metadata),
        ),
        (
            "ServiceMonitor",
            &name,
            seen.monitor.as_deref().map(|o| &o.metadata),
        ),
        (
            "Certificate",
            &name,
            seen.certificate.as_deref().map(|o| &o.metadata),
        ),
        (
            "Deployment",
            &proxy,
            seen.proxy
                .deployment
                .as_deref()
                .filter(|_| proxied)
                .map(|o| &o.metadata),
        ),
        (
            "Service",
            &proxy,
            seen.proxy
                .service
                .as_deref()
                .filter(|_| proxied)
                .map(|o| &o.metadata),
        ),
        (
            "ConfigMap",
            &proxy,
            seen.proxy
                .config_map
                .as_deref()
                .filter(|_| proxied)
                .map(|o| &o.metadata),
        ),
        (
            "PodDisruptionBudget",
            &proxy,
            seen.proxy
                .budget
                .as_deref()
                .filter(|_| proxy_budget)
                .map(|o| &o.metadata),
        ),
    ];
    let foreign = foreign
        .into_iter()
        .find(|(_, _, m)| m.is_some_and(|m| !is_controlled_by(m, mc)));
    if let Some((kind, name, _)) = foreign {
        return Some(Blocked::ResourceExists {
            message: status::named_conflict_message(kind, name, mc),
        });
    }
    if let Err(message) = validation::validate(&mc.spec) {
        return Some(Blocked::InvalidSpec { message });
    }
    if let Some(message) = desired.proxy.invalid_image.clone() {
        return Some(Blocked::InvalidSpec { message });
    }
    if let Some(message) = seen.proxy.refused_image.clone() {
        return Some(Blocked::InvalidSpec { message });
    }
    if desired.policy.is_some() && !seen.keeps_policies {
        return Some(Blocked::Refused {
            refusal: Refusal::Forbidden,
            message: status::NETWORK_POLICIES_FORBIDDEN.to_string(),
        });
    }
    if desired.certificate.is_some() && !seen.keeps_certificates {
        return Some(Blocked::InvalidSpec {
            message: status::CERTIFICATES_UNAVAILABLE.to_string(),
        });
    }
    None
}

mod proxy;
pub use proxy::{ProxyPlan, Sweep};

#[cfg(test)]
mod tests;
