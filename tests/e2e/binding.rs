//! `spec.binding` on the API server: the Secret applications mount follows the members as they
//! come and go, repeats the credentials, and is removed when turned off. (An application pod
//! connecting with it is shown on the real node.)

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::selector_string;
use serde_json::json;

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, create, memcached, namespace, set_size,
    wait_converged, wait_degraded, wait_for, wait_gone, wait_not_degraded,
};

/// The binding Secret's entries, as an application reads its files.
async fn entries(secrets: &Api<Secret>, name: &str) -> Option<BTreeMap<String, String>> {
    let data = secrets.get_opt(name).await.ok()??.data?;
    Some(
        data.into_iter()
            .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
            .collect(),
    )
}

/// `<pod>.cache.<ns>.svc:11211` of each pod of the Memcached, in the order of their names
/// (its members' stable addresses), once there are `size` of them.
async fn members(client: &Client, ns: &str, mc: &Memcached, size: usize) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let listed = pods
        .list(&ListParams::default().labels(&selector_string(mc)))
        .await
        .ok()?;
    let mut live: Vec<String> = listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    live.sort();
    let addresses: Vec<String> = live
        .iter()
        .map(|pod| format!("{pod}.cache.{ns}.svc:11211"))
        .collect();
    (addresses.len() == size).then(|| addresses.join(","))
}

/// Waits until the binding's `servers` lists exactly the `size` pods the Memcached has.
async fn wait_servers_are_the_members(client: &Client, ns: &str, mc: &Memcached, size: usize) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("servers to list the {size} pods"),
        CONVERGE,
        || async {
            let servers = entries(&secrets, "cache-binding")
                .await?
                .remove("servers")?;
            (Some(&servers) == members(client, ns, mc, size).await.as_ref()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_binding_follows_the_members_and_repeats_the_credentials() {
    let client = admin().await;
    let ns = namespace(&client, "binding").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut mc = memcached("cache", 3);
    mc.spec = serde_json::from_value(json!({
        "size": 3, "auth": {"enabled": true}, "binding": {"enabled": true},
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    mc.metadata.namespace = Some(ns.clone());
    wait_converged(&client, &ns, "cache", 3).await;
    wait_servers_are_the_members(&client, &ns, &mc, 3).await;

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let status = mcs.get("cache").await.unwrap().status.unwrap();
    assert_eq!(status.binding.unwrap().name, "cache-binding");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let binding = secrets.get("cache-binding").await.unwrap();
    assert_eq!(
        binding.type_.as_deref(),
        Some("servicebinding.io/memcached")
    );
    assert_eq!(binding.owner_references()[0].name, "cache");
    let bound = entries(&secrets, "cache-binding").await.unwrap();
    let credentials = entries(&secrets, "cache-auth").await.unwrap();
    assert_eq!(bound["type"], "memcached");
    assert_eq!(bound["host"], format!("cache.{ns}.svc"));
    assert_eq!(bound["port"], "11211");
    assert_eq!(
        (&bound["username"], &bound["password"]),
        (&credentials["username"], &credentials["password"])
    );

    // The members as they come and go.
    for size in [5, 2] {
        set_size(&client, &ns, "cache", size).await;
        wait_converged(&client, &ns, "cache", size).await;
        wait_servers_are_the_members(&client, &ns, &mc, size as usize).await;
    }

    // A rotated password reaches the binding (its Secrets are read again every 30 s).
    let rotated = json!({"stringData": {"password": "rotated-by-the-user"}});
    secrets
        .patch(
            "cache-auth",
            &PatchParams::default(),
            &Patch::Merge(&rotated),
        )
        .await
        .unwrap();
    wait_for(
        "the binding to carry the new password",
        CONVERGE,
        || async {
            let bound = entries(&secrets, "cache-binding").await?;
            (bound["password"] == "rotated-by-the-user").then_some(())
        },
    )
    .await;

    // Turned off: the copy of the password goes, and the status says there is none.
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"binding": {"enabled": false}}})),
    )
    .await
    .unwrap();
    wait_gone("the binding Secret", CONVERGE, &secrets, "cache-binding").await;
    wait_for("status.binding to go", CONVERGE, || async {
        let status = mcs.get("cache").await.ok()?.status?;
        status.binding.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_secret_of_the_bindings_name_that_is_not_ours_is_left_alone() {
    let client = admin().await;
    let ns = namespace(&client, "binding-foreign").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut theirs = Secret::default();
    theirs.metadata.name = Some("cache-binding".into());
    theirs.string_data = Some(BTreeMap::from([("host".into(), "theirs".into())]));
    secrets
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();

    let mut mc = memcached("cache", 1);
    mc.spec.binding = Some(memcached_operator::api::BindingSpec { enabled: true });
    create(&client, &ns, &mc).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let message = wait_degraded(&mcs, "cache", "ResourceExists", CONVERGE).await;
    assert!(
        message.contains("Secret") && message.contains("cache-binding"),
        "{message}"
    );
    assert_eq!(
        entries(&secrets, "cache-binding").await.unwrap()["host"],
        "theirs"
    );

    // Once theirs is gone, ours takes the name.
    secrets
        .delete("cache-binding", &Default::default())
        .await
        .unwrap();
    wait_not_degraded(&mcs, "cache", CONVERGE).await;
    wait_for("the operator's binding", CONVERGE, || async {
        let bound = entries(&secrets, "cache-binding").await?;
        (bound.get("type")? == "memcached").then_some(())
    })
    .await;
}
