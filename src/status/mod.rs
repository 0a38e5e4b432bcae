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

    let all_ready = observed.members.is_some() && ready >= size;
    // A member is replaced under its own name, so an update takes it out for a moment: the
    // Memcached stays Available while no more are out than the update may take.
    let updating_within_budget = updating && ready >= size - crate::resources::members_at_once(mc);
    let converged = all_ready && replicas == size && updated == size;
    let trouble = trouble(mc, observed, now);
    let pods_ready = format!("{ready}/{size} pods are ready");
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
mod tests {
    use super::*;
    use crate::fixtures::{members, memcached, time};

    fn seen(members: &Members) -> Option<Members> {
        Some(*members)
    }

    /// The status of `mc` whose members are counted as `members` and whose pods report
    /// `troubles`.
    fn status_seeing(
        mc: &Memcached,
        members: &Members,
        troubles: Vec<PodTrouble>,
    ) -> MemcachedStatus {
        let observed = Observed {
            members: seen(members),
            troubles,
            ..Default::default()
        };
        desired_status(mc, &observed, &time(0))
    }

    fn find<'a>(s: &'a MemcachedStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_new_memcached_is_progressing_and_unavailable() {
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
        let partly = members(3, 2);
        let s = status_seeing(&mc, &partly, vec![]);
        assert_eq!(find(&s, AVAILABLE).status, "False");
        assert_eq!(find(&s, AVAILABLE).message, "2/3 pods are ready");
        assert_eq!(find(&s, PROGRESSING).status, "True");

        let full = members(3, 3);
        let pods = vec![
            "cache-1".to_string(),
            "cache-0".to_string(),
            "cache-2".to_string(),
        ];
        let s = desired_status(
            &mc,
            &Observed {
                members: seen(&full),
                pods,
                ..Default::default()
            },
            &time(0),
        );
        assert!(condition_is_true(&s, AVAILABLE));
        assert_eq!(find(&s, PROGRESSING).status, "False");
        assert_eq!(s.nodes, ["cache-0", "cache-1", "cache-2"]);
        assert_eq!((s.replicas, s.ready_replicas), (3, 3));
    }

    #[test]
    fn servers_name_every_member_by_its_stable_address_ready_or_not() {
        let mut mc = memcached("cache", 3);
        mc.spec.container_port = 11311;
        let s = status_seeing(&mc, &members(3, 1), vec![]);
        assert_eq!(
            s.servers,
            [
                "cache-0.cache.default.svc:11311",
                "cache-1.cache.default.svc:11311",
                "cache-2.cache.default.svc:11311"
            ]
        );
        let none_yet = desired_status(&mc, &Observed::default(), &time(0));
        assert_eq!(
            none_yet.servers, s.servers,
            "what clients hash over is the spec's"
        );
    }

    /// `size` members moving from one revision to the next: `updated` of them are, `ready` of
    /// them are Ready.
    fn updating(size: i32, updated: i32, ready: i32) -> Members {
        Members {
            updated,
            ..members(size, ready)
        }
    }

