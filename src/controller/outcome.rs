//! What a reconcile found, and so what its worker does next: a domain outcome the reconcile
//! returns, turned into the runtime's `Next` here and nowhere else.

use std::time::Duration;

use operator_runtime::workers::{Next, Retry};

use crate::error::{Error, Refusal};
use crate::status::Blocked;

/// Retry delay for a reconcile that arrives before its scope's owned caches are filled.
pub const CACHE_WAIT: Duration = Duration::from_millis(100);
/// While an object of our name belongs to someone else we cannot watch it (it is not ours), so
/// look again this often.
pub const CONFLICT_RECHECK: Duration = Duration::from_secs(30);
/// How often an apply the API server refused as invalid is tried again without a spec change:
/// what refused it (an admission policy) may change without the Memcached changing.
pub const REFUSED_RECHECK: Duration = Duration::from_secs(300);
/// Secrets are not watched (the operator reads only the ones Memcacheds name), so a missing or
/// unusable one is looked at again this often.
pub const SECRET_RECHECK: Duration = Duration::from_secs(10);
/// How often a binding that copies Secrets reads them again: a rotated password reaches it
/// within this (plus the kubelet's refresh of an application's mount), well inside the default
/// rotation grace of 300 s; each such Memcached costs its Secrets' reads this often.
pub const COPY_RECHECK: Duration = Duration::from_secs(30);
/// How often members that could not be created are tried again: what refused them (a quota, a
/// policy) changes nothing the operator watches.
pub const MISSING_RECHECK: Duration = Duration::from_secs(10);
/// How often a pod template change waiting for a rollout slot asks again.
pub const ROLLOUT_WAIT: Duration = Duration::from_secs(15);

/// How a reconcile ended, short of an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is as the spec asks, or was just written (its watch events queue the status
    /// refresh).
    Converged,
    /// The Memcached, or its namespace, is being deleted: nothing to apply or report.
    Gone,
    /// This scope's caches are still filling: a status now would be wrong (no pods yet) and be
    /// corrected a moment later, two needless writes.
    CachesFilling,
    /// A pod template change of the operator's own waits for a rollout slot.
    WaitingForRolloutSlot,
    /// Members are being updated (members.rs): look again this soon, if no pod event comes first.
    UpdatingMembers(Duration),
    /// Members the operator keeps itself are Ready but not yet for `minReadySeconds`: no event
    /// comes when they are, so look again then to report them available.
    MembersBecomingAvailable(Duration),
    /// A member is not Ready: no event comes when it has not been for the progress deadline,
    /// so look again then to report it.
    AwaitingProgress(Duration),
    /// Members could not be created (a quota, a policy): try again.
    PodsMissing,
    /// The proxy's handover from its previous layout ends then: nothing else comes when it
    /// does.
    HandingOver(Duration),
    /// Converged, with a binding that copies Secrets the operator does not watch: read again
    /// shortly, so that a rotated password or a renewed CA reaches the binding.
    CopyingSecrets,
    /// Converged, with autoscaling on: the members are read again after the poll interval.
    Autoscaling,
    /// Nothing was applied, for the reason the status and an event report.
    Blocked(Blocked),
}

impl Outcome {
    pub fn next(&self) -> Next {
        match self {
            Outcome::Converged | Outcome::Gone => Next::AwaitChange,
            Outcome::CachesFilling => Next::After(CACHE_WAIT),
            Outcome::WaitingForRolloutSlot => Next::After(ROLLOUT_WAIT),
            Outcome::UpdatingMembers(recheck)
            | Outcome::MembersBecomingAvailable(recheck)
            | Outcome::AwaitingProgress(recheck)
            | Outcome::HandingOver(recheck) => Next::After(*recheck),
            Outcome::CopyingSecrets => Next::After(COPY_RECHECK),
            Outcome::Autoscaling => Next::After(super::autoscale::POLL),
            Outcome::PodsMissing => Next::After(MISSING_RECHECK),
            Outcome::Blocked(Blocked::ResourceExists { .. }) => Next::After(CONFLICT_RECHECK),
            // A spec change queues the next reconcile.
            Outcome::Blocked(Blocked::InvalidSpec { .. }) => Next::AwaitChange,
            Outcome::Blocked(Blocked::InvalidSecret { .. }) => Next::After(SECRET_RECHECK),
            // A failure for the metrics. The same request gets the same no, so an invalid object
            // is only rechecked slowly; a 403 (a quota, RBAC warming up after an API server
            // restart) can pass without any change of ours and goes through the backoff.
            Outcome::Blocked(Blocked::Refused { refusal, message }) => Next::Failed {
                reason: "refused",
                message: message.clone(),
                retry: match refusal {
                    Refusal::Invalid => Retry::After(REFUSED_RECHECK),
                    Refusal::Forbidden => Retry::Backoff,
                },
            },
        }
    }
}

/// A reconcile that failed is retried with the per-object backoff.
pub fn failed(error: &Error) -> Next {
    Next::Failed {
        reason: error.metric_label(),
        message: error.to_string(),
        retry: Retry::Backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(refusal: Refusal) -> Outcome {
        Outcome::Blocked(Blocked::Refused {
            refusal,
            message: "exceeded quota".into(),
        })
    }

    #[test]
    fn an_invalid_object_is_a_failure_rechecked_slowly() {
        assert_eq!(
            refused(Refusal::Invalid).next(),
            Next::Failed {
                reason: "refused",
                message: "exceeded quota".into(),
                retry: Retry::After(REFUSED_RECHECK)
            }
        );
    }

    #[test]
    fn a_forbidden_apply_is_a_failure_retried_with_the_backoff() {
        let Next::Failed { retry, .. } = refused(Refusal::Forbidden).next() else {
            panic!("a failure")
        };
        assert_eq!(retry, Retry::Backoff);
    }

    #[test]
    fn someone_elses_object_is_rechecked_and_an_invalid_spec_waits_for_a_change() {
        let exists = Outcome::Blocked(Blocked::ResourceExists {
            message: String::new(),
        });
        assert_eq!(exists.next(), Next::After(CONFLICT_RECHECK));
        let invalid = Outcome::Blocked(Blocked::InvalidSpec {
            message: String::new(),
        });
        assert_eq!(invalid.next(), Next::AwaitChange);
    }
}
