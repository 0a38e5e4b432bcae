//! The binding Secret (`spec.binding`): written when the members change, read and left alone
//! when they do not, deleted once turned off.

use std::collections::BTreeMap;

use http::StatusCode;
use k8s_openapi::ByteString;
use serde_json::json;

use super::*;

const BINDING: &str = "/api/v1/namespaces/default/secrets/cache-binding";

/// A converged Memcached of two pods, `cache-a` at 10.0.0.9 and `cache-b` at 10.0.0.1, whose
/// spec turns the binding on (`binding`) or off.
fn two_pods(ctx: &Context, caches: &mut apiserver::Caches, binding: bool) -> Memcached {
    let mut mc = memcached("cache", 2);
    converged(&mut mc, caches);
    for (name, ip) in [("cache-a", "10.0.0.9"), ("cache-b", "10.0.0.1")] {
        let labels = [(resources::LABEL_INSTANCE.to_string(), "cache".to_string())];
        ctx.pods.observe(&watcher::Event::Apply(PodMeta {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                labels: Some(labels.into()),
                ..Default::default()
            },
            trouble: None,
            ip: Some(ip.parse().unwrap()),
        }));
    }
    mc.spec.binding = Some(crate::api::BindingSpec { enabled: binding });
    mc
}

fn not_found(_: &serde_json::Value) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
}

fn servers(secret: &serde_json::Value) -> String {
    let data: BTreeMap<String, ByteString> =
        serde_json::from_value(secret["data"].clone()).unwrap();
    String::from_utf8(data["servers"].0.clone()).unwrap()
}

#[tokio::test]
async fn a_new_binding_lists_the_members_in_the_order_of_their_names_and_is_reported() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = two_pods(&ctx, &mut caches, true);
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        api.expect("GET", BINDING, StatusCode::NOT_FOUND, not_found)
            .await;
        let applied = api.echo("PATCH", BINDING).await;
        assert!(
            applied
                .path_and_query
                .contains("fieldManager=memcached-operator")
        );
        assert_eq!(servers(&applied.body), "10.0.0.9:11211,10.0.0.1:11211");
        assert_eq!(applied.body["type"], "servicebinding.io/memcached");
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(
            status.body["status"]["binding"],
            json!({"name": "cache-binding"})
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn a_binding_that_holds_what_it_should_is_read_and_not_rewritten() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = two_pods(&ctx, &mut caches, true);
    let current = resources::binding::secret(
        &mc,
        &ctx.pods.pods_of("default", "cache").addresses,
        &Default::default(),
    )
    .unwrap();
    let status = mc.status.as_mut().unwrap();
    status.nodes = vec!["cache-a".into(), "cache-b".into()];
    status.binding = Some(crate::api::BindingStatus {
        name: "cache-binding".into(),
    });
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let current = serde_json::to_value(&current).unwrap();
        api.expect("GET", BINDING, StatusCode::OK, |_| current)
            .await;
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn turning_the_binding_off_deletes_only_the_secret_it_made() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = two_pods(&ctx, &mut caches, false);
    mc.status.as_mut().unwrap().binding = Some(crate::api::BindingStatus {
        name: "cache-binding".into(),
    });
    let mut ours =
        resources::binding::secret(&memcached_with_binding(&mc), &[], &Default::default()).unwrap();
    ours.metadata.uid = Some("uid-binding".into());
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let ours = serde_json::to_value(&ours).unwrap();
        api.expect("GET", BINDING, StatusCode::OK, |_| ours.clone())
            .await;
        let deleted = api
            .expect("DELETE", BINDING, StatusCode::OK, |_| ours)
            .await;
        assert_eq!(deleted.body["preconditions"]["uid"], "uid-binding");
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(status.body["status"].get("binding"), None);
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

fn memcached_with_binding(mc: &Memcached) -> Memcached {
    let mut mc = mc.clone();
    mc.spec.binding = Some(crate::api::BindingSpec { enabled: true });
    mc
}
