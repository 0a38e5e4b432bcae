//! What the proxy costs its clients: operations per second and latency through the proxy's one
//! address against a hashing client straight to the members, same Memcached, same run; and how
//! long a change of members takes to reach the proxies; and the same costs with auth and TLS. A benchmark, not a test:
//! `make bench-proxy` runs it (ignored by `make test`) and writes bench/results/proxy.json.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::proxy::owner;
use memcached_operator_testkit::memcached::Connection;
use serde_json::json;

use crate::data_path::{Client, PASSWORD, USER, VALUE, percentiles};
use crate::harness::{CONVERGE, admin, create, member_pods, set_size, wait_converged, wait_for};
use crate::proxy::{loads, proxied, proxies_of, wait_loaded};
use crate::tls::{Ca, client_config, create_tls_secret};
use crate::{RealNode, create_credentials, operator_with_agent, pod_ip, real_namespace};

/// Connections kept open at once, each with one request in flight (as a web tier's pool).
const CONNECTIONS: usize = 8;
const STEADY: Duration = Duration::from_secs(10);

/// CONNECTIONS clients doing a set then a get of their keys for STEADY, each key sent to
/// `route(key)` of `targets` (one connection per target and client).
async fn steady(targets: Arc<Vec<Client>>, route: fn(&str, usize) -> usize) -> serde_json::Value {
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let targets = targets.clone();
            tokio::spawn(async move {
                let mut conns = Vec::new();
                for target in targets.iter() {
                    conns.push(target.connect().await);
                }
                let mut latencies = Vec::new();
                let end = Instant::now() + STEADY;
                let mut i = 0;
                while Instant::now() < end {
                    let key = format!("bench-{c}-{}", i % 1000);
                    let conn = &mut conns[route(&key, targets.len())];
                    let (set, get) = conn.set_then_get(&key).await;
                    latencies.push(set.as_micros() as u64);
                    latencies.push(get.as_micros() as u64);
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let ops = all.len() as f64 / STEADY.as_secs_f64();
    let (p50, p99) = percentiles(all);
    json!({"ops_per_second": ops.round(), "p50_us": p50, "p99_us": p99})
}

/// Keys put on the members before a change of their number.
const FILLED: usize = 100_000;

/// Sets FILLED keys on `members` (in ordinal order), each where the proxy's layout puts it.
async fn fill(members: &[SocketAddr]) {
    let tasks: Vec<_> = members
        .iter()
        .enumerate()
        .map(|(n, addr)| {
            let (addr, count) = (*addr, members.len());
            tokio::spawn(async move {
                let mut conn = Connection::connect(addr).await.unwrap();
                for i in 0..FILLED {
                    let key = format!("filled-{i}");
                    if owner(key.as_bytes(), count) == n {
                        conn.set(&key, VALUE).await.unwrap();
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Plain-text clients of `addrs`, without a login.
fn plain(addrs: impl IntoIterator<Item = SocketAddr>) -> Vec<Client> {
    addrs
        .into_iter()
        .map(|addr| Client {
            addr,
            host: String::new(),
            tls: None,
            auth: false,
        })
        .collect()
}

/// Memcached `secure` beside `cache`: 3 members and 2 proxies with auth, TLS and the policy
/// that admission then requires (the host admitted by address). Clients of its members (TLS,
/// logged in) and of its proxy's Service, once each proxy reaches every member.
async fn secured(client: &kube::Client, node: &RealNode, ns: &str) -> (Vec<Client>, Client) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let ca = Ca::new("proxy-cost-ca");
    let names = [
        format!("secure.{ns}.svc"),
        format!("*.secure.{ns}.svc"),
        format!("secure-proxy.{ns}.svc"),
    ];
    create_tls_secret(&secrets, "secure-tls", &names, &ca).await;
    create_credentials(&secrets, "secure-auth", USER, PASSWORD).await;
    let host = json!({"ipBlock": {"cidr": format!("{}/32", node.var("REAL_NODE_GATEWAY"))}});
    let mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "secure"},
        "spec": {
            "size": 3, "image": node.var("MEMCACHED_SID_IMAGE"), "proxy": {"enabled": true},
            "auth": {"enabled": true, "secretName": "secure-auth"},
            "tls": {"enabled": true, "secretName": "secure-tls"},
            "networkPolicy": {"enabled": true, "from": [host]},
        },
    }))
    .unwrap();
    create(client, ns, &mc).await;
    wait_converged(client, ns, "secure", 3).await;
    let tls = Some(client_config(&ca.pem, None));
    let members = member_pods(client, ns, "secure")
        .await
        .iter()
        .map(|p| Client {
            addr: SocketAddr::new(pod_ip(p).into(), 11211),
            host: format!("{}.secure.{ns}.svc", p.name_any()),
            tls: tls.clone(),
            auth: true,
        })
        .collect();
    let ready = proxies_of(client, ns, "secure", 2).await;
    let proxy_host = format!("secure-proxy.{ns}.svc");
    wait_for(
        "every secure proxy to reach every member",
        CONVERGE,
        || async {
            for pod in &ready {
                let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
                for _ in 0..8 {
                    let config = tls.clone()?;
                    let mut conn = Connection::connect_tls(addr, &proxy_host, config)
                        .await
                        .ok()?;
                    conn.login(USER, PASSWORD).await.ok()?;
                    for i in 0..30 {
                        conn.set(&format!("probe-{i}"), b"1").await.ok()?;
                    }
                }
            }
            Some(())
        },
    )
    .await;
    let service = Api::<Service>::namespaced(client.clone(), ns)
        .get("secure-proxy")
        .await
        .unwrap();
    let ip: std::net::IpAddr = service.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    let proxy = Client {
        addr: SocketAddr::new(ip, 11211),
        host: proxy_host,
        tls,
        auth: true,
    };
    (members, proxy)
}

/// A client's own hash of `key` over `n` servers (FNV-1a), as a hashing client places keys.
fn hashed(key: &str, n: usize) -> usize {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (hash % n as u64) as usize
}

fn only(_: &str, _: usize) -> usize {
    0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: make bench-proxy"]
async fn what_the_proxy_costs_against_a_hashing_client() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "proxy-cost").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let (pods, proxy) = proxied(&client, &node, &ns, json!({"proxy": {"enabled": true}})).await;

    let members = member_pods(&client, &ns, "cache")
        .await
        .iter()
        .map(|p| SocketAddr::new(pod_ip(p).into(), 11211))
        .collect::<Vec<_>>();
    let direct = steady(Arc::new(plain(members.clone())), hashed).await;
    println!("hashing client, straight to the 3 members: {direct}");
    let through = steady(Arc::new(plain([proxy])), only).await;
    println!("one address, through the proxy:            {through}");
    // With auth and TLS: the members' own TLS and login, against the proxy's agent serving
    // both and the members' agents relaying the proxy (proxy/front.rs).
    let (secure_members, secure_proxy) = secured(&client, &node, &ns).await;
    let direct_secure = steady(Arc::new(secure_members), hashed).await;
    println!("with auth and TLS, hashing client:         {direct_secure}");
    let through_secure = steady(Arc::new(vec![secure_proxy]), only).await;
    println!("with auth and TLS, through the proxy:      {through_secure}");

    // A change of members: from the spec's change to every proxy routing by the new layout.
    // The members first hold FILLED keys where the layout puts them: before each change the
    // operator walks them all, and hands on what 4 -> 3 moves back (within 3 -> 4's window).
    fill(&members).await;
    let mut changes = serde_json::Map::new();
    for (size, what) in [(4, "scale 3 -> 4"), (3, "scale 4 -> 3")] {
        let before = loads(&pods).await;
        let started = Instant::now();
        set_size(&client, &ns, "cache", size).await;
        let took = wait_loaded(&pods, &before, started).await;
        println!("{what}: the new layout loaded by every proxy after {took:?}");
        changes.insert(what.into(), json!(took.as_secs_f64()));
    }
    let report = json!({
        "what": format!(
            "a Memcached of 3 members and 2 proxies on the real node; the client on the host, \
             {CONNECTIONS} connections for {STEADY:?} of set+get ({} B values), through the \
             proxy's Service, then straight to the members (each key to one member by the \
             client's hash); the same for a second such Memcached with auth and TLS (*_tls_auth: \
             TLS and a login per connection, the proxy's agent serving both and the members' \
             agents relaying the proxy); then the seconds from a change of spec.size until every \
             proxy of the first had loaded the new layout (the new member Ready first, when \
             scaling out), its members holding {FILLED} more keys of {} B where the layout puts \
             them, which the operator sweeps before each change",
            VALUE.len(),
            VALUE.len()
        ),
        "memcached_image": node.var("MEMCACHED_SID_IMAGE"),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "results": {
            "hashing_client": direct, "proxy": through,
            "hashing_client_tls_auth": direct_secure, "proxy_tls_auth": through_secure,
        },
        "layout_loaded_seconds": changes,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/proxy.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("written to {}", out.display());
}
