//! What one line of spec turns on for a production tier: the binding Secret, the NetworkPolicy,
//! TLS and authentication.

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::DNS_SUBDOMAIN;

/// The binding Secret applications mount (servicebinding.io's Provisioned Service).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// true: the operator keeps the Secret `<name>-binding` current as pods come and go and as
    /// the credentials rotate. false: none (it holds a copy of the password).
    #[serde(default)]
    pub enabled: bool,
}

/// Who may connect to the pods, as a NetworkPolicy named after the Memcached.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// true: the operator keeps a NetworkPolicy `<name>` selecting the pods, admitting
    /// memcached's port (and tls.plaintextPort) from `from` and the exporter's 9150 from
    /// `metricsFrom`; every other port of the pods is closed to other pods. false: none.
    #[serde(default)]
    pub enabled: bool,

    /// Peers admitted to memcached, as in a NetworkPolicy's `ingress.from` (podSelector,
    /// namespaceSelector, ipBlock). Empty: every pod of the Memcached's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub from: Vec<NetworkPolicyPeer>,

    /// Peers admitted to the exporter's metrics port (with monitoring on): e.g. the
    /// namespace of the cluster's Prometheus, or an ipBlock for one on the nodes' network.
    /// Empty: every pod of every namespace (the metrics hold counters, no cached data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

/// memcached's TLS (`-Z`), from `kubernetes.io/tls` Secrets.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || has(self.secretName) || has(self.issuerRef)")
    .message("is required while TLS is enabled, unless issuerRef is set")
    .field_path(".secretName"))]
#[x_kube(validation = Rule::new("!(has(self.secretName) && has(self.issuerRef))")
    .message("and secretName are exclusive: the certificate comes from one or the other")
    .field_path(".issuerRef"))]
pub struct TlsSpec {
    /// true: memcached's port speaks TLS only (plain text only on plaintextPort, if set).
    /// Turning it on or off rolls the pods; renewing the certificate does not.
    #[serde(default)]
    pub enabled: bool,

    /// A `kubernetes.io/tls` Secret in the Memcached's namespace: `tls.crt` (the chain, leaf
    /// first) and `tls.key`. Clients that verify the server need its names, e.g.
    /// `<name>.<namespace>.svc`. A renewed certificate is in force within 2 minutes, without a
    /// restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub secret_name: Option<String>,

    /// cert-manager issues the certificate instead: the operator keeps a Certificate `<name>`
    /// from this Issuer or ClusterIssuer, for the Service's names (`<name>.<namespace>.svc`,
    /// its `cluster.local` form, and `*.` of both), in the Secret `<name>-tls`. Needs
    /// cert-manager's API (cert-manager.io/v1). cert-manager's renewals are in force within 2
    /// minutes, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,

    /// A Secret with `ca.crt`: memcached then refuses clients without a certificate signed by
    /// it (mutual TLS).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "clientCASecretName"
    )]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub client_ca_secret_name: Option<String>,

    /// A second port where memcached also serves plain text, for clients that cannot speak
    /// TLS yet. Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub plaintext_port: Option<i32>,
}

/// A cert-manager issuer, as a Certificate's `issuerRef` names it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
pub struct IssuerRef {
    /// The Issuer's (in the Memcached's namespace) or ClusterIssuer's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub name: String,

    /// Issuer (the default) or ClusterIssuer, or an external issuer's kind.
    #[serde(default = "default_issuer_kind")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    /// The issuer's API group: cert-manager.io (the default), or an external issuer's.
    #[serde(default = "default_issuer_group")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub group: String,
}

fn default_issuer_kind() -> String {
    "Issuer".into()
}

fn default_issuer_group() -> String {
    "cert-manager.io".into()
}

/// memcached's ASCII authentication, from a Secret with `username` and `password`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// true: memcached refuses every command of a client that has not authenticated. Turning it
    /// on or off rolls the pods; changing the Secret's content does not.
    #[serde(default)]
    pub enabled: bool,

    /// A Secret in the Memcached's namespace with keys `username` and `password` (no spaces,
    /// colons or line breaks; together at most 250 bytes). Unset: the operator creates
    /// `<name>-auth` with a random password, owned by the Memcached. Changing the named Secret's
    /// content rotates the password in the running pods within 2 minutes, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub secret_name: Option<String>,

    /// Seconds the previous password keeps working after the Secret changes, so clients can
    /// move to the new one without being refused.
    #[serde(default = "default_rotation_grace_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub rotation_grace_seconds: i32,
}

impl Default for AuthSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            secret_name: None,
            rotation_grace_seconds: default_rotation_grace_seconds(),
        }
    }
}

fn default_rotation_grace_seconds() -> i32 {
    300
}
