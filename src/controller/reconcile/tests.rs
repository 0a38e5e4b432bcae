//! Scenarios of one reconcile against a scripted API server.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::*;
use crate::controller::Rollouts;
use crate::controller::outcome::{self, CONFLICT_RECHECK, REFUSED_RECHECK};
use crate::controller::pod_index::PodMeta;
use crate::fixtures::apiserver::{self, ApiServer};
use crate::fixtures::{memcached, stateful_set_with_status};
use crate::resources::Images;
use crate::status::{AVAILABLE, DEGRADED, PROGRESSING};
use kube::runtime::watcher;
use operator_runtime::workers::{Next, Retry};

const STATEFUL_SET: &str = "/apis/apps/v1/namespaces/default/statefulsets/cache";
const SERVICE: &str = "/api/v1/namespaces/default/services/cache";
const BUDGET: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/cache";
const STATUS: &str = "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/cache/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Runs a reconcile against a scripted API server; the script must consume every request.
async fn scenario<F>(
    mc: Memcached,
    ctx: Arc<Context>,
    api: ApiServer,
    script: impl FnOnce(ApiServer) -> F,
) -> Result<Outcome>
where
    F: Future<Output = ApiServer> + Send + 'static,
{
    scenario_then(mc, ctx, api, script).await.0
}

/// As `scenario`, handing the API server back for the next one.
async fn scenario_then<F>(
    mc: Memcached,
    ctx: Arc<Context>,
    api: ApiServer,
    script: impl FnOnce(ApiServer) -> F,
) -> (Result<Outcome>, ApiServer)
where
    F: Future<Output = ApiServer> + Send + 'static,
{
    let server = tokio::spawn(script(api));
    let result = tokio::time::timeout(Duration::from_secs(5), reconcile(&mc, &ctx))
        .await
        .expect("reconcile sent a request the script did not expect");
    let api = server.await.expect("the script's assertions hold");
    (result, api)
}

/// Requests answered in any order that must all be event creations: after a write of the
/// StatefulSet the status is left to the refresh its watch event queues.
fn events_only(seen: Vec<apiserver::Seen>) -> Vec<apiserver::Seen> {
    assert!(
        seen.iter()
            .all(|e| (e.method.as_str(), e.path()) == ("POST", EVENTS)),
        "only events: {:?}",
        seen.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
    seen
}

/// Splits requests answered in any order into event creations and the one status apply.
fn events_and_status(seen: Vec<apiserver::Seen>) -> (Vec<apiserver::Seen>, apiserver::Seen) {
    let (mut status, events): (Vec<_>, Vec<_>) = seen.into_iter().partition(|r| r.path() == STATUS);
    assert!(
        events
            .iter()
            .all(|e| (e.method.as_str(), e.path()) == ("POST", EVENTS))
    );
    assert_eq!(status.len(), 1, "one status apply");
    (events, status.remove(0))
}

/// `seen` is a status apply and one Warning event, both saying that pods cannot be created, in
/// `message`: Available=False and Degraded=True.
fn assert_creation_refused(seen: Vec<apiserver::Seen>, message: &str) {
    let (events, status) = events_and_status(seen);
    for type_ in [AVAILABLE, DEGRADED] {
        let c = status.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap();
        assert_eq!(c["reason"], "PodCreationRefused");
        assert_eq!(c["message"], message);
    }
    assert_eq!(condition(&status.body, DEGRADED).0, "True");
    let [warning] = &events[..] else {
        panic!("one event: {}", events.len());
    };
    assert_eq!(
        (&warning.body["type"], &warning.body["reason"]),
        (&json!("Warning"), &json!("PodCreationRefused"))
    );
}

/// Pod `name` of Memcached `cache` as the pod watch decodes it, with `labels` besides its
/// instance label, and Ready since now if `ready`.
fn watched_pod(name: &str, labels: &[(&str, &str)], ready: bool) -> PodMeta {
    let labels = std::iter::once((resources::LABEL_INSTANCE, "cache"))
        .chain(labels.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()));
    PodMeta {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            namespace: Some("default".into()),
            name: Some(name.into()),
            labels: Some(labels.collect()),
            owner_references: Some(vec![resources::owner_reference(&memcached("cache", 1))]),
            ..Default::default()
        },
        trouble: None,
        ip: None,
        ready_since: ready.then(k8s_openapi::jiff::Timestamp::now),
    }
}

