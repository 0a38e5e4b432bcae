//! Scenarios of one reconcile against a scripted API server.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::*;
use crate::controller::Rollouts;
use crate::controller::outcome::{self, REFUSED_RECHECK};
use crate::fixtures::apiserver::{self, ApiServer};
use crate::fixtures::memcached;
use crate::resources;
use crate::resources::REVISION_LABEL;
use crate::status::{self, Blocked, Observed};
use crate::status::{AVAILABLE, DEGRADED, PROGRESSING};
use crate::watch::pod_index::PodMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use operator_runtime::workers::{Next, Retry};

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
        not_ready_since: None,
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

/// `mc`'s members as the pod watch sees them: of the revision of `mc`'s template, Ready for
/// long.
fn members_run(ctx: &Context, mc: &Memcached) {
    let template = resources::pod_template(mc, &ctx.config.images);
    let revision = resources::members::revision(mc, &template);
    for i in 0..mc.spec.size {
        let mut member = watched_pod(&format!("cache-{i}"), &[(REVISION_LABEL, &revision)], true);
        member.ready_since = Some(
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1),
        );
        ctx.cached.pods.observe(&watcher::Event::Apply(member));
    }
}

/// Fills the caches as after a converged reconcile of `mc` (its Service and budget kept, its
/// members running), and gives `mc` the status the operator wrote then.
fn converged(ctx: &Context, mc: &mut Memcached, caches: &mut apiserver::Caches) {
    caches.add_service(resources::service(mc));
    if let Some(mut budget) = resources::pod_disruption_budget(mc) {
        budget.metadata.uid = Some("uid-budget".into());
        caches.add_budget(budget);
    }
    members_run(ctx, mc);
    let observed = Observed {
        members: Some(crate::fixtures::members(mc.spec.size, mc.spec.size)),
        pods: ctx.cached.pods.pods_of("default", "cache").names,
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
    converged(&ctx, &mut mc, &mut caches);
    let action = scenario(mc, ctx, api, |api| async move { api })
        .await
        .unwrap();
    assert_eq!(action, Outcome::Converged);
}

#[tokio::test]
async fn a_status_written_is_not_written_again_before_the_watch_brings_it_back() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&ctx, &mut mc, &mut caches);
    mc.status = None;
    let sent = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        api.echo_status(STATUS, &sent).await;
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
    // The pods' events queue it again before its own watch has brought the status back.
    let (again, api) = scenario_then(mc.clone(), ctx.clone(), api, |api| async move { api }).await;
    assert_eq!(
        again.unwrap(),
        Outcome::Converged,
        "no request: it is written"
    );
    // A newer version read without it (someone took it away): written again.
    mc.metadata.resource_version = Some("3".into());
    let sent = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        api.echo_status(STATUS, &sent).await;
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn a_memcached_deleted_meanwhile_is_no_failure() {
    // Its owned objects' deletions, seen before its own, queue one more reconcile of it.
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&ctx, &mut mc, &mut caches);
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

fn conflict(_: &serde_json::Value) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
           "message": "Operation cannot be fulfilled on services \"cache\": the object has been modified"})
}

/// A converged Memcached whose Service the cache does not hold (its watch has not caught up).
fn uncached_service(ctx: &Context, caches: &mut apiserver::Caches) -> Memcached {
    let mut mc = memcached("cache", 1);
    converged(ctx, &mut mc, caches);
    caches.services.apply_watcher_event(&watcher::Event::Delete(
        crate::watch::owned::OwnedObject::of(&resources::service(&mc)),
    ));
    mc
}

#[tokio::test]
async fn an_uncached_object_of_ours_is_read_and_not_applied_again() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = uncached_service(&ctx, &mut caches);
    let ours = serde_json::to_value(resources::service(&mc)).unwrap();
    scenario(mc, ctx, api, |mut api| async move {
        api.expect("PATCH", SERVICE, StatusCode::CONFLICT, conflict)
            .await;
        api.expect("GET", SERVICE, StatusCode::OK, move |_| ours)
            .await;
        api
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn refused_apply_is_reported_once_and_rechecked_slowly() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = uncached_service(&ctx, &mut caches);
    let invalid = |_: &serde_json::Value| {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Invalid", "code": 422,
               "message": "Service \"cache\" is invalid: spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"})
    };
    let reported = mc.clone();
    let outcome = scenario(mc.clone(), ctx.clone(), api, |mut api| async move {
        api.expect("PATCH", SERVICE, StatusCode::UNPROCESSABLE_ENTITY, invalid)
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
            message.starts_with("the API server refused Service cache: ")
                && message.contains("must be between 1 and 65535"),
            "{message}"
        );
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("True".into(), "AllPodsReady".into()),
            "the members running still serve"
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
    let (ctx, api, mut caches) = apiserver::context();
    let mc = uncached_service(&ctx, &mut caches);
    let server_error = |_: &serde_json::Value| json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd is sad"});
    let err = scenario(mc.clone(), ctx.clone(), api, |mut api| async move {
        api.expect(
            "PATCH",
            SERVICE,
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
async fn below_two_pods_the_budget_is_deleted_with_the_members_above_the_size() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = memcached("cache", 3);
    converged(&ctx, &mut mc, &mut caches);
    mc.spec.size = 1;
    mc.metadata.generation = Some(2);
    scenario(mc.clone(), ctx, api, |mut api| async move {
        let seen = api.echo_any_order(6, &mc).await;
        let budget = seen
            .iter()
            .find(|r| (r.method.as_str(), r.path()) == ("DELETE", BUDGET))
            .expect("the budget is deleted");
        assert_eq!(
            budget.body["preconditions"]["uid"], "uid-budget",
            "only the budget we saw"
        );
        let mut notes: Vec<_> = seen
            .iter()
            .filter(|r| r.path() == EVENTS)
            .map(|e| e.body["note"].as_str().unwrap().to_string())
            .collect();
        notes.sort();
        assert_eq!(
            notes,
            [
                "Deleted Pod cache-1: no longer wanted by the spec",
                "Deleted Pod cache-2: no longer wanted by the spec",
                "Deleted PodDisruptionBudget cache: no longer wanted by the spec",
            ]
        );
        api
    })
    .await
    .unwrap();
}

/// A pod `name` of `mc` as the pod watch reports it, with nothing wrong.
fn pod_of(mc: &Memcached, name: &str) -> PodMeta {
    let revision = resources::members::revision(
        mc,
        &resources::pod_template(mc, &resources::Images::default()),
    );
    let labels = [
        (crate::resources::LABEL_INSTANCE.to_string(), mc.name_any()),
        (REVISION_LABEL.to_string(), revision),
    ];
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
    converged(&ctx, &mut mc, &mut caches);
    for pod in ["cache-0", "cache-1"] {
        let pod = pod_that_cannot_pull(&mc, pod, "failed to pull image: not found");
        ctx.cached.pods.observe(&watcher::Event::Apply(pod));
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
    let pods = ctx.cached.pods.pods_of("default", "cache");
    let observed = Observed {
        members: Some(crate::fixtures::members(2, 0)),
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
        ctx.cached.pods.observe(&watcher::Event::Apply(pod));
    }
    let outcome = scenario(mc, ctx, api, |api| async move { api })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Converged);
}

const NETWORK_POLICY: &str = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/cache";

mod binding;
mod certificates;
mod optional;
mod own_pods;
