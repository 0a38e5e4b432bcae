//! The prometheus-operator's ServiceMonitor (`monitoring.coreos.com/v1`), with only the fields
//! this operator sets; the rest of what the API server returns is ignored. The operator never
//! installs this CRD: it keeps ServiceMonitors only where the cluster already serves the API
//! (see `operator_runtime::watch_namespace::served`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Which Services' endpoints Prometheus scrapes, and how.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "monitoring.coreos.com",
    version = "v1",
    kind = "ServiceMonitor",
    plural = "servicemonitors",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    /// Services (in the ServiceMonitor's namespace) whose endpoints are scraped.
    pub selector: LabelSelector,
    pub endpoints: Vec<Endpoint>,
}

/// One scraped port of the selected Services.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Name of the Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}
