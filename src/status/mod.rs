//! Status of a Memcached computed from what the controller observed. Pure: no API calls, and the
//! clock is passed in, so every condition transition is unit-tested.

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::{Memcached, MemcachedStatus};
use crate::error::Refusal;
use crate::resources::selector_string;

pub mod pods;

use pods::{Cause, PodTrouble};

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Every condition type this operator sets.
pub const CONDITION_TYPES: [&str; 3] = [AVAILABLE, PROGRESSING, DEGRADED];

/// Reasons of the conditions this operator sets. Code decides on these; the strings are only
/// for the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    AllPodsReady,
    PodsNotReady,
    Converged,
    Creating,
    Reconciling,
    /// The operator's own pod template change waits for a rollout slot (controller/rollouts.rs).
    RolloutQueued,
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
    /// The ReplicaSet cannot create pods (a quota, an admission policy).
    PodCreationRefused,
    /// The Deployment made no progress within its deadline.
    ProgressDeadlineExceeded,
    /// The pods wait for the certificate cert-manager is to issue (`tls.issuerRef`).
    CertificatePending,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllPodsReady => "AllPodsReady",
            Self::PodsNotReady => "PodsNotReady",
            Self::Converged => "Converged",
            Self::Creating => "Creating",
            Self::Reconciling => "Reconciling",
            Self::RolloutQueued => "RolloutQueued",
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
            Self::ProgressDeadlineExceeded => "ProgressDeadlineExceeded",
            Self::CertificatePending => "CertificatePending",
        }
    }

    pub const ALL: [Reason; 18] = [
        Self::AllPodsReady,
        Self::PodsNotReady,
        Self::Converged,
        Self::Creating,
        Self::Reconciling,
        Self::RolloutQueued,
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
        Self::ProgressDeadlineExceeded,
        Self::CertificatePending,
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

/// What the controller saw of the cluster for one Memcached.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// The Deployment this Memcached controls, if any.
    pub deployment: Option<DeploymentSeen<'a>>,
    /// Names of its pods that are not being deleted.
    pub pods: Vec<String>,
    /// What its pods that are not Ready say of why.
    pub troubles: Vec<PodTrouble>,
    /// Set when the operator must not apply anything for this Memcached.
    pub blocked: Option<Blocked>,
    /// The operator's new pod template waits for a rollout slot; the limit is in the message.
    pub rollout_queued: Option<usize>,
    /// The binding Secret this Memcached has, if any.
    pub binding: Option<String>,
    /// The certificate Secret the pods mount that cert-manager has not issued yet.
    pub unissued: Option<String>,
}

/// What the status reads of a Deployment: its generation and its status.
#[derive(Clone, Copy, Debug)]
pub struct DeploymentSeen<'a> {
    pub generation: Option<i64>,
    pub status: Option<&'a DeploymentStatus>,
}

/// Why nothing is applied for a Memcached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// A Deployment or Service of its name that it does not control: left untouched.
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

/// The status a Memcached should have. Conditions keep their lastTransitionTime while their
/// status stays the same, so recomputing an unchanged status yields an equal value.
pub fn desired_status(mc: &Memcached, observed: &Observed, now: &Time) -> MemcachedStatus {
    desired_status_and_trouble(mc, observed, now).0
}

