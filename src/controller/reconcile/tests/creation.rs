//! Pods the StatefulSet cannot create (a quota, an admission policy): its controller says why
//! only in `FailedCreate` events, which are read while its status shows pods missing.

use http::StatusCode;
use serde_json::json;

use super::*;

const STATEFUL_SET_EVENTS: &str = "/api/v1/namespaces/default/events";

/// A core/v1 EventList with one `FailedCreate` of the StatefulSet "cache", seen `ago` before now.
fn failed_create(message: &str, ago: k8s_openapi::jiff::SignedDuration) -> serde_json::Value {
    let at = k8s_openapi::jiff::Timestamp::now() - ago;
    json!({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": [{
        "metadata": {"name": "cache.17f0", "namespace": "default"},
        "involvedObject": {"kind": "StatefulSet", "namespace": "default", "name": "cache"},
        "reason": "FailedCreate",
        "type": "Warning",
        "message": message,
        "lastTimestamp": at.to_string(),
    }]})
}

/// A converged Memcached of 3 whose StatefulSet, having seen its spec, runs only 1 pod.
fn one_of_three(caches: &mut apiserver::Caches) -> Memcached {
    let mut mc = memcached("cache", 3);
    converged(&mut mc, caches);
    caches.add_stateful_set(stateful_set_with_status(&mc, 1, 1));
    mc
}

const QUOTA: &str = "create Pod cache-1 in StatefulSet cache failed error: pods \"cache-1\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=1, limited: pods=1";

#[tokio::test]
async fn a_refused_pod_creation_is_reported_with_the_stateful_sets_words() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = one_of_three(&mut caches);
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let read = api
            .expect("GET", STATEFUL_SET_EVENTS, StatusCode::OK, |_| {
                failed_create(QUOTA, k8s_openapi::jiff::SignedDuration::from_secs(30))
            })
            .await;
        let query = read.path_and_query.replace("%3D", "=").replace("%2C", ",");
        for field in [
            "involvedObject.kind=StatefulSet",
            "involvedObject.name=cache",
            "reason=FailedCreate",
        ] {
            assert!(query.contains(field), "{query}");
        }
        let message = format!("1/3 pods are ready; pods cannot be created: {QUOTA}");
        assert_creation_refused(api.echo_any_order(2, &reported).await, &message);
        api
    })
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome, Outcome::PodsMissing);
    assert_eq!(outcome.next(), Next::After(outcome::MISSING_RECHECK));
}

#[tokio::test]
async fn an_old_refusal_is_not_reported() {
    // The quota was raised since: the pods are only not Ready yet.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = one_of_three(&mut caches);
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        api.expect("GET", STATEFUL_SET_EVENTS, StatusCode::OK, |_| {
            failed_create(QUOTA, k8s_openapi::jiff::SignedDuration::from_mins(30))
        })
        .await;
        let status = api.echo_status(STATUS, &reported).await;
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("False".into(), "PodsNotReady".into())
        );
        assert_eq!(condition(&status.body, DEGRADED).0, "False");
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::PodsMissing);
}

#[tokio::test]
async fn a_status_behind_the_controllers_own_creations_reads_no_events() {
    // Under a burst of new StatefulSets their controller writes a status before it has seen the
    // pods it created; the pod watch has them, so nothing failed and no events are read.
    let (ctx, api, mut caches) = apiserver::context();
    let mc = one_of_three(&mut caches);
    for name in ["cache-0", "cache-1", "cache-2"] {
        ctx.pods.observe(&watcher::Event::Apply(pod_of(&mc, name)));
    }
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let status = api.echo_status(STATUS, &reported).await;
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("False".into(), "PodsNotReady".into())
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged, "no recheck either");
}
