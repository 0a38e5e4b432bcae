use super::*;
use crate::fixtures::{members, memcached, time};

fn seen(members: &Members) -> Option<Members> {
    Some(*members)
}

/// The status of `mc` whose members are counted as `members` and whose pods report
/// `troubles`.
fn status_seeing(mc: &Memcached, members: &Members, troubles: Vec<PodTrouble>) -> MemcachedStatus {
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

#[test]
fn a_member_draining_for_the_proxy_is_said_and_counted_apart() {
    let mc = memcached("cache", 3);
    let four = members(4, 4);
    let observed = Observed {
        members: seen(&four),
        draining_ready: 1,
        proxy: Some(crate::api::ProxyStatus {
            members: 3,
            draining: vec!["cache-3".into()],
            handover: Some(crate::api::Handover {
                previous_members: 4,
                until: time(600),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = desired_status(&mc, &observed, &time(0));
    let available = find(&status, AVAILABLE);
    assert_eq!(available.message, "3/3 pods are ready; 1 draining");
    let progressing = find(&status, PROGRESSING);
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "DrainingMembers")
    );
    assert!(
        progressing.message.contains("cache-3 serve"),
        "{}",
        progressing.message
    );
}
