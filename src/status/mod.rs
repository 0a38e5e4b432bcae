//! Status of a Memcached computed from what the controller observed. Pure: no API calls, and the
//! clock is passed in, so every condition transition is unit-tested.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::{Memcached, MemcachedStatus};
use crate::resources::selector_string;

mod blocked;
pub mod pods;
mod reason;

pub use blocked::{
    Blocked, CERTIFICATES_UNAVAILABLE, NETWORK_POLICIES_FORBIDDEN, conflict_message,
    named_conflict_message,
};
use pods::{Cause, PodTrouble};
pub use reason::Reason;

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// Every condition type this operator sets.
pub const CONDITION_TYPES: [&str; 3] = [AVAILABLE, PROGRESSING, DEGRADED];

/// What the controller saw of the cluster for one Memcached.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// Its members as counted from the pod watch; None until they are looked at.
    pub members: Option<Members>,
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
    /// Why members cannot be created, when some are missing: the API server's refusal.
    pub creation_refused: Option<&'a str>,
    /// How the members are being updated, while they are.
    pub update: Option<UpdateKind>,
    /// What the autoscaler last saw and decided, while it is on.
    pub autoscaling: Option<crate::api::AutoscalingStatus>,
    /// The member not Ready for the longest, and since when.
    pub not_ready: Option<NotReady>,
    /// The proxy's status, while `spec.proxy` is on.
    pub proxy: Option<crate::api::ProxyStatus>,
    /// Of the Ready members, those past the size (draining for the proxy's handover).
    pub draining_ready: i32,
}

/// A member not Ready, since when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub member: String,
    pub since: k8s_openapi::jiff::Timestamp,
}

impl NotReady {
    /// How long until the member is not Ready for `mc`'s progress deadline (zero: it is).
    pub fn deadline_in(
        &self,
        mc: &Memcached,
        now: k8s_openapi::jiff::Timestamp,
    ) -> std::time::Duration {
        let deadline = progress_deadline_seconds(mc);
        let left = k8s_openapi::jiff::SignedDuration::from_secs(i64::from(deadline))
            - now.duration_since(self.since);
        std::time::Duration::try_from(left).unwrap_or_default()
    }
}

/// How the members are being updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    /// Images, a larger memory, requests or limits change: each member is updated in its pod
    /// and keeps its cache.
    InPlace,
    /// The pod spec changes beyond images: each member is replaced and starts empty.
    Replace,
}

/// A Memcached's members, counted: pods not being deleted (`replicas`), of them Ready,
/// available (Ready for `minReadySeconds`) and of the current revision (`updated`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Members {
    pub replicas: i32,
    pub ready: i32,
    pub available: i32,
    pub updated: i32,
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
    let Members {
        replicas,
        ready,
        available: available_replicas,
        updated,
    } = observed.members.unwrap_or_default();
    // A replaced member counts updated as soon as it exists: the operator says while it does not
    // serve yet (`update`).
    let updating = observed.members.is_some() && (updated < replicas || observed.update.is_some());

    // Members draining for the proxy are past the size: they do not stand in for one within it.
    let ready = ready - observed.draining_ready;
    let all_ready = observed.members.is_some() && ready >= size;
    // A member is replaced under its own name, so an update takes it out for a moment: the
    // Memcached stays Available while no more are out than the update may take.
    let updating_within_budget = updating && ready >= size - crate::resources::members_at_once(mc);
    let draining = observed
        .proxy
        .as_ref()
        .map_or(0, |p| p.draining.len() as i32);
    let converged = all_ready && replicas == size + draining && updated == replicas;
    let trouble = trouble(mc, observed, now);
    let pods_ready = match draining {
        0 => format!("{ready}/{size} pods are ready"),
        n => format!("{ready}/{size} pods are ready; {n} draining"),
    };
    let available = if all_ready {
        cond(AVAILABLE, true, Reason::AllPodsReady, &pods_ready)
    } else if updating_within_budget {
        let message = format!(
            "{pods_ready}; {updated}/{size} updated, at most {} at a time",
            crate::resources::members_at_once(mc)
        );
        cond(AVAILABLE, true, Reason::Updating, &message)
    } else if let Some(t) = &trouble {
        cond(AVAILABLE, false, t.reason, &t.message())
    } else {
        cond(AVAILABLE, false, Reason::PodsNotReady, &pods_ready)
    };
    let (progressing, degraded) = match &observed.blocked {
        Some(b) => (
            cond(PROGRESSING, false, b.reason(), b.message()),
            cond(DEGRADED, true, b.reason(), b.message()),
        ),
        None => {
            let stuck = trouble
                .as_ref()
                .filter(|t| t.reason == Reason::ProgressDeadlineExceeded);
            let progressing = if let Some(t) = stuck {
                cond(PROGRESSING, false, t.reason, &t.message())
            } else if let Some(limit) = observed.rollout_queued {
                let message = format!(
                    "the operator's new pod template waits for a rollout slot: at most {limit} roll at once (--max-concurrent-rollouts)"
                );
                cond(PROGRESSING, true, Reason::RolloutQueued, &message)
            } else if let Some(kind) = observed.update.filter(|_| !converged) {
                let at_once = crate::resources::members_at_once(mc);
                let (reason, how) = match kind {
                    UpdateKind::InPlace => (
                        Reason::RestartingInPlace,
                        "updated in place (new images, a larger memory, new requests or limits), each keeping its cache",
                    ),
                    UpdateKind::Replace => (
                        Reason::ReplacingMembers,
                        "replaced for a pod spec that cannot be taken in place, each starting empty",
                    ),
                };
                let message =
                    format!("{updated}/{size} members updated; {how}, at most {at_once} at a time");
                cond(PROGRESSING, true, reason, &message)
            } else if let Some(proxy) = observed
                .proxy
                .as_ref()
                .filter(|_| converged && draining > 0)
            {
                let until = proxy
                    .handover
                    .as_ref()
                    .map(|h| h.until.0.to_string())
                    .unwrap_or_default();
                let message = format!(
                    "{size} pods match the spec; {} serve the proxy's previous layout until {until}, then are deleted",
                    proxy.draining.join(", ")
                );
                cond(PROGRESSING, true, Reason::DrainingMembers, &message)
            } else if converged {
                let message = format!("{size} pods match the spec");
                cond(PROGRESSING, false, Reason::Converged, &message)
            } else if observed.members.is_none() {
                cond(PROGRESSING, true, Reason::Creating, "creating the members")
            } else if let Some(t) = &trouble {
                cond(PROGRESSING, true, t.reason, &t.message())
            } else {
                let message = format!(
                    "{updated}/{size} pods updated, {ready}/{size} ready, {replicas} running"
                );
                cond(PROGRESSING, true, Reason::Reconciling, &message)
            };
            // Two autoscalers of one size: the operator's waits until one of them goes.
            let conflict = observed
                .autoscaling
                .as_ref()
                .filter(|a| a.reason == crate::autoscaling::Reason::AutoscalerConflict.as_str());
            let degraded = match (&trouble, conflict) {
                (Some(t), _) if t.lasting => cond(DEGRADED, true, t.reason, &t.message()),
                (_, Some(a)) => cond(DEGRADED, true, Reason::AutoscalerConflict, &a.message),
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
        servers: crate::resources::servers(mc),
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
        autoscaling: observed.autoscaling.clone(),
        proxy: observed.proxy.clone(),
    };
    (status, trouble)
}

/// Why not all wanted pods are Ready, from the members' refused creations and the pods' own
/// status: for the conditions and the Warning event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub reason: Reason,
    /// The counts, e.g. "0/2 pods are ready; 2 pods cannot be scheduled": the part of the
    /// message whose change is worth a status write.
    pub summary: String,
    /// The pods' or the API server's own words.
    pub words: String,
    /// Whether it stays until someone changes something (Degraded=True).
    pub lasting: bool,
}

