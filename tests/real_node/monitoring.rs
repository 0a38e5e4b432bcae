//! spec.monitoring for real: the exporter beside real memcached, a real Prometheus (Debian's
//! 2.42) scraping it and the operator, the alerts' expressions evaluated on what it scraped.
//!
//! Debian builds Prometheus without `kubernetes_sd_configs`, so the test does the endpoints
//! discovery itself, as the owned ServiceMonitor asks for it: the Services its selector matches,
//! their EndpointSlices' ready addresses on the port named `metrics`, labelled `namespace`,
//! `service`, `pod` and `endpoint` as a prometheus-operator labels them; written as a
//! `file_sd_configs` file, which Prometheus rereads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ResourceQuota, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::core::Selector;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::{
    AutoscalingSpec, Memcached, MonitoringSpec, NetworkPolicySpec, ProxySpec,
};
use memcached_operator::resources;
use memcached_operator_testkit::memcached::Connection;
use memcached_operator_testkit::promql::metric_names;
use serde_json::{Value, json};

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, apply, cluster, create, member_pods, memcached,
    wait_converged, wait_degraded, wait_for,
};
use crate::prometheus::Prometheus;
use crate::{Process, RealNode, pod_ip, real_namespace};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Prometheus scraping every second: the operator process's /metrics (job
/// `memcached-operator-controller-manager-metrics-service`, the job a ServiceMonitor gives it in
/// a cluster, which the alerts name) and the targets in the returned `targets.json`.
fn start_prometheus(dir: &Path, operator_metrics: &str) -> (Prometheus, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let targets = dir.join("targets.json");
    std::fs::write(&targets, "[]").unwrap();
    let config = format!(
        r#"global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
- job_name: memcached-operator-controller-manager-metrics-service
  honor_labels: true
  static_configs:
  - targets: ["{operator_metrics}"]
- job_name: memcached
  file_sd_configs:
  - files: ["{targets}"]
    refresh_interval: 1s
"#,
        targets = targets.display()
    );
    (Prometheus::start(dir, &config), targets)
}

/// The scrape targets a prometheus-operator would make of the owned ServiceMonitor of `mc`
/// (role endpoints): the matching Services' ready endpoints on the port the ServiceMonitor names.
async fn service_monitor_targets(client: &Client, ns: &str, mc: &Memcached) -> Value {
    let monitor = resources::service_monitor(mc).expect("monitoring is on");
    let selector = Selector::try_from(monitor.spec.selector).expect("a valid selector");
    let port_name = monitor.spec.endpoints[0].port.clone().unwrap();
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels_from(&selector))
        .await
        .unwrap();
    let mut groups = Vec::new();
    for svc in services {
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
            .list(
                &ListParams::default()
                    .labels(&format!("kubernetes.io/service-name={}", svc.name_any())),
            )
            .await
            .unwrap();
        for slice in slices {
            let Some(port) = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(port_name.as_str()))
                .and_then(|p| p.port)
            else {
                continue;
            };
            for endpoint in slice.endpoints {
                let ready = endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(false);
                let pod = endpoint.target_ref.as_ref().and_then(|r| r.name.clone());
                for address in endpoint.addresses.iter().filter(|_| ready) {
                    groups.push(serde_json::json!({
                        "targets": [format!("{address}:{port}")],
                        "labels": {"namespace": ns, "service": svc.name_any(),
                                   "pod": pod.clone().unwrap_or_default(), "endpoint": port_name},
                    }));
                }
            }
        }
    }
    Value::Array(groups)
}

/// The alerts' expressions, by alert name (config/prometheus/prometheus_rule.yaml).
fn alert_expressions() -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(repo().join("config/prometheus/prometheus_rule.yaml")).unwrap();
    let rule: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every metric name the alerts and the dashboard read.
fn names_in_use() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = alert_expressions()
        .values()
        .flat_map(|e| metric_names(e))
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("config/grafana/memcached-operator.json")).unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            names.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    names
}

