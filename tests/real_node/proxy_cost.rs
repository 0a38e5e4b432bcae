//! What the proxy costs its clients: operations per second and latency through the proxy's one
//! address against a hashing client straight to the members, same Memcached, same run; and how
//! long a change of members takes to reach the proxies. A benchmark, not a test:
//! `make bench-proxy` runs it (ignored by `make test`) and writes bench/results/proxy.json.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memcached_operator_testkit::memcached::Connection;
use serde_json::json;

use crate::data_path::percentiles;
use crate::harness::{admin, member_pods, set_size};
use crate::proxy::{loads, proxied, wait_loaded};
use crate::{RealNode, operator_with_agent, pod_ip, real_namespace};

/// Connections kept open at once, each with one request in flight (as a web tier's pool).
const CONNECTIONS: usize = 8;
const STEADY: Duration = Duration::from_secs(10);
/// A typical cached value: a small serialized object.
const VALUE: &[u8] = &[b'x'; 200];

/// CONNECTIONS clients doing a set then a get of their keys for STEADY, each key sent to
/// `route(key)` of `targets` (one connection per target and client).
async fn steady(
    targets: Arc<Vec<SocketAddr>>,
    route: fn(&str, usize) -> usize,
) -> serde_json::Value {
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let targets = targets.clone();
            tokio::spawn(async move {
                let mut conns = Vec::new();
                for addr in targets.iter() {
                    conns.push(Connection::connect(*addr).await.unwrap());
                }
                let mut latencies = Vec::new();
                let end = Instant::now() + STEADY;
                let mut i = 0;
                while Instant::now() < end {
                    let key = format!("bench-{c}-{}", i % 1000);
                    let conn = &mut conns[route(&key, targets.len())];
                    let start = Instant::now();
                    conn.set(&key, VALUE).await.unwrap();
                    latencies.push(start.elapsed().as_micros() as u64);
                    let start = Instant::now();
                    assert!(conn.get(&key).await.unwrap().is_some(), "{key} read back");
                    latencies.push(start.elapsed().as_micros() as u64);
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

    let members: Vec<SocketAddr> = member_pods(&client, &ns, "cache")
        .await
        .iter()
        .map(|p| SocketAddr::new(pod_ip(p).into(), 11211))
        .collect();
    let direct = steady(Arc::new(members), hashed).await;
    println!("hashing client, straight to the 3 members: {direct}");
    let through = steady(Arc::new(vec![proxy]), only).await;
    println!("one address, through the proxy:            {through}");

    // A change of members: from the spec's change to every proxy routing by the new layout.
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
             client's hash); then the seconds from a change of spec.size until every proxy had \
             loaded the new layout (the new member Ready first, when scaling out)",
            VALUE.len()
        ),
        "memcached_image": node.var("MEMCACHED_SID_IMAGE"),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "results": {"hashing_client": direct, "proxy": through},
        "layout_loaded_seconds": changes,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/results/proxy.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    println!("written to {}", out.display());
}
