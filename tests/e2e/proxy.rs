//! `spec.proxy` on the API server: the proxy's Deployment, Service, disruption budget and
//! layout are kept; the layout follows the members (a new one once Ready, the previous layout
//! kept for the handover, a member leaving drained until it ends) without touching the proxy's
//! pods; the binding names the proxy; turning it off removes it all. (Clients through the
//! proxy are shown on the real node.)

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::SignedDuration;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::TOPOLOGY_ZONE;
use memcached_operator::resources::proxy::{LAYOUT_KEY, Layout};
use memcached_operator_testkit::kwok::{on_zone_nodes, zone_node};
use serde_json::json;

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, create, events_with_reason, member_pods, namespace,
    set_size, wait_converged, wait_degraded_saying, wait_for, wait_gone,
};

/// The layout the proxy is given, once its ConfigMap is there.
async fn layout(config_maps: &Api<ConfigMap>) -> Option<Layout> {
    let cm = config_maps.get_opt("cache-proxy").await.ok()??;
    Layout::check(cm.data?.get(LAYOUT_KEY)?).ok()
}

/// `cache-N.cache.<ns>.svc:11211` for N below `n`.
fn addresses(ns: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("cache-{i}.cache.{ns}.svc:11211"))
        .collect()
}

async fn wait_layout(
    config_maps: &Api<ConfigMap>,
    what: &str,
    members: Vec<String>,
    previous: Vec<String>,
) {
    let want = Layout {
        members,
        previous,
        ..Layout::default()
    };
    wait_for(what, CONVERGE, || async {
        (layout(config_maps).await? == want).then_some(())
    })
    .await;
}

