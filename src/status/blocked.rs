//! Why nothing is applied for a Memcached, and the messages that say so.

use kube::ResourceExt;

use super::{DEGRADED, Reason};
use crate::api::{Memcached, MemcachedStatus};
use crate::error::Refusal;

/// Why nothing is applied for a Memcached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// An object of its name (a Service, a member's pod) that it does not control: left
    /// untouched.
    ResourceExists { message: String },
    /// A spec that cannot work: not applied, and the pods running now keep serving.
    InvalidSpec { message: String },
    /// The credentials Secret is missing or unusable: nothing applied, the pods keep serving
    /// with the passwords they have.
    InvalidSecret { message: String },
    /// The API server refused to apply an owned object.
    Refused { refusal: Refusal, message: String },
}

impl Blocked {
    /// An apply the API server refused for good, as reported; any other error as it is.
    pub fn refused(error: crate::error::Error) -> Result<Self, crate::error::Error> {
        let (refusal, message) = error.refusal().ok_or(error)?;
        Ok(Self::Refused { refusal, message })
    }

    pub fn reason(&self) -> Reason {
        match self {
            Self::ResourceExists { .. } => Reason::ResourceExists,
            Self::InvalidSpec { .. } => Reason::InvalidSpec,
            Self::InvalidSecret { .. } => Reason::InvalidSecret,
            Self::Refused {
                refusal: Refusal::Invalid,
                ..
            } => Reason::InvalidSpec,
            Self::Refused {
                refusal: Refusal::Forbidden,
                ..
            } => Reason::Forbidden,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Self::ResourceExists { message }
            | Self::InvalidSpec { message }
            | Self::InvalidSecret { message }
            | Self::Refused { message, .. } => message,
        }
    }

    /// Whether `status` already reports this cause (Degraded=True, same reason and message).
    pub fn is_reported_in(&self, status: Option<&MemcachedStatus>) -> bool {
        status.is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == DEGRADED
                    && c.status == "True"
                    && c.reason == self.reason().as_str()
                    && c.message == self.message()
            })
        })
    }
}

/// Why an object of the Memcached's own name is left alone: `Service default/cache ...`.
pub fn conflict_message(kind: &str, mc: &Memcached) -> String {
    named_conflict_message(kind, &mc.name_any(), mc)
}

/// Why a Memcached that asks for a NetworkPolicy gets nothing applied where this process may not
/// watch NetworkPolicies.
pub const NETWORK_POLICIES_FORBIDDEN: &str = "spec.networkPolicy asks for a NetworkPolicy, but the operator's ServiceAccount may not list and watch networkpolicies here: nothing applied; grant the networkpolicies rule of the operator's role, then restart the operator";

/// Why a Memcached whose certificate cert-manager should issue gets nothing applied where this
/// process cannot keep Certificates.
pub const CERTIFICATES_UNAVAILABLE: &str = "spec.tls.issuerRef asks cert-manager for the certificate, but this cluster does not serve cert-manager's API (certificates.cert-manager.io/v1) or the operator's ServiceAccount may not list and watch certificates: nothing applied; install cert-manager (or grant the certificates rule of the operator's role), then restart the operator";

/// As `conflict_message`, for an object named after the Memcached (e.g. `<name>-auth`).
pub fn named_conflict_message(kind: &str, name: &str, mc: &Memcached) -> String {
    format!(
        "{kind} {}/{name} already exists and is not controlled by this Memcached; remove it or rename the Memcached",
        mc.namespace().unwrap_or_default(),
    )
}
