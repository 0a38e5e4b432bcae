//! One address for every client, for real: a plain pymemcache `Client` given only the proxy's
//! Service writes 10,000 keys that spread over the members; a reader keeps reading through
//! scaling out and in (the previous layout serves what misses) and through a member lost,
//! while the proxy's memcached keeps running in the same process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::proxy::owner;
use memcached_operator_testkit::memcached::{Connection, connection_lost};
use memcached_operator_testkit::net::{http_get_from, metric_value};
use serde_json::json;

use crate::harness::{
    CONVERGE, admin, create, member_pods, set_size, wait_converged, wait_degraded_saying, wait_for,
};
use crate::{
    RealNode, operator_with_agent, operator_with_agent_image, pod_ip, pymemcache, real_namespace,
    restart_counts,
};

pub const KEYS: u64 = 10_000;
/// The share of the keys that must read back.
const KEPT: f64 = 0.99;

/// The proxy's pods of Memcached `cache`, once `n` are Ready.
pub async fn proxies(client: &Client, ns: &str, n: usize) -> Vec<Pod> {
    proxies_of(client, ns, "cache", n).await
}

/// The proxy's pods of Memcached `name`, once `n` are Ready.
pub async fn proxies_of(client: &Client, ns: &str, name: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector =
        format!("app.kubernetes.io/name=memcached-proxy,app.kubernetes.io/instance={name}");
    wait_for(&format!("{n} proxies Ready"), CONVERGE, || async {
        let listed = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        let ready: Vec<Pod> = listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && crate::harness::pod_is_ready(p))
            .collect();
        (ready.len() == n).then_some(ready)
    })
    .await
}

/// Waits until writes through each proxy reach every member: a proxy marks a member it could
/// not reach (not Ready yet, so not in the DNS) as down and tries again every second, each
/// proxy, and each of its worker threads (4; connections go to them in turn), on its own.
pub async fn wait_serving(proxies: &[Pod]) {
    wait_for("every proxy to reach every member", CONVERGE, || async {
        for proxy in proxies {
            let addr = SocketAddr::new(pod_ip(proxy).into(), 11211);
            for _ in 0..8 {
                let mut conn = Connection::connect(addr).await.ok()?;
                // Enough keys that each member holds some.
                for i in 0..30 {
                    conn.set(&format!("probe-{i}"), b"1").await.ok()?;
                }
            }
        }
        Some(())
    })
    .await;
}

/// A proxy's `stats` value `name`.
async fn proxy_stat(pod: &Pod, name: &str) -> u64 {
    let mut conn = Connection::connect(SocketAddr::new(pod_ip(pod).into(), 11211))
        .await
        .unwrap();
    conn.stat("", name).await.unwrap().parse().unwrap()
}

/// Each proxy's configuration loads so far.
pub async fn loads(pods: &[Pod]) -> Vec<u64> {
    let mut loads = Vec::new();
    for pod in pods {
        loads.push(proxy_stat(pod, "proxy_config_reloads").await);
    }
    loads
}

/// Waits until every proxy has loaded a configuration since `before`, none failing; how long.
pub async fn wait_loaded(pods: &[Pod], before: &[u64], started: Instant) -> Duration {
    wait_for("every proxy to load the new layout", CONVERGE, || async {
        (loads(pods)
            .await
            .iter()
            .zip(before)
            .all(|(now, was)| now > was))
        .then_some(())
    })
    .await;
    for pod in pods {
        assert_eq!(proxy_stat(pod, "proxy_config_reload_fails").await, 0);
    }
    started.elapsed()
}

/// A plain client given only the proxy's address: writes the keys (unless `write` is false),
/// reads them back; how many were found.
pub async fn through_proxy(ns: &str, ip: &str, write: bool) -> u64 {
    through_proxy_as(ns, ip, write, "value").await
}

/// As `through_proxy`, with the values `<values>-N`: how many read back as such.
async fn through_proxy_as(ns: &str, ip: &str, write: bool, values: &str) -> u64 {
    let host = format!("cache-proxy.{ns}.svc");
    let answer = pymemcache(json!({
        "servers": [format!("{host}:11211")], "addresses": {host: ip}, "keys": KEYS,
        "write": write, "values": values,
    }))
    .await;
    assert!(answer.get("error").is_none(), "{answer}");
    answer["found"].as_u64().unwrap()
}