fn condition(body: &serde_json::Value, type_: &str) -> (String, String) {
    let c = body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap();
    (
        c["status"].as_str().unwrap().into(),
        c["reason"].as_str().unwrap().into(),
    )
}

#[tokio::test]
async fn new_cr_gets_stateful_set_service_and_events_then_status_from_the_refresh() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = memcached("cache", 3);
    let sent = mc.clone();
    let (action, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        // No reads: an apply that only creates tells whether the name is free.
        let apply = api.echo("PATCH", STATEFUL_SET).await;
        assert!(
            apply
                .path_and_query
                .contains("fieldManager=memcached-operator")
        );
        assert!(apply.path_and_query.contains("force=true"));
        assert_eq!(apply.body["metadata"]["resourceVersion"], "1");
        assert_eq!(apply.body["spec"]["replicas"], 3);
        assert_eq!(
            apply.body["metadata"]["ownerReferences"][0]["uid"],
            "uid-cache"
        );
        // Then the Service and the budget, and the events going out in the background.
        let (mut services, rest): (Vec<_>, Vec<_>) = api
            .echo_any_order(4, &sent)
            .await
            .into_iter()
            .partition(|r| r.path() == SERVICE);
        let svc = services.pop().expect("the Service is created");
        assert_eq!(svc.method, "PATCH");
        assert_eq!(svc.body["metadata"]["resourceVersion"], "1");
        assert_eq!(svc.body["spec"]["clusterIP"], "None");
        let budget = rest
            .iter()
            .find(|r| r.path() == BUDGET)
            .expect("the budget is created");
        assert_eq!(budget.body["metadata"]["resourceVersion"], "1");
        assert_eq!(budget.body["spec"]["maxUnavailable"], 1);
        assert_eq!(
            budget.body["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            "cache"
        );
        // The budget's creation has no event of its own (it comes with the StatefulSet's).
        let rest = rest.into_iter().filter(|r| r.path() != BUDGET).collect();
        let mut events: Vec<_> = events_only(rest).into_iter().map(|e| e.body).collect();
        events.sort_by_key(|e| e["note"].to_string());
        let described: Vec<_> = events
            .iter()
            .map(|e| {
                (
                    e["reason"].clone(),
                    e["note"].clone(),
                    e["related"]["kind"].clone(),
                )
            })
            .collect();
        assert_eq!(
            described,
            [
                (
                    json!("Created"),
                    json!("Created Service cache"),
                    json!("Service")
                ),
                (
                    json!("Created"),
                    json!("Created StatefulSet cache"),
                    json!("StatefulSet")
                ),
            ]
        );
        api
    })
    .await;
    assert_eq!(action.unwrap(), Outcome::Converged);

    // The StatefulSet's watch event (in the cache, no pods yet) queues the status refresh.
    caches.add_stateful_set(stateful_set_with_status(&mc, 3, 0));
    caches.add_service(resources::service(&mc));
    caches.add_budget(resources::pod_disruption_budget(&mc).expect("size 3 has one"));
    let action = scenario(mc.clone(), ctx, api, |mut api| async move {
        let status = api.echo_status(STATUS, &mc).await;
        assert_eq!(condition(&status.body, AVAILABLE).0, "False");
        assert_eq!(status.body["status"]["observedGeneration"], 1);
        api
    })
    .await;
    assert_eq!(action.unwrap(), Outcome::Converged);
}

/// Fills the caches as after a converged reconcile of `mc`, and gives `mc` the status the
/// operator wrote then.
fn converged(mc: &mut Memcached, caches: &mut apiserver::Caches) {
    let d = stateful_set_with_status(mc, mc.spec.size, mc.spec.size);
    caches.add_stateful_set(d.clone());
    caches.add_service(resources::service(mc));
    if let Some(mut budget) = resources::pod_disruption_budget(mc) {
        budget.metadata.uid = Some("uid-budget".into());
        caches.add_budget(budget);
    }
    let observed = Observed {
        stateful_set: Some(d.seen()),
        ..Default::default()
    };
    mc.status = Some(status::desired_status(
        mc,
        &observed,
        &crate::fixtures::time(0),
    ));
}

