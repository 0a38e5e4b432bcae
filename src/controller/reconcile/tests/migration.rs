//! The move from the Deployment of 0.2.0 and earlier: the StatefulSet is created beside it (a
//! rollout nobody asked for, so within the rollout budget), and the Deployment is deleted only
//! once the StatefulSet's members are all available.

use http::StatusCode;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;

const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/cache";

/// The Deployment 0.2.0 made for `mc`, with `ready` of its pods Ready.
fn legacy_deployment(mc: &Memcached, ready: i32) -> Deployment {
    let mut metadata = resources::stateful_set(mc, &Images::default()).metadata;
    metadata.uid = Some("uid-deployment".into());
    metadata.generation = Some(1);
    metadata.resource_version = Some("7".into());
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(mc.spec.size),
            selector: LabelSelector {
                match_labels: Some(resources::selector_labels(mc)),
                ..LabelSelector::default()
            },
            ..DeploymentSpec::default()
        }),
        status: Some(DeploymentStatus {
            observed_generation: Some(1),
            replicas: Some(mc.spec.size),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            updated_replicas: Some(mc.spec.size),
            ..DeploymentStatus::default()
        }),
    }
}

/// A Memcached of 3 that the previous release served with a Deployment (all 3 pods Ready),
/// with its Service and budget; `stateful_set` is its StatefulSet's (size, ready) if it has one
/// yet. Its status is the one this operator writes then.
fn moving(caches: &mut apiserver::Caches, stateful_set: Option<(i32, i32)>) -> Memcached {
    let mut mc = memcached("cache", 3);
    caches.add_service(resources::service(&mc));
    let mut budget = resources::pod_disruption_budget(&mc).expect("size 3 has one");
    budget.metadata.uid = Some("uid-budget".into());
    caches.add_budget(budget);
    caches.add_legacy_deployment(&legacy_deployment(&mc, 3));
    let sts = stateful_set.map(|(size, ready)| stateful_set_with_status(&mc, size, ready));
    if let Some(sts) = &sts {
        caches.add_stateful_set(sts.clone());
    }
    let observed = Observed {
        stateful_set: sts.as_ref().map(|s| s.seen()),
        legacy_ready: Some(3),
        ..Default::default()
    };
    mc.status = Some(status::desired_status(
        &mc,
        &observed,
        &crate::fixtures::time(0),
    ));
    mc
}

#[tokio::test]
async fn the_stateful_set_is_created_beside_the_deployment_which_stays() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = moving(&mut caches, None);
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        // Created, not deleted: the Deployment's pods serve until the members are available.
        let apply = api.echo("PATCH", STATEFUL_SET).await;
        assert_eq!(
            apply.body["metadata"]["resourceVersion"], "1",
            "create only"
        );
        assert_eq!(apply.body["spec"]["serviceName"], "cache");
        assert_eq!(apply.body["spec"]["replicas"], 3);
        let events = events_only(api.echo_any_order(1, &reported).await);
        assert_eq!(events[0].body["note"], "Created StatefulSet cache");
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn while_members_are_not_all_available_the_deployment_stays() {
    let (ctx, api, mut caches) = apiserver::context();
    // Two of three members Ready: together with the Deployment's pods the cache serves.
    let mc = moving(&mut caches, Some((3, 2)));
    assert_eq!(
        condition(&serde_json::to_value(&mc).unwrap(), AVAILABLE),
        ("True".into(), "Migrating".into())
    );
    // No DELETE (nor any other request): an unexpected one would time the reconcile out.
    let outcome = scenario(mc, ctx, api, |api| async move { api }).await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn once_every_member_is_available_the_deployment_is_deleted() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = moving(&mut caches, Some((3, 3)));
    assert_eq!(
        condition(&serde_json::to_value(&mc).unwrap(), PROGRESSING),
        ("True".into(), "Migrating".into())
    );
    let reported = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        let deployment = serde_json::to_value(legacy_deployment(&reported, 3)).unwrap();
        let deleted = api
            .expect("DELETE", DEPLOYMENT, StatusCode::OK, |_| deployment)
            .await;
        assert_eq!(
            deleted.body["preconditions"]["uid"], "uid-deployment",
            "only the Deployment that was seen"
        );
        let (events, status) = events_and_status(api.echo_any_order(2, &reported).await);
        let [event] = &events[..] else {
            panic!("one event: {}", events.len());
        };
        assert_eq!(event.body["reason"], "Replaced");
        assert_eq!(event.body["related"]["kind"], "Deployment");
        assert!(
            event.body["note"]
                .as_str()
                .unwrap()
                .contains("StatefulSet's members serve in its place"),
            "{}",
            event.body["note"]
        );
        // The move is over: the StatefulSet alone serves, and says so.
        assert_eq!(
            condition(&status.body, PROGRESSING),
            ("False".into(), "Converged".into())
        );
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("True".into(), "AllPodsReady".into())
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn creating_the_stateful_set_waits_for_a_rollout_slot() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut ctx = Arc::into_inner(ctx).expect("not shared yet");
    ctx.rollouts = Arc::new(Rollouts::new(1));
    assert!(ctx.rollouts.try_start("default", "other"), "the only slot");
    let mc = moving(&mut caches, None);
    let reported = mc.clone();
    let outcome = scenario(mc, Arc::new(ctx), api, |mut api| async move {
        // No StatefulSet yet: the Deployment's pods keep serving, and the status says why.
        let status = api.echo_status(STATUS, &reported).await;
        assert_eq!(
            condition(&status.body, PROGRESSING),
            ("True".into(), "RolloutQueued".into())
        );
        assert_eq!(
            condition(&status.body, AVAILABLE),
            ("True".into(), "Migrating".into())
        );
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::WaitingForRolloutSlot);
}