/// Empties every member, then writes the keys through the proxy: each key is then only where
/// the proxy's layout puts it now.
async fn fresh(client: &Client, ns: &str, ip: &str) {
    let members: Vec<String> = member_pods(client, ns, "cache")
        .await
        .iter()
        .map(|p| format!("{}:11211", pod_ip(p)))
        .collect();
    let flushed = pymemcache(json!({"servers": members, "keys": 0, "flush": true})).await;
    assert!(flushed.get("error").is_none(), "{flushed}");
    assert_eq!(through_proxy(ns, ip, true).await, KEYS);
}

/// A connection to each member of `cache`, by pod name.
pub async fn members(client: &Client, ns: &str) -> BTreeMap<String, Connection> {
    let mut members = BTreeMap::new();
    for pod in member_pods(client, ns, "cache").await {
        let addr = SocketAddr::new(pod_ip(&pod).into(), 11211);
        members.insert(pod.name_any(), Connection::connect(addr).await.unwrap());
    }
    members
}

/// Items each member holds.
pub async fn items(client: &Client, ns: &str) -> BTreeMap<String, u64> {
    let mut held = BTreeMap::new();
    for (name, mut conn) in members(client, ns).await {
        let n = conn.stat("", "curr_items").await.unwrap().parse().unwrap();
        held.insert(name, n);
    }
    held
}

/// Copies of the keys the members hold, over every member.
async fn copies(client: &Client, ns: &str) -> u64 {
    let mut copies = 0;
    for (_, mut conn) in members(client, ns).await {
        for i in 0..KEYS {
            copies += u64::from(conn.get(&format!("app-{i}")).await.unwrap().is_some());
        }
    }
    copies
}

/// What a reader through the proxy saw.
#[derive(Debug, Default)]
pub struct Read {
    pub gets: u64,
    pub hits: u64,
    pub errors: Vec<String>,
    pub slowest: Duration,
    /// Connections that closed and were opened again, the request asked again.
    pub reconnects: u64,
}

/// A request's failure: whether the connection closed (or was reset) rather than answered, and
/// the words.
type Failed = (bool, String);

/// An application reading the keys through the proxy's address, one after the other, until
/// stopped; on an error it reconnects.
pub struct Reader {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Read>,
}

impl Reader {
    /// Reading the values `<values>-N`.
    pub fn start(addr: SocketAddr, values: &'static str) -> Reader {
        Self::reading(addr, values, false)
    }

    /// As `start`, as an application whose client reconnects and asks again when its
    /// connection closes (a proxy replaced closes its clients' connections), and waits up to
    /// 8 s for an answer (the proxy holds a request for a member restarting up to 5 s).
    fn reconnecting(addr: SocketAddr, values: &'static str) -> Reader {
        Self::reading(addr, values, true)
    }

    fn reading(addr: SocketAddr, values: &'static str, reconnects: bool) -> Reader {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let patience = Duration::from_secs(if reconnects { 8 } else { 5 });
        let task = tokio::spawn(async move {
            let mut read = Read::default();
            let mut conn: Option<Connection> = None;
            let mut i = 0;
            while !*stopped.borrow() {
                let started = Instant::now();
                let key = format!("app-{i}");
                let mut got: Result<Option<String>, Failed> = Ok(None);
                for attempt in 0..1 + u32::from(reconnects) {
                    let get = async {
                        if conn.is_none() {
                            conn = Some(Connection::connect(addr).await?.patient(patience));
                        }
                        conn.as_mut().unwrap().get(&key).await
                    };
                    got = match tokio::time::timeout(patience, get).await {
                        Ok(got) => got.map_err(|e| (connection_lost(&e), format!("{e:#}"))),
                        Err(_) => Err((false, format!("no answer within {patience:?}"))),
                    };
                    match &got {
                        Err((true, _)) => {
                            conn = None;
                            read.reconnects += u64::from(attempt == 0 && reconnects);
                        }
                        _ => break,
                    }
                }
                read.slowest = read.slowest.max(started.elapsed());
                read.gets += 1;
                match got {
                    Ok(Some(value)) if value == format!("{values}-{i}") => read.hits += 1,
                    Ok(_) => {}
                    Err((_, e)) => {
                        read.errors.push(e);
                        conn = None;
                    }
                }
                i = (i + 1) % KEYS;
            }
            read
        });
        Reader { stop, task }
    }