/// `desired_status`, and the trouble its conditions report (for the Warning event).
pub fn desired_status_and_trouble(
    mc: &Memcached,
    observed: &Observed,
    now: &Time,
) -> (MemcachedStatus, Option<Trouble>) {
    let size = mc.spec.size;
    let generation = mc.metadata.generation;
    let deploy_status = observed
        .deployment
        .and_then(|d| d.status.cloned())
        .unwrap_or_default();
    let replicas = deploy_status.replicas.unwrap_or(0);
    let ready = deploy_status.ready_replicas.unwrap_or(0);
    let available_replicas = deploy_status.available_replicas.unwrap_or(0);
    let updated = deploy_status.updated_replicas.unwrap_or(0);
    let deploy_observed_spec = observed.deployment.is_some_and(|d| {
        d.generation.is_some() && deploy_status.observed_generation >= d.generation
    });

    // At least size: a rollout's surge pod (maxSurge 1) is Ready before an old one leaves.
    let all_ready = observed.deployment.is_some() && ready >= size;
    let converged = all_ready && deploy_observed_spec && replicas == size && updated == size;
    let trouble = trouble(mc, observed);
    let pods_ready = format!("{ready}/{size} pods are ready");
    let available = match &trouble {
        _ if all_ready => cond(AVAILABLE, true, Reason::AllPodsReady, &pods_ready),
        Some(t) => cond(AVAILABLE, false, t.reason, &t.message()),
        None => cond(AVAILABLE, false, Reason::PodsNotReady, &pods_ready),
    };
    let (progressing, degraded) = match &observed.blocked {
        Some(b) => (
            cond(PROGRESSING, false, b.reason(), b.message()),
            cond(DEGRADED, true, b.reason(), b.message()),
        ),
        None => {
            let progressing = if let Some(limit) = observed.rollout_queued {
                let message = format!(
                    "the operator's new pod template waits for a rollout slot: at most {limit} roll at once (--max-concurrent-rollouts)"
                );
                cond(PROGRESSING, true, Reason::RolloutQueued, &message)
            } else if converged {
                let message = format!("{size} pods match the spec");
                cond(PROGRESSING, false, Reason::Converged, &message)
            } else if observed.deployment.is_none() {
                cond(
                    PROGRESSING,
                    true,
                    Reason::Creating,
                    "creating the Deployment",
                )
            } else if let Some(t) = &trouble {
                // kstatus and `kubectl rollout status` read a deadline passed as failed.
                let still = t.reason != Reason::ProgressDeadlineExceeded;
                cond(PROGRESSING, still, t.reason, &t.message())
            } else {
                let message = format!(
                    "{updated}/{size} pods updated, {ready}/{size} ready, {replicas} running"
                );
                cond(PROGRESSING, true, Reason::Reconciling, &message)
            };
            let degraded = match &trouble {
                Some(t) if t.lasting => cond(DEGRADED, true, t.reason, &t.message()),
                _ => cond(
                    DEGRADED,
                    false,
                    Reason::AsExpected,
                    "no cause that needs a fix is reported",
                ),
            };
            (progressing, degraded)
        }
    };

    let conditions = [available, progressing, degraded]
        .into_iter()
        .map(|mut c| {
            c.observed_generation = generation;
            keep_words(mc, &mut c, trouble.as_ref());
            keep_transition_time(mc, c, now)
        })
        .collect();

    let mut pods = observed.pods.clone();
    pods.sort();
    let status = MemcachedStatus {
        nodes: pods,
        replicas,
        ready_replicas: ready,
        available_replicas,
        selector: Some(selector_string(mc)),
        observed_generation: generation,
        conditions,
        binding: observed
            .binding
            .clone()
            .map(|name| crate::api::BindingStatus { name }),
    };
    (status, trouble)
}

/// A Deployment's own failure signals (quota, admission, stuck rollout): the only conditions of
/// a Deployment read here.
pub fn is_deployment_failure(c: &DeploymentCondition) -> bool {
    (c.type_ == "ReplicaFailure" && c.status == "True")
        || (c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
}

/// Why not all wanted pods are Ready (or a rollout is stuck), from the Deployment's failure
/// signals and the pods' own status: for the conditions and the Warning event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub reason: Reason,
    /// The counts, e.g. "0/2 pods are ready; 2 pods cannot be scheduled": the part of the
    /// message whose change is worth a status write.
    pub summary: String,
    /// The pods' or the Deployment's own words.
    pub words: String,
    /// Whether it stays until someone changes something (Degraded=True).
    pub lasting: bool,
}

