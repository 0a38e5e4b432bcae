//! The members' pods: a new Memcached's members,
//! its revision, Service and budget go out together; the pod watch counts them for the status;
//! a smaller size deletes from the top.

use http::StatusCode;

use super::*;
use crate::resources::REVISION_LABEL;

const PODS: &str = "/api/v1/namespaces/default/pods";
const REVISIONS: &str = "/apis/apps/v1/namespaces/default/controllerrevisions";

/// The notes of the events among `seen`, sorted.
fn notes(seen: &[apiserver::Seen]) -> Vec<String> {
    let mut notes: Vec<String> = seen
        .iter()
        .filter(|r| r.path() == EVENTS)
        .map(|r| r.body["note"].as_str().unwrap().to_string())
        .collect();
    notes.sort();
    notes
}

/// Member `name` as the pod watch sees it: Ready, of `revision`.
fn ready_member(name: &str, revision: &str) -> PodMeta {
    watched_pod(name, &[(REVISION_LABEL, revision)], true)
}

/// Memcached `cache` of `size` whose Service and budget are kept and whose members `ready` are
/// Ready, of the current revision: a reconcile only makes the others.
fn with_members(
    ctx: &Context,
    caches: &mut apiserver::Caches,
    size: i32,
    ready: &[&str],
) -> Memcached {
    let mc = memcached("cache", size);
    caches.add_service(resources::service(&mc));
    caches.add_budget(resources::pod_disruption_budget(&mc).expect("size 2 and more have one"));
    let revision =
        resources::members::revision(&mc, &resources::pod_template(&mc, &ctx.config.images));
    for name in ready {
        ctx.cached
            .pods
            .observe(&watcher::Event::Apply(ready_member(name, &revision)));
    }
    mc
}