    pub async fn finish(self) -> Read {
        self.stop.send_replace(true);
        self.task.await.unwrap()
    }

    /// Stops, and asserts that every read was answered and at least `KEPT` of them were hits.
    async fn assert_served(self, what: &str) {
        let read = self.finish().await;
        println!(
            "a reader through {what}: {} gets, {} hits, {} errors, {} reconnections, slowest {:?}",
            read.gets,
            read.hits,
            read.errors.len(),
            read.reconnects,
            read.slowest
        );
        assert!(read.errors.is_empty(), "{:?}", read.errors);
        assert!(read.hits as f64 >= KEPT * read.gets as f64, "{read:?}");
    }
}

/// Force-deletes member `name` and waits until it is lost (its memcached gone: it serves on
/// through its preStop, the save and the delay, while the new pod may already be Ready) and
/// back (a new pod of that name Ready).
pub async fn force_delete(client: &Client, ns: &str, name: &str) {
    let members: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lost = members.get(name).await.unwrap().uid();
    members
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let old = lost.clone().unwrap();
    wait_for(&format!("{name}'s memcached gone"), CONVERGE, || async {
        crate::Process::in_pod(&old, "memcached")
            .is_empty()
            .then_some(())
    })
    .await;
    wait_for(&format!("{name} back"), CONVERGE, || async {
        let pod = members.get_opt(name).await.ok()??;
        (pod.uid() != lost && crate::harness::pod_is_ready(&pod)).then_some(())
    })
    .await;
}

/// The proxies' memcached: pid and container restarts, by pod.
fn processes(pods: &[Pod]) -> BTreeMap<String, (u32, i32)> {
    pods.iter()
        .map(|p| {
            let pid =
                crate::Process::in_pod(p.metadata.uid.as_deref().unwrap(), "memcached")[0].pid;
            (p.name_any(), (pid, restart_counts(p)["proxy"]))
        })
        .collect()
}

/// Scales to `size` and waits for the members, for every proxy to load the layout and to reach
/// every member in it (a member that just joined is reached once the cluster's DNS answers for
/// its name); prints and returns the keys then found through the proxy.
async fn scale(client: &Client, ns: &str, ip: &str, pods: &[Pod], size: i32, what: &str) -> u64 {
    scale_reading(client, ns, ip, pods, (size, "value"), what).await
}

/// As `scale`, reading back the values `<values>-N`.
async fn scale_reading(
    client: &Client,
    ns: &str,
    ip: &str,
    pods: &[Pod],
    (size, values): (i32, &str),
    what: &str,
) -> u64 {
    let before = loads(pods).await;
    let started = Instant::now();
    set_size(client, ns, "cache", size).await;
    let loaded = wait_loaded(pods, &before, started).await;
    wait_serving(pods).await;
    let serving = started.elapsed();
    let found = through_proxy_as(ns, ip, false, values).await;
    println!(
        "{what}: the layout loaded by every proxy after {:.1} s, every member reached through each after {:.1} s; {found} of {KEYS} keys found through the proxy",
        loaded.as_secs_f64(),
        serving.as_secs_f64()
    );
    found
}