impl Trouble {
    pub fn message(&self) -> String {
        format!("{}: {}", self.summary, self.words)
    }
}

/// The trouble of a Memcached, if any: a ReplicaSet that cannot create pods first (nothing
/// else can start), then the graver pod cause with the number of pods it holds back, then a
/// passed progress deadline.
fn trouble(mc: &Memcached, observed: &Observed) -> Option<Trouble> {
    let deployment_status = observed.deployment?.status;
    let ready = deployment_status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let pods_ready = format!("{ready}/{} pods are ready", mc.spec.size);
    let failures = || {
        deployment_status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| is_deployment_failure(c))
    };
    let words = |c: &DeploymentCondition| c.message.clone().unwrap_or_default();
    if let Some(c) = failures().find(|c| c.type_ == "ReplicaFailure") {
        return Some(Trouble {
            reason: Reason::PodCreationRefused,
            summary: format!("{pods_ready}; the ReplicaSet cannot create pods"),
            words: words(c),
            lasting: true,
        });
    }
    if let Some(cause) = observed.troubles.iter().map(|t| t.cause).min() {
        let mut held = observed.troubles.iter().filter(|t| t.cause == cause);
        let first = held.next().expect("the cause is some pod's");
        let count = 1 + held.count();
        let pods = if count == 1 {
            "1 pod".to_string()
        } else {
            format!("{count} pods")
        };
        let what = match cause {
            Cause::ImagePullFailed => "cannot pull the image",
            Cause::OomKilled => "OOMKilled",
            Cause::CrashLooping => "crash-looping",
            Cause::Unschedulable => "cannot be scheduled",
        };
        return Some(Trouble {
            reason: cause.into(),
            summary: format!("{pods_ready}; {pods} {what}"),
            words: first.words.to_string(),
            lasting: cause.lasting(),
        });
    }
    // Without it the pods cannot start, and say only that their containers are being created.
    if let Some(secret) = &observed.unissued {
        return Some(Trouble {
            reason: Reason::CertificatePending,
            summary: format!("{pods_ready}; cert-manager has not issued Secret {secret} yet"),
            words: format!(
                "see Certificate {} and its CertificateRequest (kubectl describe certificate {})",
                mc.name_any(),
                mc.name_any()
            ),
            lasting: failures().next().is_some(),
        });
    }
    failures().next().map(|c| Trouble {
        reason: Reason::ProgressDeadlineExceeded,
        summary: format!("{pods_ready}; the rollout made no progress in time"),
        words: words(c),
        lasting: true,
    })
}

fn cond(type_: &str, status: bool, reason: Reason, message: &str) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.as_str().to_string(),
        message: message.to_string(),
        last_transition_time: Time(Default::default()),
        observed_generation: None,
    }
}

/// A pod's own words change with each retry (back-off durations, the pull error then
/// "Back-off pulling image"); while the reason and the counts hold, the words first written stay,
/// so a retry is not a status write.
fn keep_words(mc: &Memcached, new: &mut Condition, trouble: Option<&Trouble>) {
    let Some(trouble) = trouble.filter(|t| t.reason.as_str() == new.reason) else {
        return;
    };
    let previous = mc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == new.type_));
    if let Some(p) = previous
        && p.status == new.status
        && p.reason == new.reason
        && p.message
            .strip_prefix(&trouble.summary)
            .is_some_and(|rest| rest.starts_with(": "))
    {
        new.message = p.message.clone();
    }
}

fn keep_transition_time(mc: &Memcached, mut new: Condition, now: &Time) -> Condition {
    let previous = mc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == new.type_));
    new.last_transition_time = match previous {
        Some(p) if p.status == new.status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    new
}

/// The user changed the spec since the last status was written.
pub fn spec_changed(mc: &Memcached) -> bool {
    mc.status.as_ref().and_then(|s| s.observed_generation) != mc.metadata.generation
}

