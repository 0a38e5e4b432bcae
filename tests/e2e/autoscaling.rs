//! Autoscaling on the fake nodes, from scripted `stats`: kwok gives the pods of a node whose
//! podCIDR is on the loopback network addresses this host answers on, so a scripted member
//! listens where the operator reads the real one (`<pod IP>:<port>`). The bounds, one step at a
//! time, the scale-in window, and a `kubectl scale` put back while autoscaling is on.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::{AutoscalingSpec, Memcached};
use memcached_operator_testkit::kwok::{loopback_node, on_loopback_node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::harness::{
    Operator, OperatorOptions, admin, create, events_with_reason, memcached, namespace, set_size,
    wait_converged, wait_for,
};

const NODE: &str = "kwok-loopback";
const MAX_MEMORY_MIB: u64 = 32;

/// What every scripted member says: evicting (at 100 items/s, 95 % full) or calm (10 % full).
#[derive(Clone, Default)]
struct Script(Arc<Mutex<bool>>);

impl Script {
    fn evict(&self, on: bool) {
        *self.0.lock().unwrap() = on;
    }

    fn evicting(&self) -> bool {
        *self.0.lock().unwrap()
    }
}

/// One scripted member: memcached's `stats` with counters that grow with time.
async fn serve_member(listener: TcpListener, script: Script) {
    let started = Instant::now();
    let mut evictions = 0u64;
    let mut last = Instant::now();
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0u8; 7];
        if stream.read_exact(&mut request).await.is_err() || &request != b"stats\r\n" {
            continue;
        }
        let evicting = script.evicting();
        if evicting {
            evictions += (last.elapsed().as_secs_f64() * 100.0) as u64;
        }
        last = Instant::now();
        let limit = MAX_MEMORY_MIB * 1024 * 1024;
        let bytes = (limit * if evicting { 95 } else { 10 }).div_ceil(100);
        let answer = format!(
            "STAT uptime {}\r\nSTAT curr_connections 10\r\nSTAT max_connections 1024\r\n\
             STAT get_hits 0\r\nSTAT get_misses 0\r\nSTAT bytes {bytes}\r\n\
             STAT limit_maxbytes {limit}\r\nSTAT evictions {evictions}\r\nEND\r\n",
            started.elapsed().as_secs() + 1000
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }
}

