//! The objects one line of spec adds beside the members: the exporter with its ServiceMonitor,
//! and the NetworkPolicy.

use super::*;

const MONITOR: &str = "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors/cache";

fn with_monitoring(mut mc: Memcached, enabled: bool) -> Memcached {
    mc.spec.monitoring = Some(crate::api::MonitoringSpec {
        enabled,
        image: None,
    });
    mc
}

type Requests = Vec<(String, String, serde_json::Value)>;

/// The `n` requests (method, path, body; sorted) of a reconcile of the Memcached `prepare`
/// returns after filling the caches, where the cluster does or does not serve
/// ServiceMonitors.
async fn requests_of(
    served: bool,
    n: usize,
    prepare: impl FnOnce(&Context, &mut apiserver::Caches) -> Memcached,
) -> Requests {
    let (ctx, api, mut caches) = apiserver::context_where_service_monitors_are(served);
    let mc = prepare(&ctx, &mut caches);
    let seen = Arc::new(std::sync::Mutex::new(Requests::new()));
    let into = seen.clone();
    let answered = mc.clone();
    let action = scenario(mc, ctx, api, |mut api| async move {
        let requests = api.echo_any_order(n, &answered).await;
        *into.lock().unwrap() = requests
            .into_iter()
            .map(|r| (r.method.clone(), r.path().to_string(), r.body))
            .collect();
        api
    })
    .await;
    assert_eq!(action.unwrap(), Outcome::Converged);
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    seen.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    seen
}

/// A converged Memcached whose spec now turns monitoring on, and whose members run the
/// exporter already (its update is members.rs's).
fn turning_monitoring_on(ctx: &Context, caches: &mut apiserver::Caches) -> Memcached {
    let mut mc = memcached("cache", 1);
    converged(ctx, &mut mc, caches);
    let mut mc = with_monitoring(mc, true);
    mc.metadata.generation = Some(2);
    members_run(ctx, &mc);
    mc
}

/// The body of the one request to `path` among `requests`.
fn body_of<'a>(requests: &'a Requests, path: &str) -> &'a serde_json::Value {
    let [(_, _, body)] = &requests
        .iter()
        .filter(|(_, p, _)| p == path)
        .collect::<Vec<_>>()[..]
    else {
        panic!("one request to {path}: {:?}", paths(requests));
    };
    body
}

fn paths(requests: &Requests) -> Vec<(&str, &str)> {
    requests
        .iter()
        .map(|(m, p, _)| (m.as_str(), p.as_str()))
        .collect()
}

#[tokio::test]
async fn monitoring_without_the_service_monitor_api_adds_the_metrics_port_only() {
    let requests = requests_of(false, 3, turning_monitoring_on).await;
    assert_eq!(
        paths(&requests),
        [("PATCH", SERVICE), ("PATCH", STATUS), ("POST", EVENTS)],
        "nothing under monitoring.coreos.com"
    );
    assert_eq!(
        body_of(&requests, SERVICE)["spec"]["ports"][1]["name"],
        "metrics"
    );
}

#[tokio::test]
async fn monitoring_where_the_api_is_served_creates_an_owned_service_monitor() {
    let requests = requests_of(true, 4, turning_monitoring_on).await;
    assert_eq!(
        paths(&requests),
        [
            ("PATCH", SERVICE),
            ("PATCH", STATUS),
            ("PATCH", MONITOR),
            ("POST", EVENTS)
        ]
    );
    let monitor = body_of(&requests, MONITOR);
    assert_eq!(monitor["metadata"]["resourceVersion"], "1", "create only");
    assert_eq!(
        monitor["metadata"]["ownerReferences"][0]["uid"],
        "uid-cache"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "cache"
    );
}

#[tokio::test]
async fn turning_monitoring_off_deletes_our_service_monitor() {
    let mut on = memcached("cache", 1);
    on = with_monitoring(on, true);
    let mut off = with_monitoring(on.clone(), false);
    off.metadata.generation = Some(2);
    let (ctx, api, mut caches) = apiserver::context_where_service_monitors_are(true);
    converged(&ctx, &mut on, &mut caches);
    members_run(&ctx, &off);
    let mut monitor = resources::service_monitor(&on).unwrap();
    monitor.metadata.uid = Some("uid-monitor".into());
    caches.add_monitor(monitor);
    off.status = on.status.clone();
    scenario(off.clone(), ctx, api, |mut api| async move {
        let mut seen = Vec::new();
        let mut notes = Vec::new();
        // The monitor's deletion, the Service's apply, their two events (an update, a
        // deletion), and the status.
        for _ in 0..5 {
            let (request, reply) = api.receive_any().await;
            match (request.method.as_str(), request.path()) {
                ("DELETE", MONITOR) => {
                    assert_eq!(request.body["preconditions"]["uid"], "uid-monitor");
                    reply.send(StatusCode::OK, &apiserver::success());
                }
                (_, STATUS) => {
                    let mut object = serde_json::to_value(&off).unwrap();
                    object["status"] = request.body["status"].clone();
                    reply.send(StatusCode::OK, &object);
                }
                _ => reply.send(StatusCode::OK, &apiserver::echoed(&request.body)),
            }
            if request.path() == EVENTS {
                notes.push(request.body["note"].as_str().unwrap().to_string());
            }
            seen.push((request.method.clone(), request.path().to_string()));
        }
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen,
            [
                ("DELETE".to_string(), MONITOR.to_string()),
                ("PATCH".to_string(), SERVICE.to_string()),
                ("PATCH".to_string(), STATUS.to_string()),
                ("POST".to_string(), EVENTS.to_string()),
            ]
        );
        notes.sort();
        assert_eq!(
            notes[0],
            "Deleted ServiceMonitor cache: no longer wanted by the spec"
        );
        api
    })
    .await
    .unwrap();
}

/// A converged Memcached whose spec now turns the network policy on.
fn turning_the_network_policy_on(ctx: &Context, caches: &mut apiserver::Caches) -> Memcached {
    let mut mc = memcached("cache", 1);
    converged(ctx, &mut mc, caches);
    mc.spec.network_policy = Some(crate::api::NetworkPolicySpec {
        enabled: true,
        ..Default::default()
    });
    mc.metadata.generation = Some(2);
    mc
}

#[tokio::test]
async fn turning_the_network_policy_on_applies_it_and_leaves_the_pods_alone() {
    let requests = requests_of(false, 2, turning_the_network_policy_on).await;
    assert_eq!(
        paths(&requests),
        [("PATCH", STATUS), ("PATCH", NETWORK_POLICY)],
        "no member written: the pods keep running"
    );
    assert_eq!(
        requests[1].2["spec"]["ingress"][0]["from"],
        json!([{"podSelector": {}}])
    );
}

#[tokio::test]
async fn a_policy_the_operator_may_not_keep_blocks_the_memcached_instead_of_leaving_it_open() {
    let (ctx, api, mut caches) = apiserver::context_without_network_policies();
    let mc = turning_the_network_policy_on(&ctx, &mut caches);
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let (events, status) = events_and_status(api.echo_any_order(2, &answered).await);
        assert_eq!(
            condition(&status.body, "Degraded"),
            ("True".to_string(), "Forbidden".to_string())
        );
        assert!(
            events[0].body["note"]
                .as_str()
                .unwrap()
                .contains("networkpolicies"),
            "{}",
            events[0].body
        );
        api
    })
    .await
    .unwrap();
    assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
}
