//! The binding Secret (`spec.binding`): written with the members' stable names, read and left
//! alone while it holds them (whatever the pods do), deleted once turned off.

use std::collections::BTreeMap;

use http::StatusCode;
use k8s_openapi::ByteString;
use serde_json::json;

use super::*;

const BINDING: &str = "/api/v1/namespaces/default/secrets/cache-binding";

/// The member `name` of the Memcached "cache", as the pod watch reports it once it is being
/// deleted.
fn deleted_member(name: &str) -> PodMeta {
    let mut member = watched_pod(name, &[], true);
    member.metadata.deletion_timestamp = Some(crate::fixtures::time(1));
    member
}

/// A converged Memcached of two members, `cache-0` and `cache-1`, whose spec turns the binding
/// on (`binding`) or off.
fn two_pods(ctx: &Context, caches: &mut apiserver::Caches, binding: bool) -> Memcached {
    let mut mc = memcached("cache", 2);
    converged(ctx, &mut mc, caches);
    mc.spec.binding = Some(crate::api::BindingSpec { enabled: binding });
    mc
}

/// `mc` as it reports its binding and its two members.
fn reporting_the_binding(mut mc: Memcached) -> Memcached {
    let status = mc.status.as_mut().unwrap();
    status.nodes = vec!["cache-0".into(), "cache-1".into()];
    status.binding = Some(crate::api::BindingStatus {
        name: "cache-binding".into(),
    });
    mc
}

const MEMBERS: &str = "cache-0.cache.default.svc:11211,cache-1.cache.default.svc:11211";

fn not_found(_: &serde_json::Value) -> serde_json::Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
}

fn servers(secret: &serde_json::Value) -> String {
    let data: BTreeMap<String, ByteString> =
        serde_json::from_value(secret["data"].clone()).unwrap();
    String::from_utf8(data["servers"].0.clone()).unwrap()
}

#[tokio::test]
async fn a_new_binding_lists_the_members_by_their_stable_names_and_is_reported() {
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
        assert_eq!(servers(&applied.body), MEMBERS);
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
    let mc = reporting_the_binding(two_pods(&ctx, &mut caches, true));
    let current = resources::binding::secret(&mc, &Default::default()).unwrap();
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
async fn a_member_being_replaced_stays_in_the_binding() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = reporting_the_binding(two_pods(&ctx, &mut caches, true));
    let current = resources::binding::secret(&mc, &Default::default()).unwrap();
    // cache-1 is out until it is made again, under the same name.
    ctx.cached
        .pods
        .observe(&watcher::Event::Apply(deleted_member("cache-1")));
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let current = serde_json::to_value(&current).unwrap();
        assert_eq!(servers(&current), MEMBERS);
        api.expect("GET", BINDING, StatusCode::OK, |_| current)
            .await;
        // The binding is not written again: only the status changes, with its pods.
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(status.body["status"]["nodes"], json!(["cache-0"]));
        assert_eq!(
            status.body["status"]["servers"],
            json!([
                "cache-0.cache.default.svc:11211",
                "cache-1.cache.default.svc:11211"
            ])
        );
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
async fn turning_the_binding_off_deletes_only_the_secret_it_made() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut mc = two_pods(&ctx, &mut caches, false);
    mc.status.as_mut().unwrap().binding = Some(crate::api::BindingStatus {
        name: "cache-binding".into(),
    });
    let mut ours =
        resources::binding::secret(&memcached_with_binding(&mc), &Default::default()).unwrap();
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
