//! The autoscaler's own cost (issue 37): Memcacheds of three members with spec.autoscaling on,
//! every member a scripted `stats` responder in this process. As tests/e2e/autoscaling.rs does,
//! a kwok node whose podCIDR is on loopback gives the pods addresses this host answers on, so a
//! responder listens where the operator reads the member (`<pod IP>:11211`). The responders say
//! the same plausible thing every time (no evictions, 40 % full, 90 % hits), so the autoscaler
//! holds at Steady and its status stops changing. Then the operator's CPU over a steady window
//! with autoscaling on, and over the same window with it off on every one of them.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use memcached_operator::api::{Memcached, MemcachedSpec};
use memcached_operator_testkit::OperatorProcess;
use memcached_operator_testkit::kwok::{loopback_node, on_loopback_node};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::cluster::Cluster;
use crate::{Args, audit, cpu_since, is_available, procs, top_cpu, wait_count};

const NODE: &str = "kwok-loopback";
/// Room for 510 pods, away from the e2e suite's 127.77.0.0/24.
const POD_CIDR: &str = "127.78.0.0/23";
pub const MEMBERS: i32 = 3;
const MAX_MEMORY_MIB: u64 = 32;
/// memcached's port, the operator's default containerPort.
const PORT: u16 = 11211;

/// Creates `--crs` autoscaled Memcacheds over `namespaces`, waits until every one is converged
/// and Steady, and measures `--idle-seconds` with autoscaling on, then as long with it off.
pub async fn run(
    args: &Args,
    client: &Client,
    cluster: &Cluster,
    op: &OperatorProcess,
    memcacheds: &Store<Memcached>,
    namespaces: &[String],
) -> Result<Value> {
    let (crs, window) = (args.crs, Duration::from_secs(args.idle_seconds));
    let timeout = Duration::from_secs(args.timeout_seconds);
    loopback_node(client, NODE, POD_CIDR, 1000).await?;
    let answered = Arc::new(AtomicU64::new(0));
    let responders = tokio::spawn(respond_on_node(client.clone(), answered.clone()));
    let names: Vec<(String, String)> = (0..crs)
        .map(|i| {
            (
                namespaces[i % namespaces.len()].clone(),
                format!("auto-{i:03}"),
            )
        })
        .collect();
    let ours = |m: &Memcached| {
        m.metadata
            .name
            .as_ref()
            .is_some_and(|n| n.starts_with("auto-"))
    };

    let t_audit = audit::now();
    let started = Instant::now();
    stream::iter(names.iter())
        .map(|(ns, name)| create(client, ns, name))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    wait_count(
        memcacheds,
        "autoscaled Memcacheds Available and Steady",
        crs,
        timeout,
        |m| ours(m) && steady(m),
    )
    .await?;
    let steady_after = started.elapsed();
    let setup = cluster.audit_counts(t_audit, audit::now())?;
    // One more round for every Memcached: its status stays as it is.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let on = measure(cluster, op, &answered, window).await?;
    let holding = memcacheds
        .state()
        .iter()
        .filter(|m| ours(m) && steady(m))
        .count();
    // What the autoscaler reported, from one of them.
    let sample = memcacheds
        .state()
        .iter()
        .find(|m| ours(m))
        .and_then(|m| m.status.as_ref()?.autoscaling.clone());

    let off_started = Instant::now();
    stream::iter(names.iter())
        .map(|(ns, name)| disable(client, ns, name))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    wait_count(
        memcacheds,
        "Memcacheds without status.autoscaling",
        crs,
        timeout,
        |m| {
            ours(m) && is_available(m) && m.status.as_ref().is_some_and(|s| s.autoscaling.is_none())
        },
    )
    .await?;
    let off_after = off_started.elapsed();
    // The polls queued before each one was turned off have come and gone.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let off = measure(cluster, op, &answered, window).await?;
    responders.abort();

    let seconds = window.as_secs_f64();
    let percent = |cpu: f64| cpu / seconds * 100.0;
    let (cpu_on, cpu_off) = (on["cpu_seconds"].as_f64(), off["cpu_seconds"].as_f64());
    let (cpu_on, cpu_off) = (cpu_on.unwrap_or(f64::NAN), cpu_off.unwrap_or(f64::NAN));
    Ok(json!({
        "memcacheds": crs,
        "members_each": MEMBERS,
        "members": crs * MEMBERS as usize,
        "poll_seconds": 10,
        "window_seconds": seconds,
        "steady_after_seconds": steady_after.as_secs_f64(),
        "steady_at_end_of_window": holding,
        "status_autoscaling_sample": sample,
        "until_steady_writes": setup.writes,
        "until_steady_requests": setup.by_key,
        "off_after_seconds": off_after.as_secs_f64(),
        "on": on,
        "off": off,
        "cpu_percent_of_a_core_on": percent(cpu_on),
        "cpu_percent_of_a_core_off": percent(cpu_off),
        "cpu_seconds_difference": cpu_on - cpu_off,
        "cpu_percent_of_a_core_difference": percent(cpu_on - cpu_off),
    }))
}

