//! An operator that keeps the members' pods itself (`--members=pods`): a new Memcached's members,
//! its revision, Service and budget go out together; the pod watch counts them for the status;
//! a smaller size deletes from the top.

use super::*;
use crate::resources::REVISION_LABEL;

const PODS: &str = "/api/v1/namespaces/default/pods";
const REVISIONS: &str = "/apis/apps/v1/namespaces/default/controllerrevisions";

/// Member `name` as the pod watch sees it: Ready, of `revision`.
fn ready_member(name: &str, revision: &str) -> PodMeta {
    watched_pod(name, &[(REVISION_LABEL, revision)], true)
}

#[tokio::test]
async fn a_new_memcached_gets_its_members_revision_service_and_budget_at_once_then_status() {
    let (ctx, api, mut caches) = apiserver::context_keeping_pods();
    let mc = memcached("cache", 3);
    let sent = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        // Seven requests, none waiting for another: the revision, three members, the
        // Service, the budget and the Service's event.
        let seen = api.echo_any_order(7, &sent).await;
        let posted = |path: &str| -> Vec<&serde_json::Value> {
            seen.iter()
                .filter(|r| (r.method.as_str(), r.path()) == ("POST", path))
                .map(|r| &r.body)
                .collect()
        };
        let mut members: Vec<_> = posted(PODS)
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        members.sort();
        assert_eq!(members, ["cache-0", "cache-1", "cache-2"]);
        let revision = posted(REVISIONS)[0]["metadata"]["name"].clone();
        for pod in posted(PODS) {
            assert_eq!(pod["metadata"]["labels"][REVISION_LABEL], revision);
            assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-cache");
            assert_eq!(pod["spec"]["subdomain"], "cache");
        }
        assert!(seen.iter().any(|r| r.path() == SERVICE));
        assert!(seen.iter().any(|r| r.path() == BUDGET));
        assert!(
            !seen.iter().any(|r| r.path().contains("statefulsets")),
            "no StatefulSet"
        );
        api
    })
    .await;
    assert_eq!(
        outcome.unwrap(),
        Outcome::Converged,
        "the pods' events refresh the status"
    );

    // The members' watch events: the status counts them, and nothing else is written.
    let sts = resources::stateful_set(&mc, &ctx.images);
    let revision = resources::members::revision(&mc, &sts);
    for name in ["cache-0", "cache-1", "cache-2"] {
        ctx.pods
            .observe(&watcher::Event::Apply(ready_member(name, &revision)));
    }
    caches.add_service(resources::service(&mc));
    caches.add_budget(resources::pod_disruption_budget(&mc).expect("size 3 has one"));
    let answered = mc.clone();
    let (outcome, api) = scenario_then(mc.clone(), ctx.clone(), api, |mut api| async move {
        let status = api.echo_status(STATUS, &answered).await;
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("True".into(), "AllPodsReady".into())
        );
        assert_eq!(status.body["status"]["readyReplicas"], 3);
        assert_eq!(
            status.body["status"]["nodes"],
            json!(["cache-0", "cache-1", "cache-2"])
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);

    // Size 1: the two highest members are deleted, and the budget one member does not have.
    let mut smaller = mc.clone();
    smaller.spec.size = 1;
    smaller.metadata.generation = Some(2);
    let outcome = scenario(smaller.clone(), ctx, api, |mut api| async move {
        let seen = api.echo_any_order(3, &smaller).await;
        let mut deleted: Vec<_> = seen
            .iter()
            .filter(|r| r.method == "DELETE")
            .map(|r| r.path().to_string())
            .collect();
        deleted.sort();
        assert_eq!(
            deleted,
            [
                format!("{PODS}/cache-1"),
                format!("{PODS}/cache-2"),
                BUDGET.to_string()
            ]
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}