fn proxied(handover_seconds: i32) -> Memcached {
    serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {
            "size": 3, "binding": {"enabled": true},
            "proxy": {"enabled": true, "handoverSeconds": handover_seconds},
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn the_proxy_is_kept_and_its_layout_follows_the_members_with_a_handover() {
    let client = admin().await;
    let ns = namespace(&client, "proxy").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &proxied(15)).await;
    wait_converged(&client, &ns, "cache", 3).await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_layout(&config_maps, "the first layout", addresses(&ns, 3), vec![]).await;
    let deployment = wait_for("the proxy's pods Ready", CONVERGE, || async {
        let d = deployments.get_opt("cache-proxy").await.ok()??;
        (d.status.as_ref()?.ready_replicas? == 2).then_some(d)
    })
    .await;
    assert_eq!(deployment.owner_references()[0].name, "cache");
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .get("cache-proxy")
        .await
        .unwrap();
    let spec = service.spec.unwrap();
    assert_ne!(
        spec.cluster_ip.as_deref(),
        Some("None"),
        "one address, not headless"
    );
    assert_eq!(spec.ports.unwrap()[0].port, 11211);
    let budget = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .get("cache-proxy")
        .await
        .unwrap();
    assert!(budget.spec.unwrap().max_unavailable.is_some());

    // The proxy's pods are not members; the status and the binding name its address.
    assert_eq!(member_pods(&client, &ns, "cache").await.len(), 3);
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let address = format!("cache-proxy.{ns}.svc:11211");
    wait_for("status.proxy", CONVERGE, || async {
        let proxy = mcs.get("cache").await.ok()?.status?.proxy?;
        (proxy.address == address && proxy.ready_replicas == 2 && proxy.members == 3).then_some(())
    })
    .await;
    let binding = Api::<Secret>::namespaced(client.clone(), &ns)
        .get("cache-binding")
        .await
        .unwrap();
    let host = binding.data.unwrap()["host"].0.clone();
    assert_eq!(
        String::from_utf8(host).unwrap(),
        format!("cache-proxy.{ns}.svc")
    );

    // Scaled out: the new member joins with the previous layout behind it, which is dropped
    // when the window ends; the proxy's pods are never rolled.
    let generation = deployment.metadata.generation;
    set_size(&client, &ns, "cache", 4).await;
    wait_layout(
        &config_maps,
        "4 members, 3 behind",
        addresses(&ns, 4),
        addresses(&ns, 3),
    )
    .await;
    // The members here are the fake kubelet's, with no memcached to sweep: the layout changed
    // all the same, and a Warning names each member the operator could not sweep.
    wait_for("a SweepFailed warning", CONVERGE, || async {
        let failed = events_with_reason(&client, &ns, "cache", "SweepFailed").await;
        let note = failed.first()?.note.clone()?;
        (note.starts_with("Could not sweep cache-") && note.contains("may read back old"))
            .then_some(())
    })
    .await;
    // The status follows the layout (it is written after it, in the same reconcile).
    wait_for("status.proxy.handover", CONVERGE, || async {
        let handover = mcs.get("cache").await.ok()?.status?.proxy?.handover?;
        (handover.previous_members == 3).then_some(())
    })
    .await;
    wait_layout(&config_maps, "the window over", addresses(&ns, 4), vec![]).await;

    // Scaled in: the member leaving stays, draining, until the window ends.
    set_size(&client, &ns, "cache", 3).await;
    wait_layout(
        &config_maps,
        "3 members, 4 behind",
        addresses(&ns, 3),
        addresses(&ns, 4),
    )
    .await;
    let status = mcs.get("cache").await.unwrap().status.unwrap();
    assert_eq!(status.proxy.unwrap().draining, ["cache-3"]);
    assert!(
        member_pods(&client, &ns, "cache")
            .await
            .iter()
            .any(|p| p.name_any() == "cache-3"),
        "cache-3 drains"
    );
    wait_layout(&config_maps, "the window over", addresses(&ns, 3), vec![]).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let after = deployments.get("cache-proxy").await.unwrap();
    assert_eq!(
        after.metadata.generation, generation,
        "the proxy's pods were not rolled"
    );

    // A new image: the proxies hold what a member restarting in place cannot answer, from 5 s
    // or more before the first restart (the time they get to load that layout) until the last
    // member is back; the status says since when.
    let image = "memcached:1.6.44";
    let patch = json!({"spec": {"image": image}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let since = wait_for("the proxies told to hold", CONVERGE, || async {
        let held = layout(&config_maps).await?.hold;
        let since = mcs.get("cache").await.ok()?.status?.proxy?.holding_since?;
        held.then_some(since)
    })
    .await;
    wait_for(
        "every member on the new image, the hold over",
        3 * CONVERGE,
        || async {
            let pods = member_pods(&client, &ns, "cache").await;
            let rolled = pods.len() == 3
                && pods.iter().all(|p| {
                    p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(image)
                });
            let held = layout(&config_maps).await?.hold;
            let holding = mcs.get("cache").await.ok()?.status?.proxy?.holding_since;
            (rolled && !held && holding.is_none()).then_some(())
        },
    )
    .await;
    let restarted = events_with_reason(&client, &ns, "cache", "Restarted").await;
    assert!(!restarted.is_empty());
    for event in restarted {
        let at = event.event_time.unwrap().0;
        assert!(
            at >= since.0 + SignedDuration::from_secs(5),
            "{:?} at {at}, the hold from {}",
            event.note,
            since.0
        );
    }
    wait_converged(&client, &ns, "cache", 3).await;

    // Someone's edit of the layout is put back.
    let edit = json!({"data": {LAYOUT_KEY: "{\"members\": []}"}});
    config_maps
        .patch("cache-proxy", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    wait_layout(
        &config_maps,
        "the layout put back",
        addresses(&ns, 3),
        vec![],
    )
    .await;

    // Off: the proxy's objects go; the members stay.
    let off = json!({"spec": {"proxy": {"enabled": false}}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&off))
        .await
        .unwrap();
    wait_gone(
        "the proxy's Deployment",
        CONVERGE,
        &deployments,
        "cache-proxy",
    )
    .await;
    wait_gone("the layout", CONVERGE, &config_maps, "cache-proxy").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    wait_gone("the proxy's Service", CONVERGE, &services, "cache-proxy").await;
    assert!(services.get_opt("cache").await.unwrap().is_some());
    wait_for("status.proxy gone", CONVERGE, || async {
        mcs.get("cache")
            .await
            .ok()?
            .status?
            .proxy
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_proxy_it_cannot_run_is_refused_naming_the_field() {
    let client = admin().await;
    let ns = namespace(&client, "proxy-refused").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mut mc = proxied(600);
    mc.spec.auth = serde_json::from_value(json!({"enabled": true})).unwrap();
    let refused = mcs.create(&PostParams::default(), &mc).await.unwrap_err();
    assert!(
        refused.to_string().contains("spec.proxy.enabled")
            && refused.to_string().contains("needs networkPolicy.enabled"),
        "{refused}"
    );
    // With the policy that keeps the members' relay to the proxy's pods, it is taken.
    mc.metadata.name = Some("with-policy".into());
    mc.spec.network_policy = serde_json::from_value(json!({"enabled": true})).unwrap();
    mcs.create(&PostParams::default(), &mc).await.unwrap();
    mcs.delete("with-policy", &Default::default())
        .await
        .unwrap();

    // An image too old for the proxy: Degraded, the field named, nothing applied.
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut mc = proxied(600);
    mc.spec.proxy.as_mut().unwrap().image = Some("memcached:1.6.18".into());
    create(&client, &ns, &mc).await;
    let said = "spec.proxy.image: memcached:1.6.18";
    wait_degraded_saying(&mcs, "cache", "InvalidSpec", said, CONVERGE).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(deployments.get_opt("cache-proxy").await.unwrap().is_none());
    assert!(
        member_pods(&client, &ns, "cache").await.is_empty(),
        "nothing applied"
    );
}

/// The zone the API server gave pod `name` (from its node, when it was bound).
fn zone_of(pods: &[Pod], name: &str) -> Option<String> {
    let pod = pods.iter().find(|p| p.name_any() == name)?;
    pod.labels().get(TOPOLOGY_ZONE).cloned()
}

#[tokio::test]
async fn with_zone_local_reads_the_layout_names_the_zone_each_member_runs_in() {
    let client = admin().await;
    for (i, zone) in ["zone-a", "zone-b", "zone-c"].into_iter().enumerate() {
        let name = format!("kwok-{zone}");
        zone_node(&client, &name, zone, &format!("10.{}.0.0/16", 210 + i))
            .await
            .unwrap();
    }
    let ns = namespace(&client, "proxy-zones").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut spec = on_zone_nodes();
    spec["size"] = json!(3);
    // One member per node, so each zone has one.
    spec["spread"] = json!("Required");
    spec["proxy"] = json!({"enabled": true, "zoneLocalReads": true});
    let mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"}, "spec": spec,
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;

    // Each member's zone is its node's, as the API server copied it onto the pod; the layout
    // names it, and the status groups the members by it.
    let pods = member_pods(&client, &ns, "cache").await;
    let zones: Vec<String> = (0..3)
        .map(|n| zone_of(&pods, &format!("cache-{n}")).expect("a zone label"))
        .collect();
    let mut distinct = zones.clone();
    distinct.sort();
    assert_eq!(distinct, ["zone-a", "zone-b", "zone-c"]);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_for("the layout with the members' zones", CONVERGE, || async {
        let layout = layout(&config_maps).await?;
        (layout.members == addresses(&ns, 3) && layout.zones == zones).then_some(())
    })
    .await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let status = mcs.get("cache").await.unwrap().status.unwrap();
    let grouped = status.proxy.unwrap().zones;
    assert_eq!(grouped.len(), 3, "{grouped:?}");
    for group in &grouped {
        assert_eq!(group.members.len(), 1, "{grouped:?}");
        let n = group.members[0]
            .trim_start_matches("cache-")
            .parse::<usize>()
            .unwrap();
        assert_eq!(group.zone, zones[n]);
    }

    // The proxies read their own zone from their pods' label, which the API server set too.
    let proxies = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels("app.kubernetes.io/name=memcached-proxy"))
        .await
        .unwrap();
    assert_eq!(proxies.items.len(), 2);
    for proxy in &proxies.items {
        assert!(
            proxy.labels().contains_key(TOPOLOGY_ZONE),
            "{:?}",
            proxy.labels()
        );
        let spec = proxy.spec.as_ref().unwrap();
        let agent = spec
            .containers
            .iter()
            .find(|c| c.name == "route-agent")
            .unwrap();
        assert!(
            agent
                .args
                .as_ref()
                .unwrap()
                .contains(&"--zone=$(PROXY_ZONE)".to_string())
        );
        let env = &agent.env.as_ref().unwrap()[0];
        let field = &env
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path;
        assert_eq!(field, &format!("metadata.labels['{TOPOLOGY_ZONE}']"));
    }

    // A member found in another zone (as a pod rescheduled there would be): the layout moves it.
    let moved = zones.iter().find(|z| **z != zones[1]).unwrap().clone();
    let patch = json!({"metadata": {"labels": {TOPOLOGY_ZONE: moved}}});
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch("cache-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for("cache-1 in its new zone", CONVERGE, || async {
        let layout = layout(&config_maps).await?;
        (layout.zones[1] == moved && layout.zones[0] == zones[0]).then_some(())
    })
    .await;
    wait_for("the status with two zones", CONVERGE, || async {
        let grouped = mcs.get("cache").await.ok()?.status?.proxy?.zones;
        (grouped.len() == 2).then_some(())
    })
    .await;
    // The keys move between zones' pools as in a change of members: the members were swept
    // first (here the fake kubelet's, with no memcached: a Warning names each).
    let failed = events_with_reason(&client, &ns, "cache", "SweepFailed").await;
    assert!(
        !failed.is_empty(),
        "the members swept before the zones changed"
    );
}
