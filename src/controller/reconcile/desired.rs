//! The objects beside the members that a Memcached's spec wants, built once per reconcile:
//! observe reads what it wants, plan decides, apply applies them.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::resources::{self, Images, proxy};
use crate::service_monitor::ServiceMonitor;

/// The objects beside the members that the spec wants.
pub struct Desired {
    pub service: Service,
    pub budget: Option<PodDisruptionBudget>,
    pub policy: Option<NetworkPolicy>,
    pub monitor: Option<ServiceMonitor>,
    pub certificate: Option<Certificate>,
    pub proxy: Proxy,
}

/// The proxy's objects (`spec.proxy`): all None while it is off.
pub struct Proxy {
    pub deployment: Option<Deployment>,
    pub service: Option<Service>,
    /// The layout; set by the plan.
    pub config_map: Option<ConfigMap>,
    pub budget: Option<PodDisruptionBudget>,
    /// Why its image cannot run the proxy (one too old for it).
    pub invalid_image: Option<String>,
}

/// The objects `mc`'s spec wants; `operator_namespace` is let through its NetworkPolicy.
pub fn desired(mc: &Memcached, operator_namespace: Option<&str>, images: &Images) -> Desired {
    let memcached_image = resources::image(mc, &images.memcached);
    Desired {
        service: resources::service(mc),
        budget: resources::pod_disruption_budget(mc),
        policy: resources::network_policy(mc, operator_namespace),
        monitor: resources::service_monitor(mc),
        certificate: resources::tls::certificate(mc, resources::proxy::certificate_names(mc)),
        proxy: Proxy {
            deployment: proxy::deployment(mc, memcached_image, &images.agent),
            service: proxy::service(mc),
            // From the members as they are: the plan's.
            config_map: None,
            budget: proxy::pod_disruption_budget(mc),
            invalid_image: proxy::invalid_image(mc, memcached_image),
        },
    }
}