#[tokio::test]
async fn converged_cr_makes_no_requests() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&mut mc, &mut caches);
    let action = scenario(mc, ctx, api, |api| async move { api })
        .await
        .unwrap();
    assert_eq!(action, Outcome::Converged);
}

#[tokio::test]
async fn a_memcached_deleted_meanwhile_is_no_failure() {
    // Its owned objects' deletions, seen before its own, queue one more reconcile of it.
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&mut mc, &mut caches);
    mc.status = None;
    let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
    let action = one_request(
        mc,
        &ctx,
        api,
        ("PATCH", STATUS),
        StatusCode::NOT_FOUND,
        not_found,
    );
    let outcome = action.await.unwrap();
    assert_eq!(outcome, Outcome::Gone);
    assert_eq!(outcome.next(), Next::AwaitChange, "no failure, no recheck");
    let text = ctx.metrics.render();
    assert!(
        !text.contains(r#"memcached="cache""#),
        "no conditions kept for it: {text}"
    );
}

#[tokio::test]
async fn a_namespace_being_deleted_is_no_failure() {
    // Its StatefulSet deleted with the namespace before the Memcached was: creating it again
    // is refused, and the Memcached goes next.
    let (ctx, api, _caches) = apiserver::context();
    let mc = memcached("cache", 1);
    let terminating = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": "statefulsets.apps \"cache\" is forbidden: unable to create new content in namespace default because it is being terminated",
        "details": {"name": "cache", "group": "apps", "kind": "statefulsets",
                    "causes": [{"reason": "NamespaceTerminating", "message": "namespace default is being terminated", "field": "metadata.namespace"}]}});
    let action = one_request(
        mc,
        &ctx,
        api,
        ("PATCH", STATEFUL_SET),
        StatusCode::FORBIDDEN,
        terminating,
    );
    let outcome = action.await.unwrap();
    assert_eq!(outcome, Outcome::Gone);
    assert_eq!(outcome.next(), Next::AwaitChange, "no failure, no recheck");
}

/// A reconcile whose one request is answered with `status` and `body`.
async fn one_request(
    mc: Memcached,
    ctx: &Arc<Context>,
    api: ApiServer,
    (method, path): (&'static str, &'static str),
    status: StatusCode,
    body: serde_json::Value,
) -> Result<Outcome> {
    scenario(mc, ctx.clone(), api, move |mut api| async move {
        api.expect(method, path, status, move |_| body).await;
        api
    })
    .await
}

#[tokio::test]
async fn size_change_scales_the_stateful_set() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&mut mc, &mut caches);
    mc.spec.size = 5;
    mc.metadata.generation = Some(2);

    scenario(mc.clone(), ctx, api, |mut api| async move {
        let apply = api.echo("PATCH", STATEFUL_SET).await;
        assert_eq!(apply.body["spec"]["replicas"], 5);
        let events = events_only(api.echo_any_order(1, &mc).await);
        let [event] = &events[..] else {
            panic!("one event, not {}", events.len())
        };
        assert_eq!(event.body["reason"], "Scaled");
        assert_eq!(
            event.body["note"],
            "Scaled StatefulSet cache from 3 to 5 replicas"
        );
        api
    })
    .await
    .unwrap();
}

fn conflict(_: &serde_json::Value) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
           "message": "Operation cannot be fulfilled on statefulsets.apps \"cache\": the object has been modified"})
}

fn foreign_stateful_set(mc: &Memcached) -> serde_json::Value {
    let mut foreign = resources::stateful_set(mc, &Images::new("someone/else"));
    foreign.metadata.owner_references = None;
    foreign.metadata.labels = None;
    serde_json::to_value(&foreign).unwrap()
}