/// One steady window: the operator's CPU and RSS, the `stats` the responders answered, and the
/// operator's requests from the audit log.
async fn measure(
    cluster: &Cluster,
    op: &OperatorProcess,
    answered: &AtomicU64,
    window: Duration,
) -> Result<Value> {
    let t_audit = audit::now();
    let procs_before = procs::snapshot();
    let cpu0 = op.cpu_seconds();
    let reads0 = answered.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let cpu = op.cpu_seconds() - cpu0;
    let reads = answered.load(Ordering::Relaxed) - reads0;
    let elapsed = started.elapsed().as_secs_f64();
    let used = cpu_since(&procs_before, op);
    let requests = cluster.audit_counts(t_audit, audit::now())?;
    let status_writes: u64 = requests
        .by_key
        .iter()
        .filter(|(key, _)| {
            let mut words = key.split(' ');
            matches!(words.next(), Some("patch" | "update"))
                && words.next() == Some("memcacheds/status")
        })
        .map(|(_, n)| n)
        .sum();
    Ok(json!({
        "cpu_seconds": cpu,
        "stats_reads": reads,
        "stats_reads_per_second": reads as f64 / elapsed,
        "writes": requests.writes,
        "status_writes": status_writes,
        "requests": requests.by_key,
        "cpu_seconds_by_process": top_cpu(&used),
        "rss_mib": op.rss_mib(),
        "rss_peak_mib": op.peak_rss_mib(),
    }))
}

/// Available with every member ready, and the autoscaler past its first reading: Steady.
fn steady(m: &Memcached) -> bool {
    is_available(m)
        && m.status.as_ref().is_some_and(|s| {
            s.ready_replicas == MEMBERS
                && s.autoscaling.as_ref().is_some_and(|a| a.reason == "Steady")
        })
}

/// Size 3 on the loopback node, too little memory for the agent (so `stats` is read from
/// memcached's own port), autoscaling on with nothing to scale: minSize = maxSize = 3.
async fn create(client: &Client, ns: &str, name: &str) -> Result<()> {
    let mut spec = on_loopback_node(NODE);
    spec.as_object_mut().unwrap().extend(
        json!({
            "size": MEMBERS,
            "maxMemoryMiB": MAX_MEMORY_MIB,
            "autoscaling": {"enabled": true, "minSize": MEMBERS, "maxSize": MEMBERS},
        })
        .as_object()
        .unwrap()
        .clone(),
    );
    let spec: MemcachedSpec = serde_json::from_value(spec)?;
    Api::<Memcached>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &Memcached::new(name, spec))
        .await?;
    Ok(())
}

async fn disable(client: &Client, ns: &str, name: &str) -> Result<()> {
    let patch = json!({"spec": {"autoscaling": {"enabled": false}}});
    Api::<Memcached>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A scripted member on each address a pod of the loopback node gets, from a watch (no polling
/// of the API server while it is measured). `answered` counts the `stats` answered.
async fn respond_on_node(client: Client, answered: Arc<AtomicU64>) {
    let pods: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={NODE}"));
    let mut serving: HashSet<IpAddr> = HashSet::new();
    let mut events = std::pin::pin!(watcher(pods, config).default_backoff().applied_objects());
    while let Some(pod) = events.next().await {
        let Ok(pod) = pod else { continue };
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        let Some(ip) = ip.and_then(|ip| ip.parse::<IpAddr>().ok()) else {
            continue;
        };
        if serving.contains(&ip) {
            continue;
        }
        match TcpListener::bind((ip, PORT)).await {
            Ok(listener) => {
                tokio::spawn(serve_member(listener, answered.clone()));
                serving.insert(ip);
            }
            Err(error) => eprintln!("a scripted member on {ip}:{PORT}: {error}"),
        }
    }
}

/// One scripted member: memcached's `stats`, with counters that grow with time at a steady
/// rate: gets at 90 % hits, no evictions, items taking 40 % of the memory.
async fn serve_member(listener: TcpListener, answered: Arc<AtomicU64>) {
    let started = Instant::now();
    let limit = MAX_MEMORY_MIB * 1024 * 1024;
    let bytes = limit * 40 / 100;
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0u8; 7];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut request));
        if !matches!(read.await, Ok(Ok(_))) || &request != b"stats\r\n" {
            continue;
        }
        let elapsed = started.elapsed();
        // A hundred gets a second, nine in ten of them hits: exactly 90 % between any readings.
        let misses = elapsed.as_millis() as u64 / 100;
        let answer = format!(
            "STAT pid 1\r\nSTAT uptime {}\r\nSTAT version 1.6.18\r\n\
             STAT curr_connections 10\r\nSTAT max_connections 1024\r\n\
             STAT cmd_get {}\r\nSTAT get_hits {}\r\nSTAT get_misses {misses}\r\n\
             STAT bytes {bytes}\r\nSTAT curr_items {}\r\nSTAT limit_maxbytes {limit}\r\n\
             STAT evictions 0\r\nSTAT store_too_large 0\r\nEND\r\n",
            elapsed.as_secs() + 1000,
            misses * 10,
            misses * 9,
            bytes / 1024,
        );
        if stream.write_all(answer.as_bytes()).await.is_ok() {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}
