//! The objects beside the members that a Memcached's spec wants, built once per reconcile:
//! observe reads what it wants, plan decides, apply applies them.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::Memcached;
use crate::certificate::Certificate;
use crate::resources;
use crate::service_monitor::ServiceMonitor;

/// The objects beside the members that the spec wants.
pub struct Desired {
    pub service: Service,
    pub budget: Option<PodDisruptionBudget>,
    pub policy: Option<NetworkPolicy>,
    pub monitor: Option<ServiceMonitor>,
    pub certificate: Option<Certificate>,
}

/// The objects `mc`'s spec wants; `operator_namespace` is let through its NetworkPolicy.
pub fn desired(mc: &Memcached, operator_namespace: Option<&str>) -> Desired {
    Desired {
        service: resources::service(mc),
        budget: resources::pod_disruption_budget(mc),
        policy: resources::network_policy(mc, operator_namespace),
        monitor: resources::service_monitor(mc),
        certificate: resources::tls::certificate(mc),
    }
}