#[tokio::test]
async fn foreign_stateful_set_is_left_untouched_with_a_warning() {
    let (ctx, api, _caches) = apiserver::context();
    let mc = memcached("cache", 1);
    let foreign = foreign_stateful_set(&mc);
    let action = scenario(mc.clone(), ctx, api, |mut api| async move {
        // The create-only apply fails on the existing object, without changing it.
        let create = api
            .expect("PATCH", STATEFUL_SET, StatusCode::CONFLICT, conflict)
            .await;
        assert_eq!(create.body["metadata"]["resourceVersion"], "1");
        api.expect("GET", STATEFUL_SET, StatusCode::OK, move |_| foreign)
            .await;
        // Nothing else is created.
        let status = api.echo_status(STATUS, &mc).await;
        assert_eq!(
            condition(&status.body, DEGRADED),
            ("True".into(), "ResourceExists".into())
        );
        let event = api.echo("POST", EVENTS).await;
        assert_eq!(
            (event.body["type"].as_str(), event.body["reason"].as_str()),
            (Some("Warning"), Some("ResourceExists"))
        );
        api
    })
    .await
    .unwrap();
    assert_eq!(action.next(), Next::After(CONFLICT_RECHECK));
}

#[tokio::test]
async fn a_reported_foreign_object_is_rechecked_with_reads_only() {
    let (ctx, api, _caches) = apiserver::context();
    let mut mc = memcached("cache", 1);
    let blocked = Blocked::ResourceExists {
        message: status::conflict_message("StatefulSet", &mc),
    };
    let observed = Observed {
        blocked: Some(blocked),
        ..Default::default()
    };
    mc.status = Some(status::desired_status(
        &mc,
        &observed,
        &crate::fixtures::time(0),
    ));
    let foreign = foreign_stateful_set(&mc);
    let action = scenario(mc.clone(), ctx, api, |mut api| async move {
        let mut reads = Vec::new();
        for _ in 0..2 {
            let (request, reply) = api.receive_any().await;
            reads.push(request.path().to_string());
            match request.path() {
                STATEFUL_SET => reply.send(StatusCode::OK, &foreign),
                _ => reply.send(StatusCode::NOT_FOUND, &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})),
            }
        }
        reads.sort();
        assert_eq!(reads, [SERVICE, STATEFUL_SET]);
        // The status already says so, and the Warning was published: nothing more.
        api
    })
    .await
    .unwrap();
    assert_eq!(action.next(), Next::After(CONFLICT_RECHECK));
}

#[tokio::test]
async fn an_uncached_object_of_ours_is_read_and_not_applied_again() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 1);
    let stored = crate::fixtures::stored_stateful_set(&mc, 1, 1);
    let d = stateful_set_with_status(&mc, 1, 1);
    caches.add_service(resources::service(&mc));
    let observed = Observed {
        stateful_set: Some(d.seen()),
        ..Default::default()
    };
    mc.status = Some(status::desired_status(
        &mc,
        &observed,
        &crate::fixtures::time(0),
    ));
    let ours = serde_json::to_value(&stored).unwrap();
    scenario(mc, ctx, api, |mut api| async move {
        api.expect("PATCH", STATEFUL_SET, StatusCode::CONFLICT, conflict)
            .await;
        api.expect("GET", STATEFUL_SET, StatusCode::OK, move |_| ours)
            .await;
        api
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn refused_apply_is_reported_once_and_rechecked_slowly() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = memcached("cache", 1);
    caches.add_service(resources::service(&mc));
    let invalid = |_: &serde_json::Value| {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
               "message": "StatefulSet.apps \"cache\" is invalid: spec.template.spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"})
    };
    let reported = mc.clone();
    let outcome = scenario(mc.clone(), ctx.clone(), api, |mut api| async move {
        api.expect(
            "PATCH",
            STATEFUL_SET,
            StatusCode::UNPROCESSABLE_ENTITY,
            invalid,
        )
        .await;
        let (events, status) = events_and_status(api.echo_any_order(2, &reported).await);
        let (degraded, reason) = condition(&status.body, DEGRADED);
        assert_eq!(
            (degraded.as_str(), reason.as_str()),
            ("True", "InvalidSpec")
        );
        let message = status.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == DEGRADED)
            .unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("the API server refused StatefulSet cache: ")
                && message.contains("must be less than or equal to cpu limit"),
            "{message}"
        );
        let [event] = &events[..] else {
            panic!("one event, not {}", events.len())
        };
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], "InvalidSpec");
        api
    })
    .await
    .unwrap();
    let Next::Failed { reason, retry, .. } = outcome.next() else {
        panic!("a failure for the metrics: {outcome:?}")
    };
    assert_eq!(reason, "refused");
    assert_eq!(
        retry,
        Retry::After(REFUSED_RECHECK),
        "not retried hot, and the backoff of later failures not grown"
    );
}