impl Trouble {
    pub fn message(&self) -> String {
        format!("{}: {}", self.summary, self.words)
    }
}

fn progress_deadline_seconds(mc: &Memcached) -> i32 {
    let rollout = mc.spec.rollout.clone().unwrap_or_default();
    rollout.progress_deadline_seconds
}

/// The trouble of a Memcached, if any: a lasting cause first (see `cause`), then a member not
/// Ready for longer than the progress deadline, then a passing cause.
fn trouble(mc: &Memcached, observed: &Observed, now: &Time) -> Option<Trouble> {
    let ready = observed.members?.ready;
    let pods_ready = format!("{ready}/{} pods are ready", mc.spec.size);
    let cause = cause(mc, observed, &pods_ready);
    if cause.as_ref().is_some_and(|c| c.lasting) {
        return cause;
    }
    let stuck = observed
        .not_ready
        .as_ref()
        .filter(|n| n.deadline_in(mc, now.0).is_zero());
    let Some(stuck) = stuck else {
        return cause;
    };
    let deadline = progress_deadline_seconds(mc);
    Some(Trouble {
        reason: Reason::ProgressDeadlineExceeded,
        summary: format!(
            "{pods_ready}; {} not Ready for {deadline} s (spec.rollout.progressDeadlineSeconds)",
            stuck.member
        ),
        words: match cause {
            Some(cause) => cause.words,
            None => format!(
                "kubectl describe pod {} says why (its readiness probe, say)",
                stuck.member
            ),
        },
        lasting: true,
    })
}

/// What a member's pods say holds them back: members that cannot be created first (nothing
/// else can start), then the graver pod cause with the number of pods it holds back, then a
/// certificate not issued yet.
fn cause(mc: &Memcached, observed: &Observed, pods_ready: &str) -> Option<Trouble> {
    if let Some(words) = observed.creation_refused {
        return Some(Trouble {
            reason: Reason::PodCreationRefused,
            summary: format!("{pods_ready}; pods cannot be created"),
            words: words.to_string(),
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
    observed.unissued.as_ref().map(|secret| Trouble {
        reason: Reason::CertificatePending,
        summary: format!("{pods_ready}; cert-manager has not issued Secret {secret} yet"),
        words: format!(
            "see Certificate {} and its CertificateRequest (kubectl describe certificate {})",
            mc.name_any(),
            mc.name_any()
        ),
        lasting: false,
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

#[cfg(test)]
mod tests;