/// The named condition's status, for callers that only need True/False.
pub fn condition_is_true(status: &MemcachedStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Why an object of the Memcached's own name is left alone: `Deployment default/cache ...`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{deployment_status, memcached, time};

    /// A Deployment at generation 1 with `status`.
    fn seen(status: &DeploymentStatus) -> Option<DeploymentSeen<'_>> {
        Some(DeploymentSeen {
            generation: Some(1),
            status: Some(status),
        })
    }

    /// The status of `mc` whose Deployment (at generation 1) reports `deployment` and whose
    /// pods report `troubles`.
    fn status_seeing(
        mc: &Memcached,
        deployment: &DeploymentStatus,
        troubles: Vec<PodTrouble>,
    ) -> MemcachedStatus {
        let observed = Observed {
            deployment: seen(deployment),
            troubles,
            ..Default::default()
        };
        desired_status(mc, &observed, &time(0))
    }

    fn find<'a>(s: &'a MemcachedStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn new_cr_without_deployment_is_progressing_and_unavailable() {
        let mc = memcached("cache", 3);
        let s = desired_status(&mc, &Observed::default(), &time(0));
        assert_eq!(find(&s, AVAILABLE).status, "False");
        assert_eq!(find(&s, PROGRESSING).status, "True");
        assert_eq!(find(&s, PROGRESSING).reason, "Creating");
        assert_eq!(find(&s, DEGRADED).status, "False");
        assert_eq!(s.observed_generation, Some(1));
        assert_eq!(
            s.selector.as_deref(),
            Some("app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached")
        );
    }

    #[test]
    fn available_only_when_size_pods_are_ready() {
        let mc = memcached("cache", 3);
        let partly = deployment_status(3, 2);
        let s = status_seeing(&mc, &partly, vec![]);
        assert_eq!(find(&s, AVAILABLE).status, "False");
        assert_eq!(find(&s, AVAILABLE).message, "2/3 pods are ready");
        assert_eq!(find(&s, PROGRESSING).status, "True");

        let full = deployment_status(3, 3);
        let pods = vec![
            "cache-b".to_string(),
            "cache-a".to_string(),
            "cache-c".to_string(),
        ];
        let s = desired_status(
            &mc,
            &Observed {
                deployment: seen(&full),
                pods,
                ..Default::default()
            },
            &time(0),
        );
        assert!(condition_is_true(&s, AVAILABLE));
        assert_eq!(find(&s, PROGRESSING).status, "False");
        assert_eq!(s.nodes, ["cache-a", "cache-b", "cache-c"]);
        assert_eq!((s.replicas, s.ready_replicas), (3, 3));
    }

    #[test]
    fn a_rollouts_surge_pod_keeps_it_available() {
        // maxSurge 1: the new pod is Ready before an old one leaves, so size + 1 pods are Ready.
        let mc = memcached("cache", 3);
        let mut rolling = deployment_status(4, 4);
        rolling.updated_replicas = Some(1);
        let s = status_seeing(&mc, &rolling, vec![]);
        assert!(condition_is_true(&s, AVAILABLE));
        assert_eq!(find(&s, AVAILABLE).message, "4/3 pods are ready");
        assert_eq!(find(&s, PROGRESSING).status, "True");
        assert_eq!(
            find(&s, PROGRESSING).message,
            "1/3 pods updated, 4/3 ready, 4 running"
        );
    }

    #[test]
    fn scaled_to_zero_is_available() {
        let mc = memcached("cache", 0);
        let d = deployment_status(0, 0);
        let s = status_seeing(&mc, &d, vec![]);
        assert!(condition_is_true(&s, AVAILABLE));
        assert!(s.nodes.is_empty());
    }

    #[test]
    fn conflict_is_degraded_with_resource_exists() {
        let mc = memcached("cache", 1);
        let blocked = Blocked::ResourceExists {
            message: conflict_message("Deployment", &mc),
        };
        let observed = Observed {
            blocked: Some(blocked),
            ..Default::default()
        };
        let s = desired_status(&mc, &observed, &time(0));
        let degraded = find(&s, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ResourceExists")
        );
        assert!(degraded.message.contains("Deployment default/cache"));
        assert_eq!(find(&s, AVAILABLE).status, "False");
    }

    #[test]
    fn invalid_spec_is_degraded_but_running_pods_still_count() {
        let mc = memcached("cache", 2);
        let d = deployment_status(2, 2);
        let blocked = Blocked::InvalidSpec {
            message: "spec.resources.limits.memory ...".into(),
        };
        let observed = Observed {
            deployment: seen(&d),
            blocked: Some(blocked),
            ..Default::default()
        };
        let s = desired_status(&mc, &observed, &time(0));
        assert_eq!(
            (
                find(&s, DEGRADED).status.as_str(),
                find(&s, DEGRADED).reason.as_str()
            ),
            ("True", "InvalidSpec")
        );
        assert_eq!(find(&s, PROGRESSING).status, "False");
        assert!(
            condition_is_true(&s, AVAILABLE),
            "the previous pods keep serving"
        );
    }

    #[test]
    fn stuck_rollout_is_degraded() {
        let mc = memcached("cache", 1);
        let mut d = deployment_status(1, 0);
        d.conditions = Some(vec![k8s_openapi::api::apps::v1::DeploymentCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some("exceeded quota".into()),
            ..Default::default()
        }]);
        let s = status_seeing(&mc, &d, vec![]);
        for type_ in [AVAILABLE, DEGRADED] {
            assert_eq!(find(&s, type_).reason, "PodCreationRefused");
            assert_eq!(
                find(&s, type_).message,
                "0/1 pods are ready; the ReplicaSet cannot create pods: exceeded quota"
            );
        }
        assert_eq!(find(&s, DEGRADED).status, "True");
    }

    fn unschedulable() -> PodTrouble {
        PodTrouble {
            cause: Cause::Unschedulable,
            words: "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
                .into(),
        }
    }

    fn cannot_pull(words: &str) -> PodTrouble {
        PodTrouble {
            cause: Cause::ImagePullFailed,
            words: words.into(),
        }
    }

    #[test]
    fn pods_no_node_takes_are_unschedulable_but_not_degraded() {
        let mc = memcached("cache", 2);
        let s = status_seeing(
            &mc,
            &deployment_status(2, 0),
            vec![unschedulable(), unschedulable()],
        );
        let available = find(&s, AVAILABLE);
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            ("False", "Unschedulable")
        );
        assert_eq!(
            available.message,
            "0/2 pods are ready; 2 pods cannot be scheduled: 0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
        );
        assert_eq!(find(&s, PROGRESSING).reason, "Unschedulable");
        assert_eq!(find(&s, DEGRADED).status, "False", "a node may join");
    }

    #[test]
    fn the_graver_cause_is_reported_with_its_own_count() {
        let mc = memcached("cache", 3);
        let s = status_seeing(
            &mc,
            &deployment_status(3, 1),
            vec![unschedulable(), cannot_pull("not found")],
        );
        assert_eq!(find(&s, AVAILABLE).reason, "ImagePullFailed");
        assert_eq!(
            find(&s, AVAILABLE).message,
            "1/3 pods are ready; 1 pod cannot pull the image: not found"
        );
        let degraded = find(&s, DEGRADED);
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "ImagePullFailed")
        );
    }

    #[test]
    fn a_retry_in_other_words_is_not_a_status_change_but_a_new_count_is() {
        let mut mc = memcached("cache", 2);
        let d = deployment_status(2, 0);
        let first = status_seeing(&mc, &d, vec![cannot_pull("rpc error: not found")]);
        mc.status = Some(first.clone());
        let retry = status_seeing(&mc, &d, vec![cannot_pull("Back-off pulling image")]);
        assert_eq!(retry, first, "only the pod's words changed");

        let both = status_seeing(
            &mc,
            &d,
            vec![cannot_pull("Back-off pulling image"), cannot_pull("x")],
        );
        assert_eq!(
            find(&both, AVAILABLE).message,
            "0/2 pods are ready; 2 pods cannot pull the image: Back-off pulling image"
        );
    }

    #[test]
    fn a_new_pod_that_fails_during_a_rollout_degrades_an_available_memcached() {
        let mc = memcached("cache", 2);
        let mut rolling = deployment_status(3, 2);
        rolling.updated_replicas = Some(1);
        let s = status_seeing(&mc, &rolling, vec![cannot_pull("not found")]);
        assert!(condition_is_true(&s, AVAILABLE), "the old pods serve");
        assert_eq!(find(&s, PROGRESSING).reason, "ImagePullFailed");
        assert_eq!(find(&s, DEGRADED).reason, "ImagePullFailed");
        assert_eq!(find(&s, DEGRADED).status, "True");
    }

    #[test]
    fn a_rollout_past_its_deadline_is_no_longer_progressing() {
        let mc = memcached("cache", 1);
        let mut d = deployment_status(1, 0);
        d.conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("ReplicaSet \"cache-1\" has timed out progressing.".into()),
            ..Default::default()
        }]);
        let s = status_seeing(&mc, &d, vec![]);
        let progressing = find(&s, PROGRESSING);
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("False", "ProgressDeadlineExceeded")
        );
        assert_eq!(find(&s, AVAILABLE).reason, "ProgressDeadlineExceeded");
        assert_eq!(find(&s, DEGRADED).status, "True");
    }

    #[test]
    fn without_a_cause_pods_are_only_not_ready() {
        let mc = memcached("cache", 2);
        let s = status_seeing(&mc, &deployment_status(2, 1), vec![]);
        assert_eq!(find(&s, AVAILABLE).reason, "PodsNotReady");
        assert_eq!(find(&s, AVAILABLE).message, "1/2 pods are ready");
        assert_eq!(find(&s, DEGRADED).status, "False");
    }

    #[test]
    fn every_reason_reads_back() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(Reason::parse("FailedCreate"), None);
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let mut mc = memcached("cache", 1);
        let d = deployment_status(1, 1);
        let observed = Observed {
            deployment: seen(&d),
            ..Default::default()
        };
        let first = desired_status(&mc, &observed, &time(100));
        mc.status = Some(first.clone());
        let again = desired_status(&mc, &observed, &time(200));
        assert_eq!(
            first, again,
            "recomputing an unchanged status must be a no-op"
        );

        // A real transition takes the new time; the others keep theirs.
        mc.spec.size = 2;
        let scaled = desired_status(&mc, &observed, &time(300));
        assert_eq!(find(&scaled, AVAILABLE).last_transition_time, time(300));
        assert_eq!(find(&scaled, DEGRADED).last_transition_time, time(100));
    }

    #[test]
    fn pods_waiting_for_cert_manager_say_which_certificate_to_look_at() {
        let mc = memcached("cache", 2);
        let d = deployment_status(2, 0);
        let observed = Observed {
            deployment: seen(&d),
            unissued: Some("cache-tls".into()),
            ..Default::default()
        };
        let status = desired_status(&mc, &observed, &time(0));
        let available = find(&status, AVAILABLE);
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            ("False", "CertificatePending")
        );
        assert_eq!(
            available.message,
            "0/2 pods are ready; cert-manager has not issued Secret cache-tls yet: \
             see Certificate cache and its CertificateRequest (kubectl describe certificate cache)"
        );
        assert_eq!(
            find(&status, DEGRADED).status,
            "False",
            "issuing takes a moment"
        );
        // Issued and the pods Ready: nothing pending is said.
        let ready = deployment_status(2, 2);
        let observed = Observed {
            deployment: seen(&ready),
            ..Default::default()
        };
        let status = desired_status(&mc, &observed, &time(1));
        assert_eq!(find(&status, AVAILABLE).reason, "AllPodsReady");
    }
}