/// Memcached `cache` of 3 members of sid's memcached behind 2 proxies (`spec` has its
/// spec.proxy, and whatever else it sets), serving; the proxies' pods and the proxy's Service
/// address.
pub async fn proxied(
    client: &Client,
    node: &RealNode,
    ns: &str,
    spec: serde_json::Value,
) -> (Vec<Pod>, SocketAddr) {
    let mut mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {"size": 3, "image": node.var("MEMCACHED_SID_IMAGE")},
    }))
    .unwrap();
    let mut merged = serde_json::to_value(&mc.spec).unwrap();
    merged
        .as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    mc.spec = serde_json::from_value(merged).unwrap();
    create(client, ns, &mc).await;
    wait_converged(client, ns, "cache", 3).await;
    let pods = proxies(client, ns, 2).await;
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get("cache-proxy")
        .await
        .unwrap();
    let ip = service.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    let addr = SocketAddr::new(ip, 11211);
    wait_serving(&pods).await;
    (pods, addr)
}

#[tokio::test]
async fn one_address_serves_every_key_through_scaling_and_a_member_lost() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "proxy").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    // With monitoring, so that each proxy's agent serves the proxy's own view.
    let spec = json!({"proxy": {"enabled": true, "handoverSeconds": 300},
                      "monitoring": {"enabled": true}});
    let (pods, addr) = proxied(&client, &node, &ns, spec).await;
    let ip = addr.ip().to_string();
    let member = |n: u32| format!("cache-{n}.cache.{ns}.svc:11211");
    for pod in &pods {
        let view = proxy_metrics(pod).await;
        assert_eq!(
            metric_value(&view, "memcached_proxy_up"),
            Some(1.0),
            "{view}"
        );
        assert_eq!(
            metric_value(&view, "memcached_proxy_layout_members"),
            Some(3.0)
        );
        for n in 0..3 {
            assert_eq!(
                metric_value(&view, &backend_up(&member(n))),
                Some(1.0),
                "{view}"
            );
        }
    }

    // A plain client, one address: every key reads back, spread over the members.
    let found = through_proxy(&ns, &ip, true).await;
    let held = items(&client, &ns).await;
    println!("written through the proxy: {found} of {KEYS} found; held by member: {held:?}");
    assert!(found as f64 >= KEPT * KEYS as f64, "{found}");
    for (member, n) in &held {
        let share = *n as f64 / KEYS as f64;
        assert!((0.20..=0.45).contains(&share), "{member} holds {n}");
    }
    // Each on the member the operator computes for it (what its sweep relies on).
    let mut members = members(&client, &ns).await;
    let mut placed = 0;
    for i in 0..KEYS {
        let key = format!("app-{i}");
        let at = members.get_mut(&format!("cache-{}", owner(key.as_bytes(), 3)));
        placed += u64::from(at.unwrap().get(&key).await.unwrap().is_some());
    }
    assert_eq!(
        placed, KEYS,
        "memcached's proxy and the operator place keys alike"
    );
    let running = processes(&pods);

    // Scaled out, then in, with a reader all the while: the previous layout serves what misses.
    let reader = Reader::start(addr, "value");
    let out = scale(
        &client,
        &ns,
        &ip,
        &pods,
        4,
        "scale 3 -> 4 with the handover",
    )
    .await;
    assert!(out as f64 >= KEPT * KEYS as f64, "{out}");
    reader.assert_served("3 -> 4").await;
    // Every key written again on the layout of 4: the members of 3 still hold the old values
    // of the keys that moved to cache-3, and the scale-in routes those keys back to them. The
    // sweep before it leaves each key on one member only, with its newest value.
    assert_eq!(through_proxy_as(&ns, &ip, true, "rewritten").await, KEYS);
    let reader = Reader::start(addr, "rewritten");
    let back = scale_reading(
        &client,
        &ns,
        &ip,
        &pods,
        (3, "rewritten"),
        "scale 4 -> 3 with the handover, every key rewritten",
    )
    .await;
    assert!(back as f64 >= KEPT * KEYS as f64, "{back}");
    let held = items(&client, &ns).await;
    println!("after the scale-in: held by member {held:?}");
    assert_eq!(copies(&client, &ns).await, KEYS, "one copy of each key");
    assert!(
        member_pods(&client, &ns, "cache")
            .await
            .iter()
            .any(|p| p.name_any() == "cache-3"),
        "cache-3 drains until the handover ends"
    );
    reader.assert_served("4 -> 3").await;
    let pods = proxies(&client, &ns, 2).await;
    assert_eq!(
        processes(&pods),
        running,
        "the same memcached in each proxy, never restarted"
    );

    // Wanted again while it drains: cache-3 rejoins emptied, so the values set meanwhile on the
    // layout without it read back, not the ones it held.
    assert_eq!(through_proxy_as(&ns, &ip, true, "again").await, KEYS);
    let rejoined = scale_reading(
        &client,
        &ns,
        &ip,
        &pods,
        (4, "again"),
        "scale 3 -> 4 while cache-3 drains",
    )
    .await;
    assert!(rejoined as f64 >= KEPT * KEYS as f64, "{rejoined}");
    let held = items(&client, &ns).await;
    println!("rejoined: held by member {held:?}");
    let again = scale_reading(
        &client,
        &ns,
        &ip,
        &pods,
        (3, "again"),
        "scale 4 -> 3 again with the handover",
    )
    .await;
    assert!(again as f64 >= KEPT * KEYS as f64, "{again}");
    // The keys as the readers below expect them.
    fresh(&client, &ns, &ip).await;

    // A member lost (force-deleted): its keys fail fast, and it comes back into the layout.
    // The proxies' metrics show it counted bad meanwhile.
    let reader = Reader::start(addr, "value");
    let watch = BackendWatch::start(&pods, &member(1));
    force_delete(&client, &ns, "cache-1").await;
    // The proxy resolves cache-1's name again once the cluster's DNS (and its cache) answers.
    let ready = Instant::now();
    wait_serving(&pods).await;
    let read = reader.finish().await;
    println!(
        "a reader through cache-1 force-deleted: {} gets, {} hits, {} errors, slowest {:?}; cache-1 served through the proxy {:.1} s after it was Ready",
        read.gets,
        read.hits,
        read.errors.len(),
        read.slowest,
        ready.elapsed().as_secs_f64()
    );
    assert!(read.slowest < Duration::from_secs(1), "{read:?}");
    let (down_after, down_in) = watch.finish().await;
    println!(
        "cache-1 counted bad in the metrics of {down_in} of 2 proxies, {:.1} s after its deletion",
        down_after.as_secs_f64()
    );
    assert!(
        down_in >= 1,
        "a proxy that failed cache-1's requests says so"
    );
    assert_eq!(
        through_proxy(&ns, &ip, true).await,
        KEYS,
        "cache-1 back in the layout"
    );
    for pod in &pods {
        let view = proxy_metrics(pod).await;
        assert_eq!(
            metric_value(&view, &backend_up(&member(1))),
            Some(1.0),
            "cache-1 up again for {}: {view}",
            pod.name_any()
        );
    }
    let held = items(&client, &ns).await;
    assert!(held["cache-1"] > 0, "{held:?}");

    // Without a handover, the same scaling loses what the jump hash moves.
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"proxy": {"handoverSeconds": 0}}})),
        )
        .await
        .unwrap();
    wait_converged(&client, &ns, "cache", 3).await;
    fresh(&client, &ns, &ip).await;
    let without = scale(
        &client,
        &ns,
        &ip,
        &pods,
        4,
        "scale 3 -> 4 without a handover",
    )
    .await;
    assert!(
        without < out,
        "the handover is what keeps them: {without} against {out}"
    );
    wait_converged(&client, &ns, "cache", 4).await;
    fresh(&client, &ns, &ip).await;
    let without = scale(
        &client,
        &ns,
        &ip,
        &pods,
        3,
        "scale 4 -> 3 without a handover",
    )
    .await;
    assert!(
        without < back,
        "the handover is what keeps them: {without} against {back}"
    );
    let pods = proxies(&client, &ns, 2).await;
    assert_eq!(
        processes(&pods),
        running,
        "still the same memcached in each proxy"
    );
    for pod in &pods {
        let view = proxy_metrics(pod).await;
        let loaded = metric_value(&view, "memcached_proxy_config_reloads_total");
        println!("{}: configurations loaded {loaded:?}", pod.name_any());
        assert!(loaded >= Some(4.0), "every change loaded: {view}");
        assert_eq!(
            metric_value(&view, "memcached_proxy_config_reload_failures_total"),
            Some(0.0)
        );
        assert_eq!(
            metric_value(&view, "memcached_proxy_layout_refused"),
            Some(0.0)
        );
        assert_eq!(
            metric_value(&view, "memcached_proxy_layout_load_failed"),
            Some(0.0)
        );
    }
}

