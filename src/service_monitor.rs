//! The prometheus-operator's ServiceMonitor (`monitoring.coreos.com/v1`), with only the fields
//! this operator sets; the rest of what the API server returns is ignored. The operator never
//! installs this CRD: it keeps ServiceMonitors only where the cluster already serves the API
//! (see `served`).

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::PostParams;
use kube::{Api, Client, CustomResource, Resource};
use serde::{Deserialize, Serialize};

use operator_runtime::watch_namespace::Scope;

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

/// Whether the API server serves ServiceMonitors (the prometheus-operator's CRD is installed).
/// Asked once at start: a CRD installed later is used after the operator's next restart.
pub async fn served(client: &Client) -> Result<bool, kube::Error> {
    let group_version = ServiceMonitor::api_version(&());
    match client.list_api_group_resources(&group_version).await {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|r| r.name == ServiceMonitor::plural(&()))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// The scopes where this process may not list or watch ServiceMonitors. A watch it may not run
/// would keep the operator from ever being ready, so with any such scope none are kept (an
/// install whose RBAC predates them, or that leaves them out on purpose).
pub async fn forbidden_scopes(
    client: &Client,
    scopes: &[Scope],
) -> Result<Vec<Scope>, kube::Error> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut forbidden = Vec::new();
    for scope in scopes {
        for verb in ["list", "watch"] {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(ServiceMonitor::group(&()).into_owned()),
                        resource: Some(ServiceMonitor::plural(&()).into_owned()),
                        verb: Some(verb.into()),
                        namespace: match scope {
                            Scope::Cluster => None,
                            Scope::Namespace(ns) => Some(ns.clone()),
                        },
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = reviews.create(&PostParams::default(), &review).await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                forbidden.push(scope.clone());
                break;
            }
        }
    }
    Ok(forbidden)
}
