//! Reconcile errors. Each carries a short, stable label for the `reason` of metrics and logs.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {kind} {name}: {source}")]
    Read {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying {kind} {name}: {source}")]
    Apply {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating status of Memcached {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("setting the size of Memcached {name} through its scale subresource: {source}")]
    Scale {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// An object of an owned object's name exists and this Memcached does not control it.
    #[error("{kind} of the Memcached's name belongs to someone else")]
    Foreign { kind: String },
    /// Members of a release up to 0.6.0 are not handed over as of another template than theirs
    /// (legacy.rs says which).
    #[error("{0}")]
    Adoption(String),
}

/// Why the API server refused to apply an object: the answer will be the same until the spec
/// (or the cluster's policy or quota) changes, so it is reported, not retried hot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 400 or 422: the object is invalid, or an admission policy denied it.
    Invalid,
    /// 403: forbidden, e.g. by a ResourceQuota, or by RBAC while a restarted API server's
    /// authorizer warms up: it can pass without any change of ours, so it is retried with the
    /// per-object back-off.
    Forbidden,
}

impl Refusal {
    /// The refusal an API status code is, if it is one: a 4xx other than not-found, conflict
    /// and throttling.
    pub fn of(code: u16) -> Option<Self> {
        match code {
            403 => Some(Refusal::Forbidden),
            400..=499 if ![404, 409, 429].contains(&code) => Some(Refusal::Invalid),
            _ => None,
        }
    }
}

impl Error {
    /// Low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply { .. } => "apply",
            Error::Status { .. } => "status",
            Error::Scale { .. } => "scale",
            Error::Foreign { .. } => "foreign",
            Error::Adoption(_) => "adoption",
        }
    }

    /// Whether this is an apply refused because the namespace is being deleted: the namespace
    /// controller deletes the Memcached with everything else there, so there is nothing to
    /// retry and nothing to report.
    pub fn namespace_terminating(&self) -> bool {
        matches!(self, Error::Apply { source, .. } if namespace_terminating(source))
    }

    /// Whether this is an apply that the API server refused for good (a 4xx other than
    /// not-found, conflict and throttling), and the server's message.
    pub fn refusal(&self) -> Option<(Refusal, String)> {
        let Error::Apply {
            kind,
            name,
            source: kube::Error::Api(status),
        } = self
        else {
            return None;
        };
        let refusal = Refusal::of(status.code)?;
        Some((
            refusal,
            format!("the API server refused {kind} {name}: {}", status.message),
        ))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether the API server refused a write because the namespace is being deleted.
pub fn namespace_terminating(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
    if status.code == 403 && status.details.as_ref().is_some_and(|details| {
        details.causes.iter().any(|cause| cause.reason == "NamespaceTerminating")
    }))
}
