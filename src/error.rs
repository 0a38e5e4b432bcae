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
}

impl Error {
    /// Low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply { .. } => "apply",
            Error::Status { .. } => "status",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