#[tokio::test]
async fn an_api_error_is_retried_with_the_backoff() {
    let (ctx, api, _caches) = apiserver::context();
    let mc = memcached("cache", 1);
    let server_error = |_: &serde_json::Value| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is sad"});
    let err = scenario(mc.clone(), ctx.clone(), api, |mut api| async move {
        api.expect(
            "PATCH",
            STATEFUL_SET,
            StatusCode::INTERNAL_SERVER_ERROR,
            server_error,
        )
        .await;
        api
    })
    .await
    .unwrap_err();
    assert_eq!(err.metric_label(), "apply");
    let Next::Failed { retry, .. } = outcome::failed(&err) else {
        panic!("a failure")
    };
    assert_eq!(retry, Retry::Backoff, "the worker's per-object backoff");
}
#[tokio::test]
async fn below_two_pods_the_budget_is_deleted() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&mut mc, &mut caches);
    mc.spec.size = 1;
    mc.metadata.generation = Some(2);
    scenario(mc.clone(), ctx, api, |mut api| async move {
        let apply = api.echo("PATCH", STATEFUL_SET).await;
        assert_eq!(apply.body["spec"]["replicas"], 1);
        let delete = api
            .expect(
                "DELETE",
                BUDGET,
                StatusCode::OK,
                |_| json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
            .await;
        assert_eq!(
            delete.body["preconditions"]["uid"], "uid-budget",
            "only the budget we saw"
        );
        let events = events_only(api.echo_any_order(2, &mc).await);
        let mut notes: Vec<_> = events.iter().map(|e| e.body["note"].to_string()).collect();
        notes.sort();
        assert_eq!(
            notes,
            [
                "\"Deleted PodDisruptionBudget cache: no longer wanted by the spec\"",
                "\"Scaled StatefulSet cache from 3 to 1 replicas\""
            ]
        );
        api
    })
    .await
    .unwrap();
}

/// An operator whose pod template differs from the one running, for a Memcached whose spec
/// did not change: an upgrade.
fn upgraded_operator(limit: u16) -> (Arc<Context>, ApiServer, apiserver::Caches) {
    let (ctx, api, caches) = apiserver::context();
    let mut ctx = Arc::into_inner(ctx).unwrap();
    ctx.images = Images::new("memcached:next");
    ctx.rollouts = Arc::new(Rollouts::new(limit));
    (Arc::new(ctx), api, caches)
}

#[tokio::test]
async fn an_upgrade_rolls_only_as_many_stateful_sets_as_the_budget_allows() {
    let (ctx, api, mut caches) = upgraded_operator(1);
    let mut first = memcached("cache", 3);
    converged(&mut first, &mut caches);
    let mut second = memcached("other", 3);
    converged(&mut second, &mut caches);

    let (action, api) = scenario_then(first.clone(), ctx.clone(), api, |mut api| async move {
        let apply = api.echo("PATCH", STATEFUL_SET).await;
        assert_eq!(
            apply.body["spec"]["template"]["spec"]["containers"][0]["image"],
            "memcached:next"
        );
        let events = events_only(api.echo_any_order(1, &first).await);
        assert_eq!(events[0].body["reason"], "Updated");
        api
    })
    .await;
    assert_eq!(action.unwrap(), Outcome::Converged);

    // The budget of 1 is spent: the second waits, says so, and asks again later.
    let status_path = STATUS.replace("/cache/", "/other/");
    let reported = second.clone();
    let (action, api) = scenario_then(second.clone(), ctx.clone(), api, |mut api| async move {
        let status = api.echo_status(&status_path, &reported).await;
        assert_eq!(
            condition(&status.body, PROGRESSING),
            ("True".into(), "RolloutQueued".into())
        );
        api
    })
    .await;
    assert_eq!(action.unwrap(), Outcome::WaitingForRolloutSlot);

    // Its own spec change never waits.
    let mut changed = second;
    changed.spec.size = 4;
    changed.metadata.generation = Some(2);
    let path = STATEFUL_SET.replace("/cache", "/other");
    scenario(changed.clone(), ctx, api, |mut api| async move {
        let apply = api.echo("PATCH", &path).await;
        assert_eq!(
            apply.body["spec"]["template"]["spec"]["containers"][0]["image"],
            "memcached:next"
        );
        events_only(api.echo_any_order(1, &changed).await);
        api
    })
    .await
    .unwrap();
}