    #[test]
    fn an_update_that_takes_one_member_out_at_a_time_keeps_it_available() {
        let mc = memcached("cache", 3);
        let s = status_seeing(&mc, &updating(3, 1, 2), vec![]);
        let available = find(&s, AVAILABLE);
        assert_eq!(
            (available.status.as_str(), available.reason.as_str()),
            ("True", "Updating")
        );
        assert_eq!(
            available.message,
            "2/3 pods are ready; 1/3 updated, at most 1 at a time"
        );
        let progressing = find(&s, PROGRESSING);
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "Reconciling")
        );
        assert_eq!(
            progressing.message,
            "1/3 pods updated, 2/3 ready, 3 running"
        );
        assert_eq!(find(&s, DEGRADED).status, "False");

        // Two members out where the update may take one: not available.
        let s = status_seeing(&mc, &updating(3, 1, 1), vec![]);
        assert_eq!(
            (
                find(&s, AVAILABLE).status.as_str(),
                find(&s, AVAILABLE).reason.as_str()
            ),
            ("False", "PodsNotReady")
        );
    }

    #[test]
    fn the_status_says_whether_members_keep_their_cache_through_the_update() {
        let mc = memcached("cache", 3);
        let members = updating(3, 1, 2);
        let during = |kind| {
            let observed = Observed {
                members: seen(&members),
                update: Some(kind),
                ..Default::default()
            };
            let s = desired_status(&mc, &observed, &time(0));
            let p = find(&s, PROGRESSING);
            (
                p.reason.clone(),
                p.message.clone(),
                find(&s, AVAILABLE).reason.clone(),
            )
        };
        assert_eq!(
            during(UpdateKind::InPlace),
            (
                "RestartingInPlace".to_string(),
                "1/3 members updated; updated in place (new images, a larger memory, new requests or limits), each keeping its cache, at most 1 at a time".to_string(),
                "Updating".to_string()
            )
        );
        assert_eq!(during(UpdateKind::Replace).0, "ReplacingMembers");

        // Every member updated and Ready is the end of the update.
        let s = status_seeing(&mc, &updating(3, 3, 3), vec![]);
        assert_eq!(find(&s, AVAILABLE).reason, "AllPodsReady");
        assert_eq!(find(&s, PROGRESSING).reason, "Converged");
    }

    #[test]
    fn an_update_may_take_out_as_many_members_as_max_unavailable() {
        let mc = crate::fixtures::memcached_with_spec(
            serde_json::json!({"size": 4, "rollout": {"maxUnavailable": 2}}),
        );
        let s = status_seeing(&mc, &updating(4, 2, 2), vec![]);
        assert_eq!(
            (
                find(&s, AVAILABLE).status.as_str(),
                find(&s, AVAILABLE).reason.as_str()
            ),
            ("True", "Updating")
        );
        let s = status_seeing(&mc, &updating(4, 2, 1), vec![]);
        assert_eq!(find(&s, AVAILABLE).status, "False", "three out of four");
    }

    #[test]
    fn a_member_not_ready_past_the_progress_deadline_stops_progressing_and_degrades() {
        let mc = crate::fixtures::memcached_with_spec(
            serde_json::json!({"size": 2, "rollout": {"progressDeadlineSeconds": 60}}),
        );
        let at = |since: i64| Observed {
            members: seen(&members(2, 1)),
            not_ready: Some(NotReady {
                member: "cache-1".into(),
                since: time(since).0,
            }),
            ..Default::default()
        };
        // 59 s not Ready: still progressing.
        let s = desired_status(&mc, &at(1), &time(60));
        assert_eq!(find(&s, PROGRESSING).status, "True");
        assert_eq!(find(&s, DEGRADED).status, "False");

        // 60 s: as a Deployment past its deadline says.
        let (s, trouble) = desired_status_and_trouble(&mc, &at(0), &time(60));
        for type_ in [PROGRESSING, DEGRADED, AVAILABLE] {
            assert_eq!(
                find(&s, type_).reason,
                "ProgressDeadlineExceeded",
                "{type_}"
            );
        }
        assert_eq!(find(&s, PROGRESSING).status, "False");
        assert_eq!(find(&s, DEGRADED).status, "True");
        assert_eq!(
            find(&s, DEGRADED).message,
            "1/2 pods are ready; cache-1 not Ready for 60 s (spec.rollout.progressDeadlineSeconds): kubectl describe pod cache-1 says why (its readiness probe, say)"
        );
        assert!(trouble.is_some_and(|t| t.lasting), "one Warning event");

        // A lasting cause of the pods' own says more.
        let mut pulling = at(0);
        pulling.troubles = vec![PodTrouble {
            cause: Cause::ImagePullFailed,
            words: "not found".into(),
        }];
        let s = desired_status(&mc, &pulling, &time(60));
        assert_eq!(find(&s, DEGRADED).reason, "ImagePullFailed");
    }

    #[test]
    fn scaled_to_zero_is_available() {
        let mc = memcached("cache", 0);
        let d = members(0, 0);
        let s = status_seeing(&mc, &d, vec![]);
        assert!(condition_is_true(&s, AVAILABLE));
        assert!(s.nodes.is_empty());
        assert!(s.servers.is_empty());
    }

    #[test]
    fn conflict_is_degraded_with_resource_exists() {
        let mc = memcached("cache", 1);
        let blocked = Blocked::ResourceExists {
            message: conflict_message("Service", &mc),
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
        assert!(degraded.message.contains("Service default/cache"));
        assert_eq!(find(&s, AVAILABLE).status, "False");
    }

    #[test]
    fn invalid_spec_is_degraded_but_running_pods_still_count() {
        let mc = memcached("cache", 2);
        let d = members(2, 2);
        let blocked = Blocked::InvalidSpec {
            message: "spec.resources.limits.memory ...".into(),
        };
        let observed = Observed {
            members: seen(&d),
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
    fn pods_the_stateful_set_cannot_create_are_degraded() {
        let mc = memcached("cache", 2);
        // One member created, the other refused.
        let d = members(1, 0);
        let observed = Observed {
            members: seen(&d),
            creation_refused: Some("pods \"cache-1\" is forbidden: exceeded quota: pods=2"),
            // The pod it could create is not scheduled either: its creation is the graver cause.
            troubles: vec![unschedulable()],
            ..Default::default()
        };
        let s = desired_status(&mc, &observed, &time(0));
        for type_ in [AVAILABLE, PROGRESSING, DEGRADED] {
            assert_eq!(find(&s, type_).reason, "PodCreationRefused");
            assert_eq!(
                find(&s, type_).message,
                "0/2 pods are ready; pods cannot be created: pods \"cache-1\" is forbidden: exceeded quota: pods=2"
            );
        }
        assert_eq!(find(&s, AVAILABLE).status, "False");
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
        let s = status_seeing(&mc, &members(2, 0), vec![unschedulable(), unschedulable()]);
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
            &members(3, 1),
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
        let d = members(2, 0);
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
        let s = status_seeing(&mc, &updating(2, 1, 1), vec![cannot_pull("not found")]);
        assert!(condition_is_true(&s, AVAILABLE), "the other member serves");
        assert_eq!(find(&s, PROGRESSING).reason, "ImagePullFailed");
        assert_eq!(find(&s, DEGRADED).reason, "ImagePullFailed");
        assert_eq!(find(&s, DEGRADED).status, "True");
    }

    #[test]
    fn without_a_cause_pods_are_only_not_ready() {
        let mc = memcached("cache", 2);
        let s = status_seeing(&mc, &members(2, 1), vec![]);
        assert_eq!(find(&s, AVAILABLE).reason, "PodsNotReady");
        assert_eq!(find(&s, AVAILABLE).message, "1/2 pods are ready");
        assert_eq!(find(&s, DEGRADED).status, "False");
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let mut mc = memcached("cache", 1);
        let d = members(1, 1);
        let observed = Observed {
            members: seen(&d),
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
        let d = members(2, 0);
        let observed = Observed {
            members: seen(&d),
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
        let ready = members(2, 2);
        let observed = Observed {
            members: seen(&ready),
            ..Default::default()
        };
        let status = desired_status(&mc, &observed, &time(1));
        assert_eq!(find(&status, AVAILABLE).reason, "AllPodsReady");
    }
}