#[tokio::test]
async fn prometheus_scrapes_memcached_and_the_operator_and_the_alerts_see_evictions() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "monitored").await;
    let op = Operator::start(
        &client,
        OperatorOptions {
            watch_namespace: Some(ns.clone()),
            leader_elect: true,
            lease: format!("monitoring-{ns}"),
            env: vec![
                (
                    "RELATED_IMAGE_MEMCACHED".into(),
                    node.memcached_image().into(),
                ),
                (
                    "RELATED_IMAGE_MEMCACHED_EXPORTER".into(),
                    node.var("EXPORTER_IMAGE").into(),
                ),
                ("RELATED_IMAGE_AGENT".into(), node.operator_image()),
            ],
            ..Default::default()
        },
    )
    .await;
    let started = Instant::now();
    let mut mc = memcached("cache", 1);
    mc.spec.max_memory_mib = 16;
    mc.spec.monitoring = Some(MonitoringSpec {
        enabled: true,
        image: None,
    });
    // With the policy on, as a careful user runs it: this Prometheus runs on the host, so it is
    // admitted by address.
    mc.spec.network_policy = Some(NetworkPolicySpec {
        enabled: true,
        from: vec![],
        metrics_from: vec![
            serde_json::from_value(
                json!({"ipBlock": {"cidr": format!("{}/32", node.var("REAL_NODE_GATEWAY"))}}),
            )
            .unwrap(),
        ],
    });
    // With the proxy (sid's memcached has it), so that its agent's series exist, under the
    // same ServiceMonitor and policy.
    mc.spec.proxy = Some(ProxySpec {
        enabled: true,
        replicas: 1,
        image: Some(node.var("MEMCACHED_SID_IMAGE").into()),
        ..ProxySpec::default()
    });
    // Autoscaled, so that the autoscaler's series exist: the evictions below add a member.
    mc.spec.autoscaling = Some(AutoscalingSpec {
        enabled: true,
        min_size: 1,
        max_size: 2,
        scale_out_stabilization_seconds: 0,
        ..AutoscalingSpec::default()
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 1).await;
    println!(
        "monitored Memcached Available after {:?}",
        started.elapsed()
    );

    // The exporter runs beside memcached, as confined as it.
    let pods = member_pods(&client, &ns, "cache").await;
    let [pod] = &pods[..] else {
        panic!("one pod, found {}", pods.len())
    };
    let statuses = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .clone()
        .unwrap();
    assert_eq!(statuses.len(), 2);
    assert!(
        statuses.iter().all(|s| s.ready && s.restart_count == 0),
        "{statuses:?}"
    );
    let uid = pod.metadata.uid.clone().unwrap();
    let exporters = Process::in_pod(&uid, "memcached_expor"); // comm keeps 15 characters
    let [exporter] = &exporters[..] else {
        panic!("one exporter process, found {}", exporters.len())
    };
    assert_eq!(exporter.status("Uid"), "65534 65534 65534 65534");
    assert_eq!(exporter.status("CapEff"), "0000000000000000");
    assert_eq!(exporter.status("NoNewPrivs"), "1");
    assert_eq!(exporter.status("Seccomp"), "2");
    assert!(exporter.root_is_read_only());

    // Prometheus: the operator, and the exporters the ServiceMonitor selects.
    let mc = Api::<Memcached>::namespaced(client.clone(), &ns)
        .get("cache")
        .await
        .unwrap();
    let dir = cluster().dir.join(format!("prometheus-{ns}"));
    let (prometheus, targets_file) =
        start_prometheus(&dir, &format!("127.0.0.1:{}", op.metrics_port));
    // As Prometheus's discovery does: the Service's endpoints may trail the Memcached's
    // Available (the EndpointSlice controller writes them), so they are waited for.
    let targets = wait_for(
        "the ServiceMonitor's Services (the members' and the proxy's) to have an endpoint each",
        Duration::from_secs(30),
        || async {
            let targets = service_monitor_targets(&client, &ns, &mc).await;
            (targets.as_array().unwrap().len() == 2).then_some(targets)
        },
    )
    .await;
    let target_of = |service: &str| {
        targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["labels"]["service"] == service)
            .unwrap_or_else(|| panic!("no target of {service}: {targets}"))
            .clone()
    };
    assert_eq!(
        target_of("cache")["targets"][0],
        format!("{}:9150", pod_ip(pod)),
        "the pod's metrics port"
    );
    let proxy_pod = target_of("cache-proxy")["labels"]["pod"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(&targets_file, targets.to_string()).unwrap();

    // Clients: connections held open, and gets that hit.
    let address = SocketAddr::new(pod_ip(pod).into(), 11211);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(Connection::connect(address).await.unwrap());
    }
    let mut client_conn = Connection::connect(address).await.unwrap();
    client_conn.set("greeting", b"hello").await.unwrap();
    for _ in 0..20 {
        assert_eq!(
            client_conn.get("greeting").await.unwrap(),
            Some("hello".into())
        );
    }

    let selector = format!(r#"namespace="{ns}",service="cache""#);
    let (up, connections) = wait_for(
        "Prometheus to scrape the exporter with the clients connected",
        Duration::from_secs(60),
        || async {
            let up = prometheus
                .value(&format!("memcached_up{{{selector}}}"))
                .await?;
            let connections = prometheus
                .value(&format!("memcached_current_connections{{{selector}}}"))
                .await?;
            (up == 1.0 && connections >= 7.0).then_some((up, connections))
        },
    )
    .await;
    let reconciles = wait_for(
        "Prometheus to scrape the operator",
        Duration::from_secs(60),
        || async {
            let v = prometheus
                .value(r#"sum(controller_runtime_reconcile_total{controller="memcached"})"#)
                .await?;
            (v > 0.0).then_some(v)
        },
    )
    .await;
    let hits = prometheus
        .value(&format!(
            r#"memcached_commands_total{{{selector},command="get",status="hit"}}"#
        ))
        .await;
    println!(
        "Prometheus: memcached_up {up}, memcached_current_connections {connections} (at least 6 clients and the exporter), controller_runtime_reconcile_total {reconciles}, get hits {hits:?}"
    );
    assert_eq!(hits, Some(20.0), "the 20 gets that hit");
    drop(held);

    // Through the proxy (its pod's address; the policy admits the namespace's clients): the
    // proxy's own series, scraped from its agent through the same ServiceMonitor and policy.
    let proxy_ip = pod_ip(
        &Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
            .get(&proxy_pod)
            .await
            .unwrap(),
    );
    let proxy_addr = SocketAddr::new(proxy_ip.into(), 11211);
    let mut through = wait_for(
        "the proxy to route to the member",
        Duration::from_secs(30),
        || async {
            let mut conn = Connection::connect(proxy_addr).await.ok()?;
            let hit = conn.get("greeting").await.ok()? == Some("hello".into());
            hit.then_some(conn)
        },
    )
    .await;
    for _ in 0..20 {
        assert_eq!(
            through.get("greeting").await.unwrap(),
            Some("hello".into()),
            "the proxy reaches the member"
        );
    }
    let proxy_selector = format!(r#"namespace="{ns}",service="cache-proxy""#);
    let member = format!("cache-0.cache.{ns}.svc:11211");
    let (proxy_gets, member_up) = wait_for(
        "Prometheus to scrape the proxy's agent",
        Duration::from_secs(60),
        || async {
            let gets = prometheus
                .value(&format!(
                    r#"memcached_proxy_commands_total{{{proxy_selector},command="get"}}"#
                ))
                .await?;
            let up = prometheus
                .value(&format!(
                    r#"memcached_proxy_backend_up{{{proxy_selector},backend="{member}"}}"#
                ))
                .await?;
            (gets >= 20.0).then_some((gets, up))
        },
    )
    .await;
    println!("Prometheus: the proxy's gets {proxy_gets}, {member} up {member_up}");
    assert_eq!(member_up, 1.0);

    // A refused Memcached, so the error and Degraded series exist too: a quota of the Services
    // the namespace has ("cache"'s among them), so that "over-quota"'s is refused.
    let services = Api::<Service>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len()
        .to_string();
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "no-more-services", "namespace": ns},
        "spec": {"hard": {"services": services}},
    }))
    .unwrap();
    apply(
        &Api::<ResourceQuota>::namespaced(client.clone(), &ns),
        &quota,
    )
    .await;
    wait_for("the quota counted", CONVERGE, || async {
        let q = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
            .get("no-more-services")
            .await
            .ok()?;
        let used = q.status?.used?;
        (used.get("services")?.0 == services).then_some(())
    })
    .await;
    create(&client, &ns, &memcached("over-quota", 1)).await;
    let message = wait_degraded(
        &Api::<Memcached>::namespaced(client.clone(), &ns),
        "over-quota",
        "Forbidden",
        CONVERGE,
    )
    .await;
    println!("over-quota Degraded: {message}");

    // Evictions: 16 MiB of memory, 40 MiB of 16 KiB values. The alert's rate is over 5 minutes,
    // so it needs more than 300 evictions (about 1,500 here).
    let value = vec![b'x'; 16 * 1024];
    let t0 = Instant::now();
    for i in 0..2560 {
        client_conn.set(&format!("big-{i}"), &value).await.unwrap();
    }
    println!("2560 sets of 16 KiB in {:?}", t0.elapsed());
    let expressions = alert_expressions();
    let evictions = &expressions["MemcachedEvictions"];
    let fired = wait_for(
        "the MemcachedEvictions expression to return this Memcached",
        Duration::from_secs(60),
        || async {
            let samples = prometheus.query(evictions).await?;
            samples.into_iter().find(|(labels, _)| {
                labels.get("namespace") == Some(&ns)
                    && labels.get("service").map(String::as_str) == Some("cache")
            })
        },
    )
    .await;
    let evicted = prometheus
        .value(&format!("memcached_items_evicted_total{{{selector}}}"))
        .await;
    println!(
        "MemcachedEvictions expression: {} evictions/s for {:?}; memcached_items_evicted_total {evicted:?}",
        fired.1, fired.0
    );
    // The Degraded alert's expression finds the refused one.
    let degraded = wait_for(
        "the MemcachedDegraded expression to return over-quota",
        Duration::from_secs(60),
        || async {
            let samples = prometheus.query(&expressions["MemcachedDegraded"]).await?;
            samples.into_iter().find(|(labels, _)| {
                labels.get("memcached").map(String::as_str) == Some("over-quota")
            })
        },
    )
    .await;
    println!("MemcachedDegraded expression: {:?}", degraded.0);
    // The autoscaler, reading the members' stats through the policy (the node's traffic is
    // admitted), adds a member for the evictions.
    let scaled = wait_for(
        "Prometheus to see the autoscaler scale out on the evictions",
        Duration::from_secs(90),
        || async {
            prometheus
                .value(&format!(
                    r#"sum(memcached_operator_autoscaling_scales_total{{namespace="{ns}",memcached="cache",direction="out",reason="Evicting"}})"#
                ))
                .await
                .filter(|v| *v >= 1.0)
        },
    )
    .await;
    println!("autoscaler scales out: {scaled}");
    // The hit ratio is of the gets between two of the autoscaler's readings (every 10 s), and
    // the gets above may all precede its first: keep some flowing until Prometheus has it.
    let hit_percent = wait_for(
        "Prometheus to see the autoscaler's hit ratio",
        Duration::from_secs(90),
        || async {
            let mut conn = Connection::connect(address).await.ok()?;
            for _ in 0..10 {
                conn.get("greeting").await.ok()?;
            }
            prometheus
                .value(&format!(
                    r#"memcached_operator_autoscaling_hit_percent{{namespace="{ns}",memcached="cache"}}"#
                ))
                .await
        },
    )
    .await;
    println!("autoscaler's hit ratio: {hit_percent} %");

    // Every name the alerts and the dashboard read exists in what Prometheus scraped.
    let mut missing = Vec::new();
    let names = names_in_use();
    for name in &names {
        let count = prometheus
            .value(&format!(r#"count({{__name__="{name}"}})"#))
            .await;
        if count.is_none_or(|c| c < 1.0) {
            missing.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "names used by the alerts or the dashboard that Prometheus has no series of: {missing:?}"
    );
    println!(
        "all {} metric names used by the alerts and the dashboard exist: {names:?}",
        names.len()
    );
    // With no operator running (uninstalled but its rule kept, or every replica down), the
    // MemcachedOperatorDown expression fires (the alert after its `for`).
    let down = &expressions["MemcachedOperatorDown"];
    let scraped = prometheus.query(down).await;
    assert_eq!(
        scraped,
        Some(vec![]),
        "no MemcachedOperatorDown while it is scraped"
    );
    // Later tests deploy an operator that watches every namespace, with other default images.
    drop(op);
    let stopped = Instant::now();
    let fired = wait_for(
        "the MemcachedOperatorDown expression once no operator runs",
        Duration::from_secs(60),
        || async { prometheus.query(down).await.filter(|s| !s.is_empty()) },
    )
    .await;
    println!(
        "MemcachedOperatorDown expression {:.1} s after the operator stopped: {fired:?}",
        stopped.elapsed().as_secs_f64()
    );
    Api::<Namespace>::all(client.clone())
        .delete(&ns, &Default::default())
        .await
        .unwrap();
}
