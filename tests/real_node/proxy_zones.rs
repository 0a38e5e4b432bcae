//! Zone-local reads for real (`spec.proxy.zoneLocalReads`). The real node is one node, so the
//! test gives the zones as the API server would: the node's `topology.kubernetes.io/zone`
//! label, which it copies onto each pod bound there, and the members' own labels changed after
//! (as a member rescheduled into another zone would have them). Every zone then holds every
//! key; the proxies' reads go to their own zone's member, and fall over to the other zones
//! when it has lost its copies.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::TOPOLOGY_ZONE;
use serde_json::json;

use crate::harness::{CONVERGE, admin, wait_for};
use crate::proxy::{
    KEYS, Reader, force_delete, items, loads, members, proxied, proxies, through_proxy,
    wait_loaded, wait_serving,
};
use crate::{RealNode, operator_with_agent, pod_ip, pymemcache, real_namespace};

/// Labels (or, with None, unlabels) `what`'s zone.
async fn set_zone<K>(api: &Api<K>, name: &str, zone: Option<&str>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"labels": {TOPOLOGY_ZONE: zone}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Each member's `get_hits`, by pod name.
async fn hits(client: &Client, ns: &str) -> BTreeMap<String, u64> {
    let mut hits = BTreeMap::new();
    for (name, mut conn) in members(client, ns).await {
        let n = conn.stat("", "get_hits").await.unwrap().parse().unwrap();
        hits.insert(name, n);
    }
    hits
}

/// The hits each member served since `before`.
async fn served_since(client: &Client, ns: &str, before: &BTreeMap<String, u64>) -> Vec<u64> {
    let now = hits(client, ns).await;
    let since = |name: &String| now[name] - before.get(name).copied().unwrap_or(0);
    now.keys().map(since).collect()
}

#[tokio::test]
async fn with_zone_local_reads_every_zone_holds_the_keys_and_reads_stay_in_the_proxys_own() {
    let client = admin().await;
    let node = RealNode::get();
    let nodes: Api<Node> = Api::all(client.clone());
    set_zone(&nodes, node.name(), Some("zone-a")).await;
    let ns = real_namespace(&client, "proxy-zones").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let spec = json!({"proxy": {"enabled": true, "zoneLocalReads": true}});
    let (pods, addr) = proxied(&client, &node, &ns, spec).await;
    let ip = addr.ip().to_string();

    // cache-1 and cache-2 found in zones b and c: the proxies load the layout of three zones.
    let before = loads(&pods).await;
    let started = Instant::now();
    let member_pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    set_zone(&member_pods, "cache-1", Some("zone-b")).await;
    set_zone(&member_pods, "cache-2", Some("zone-c")).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    wait_for("status.proxy.zones: three", CONVERGE, || async {
        let zones = mcs.get("cache").await.ok()?.status?.proxy?.zones;
        let named: Vec<(String, Vec<String>)> =
            zones.into_iter().map(|z| (z.zone, z.members)).collect();
        (named
            == [
                ("zone-a".to_string(), vec!["cache-0".to_string()]),
                ("zone-b".to_string(), vec!["cache-1".to_string()]),
                ("zone-c".to_string(), vec!["cache-2".to_string()]),
            ])
        .then_some(())
    })
    .await;
    let loaded = wait_loaded(&pods, &before, started).await;
    wait_serving(&pods).await;
    println!(
        "two members' zones changed: the layout loaded by every proxy after {:.1} s",
        loaded.as_secs_f64()
    );

    // A plain client writes through the proxy: every zone (here, each member) holds every key.
    assert_eq!(through_proxy(&ns, &ip, true).await, KEYS);
    let held = items(&client, &ns).await;
    println!("items held with zone-local reads: {held:?}");
    assert!(held.values().all(|n| *n >= KEYS), "{held:?}");

    // Reads through the proxies (both in zone a) are served by zone a's member alone.
    let before = hits(&client, &ns).await;
    assert_eq!(through_proxy(&ns, &ip, false).await, KEYS);
    let served = served_since(&client, &ns, &before).await;
    println!("reads served by cache-0, cache-1, cache-2 from zone a's proxies: {served:?}");
    assert!(
        served[0] >= KEYS && served[1] == 0 && served[2] == 0,
        "{served:?}"
    );

    // Zone a's member lost (force-deleted; it comes back empty): every read is still a hit,
    // answered by the other zones, none waiting a second.
    let reader = Reader::start(addr, "value");
    force_delete(&client, &ns, "cache-0").await;
    wait_serving(&pods).await;
    let read = reader.finish().await;
    println!(
        "a reader through zone a's member force-deleted: {} gets, {} hits, {} errors, slowest {:?}",
        read.gets,
        read.hits,
        read.errors.len(),
        read.slowest
    );
    assert!(read.errors.is_empty(), "{read:?}");
    assert_eq!(read.hits, read.gets, "{read:?}");
    assert!(read.slowest < Duration::from_secs(1), "{read:?}");

    // A proxy in zone b (the node's label changed, one proxy replaced): its reads go to
    // cache-1 alone.
    set_zone(&nodes, node.name(), Some("zone-b")).await;
    let replaced = pods[0].name_any();
    member_pods
        .delete(&replaced, &DeleteParams::default())
        .await
        .unwrap();
    let now = proxies(&client, &ns, 2).await;
    let in_b = now
        .iter()
        .find(|p| p.labels().get(TOPOLOGY_ZONE).map(String::as_str) == Some("zone-b"))
        .expect("a proxy in zone b");
    wait_serving(std::slice::from_ref(in_b)).await;
    let before = hits(&client, &ns).await;
    let direct = format!("{}:11211", pod_ip(in_b));
    let answer = pymemcache(json!({"servers": [direct], "keys": KEYS, "write": false})).await;
    assert_eq!(answer["found"].as_u64(), Some(KEYS), "{answer}");
    let served = served_since(&client, &ns, &before).await;
    println!("reads served by cache-0, cache-1, cache-2 from zone b's proxy: {served:?}");
    assert!(
        served[1] >= KEYS && served[0] == 0 && served[2] == 0,
        "{served:?}"
    );
    set_zone(&nodes, node.name(), None).await;
}