/// A proxy's metrics, as its agent serves them.
async fn proxy_metrics(pod: &Pod) -> String {
    let addr = SocketAddr::new(pod_ip(pod).into(), 9150);
    match http_get_from(addr, "/metrics").await {
        Some((200, body)) => body,
        other => panic!("{}'s metrics: {other:?}", pod.name_any()),
    }
}

fn backend_up(backend: &str) -> String {
    format!(r#"memcached_proxy_backend_up{{backend="{backend}"}}"#)
}

/// Reads every proxy's metrics until finished: which of them counted `backend` bad, and when
/// the first did.
struct BackendWatch {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(Option<Duration>, usize)>,
}

impl BackendWatch {
    fn start(pods: &[Pod], backend: &str) -> BackendWatch {
        let addrs: Vec<SocketAddr> = pods
            .iter()
            .map(|p| SocketAddr::new(pod_ip(p).into(), 9150))
            .collect();
        let series = backend_up(backend);
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut first = None;
            let mut down = std::collections::BTreeSet::new();
            while !*stopped.borrow() {
                for addr in &addrs {
                    if let Some((200, body)) = http_get_from(*addr, "/metrics").await
                        && metric_value(&body, &series) == Some(0.0)
                    {
                        first.get_or_insert(started.elapsed());
                        down.insert(*addr);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stopped.changed() => {}
                }
            }
            (first, down.len())
        });
        BackendWatch { stop, task }
    }

    async fn finish(self) -> (Duration, usize) {
        self.stop.send(true).unwrap();
        let (first, down) = self.task.await.unwrap();
        (first.unwrap_or_default(), down)
    }
}

