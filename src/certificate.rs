//! cert-manager's Certificate (`cert-manager.io/v1`), with only the fields this operator sets;
//! the rest of what the API server returns is ignored. Kept for `spec.tls.issuerRef` where the
//! cluster serves the API; the operator never installs cert-manager or its CRDs.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub use crate::api::IssuerRef;

/// A certificate cert-manager keeps issued, renewed, in a `kubernetes.io/tls` Secret.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "Certificate",
    plural = "certificates",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    /// The Secret cert-manager writes `tls.crt`, `tls.key` and `ca.crt` to.
    pub secret_name: String,
    pub dns_names: Vec<String>,
    pub issuer_ref: IssuerRef,
    pub usages: Vec<String>,
}