#[tokio::test]
async fn a_new_memcached_gets_its_members_service_and_budget_at_once_then_status() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = memcached("cache", 3);
    let sent = mc.clone();
    let images = ctx.config.images.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        // Five requests, none waiting for another: three members, the Service, the budget;
        // then one event for what was created. No ControllerRevision: each member records
        // what an update compares of its template.
        let seen = api.echo_any_order(6, &sent).await;
        let posted = |path: &str| -> Vec<&serde_json::Value> {
            seen.iter()
                .filter(|r| (r.method.as_str(), r.path()) == ("POST", path))
                .map(|r| &r.body)
                .collect()
        };
        let mut members: Vec<_> = posted(PODS)
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        members.sort();
        assert_eq!(members, ["cache-0", "cache-1", "cache-2"]);
        assert!(posted(REVISIONS).is_empty());
        let template = resources::pod_template(&sent, &images);
        let revision = resources::members::revision(&sent, &template);
        for pod in posted(PODS) {
            assert_eq!(pod["metadata"]["labels"][REVISION_LABEL], revision);
            let record = &pod["metadata"]["annotations"][crate::controller::TEMPLATE_ANNOTATION];
            assert!(
                record.as_str().unwrap().starts_with(r#"{"fixed":""#),
                "{record}"
            );
            assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-cache");
            assert_eq!(pod["spec"]["subdomain"], "cache");
        }
        assert_eq!(
            notes(&seen),
            ["Created Pod cache-0, Pod cache-1, Pod cache-2, Service cache"],
            "one event for what the reconcile created"
        );
        assert!(seen.iter().any(|r| r.path() == SERVICE));
        assert!(seen.iter().any(|r| r.path() == BUDGET));
        api
    })
    .await;
    assert_eq!(
        outcome.unwrap(),
        Outcome::Converged,
        "the pods' events refresh the status"
    );

    // The members' watch events: the status counts them, and nothing else is written.
    let template = resources::pod_template(&mc, &ctx.config.images);
    let revision = resources::members::revision(&mc, &template);
    for name in ["cache-0", "cache-1", "cache-2"] {
        ctx.cached
            .pods
            .observe(&watcher::Event::Apply(ready_member(name, &revision)));
    }
    caches.add_service(resources::service(&mc));
    caches.add_budget(resources::pod_disruption_budget(&mc).expect("size 3 has one"));
    let answered = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("True".into(), "AllPodsReady".into())
        );
        assert_eq!(status.body["status"]["readyReplicas"], 3);
        assert_eq!(status.body["status"]["availableReplicas"], 0);
        assert_eq!(
            status.body["status"]["nodes"],
            json!(["cache-0", "cache-1", "cache-2"])
        );
        api
    })
    .await;
    let Outcome::MembersBecomingAvailable(soon) = outcome.unwrap() else {
        panic!("no event comes when they have been Ready for minReadySeconds");
    };
    assert!(
        soon > Duration::from_secs(4) && soon <= Duration::from_secs(6),
        "{soon:?}: the default minReadySeconds, 5"
    );

    // Then: Ready for long enough, all available.
    for name in ["cache-0", "cache-1", "cache-2"] {
        let mut member = ready_member(name, &revision);
        member.ready_since = Some(k8s_openapi::jiff::Timestamp::now() - soon);
        ctx.cached.pods.observe(&watcher::Event::Apply(member));
    }
    let answered = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(status.body["status"]["availableReplicas"], 3);
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);

    // Size 1: the two highest members are deleted, and the budget one member does not have.
    let mut smaller = mc.clone();
    smaller.spec.size = 1;
    smaller.metadata.generation = Some(2);
    let outcome = scenario(smaller.clone(), ctx, api, |mut api| async move {
        let seen = api.echo_any_order(6, &smaller).await;
        assert_eq!(
            notes(&seen),
            [
                "Deleted Pod cache-1: no longer wanted by the spec",
                "Deleted Pod cache-2: no longer wanted by the spec",
                "Deleted PodDisruptionBudget cache: no longer wanted by the spec"
            ]
        );
        let mut deleted: Vec<_> = seen
            .iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path().to_string())
            .collect();
        deleted.sort();
        assert_eq!(
            deleted,
            [
                format!("{PODS}/cache-1"),
                format!("{PODS}/cache-2"),
                BUDGET.to_string()
            ]
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn a_member_the_api_server_refuses_is_reported_in_its_words_and_tried_again() {
    // A quota of two pods: cache-2's create is refused, the rest is kept.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = with_members(&ctx, &mut caches, 3, &["cache-0", "cache-1"]);
    let quota = "pods \"cache-2\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2";
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        // Only the missing member: its revision is kept already, as its fellows show.
        let refused = api
            .expect("POST", PODS, StatusCode::FORBIDDEN, |_| {
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Forbidden", "code": 403, "message": quota})
            })
            .await;
        assert_eq!(refused.body["metadata"]["name"], "cache-2");
        let message = format!("2/3 pods are ready; pods cannot be created: {quota}");
        assert_creation_refused(api.echo_any_order(2, &reported).await, &message);
        api
    })
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(
        outcome,
        Outcome::PodsMissing,
        "no watch event tells of a raised quota"
    );
    assert_eq!(outcome.next(), Next::After(outcome::MISSING_RECHECK));
}

#[tokio::test]
async fn a_member_refused_in_a_namespace_being_deleted_is_no_failure() {
    // The namespace controller deleted the members before the Memcached: making them again is
    // refused, and the Memcached goes next. Nothing to report, nothing to recheck.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = with_members(&ctx, &mut caches, 2, &["cache-0"]);
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        api.expect("POST", PODS, StatusCode::FORBIDDEN, |_| {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                "message": "pods \"cache-1\" is forbidden: unable to create new content in namespace default because it is being terminated",
                "details": {"name": "cache-1", "kind": "pods",
                    "causes": [{"reason": "NamespaceTerminating", "message": "namespace default is being terminated", "field": "metadata.namespace"}]}})
        })
        .await;
        api
    })
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome, Outcome::Gone);
    assert_eq!(outcome.next(), Next::AwaitChange, "no failure, no recheck");
}