/// Each image in `pods`' container `container`, by pod name.
fn images(pods: &[Pod], container: &str) -> BTreeMap<String, String> {
    pods.iter()
        .map(|p| {
            let spec = p.spec.as_ref().unwrap();
            let c = spec
                .containers
                .iter()
                .find(|c| c.name == container)
                .unwrap();
            (p.name_any(), c.image.clone().unwrap_or_default())
        })
        .collect()
}

/// Waits until the members (the same pods as `before`, by UID) and 2 Ready proxies run
/// `image` in their containers `member` and `proxy`, each member's `member` container has
/// restarted since `before`'s count, and the proxies no longer hold requests (the members'
/// update is over); the members' restarts, by container.
async fn wait_rolled(
    client: &Client,
    ns: &str,
    before: &BTreeMap<String, (String, i32)>,
    (member, proxy, image): (&str, &str, &str),
) -> Vec<BTreeMap<String, i32>> {
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let updated =
        |pods: &[Pod], container: &str| images(pods, container).values().all(|i| i == image);
    wait_for(
        &format!("members and proxies on {image}"),
        4 * CONVERGE,
        || async {
            let members = member_pods(client, ns, "cache").await;
            let restarted = members.len() == before.len()
                && members.iter().all(|p| {
                    before.get(&p.name_any()).is_some_and(|(uid, restarts)| {
                        p.uid().as_ref() == Some(uid) && restart_counts(p)[member] > *restarts
                    })
                });
            let proxies = proxies(client, ns, 2).await;
            let status = mcs.get("cache").await.ok()?.status?;
            let holding = status.proxy?.holding_since.is_some();
            (restarted
                && updated(&members, member)
                && members.iter().all(crate::harness::pod_is_ready)
                && updated(&proxies, proxy)
                && !holding)
                .then(|| members.iter().map(restart_counts).collect())
        },
    )
    .await
}

