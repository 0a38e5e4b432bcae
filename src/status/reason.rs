//! The reasons of the conditions this operator sets.

use super::pods::Cause;

/// Reasons of the conditions this operator sets. Code decides on these; the strings are only
/// for the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    AllPodsReady,
    PodsNotReady,
    Converged,
    Creating,
    Reconciling,
    /// Members are being updated; no more are out than the update may take.
    Updating,
    /// Members are updated in place (new images, a larger memory, new requests or limits),
    /// keeping their caches (controller/members.rs).
    RestartingInPlace,
    /// Members are replaced one at a time for a pod spec they cannot take in place.
    ReplacingMembers,
    /// The operator's own pod template change waits for a rollout slot (controller/rollouts.rs).
    RolloutQueued,
    /// Members beyond the size serve the proxy's previous layout until its handover ends.
    DrainingMembers,
    AsExpected,
    /// An object of the Memcached's name belongs to someone else.
    ResourceExists,
    /// The spec cannot work (see validation.rs), or the API server refused what it asks for.
    InvalidSpec,
    /// The Secret `spec.auth` names is missing or memcached cannot use its credentials.
    InvalidSecret,
    /// The API server forbade an owned object (a quota, a policy).
    Forbidden,
    /// Why pods are not Ready (see `Trouble`).
    Unschedulable,
    ImagePullFailed,
    CrashLooping,
    OOMKilled,
    /// Pods cannot be created (a quota, an admission policy).
    PodCreationRefused,
    /// The pods wait for the certificate cert-manager is to issue (`tls.issuerRef`).
    CertificatePending,
    /// A member has not been Ready for `rollout.progressDeadlineSeconds`.
    ProgressDeadlineExceeded,
    AutoscalerConflict,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllPodsReady => "AllPodsReady",
            Self::PodsNotReady => "PodsNotReady",
            Self::Converged => "Converged",
            Self::Updating => "Updating",
            Self::RestartingInPlace => "RestartingInPlace",
            Self::ReplacingMembers => "ReplacingMembers",
            Self::Creating => "Creating",
            Self::Reconciling => "Reconciling",
            Self::RolloutQueued => "RolloutQueued",
            Self::DrainingMembers => "DrainingMembers",
            Self::AsExpected => "AsExpected",
            Self::ResourceExists => "ResourceExists",
            Self::InvalidSpec => "InvalidSpec",
            Self::InvalidSecret => "InvalidSecret",
            Self::Forbidden => "Forbidden",
            Self::Unschedulable => "Unschedulable",
            Self::ImagePullFailed => "ImagePullFailed",
            Self::CrashLooping => "CrashLooping",
            Self::OOMKilled => "OOMKilled",
            Self::PodCreationRefused => "PodCreationRefused",
            Self::CertificatePending => "CertificatePending",
            Self::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            Self::AutoscalerConflict => "AutoscalerConflict",
        }
    }

    pub const ALL: [Reason; 23] = [
        Self::AllPodsReady,
        Self::PodsNotReady,
        Self::Converged,
        Self::Creating,
        Self::Reconciling,
        Self::Updating,
        Self::RestartingInPlace,
        Self::ReplacingMembers,
        Self::RolloutQueued,
        Self::DrainingMembers,
        Self::AsExpected,
        Self::ResourceExists,
        Self::InvalidSpec,
        Self::InvalidSecret,
        Self::Forbidden,
        Self::Unschedulable,
        Self::ImagePullFailed,
        Self::CrashLooping,
        Self::OOMKilled,
        Self::PodCreationRefused,
        Self::CertificatePending,
        Self::ProgressDeadlineExceeded,
        Self::AutoscalerConflict,
    ];

    /// The reason a condition's string names, if it is one of ours.
    pub fn parse(reason: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

impl From<Cause> for Reason {
    fn from(cause: Cause) -> Self {
        match cause {
            Cause::ImagePullFailed => Self::ImagePullFailed,
            Cause::OomKilled => Self::OOMKilled,
            Cause::CrashLooping => Self::CrashLooping,
            Cause::Unschedulable => Self::Unschedulable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(Reason::parse("FailedCreate"), None);
    }
}
