//! What a reconcile reads and shares: the API client, the caches of owned objects, and the
//! controller's shared parts.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;

use super::autoscale::remembered::Autoscaler;
use super::events::Events;
use super::hpa_index::HpaIndex;
use super::legacy::cache as legacy;
use super::members::replacing::Replacing;
use super::own_writes::OwnWrites;
use super::owned::OwnedObject;
use super::pod_index::PodIndex;
use super::rollouts::Rollouts;
use crate::certificate::Certificate;
use crate::metrics::Metrics;
use crate::resources::Images;
use crate::service_monitor::ServiceMonitor;
use operator_runtime::cache::Cache;
use operator_runtime::readiness::SyncGate;

/// What a reconcile needs: the API client and the caches of owned objects.
pub struct Context {
    pub client: Client,
    pub services: Cache<OwnedObject<Service>>,
    /// Of releases up to 0.6.0, until each is adopted.
    pub legacy_stateful_sets: legacy::Cache,
    pub pod_disruption_budgets: Cache<OwnedObject<PodDisruptionBudget>>,
    /// Owned NetworkPolicies; None where this process may not watch them.
    pub network_policies: Option<Cache<OwnedObject<NetworkPolicy>>>,
    /// Owned ServiceMonitors; None where the cluster does not serve their API.
    pub service_monitors: Option<Cache<OwnedObject<ServiceMonitor>>>,
    /// Owned cert-manager Certificates; None where the cluster does not serve their API or this
    /// process may not watch them.
    pub certificates: Option<Cache<OwnedObject<Certificate>>>,
    pub pods: Arc<PodIndex>,
    /// Our writes to owned objects, so that their watches do not take them for drift.
    pub own_writes: Arc<OwnWrites>,
    pub rollouts: Arc<Rollouts>,
    /// Members evicted for an update whose replacements do not serve yet.
    pub replacing: Replacing,
    /// What the autoscaler remembers of each autoscaled Memcached.
    pub autoscaler: Autoscaler,
    /// HorizontalPodAutoscalers by the Memcached they target; None where this process may not
    /// watch them.
    pub hpas: Option<Arc<HpaIndex>>,
    pub events: Events,
    pub images: Images,
    /// Where this operator runs, when in a cluster: its pods are let through a Memcached's
    /// NetworkPolicy to read the members' `stats`.
    pub operator_namespace: Option<String>,
    pub metrics: Arc<Metrics>,
    /// This scope's watch caches: reconciling before they are filled would report a wrong status
    /// (no pods yet) and correct it a moment later, two needless writes per object.
    pub caches: SyncGate,
}