/// Starts a scripted member on each pod's address as pods get one, for as long as the test runs.
fn scripted_members(pods: Api<Pod>, script: Script) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut serving: HashMap<String, IpAddr> = HashMap::new();
        loop {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
                .await;
            for pod in list.map(|l| l.items).unwrap_or_default() {
                let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
                let Some(ip) = ip.and_then(|ip| ip.parse::<IpAddr>().ok()) else {
                    continue;
                };
                if serving.get(&pod.name_any()) == Some(&ip) {
                    continue;
                }
                if let Ok(listener) = TcpListener::bind((ip, 11211)).await {
                    tokio::spawn(serve_member(listener, script.clone()));
                    serving.insert(pod.name_any(), ip);
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Records every spec.size the Memcached has, in order.
fn sizes_seen(mcs: Api<Memcached>) -> (Arc<Mutex<Vec<i32>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            if let Ok(mc) = mcs.get("cache").await {
                let mut seen = record.lock().unwrap();
                if seen.last() != Some(&mc.spec.size) {
                    seen.push(mc.spec.size);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (seen, task)
}

/// The events of `reason` regarding Memcached `cache`, after checking that no operator recorded
/// it more than once: operators of the suite's other tests, watching every namespace, may run
/// meanwhile and record their own.
async fn events_once_each(client: &kube::Client, ns: &str, reason: &str) -> Vec<Event> {
    let events: Vec<Event> = events_with_reason(client, ns, "cache", reason).await;
    let reporters: BTreeSet<_> = events
        .iter()
        .map(|e| e.reporting_instance.clone())
        .collect();
    assert_eq!(
        reporters.len(),
        events.len(),
        "one {reason} per operator: {events:#?}"
    );
    events
}

fn autoscaled(mc: &Memcached) -> Option<(Option<i32>, String)> {
    let a = mc.status.as_ref()?.autoscaling.as_ref()?;
    Some((a.size, a.reason.clone()))
}

#[tokio::test]
async fn the_operator_scales_out_on_evictions_one_step_at_a_time_and_back_in_after_the_window() {
    let client = admin().await;
    loopback_node(&client, NODE, "127.77.0.0/24", 200)
        .await
        .unwrap();
    let ns = namespace(&client, "autoscaling").await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let script = Script::default();
    let members = scripted_members(Api::namespaced(client.clone(), &ns), script.clone());

    let mut mc = memcached("cache", 1);
    mc.spec.max_memory_mib = MAX_MEMORY_MIB as i32;
    let placed = on_loopback_node(NODE);
    mc.spec.node_selector = serde_json::from_value(placed["nodeSelector"].clone()).unwrap();
    mc.spec.tolerations = serde_json::from_value(placed["tolerations"].clone()).unwrap();
    mc.spec.autoscaling = Some(AutoscalingSpec {
        enabled: true,
        min_size: 1,
        max_size: 3,
        scale_out_stabilization_seconds: 0,
        scale_in_stabilization_seconds: 20,
        ..AutoscalingSpec::default()
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 1).await;
    let (sizes, recorder) = sizes_seen(mcs.clone());

    // Evicting with a full memory: one member more per decision, up to maxSize and no further.
    script.evict(true);
    let status = wait_for(
        "scaled out to maxSize",
        Duration::from_secs(120),
        || async {
            let mc = mcs.get("cache").await.ok()?;
            (autoscaled(&mc)? == (Some(3), "AtMaxSize".to_string())).then_some(mc)
        },
    )
    .await;
    assert_eq!(*sizes.lock().unwrap(), [1, 2, 3], "one step at a time");
    let a = status.status.unwrap().autoscaling.unwrap();
    assert!(a.message.contains("raise maxSize"), "{}", a.message);
    let signals = a.signals.unwrap();
    assert_eq!((signals.members_answering, signals.memory_percent), (3, 95));
    assert!(signals.evictions_per_second >= 100, "{signals:?}");
    let last = a.last_scale.unwrap();
    assert_eq!(
        (last.from, last.to, last.reason.as_str()),
        (2, 3, "Evicting")
    );
    let metrics = op.metrics_text().await;
    let scales = format!(
        r#"memcached_operator_autoscaling_scales_total{{direction="out",memcached="cache",namespace="{ns}",reason="Evicting"}}"#
    );
    let decision = format!(
        r#"memcached_operator_autoscaling_decision{{memcached="cache",namespace="{ns}",reason="AtMaxSize"}} 1"#
    );
    // Other operators of the suite may have made one of the two scales: this one made one at least.
    assert!(
        metrics.contains(&scales),
        "{scales} missing from:\n{metrics}"
    );
    assert!(
        metrics.contains(&decision),
        "{decision} missing from:\n{metrics}"
    );
    wait_converged(&client, &ns, "cache", 3).await;

    // A size set by hand is put back, with a Warning that says how to size by hand, before
    // the members follow it: no member goes.
    let uids = |pods: Vec<Pod>| -> Vec<String> { pods.iter().filter_map(|p| p.uid()).collect() };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = ListParams::default().labels("app.kubernetes.io/instance=cache");
    let before = uids(pods.list(&selector).await.unwrap().items);
    set_size(&client, &ns, "cache", 1).await;
    wait_for("the size put back", Duration::from_secs(30), || async {
        (mcs.get("cache").await.ok()?.spec.size == 3).then_some(())
    })
    .await;
    // Events are posted beside the write, not before it: the put-back can be seen first.
    wait_for(
        "a Warning that the size was put back",
        Duration::from_secs(30),
        || async {
            let warned = events_with_reason(&client, &ns, "cache", "ManualScaleReverted").await;
            (!warned.is_empty()).then_some(())
        },
    )
    .await;
    let reverted = events_once_each(&client, &ns, "ManualScaleReverted").await;
    for event in &reverted {
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let note = event.note.as_deref().unwrap_or_default();
        assert!(
            note.contains("set to 1") && note.contains("put back to 3"),
            "{note}"
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(uids(pods.list(&selector).await.unwrap().items), before);

    // Calm, with the items fitting one member fewer: one member less after each 20 s window,
    // down to minSize.
    script.evict(false);
    let calm = Instant::now();
    wait_for("scaled in to minSize", Duration::from_secs(150), || async {
        (mcs.get("cache").await.ok()?.spec.size == 1).then_some(())
    })
    .await;
    assert!(
        calm.elapsed() >= Duration::from_secs(40),
        "two windows of 20 s"
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    recorder.abort();
    members.abort();
    let seen: Vec<i32> = sizes.lock().unwrap().clone();
    // The hand-set 1 shows between 3 and its put-back 3 if the recorder read it in between.
    assert!(
        seen == [1, 2, 3, 2, 1] || seen == [1, 2, 3, 1, 3, 2, 1],
        "never below minSize, one step at a time: {seen:?}"
    );
    // Each scale an event (of whichever operator of the suite made it).
    let scales: BTreeSet<String> = events_with_reason(&client, &ns, "cache", "Autoscaled")
        .await
        .into_iter()
        .filter_map(|e| Some(e.note?.split(" (").next()?.to_string()))
        .collect();
    let expected = [
        "scaling 1 → 2",
        "scaling 2 → 3",
        "scaling 3 → 2",
        "scaling 2 → 1",
    ];
    assert_eq!(scales, BTreeSet::from(expected.map(String::from)));
}

fn degraded(mc: &Memcached) -> Option<(String, String)> {
    super::harness::condition(mc, "Degraded")
}

#[tokio::test]
async fn a_horizontal_pod_autoscaler_of_the_same_memcached_stops_the_operators_own() {
    let client = admin().await;
    let ns = namespace(&client, "autoscaling-hpa").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mut mc = memcached("cache", 2);
    mc.spec.autoscaling = Some(AutoscalingSpec {
        enabled: true,
        min_size: 1,
        max_size: 3,
        ..AutoscalingSpec::default()
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;
    // Its members do not answer (fake nodes): the autoscaler holds, and keeps the size.
    wait_for(
        "the autoscaler to hold",
        Duration::from_secs(30),
        || async {
            let (size, reason) = autoscaled(&mcs.get("cache").await.ok()?)?;
            (size == Some(2) && reason == "MembersNotAnswering").then_some(())
        },
    )
    .await;

    let hpa: HorizontalPodAutoscaler = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cache-cpu", "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "cache"},
            "minReplicas": 1, "maxReplicas": 5,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }))
    .unwrap();
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    hpas.create(&PostParams::default(), &hpa).await.unwrap();
    let message = wait_for("Degraded for the HPA", Duration::from_secs(30), || async {
        let mc = mcs.get("cache").await.ok()?;
        let (status, reason) = degraded(&mc)?;
        let a = mc.status?.autoscaling?;
        (status == "True" && reason == "AutoscalerConflict" && a.reason == "AutoscalerConflict")
            .then_some(a.message)
    })
    .await;
    assert!(
        message.contains("HorizontalPodAutoscaler cache-cpu"),
        "{message}"
    );
    let warned = events_once_each(&client, &ns, "AutoscalerConflict").await;
    assert!(
        !warned.is_empty(),
        "a Warning that the HPA stops the autoscaler"
    );

    // The size is the HPA's (or anyone's) now: one set by hand stays.
    set_size(&client, &ns, "cache", 3).await;
    wait_converged(&client, &ns, "cache", 3).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(mcs.get("cache").await.unwrap().spec.size, 3, "not put back");

    // The HPA goes: the operator decides again, from the size it finds.
    hpas.delete("cache-cpu", &Default::default()).await.unwrap();
    wait_for("Degraded no more", Duration::from_secs(30), || async {
        let mc = mcs.get("cache").await.ok()?;
        let (status, _) = degraded(&mc)?;
        let (size, reason) = autoscaled(&mc)?;
        (status == "False" && size == Some(3) && reason != "AutoscalerConflict").then_some(())
    })
    .await;
    assert_eq!(mcs.get("cache").await.unwrap().spec.size, 3);
}