/// Each member's pod UID and its container `container`'s restarts, by name.
async fn member_restarts(
    client: &Client,
    ns: &str,
    container: &str,
) -> BTreeMap<String, (String, i32)> {
    member_pods(client, ns, "cache")
        .await
        .iter()
        .map(|p| {
            (
                p.name_any(),
                (p.uid().unwrap(), restart_counts(p)[container]),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_image_change_and_an_operator_upgrade_answer_every_read_through_the_proxy() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "proxy-update").await;
    let mut op = operator_with_agent(&client, &node, &ns).await;
    let (_, addr) = proxied(&client, &node, &ns, json!({"proxy": {"enabled": true}})).await;
    let ip = addr.ip().to_string();
    assert_eq!(through_proxy(&ns, &ip, true).await, KEYS);
    let before = member_restarts(&client, &ns, "memcached").await;

    // The same memcached under a second name: each member restarts in its pod, keeping its
    // items, while the proxies hold the requests it cannot answer; the proxies are replaced.
    let image = format!("{}-proxied", node.var("MEMCACHED_SID_IMAGE"));
    node.ctr(&[
        "images",
        "tag",
        "--force",
        node.var("MEMCACHED_SID_IMAGE"),
        &image,
    ]);
    let reader = Reader::reconnecting(addr, "value");
    let started = Instant::now();
    let patch = json!({"spec": {"image": image}});
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let restarts = wait_rolled(&client, &ns, &before, ("memcached", "proxy", &image)).await;
    println!(
        "image change: members restarted in place and proxies replaced in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(restarts.iter().all(|r| r["memcached"] == 1), "{restarts:?}");
    reader.assert_served("an image change").await;
    let found = through_proxy(&ns, &ip, false).await;
    println!("after the image change: {found} of {KEYS} keys found through the proxy");
    assert!(found as f64 >= KEPT * KEYS as f64, "{found}");

    // An operator upgrade, for the operands: a new agent image beside every memcached. The
    // members' agents restart in their pods, memcached does not; the proxies are replaced.
    op.stop("TERM").await;
    let before = member_restarts(&client, &ns, "agent").await;
    let agent = format!("{}-upgraded", node.operator_image());
    node.ctr(&["images", "tag", "--force", &node.operator_image(), &agent]);
    let reader = Reader::reconnecting(addr, "value");
    let started = Instant::now();
    let _op = operator_with_agent_image(&client, &node, &ns, agent.clone()).await;
    let after = wait_rolled(&client, &ns, &before, ("agent", "route-agent", &agent)).await;
    println!(
        "operator upgrade: agents restarted in place and proxies replaced in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        after.iter().map(|r| r["memcached"]).collect::<Vec<_>>(),
        restarts.iter().map(|r| r["memcached"]).collect::<Vec<_>>(),
        "memcached kept running"
    );
    reader.assert_served("an operator upgrade").await;
    assert!(through_proxy(&ns, &ip, false).await as f64 >= KEPT * KEYS as f64);
}

#[tokio::test]
async fn an_image_without_the_proxy_is_refused_in_memcacheds_words() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "proxy-image").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    // Debian bookworm's memcached (1.6.18, built without the proxy) under a tag that names no
    // version: only running it tells.
    let custom = "localhost/memcached:custom";
    node.ctr(&["images", "tag", "--force", node.memcached_image(), custom]);
    let mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {"size": 1, "image": node.var("MEMCACHED_SID_IMAGE"),
                 "proxy": {"enabled": true, "replicas": 1, "image": custom}},
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let message = wait_degraded_saying(&mcs, "cache", "InvalidSpec", custom, CONVERGE).await;
    println!("a proxy image without the proxy: {message}");
    assert!(
        message.starts_with(&format!(
            "spec.proxy.image: {custom} cannot run memcached's proxy (memcached says: Illegal suboption"
        )),
        "{message}"
    );
    // The members serve meanwhile; an image with the proxy is applied at once.
    assert_eq!(member_pods(&client, &ns, "cache").await.len(), 1);
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"proxy": {"image": node.var("MEMCACHED_SID_IMAGE")}}})),
    )
    .await
    .unwrap();
    wait_converged(&client, &ns, "cache", 1).await;
    let pods = proxies(&client, &ns, 1).await;
    wait_serving(&pods).await;
}