#[tokio::test]
async fn a_member_being_deleted_is_made_again_once_it_is_gone() {
    // cache-1 was evicted and is shutting down: its name is taken till it is gone (a create
    // would be refused), and its delete event brings the reconcile that makes it again.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = with_members(&ctx, &mut caches, 2, &["cache-0"]);
    let mut going = watched_pod("cache-1", &[], true);
    going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    ctx.cached
        .pods
        .observe(&watcher::Event::Apply(going.clone()));
    let answered = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(status.body["status"]["nodes"], json!(["cache-0"]));
        assert_eq!(status.body["status"]["readyReplicas"], 1);
        api
    })
    .await;
    assert!(outcome.is_ok(), "{outcome:?}");

    ctx.cached.pods.observe(&watcher::Event::Delete(going));
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let seen = api.echo_any_order(2, &answered).await;
        assert_eq!(notes(&seen), ["Created Pod cache-1"]);
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn a_pod_of_a_members_name_that_is_someone_elses_is_left_alone_and_reported() {
    // cache-1's name is taken by a pod the Memcached does not control (a workload's of its
    // name, say): its create finds it there, a read says whose it is, and nothing is written
    // to it.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = with_members(&ctx, &mut caches, 2, &["cache-0"]);
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        api.expect("POST", PODS, StatusCode::CONFLICT, |_| {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409,
                "message": "pods \"cache-1\" already exists"})
        })
        .await;
        api.expect("GET", &format!("{PODS}/cache-1"), StatusCode::OK, |_| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "cache-1", "namespace": "default", "uid": "theirs",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "cache", "uid": "their-set", "controller": true}]}})
        })
        .await;
        let (events, status) = events_and_status(api.echo_any_order(2, &reported).await);
        let message = "Pod default/cache-1 already exists and is not controlled by this Memcached; remove it or rename the Memcached";
        assert_eq!(
            condition(&status.body, DEGRADED),
            ("True".into(), "ResourceExists".into())
        );
        let [warning] = &events[..] else {
            panic!("one event: {}", events.len());
        };
        assert_eq!(warning.body["note"], message);
        api
    })
    .await;
    let outcome = outcome.unwrap();
    assert!(
        matches!(outcome, Outcome::Blocked(Blocked::ResourceExists { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        outcome.next(),
        Next::After(outcome::CONFLICT_RECHECK),
        "no watch event tells of it gone"
    );
}

#[tokio::test]
async fn an_update_nobody_asked_for_waits_for_a_rollout_slot_then_starts() {
    // An operator upgrade changed the members' template; another Memcached's members hold the
    // only slot.
    let (ctx, api, mut caches) = apiserver::context();
    let mut ctx = Arc::into_inner(ctx).unwrap();
    ctx.remembered.rollouts = Arc::new(Rollouts::new(1));
    let ctx = Arc::new(ctx);
    ctx.remembered.rollouts.members("default", "other", true);
    let mut mc = memcached("cache", 1);
    mc.status = Some(crate::api::MemcachedStatus {
        observed_generation: mc.metadata.generation,
        ..Default::default()
    });
    caches.add_service(resources::service(&mc));
    ctx.cached
        .pods
        .observe(&watcher::Event::Apply(ready_member("cache-0", "cache-old")));
    let reported = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        // No revision posted, no member touched: only the status, which says why.
        let status = api.echo_status(STATUS, &reported).await;
        assert_eq!(
            condition(&status.body, PROGRESSING),
            ("True".into(), "RolloutQueued".into())
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::WaitingForRolloutSlot);
    assert_eq!(
        ctx.remembered.rollouts.rolling(),
        1,
        "a waiting Memcached holds no slot"
    );

    // The other's members are all updated: this one's update starts, with the revisions of
    // releases before 0.9.0 that no member names collected (none is made any more).
    ctx.remembered.rollouts.members("default", "other", false);
    let outcome = scenario(mc, ctx.clone(), api, |mut api| async move {
        let pruned = api
            .expect("DELETE", REVISIONS, StatusCode::OK, |_| {
                apiserver::success()
            })
            .await;
        let query = pruned
            .path_and_query
            .replace("%3D", "=")
            .replace("%21", "!");
        assert!(query.contains("metadata.name!=cache-old"), "{query}");
        // The update lists the members next; the script ends there.
        api.expect(
            "GET",
            PODS,
            StatusCode::NOT_FOUND,
            |_| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}),
        )
        .await;
        api
    })
    .await;
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("Pods of cache"), "the update began: {error}");
    assert_eq!(
        ctx.remembered.rollouts.rolling(),
        1,
        "this one holds the slot now"
    );
}