/// A pod `name` of `mc` as the pod watch reports it, with nothing wrong.
fn pod_of(mc: &Memcached, name: &str) -> PodMeta {
    let labels = [(crate::resources::LABEL_INSTANCE.to_string(), mc.name_any())];
    PodMeta {
        metadata: ObjectMeta {
            namespace: mc.namespace(),
            name: Some(name.into()),
            labels: Some(labels.into()),
            owner_references: Some(vec![crate::resources::owner_reference(mc)]),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A pod of `mc` as the pod watch reports it, not Ready because it cannot pull its image.
fn pod_that_cannot_pull(mc: &Memcached, name: &str, words: &str) -> PodMeta {
    PodMeta {
        trouble: Some(crate::status::pods::PodTrouble {
            cause: crate::status::pods::Cause::ImagePullFailed,
            words: words.into(),
        }),
        ..pod_of(mc, name)
    }
}

#[tokio::test]
async fn pods_that_cannot_pull_their_image_are_reported_once_whatever_their_retries_say() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 2);
    converged(&mut mc, &mut caches);
    caches.add_stateful_set(stateful_set_with_status(&mc, 2, 0));
    for pod in ["cache-0", "cache-1"] {
        let pod = pod_that_cannot_pull(&mc, pod, "failed to pull image: not found");
        ctx.pods.observe(&watcher::Event::Apply(pod));
    }
    let reported = mc.clone();
    let (first, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        let (events, status) = events_and_status(api.echo_any_order(2, &reported).await);
        let conditions = &status.body["status"]["conditions"];
        let available = conditions
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == AVAILABLE)
            .unwrap();
        assert_eq!(available["reason"], "ImagePullFailed");
        assert_eq!(
            available["message"],
            "0/2 pods are ready; 2 pods cannot pull the image: failed to pull image: not found"
        );
        assert_eq!(
            condition(&status.body, DEGRADED),
            ("True".into(), "ImagePullFailed".into())
        );
        let [event] = &events[..] else {
            panic!("one event, not {}", events.len())
        };
        assert_eq!(
            (&event.body["type"], &event.body["reason"]),
            (&json!("Warning"), &json!("ImagePullFailed"))
        );
        assert_eq!(event.body["note"], available["message"]);
        api
    })
    .await;
    assert_eq!(first.unwrap(), Outcome::Converged);

    // The kubelet retries: the pods now say "Back-off pulling image". The status written keeps
    // the first words, and the cause was warned about: no request.
    let stateful_set = stateful_set_with_status(&mc, 2, 0);
    let pods = ctx.pods.pods_of("default", "cache");
    let observed = Observed {
        stateful_set: Some(stateful_set.seen()),
        pods: pods.names,
        troubles: pods.troubles,
        ..Default::default()
    };
    mc.status = Some(status::desired_status(
        &mc,
        &observed,
        &crate::fixtures::time(1),
    ));
    for pod in ["cache-0", "cache-1"] {
        let pod = pod_that_cannot_pull(&mc, pod, "Back-off pulling image \"memcached:nope\"");
        ctx.pods.observe(&watcher::Event::Apply(pod));
    }
    let outcome = scenario(mc, ctx, api, |api| async move { api })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Converged);
}

const NETWORK_POLICY: &str = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/cache";

mod binding;
mod certificates;
mod creation;
mod migration;
mod optional;
mod own_pods;
