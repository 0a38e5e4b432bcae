//! End-to-end tests on the local control plane (`make test-e2e`): real API server, admission,
//! RBAC, garbage collector, scheduler and kwok nodes; the operator runs as its own ServiceAccount.

// Shared with the real-node and chaos suites, which use parts this one does not.
#[allow(dead_code)]
mod harness;

mod adoption;
mod auth;
mod autoscaling;
mod binding;
mod cluster;
mod endpoints;
mod issuer;
mod members;
mod network_policy;
mod own_pods;
mod progress_deadline;
mod proxy;
mod tls;

use std::time::{Duration, Instant};

use harness::{
    CONVERGE, Operator, OperatorOptions, Rbac, admin, apply, condition, create, events_for,
    events_with_reason, kubectl, member_pods, memcached, namespace, set_size, wait_converged,
    wait_degraded, wait_for, wait_gone,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;

/// Whether `ns` has no `K` named `name`.
async fn absent<K>(client: &Client, ns: &str, name: &str) -> bool
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_none()
}

#[tokio::test]
async fn memcached_is_created_scaled_and_reported() {
    let client = admin().await;
    let ns = namespace(&client, "lifecycle").await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;

    create(&client, &ns, &memcached("cache", 3)).await;
    // Stable members: ordinals as a StatefulSet gives them, and each one's address under the
    // Service.
    let pods = wait_converged(&client, &ns, "cache", 3).await;
    assert_eq!(pods, ["cache-0", "cache-1", "cache-2"]);

    // Member pods owned by the Memcached itself, and a headless Service, with the restricted
    // security profile.
    let mc = Api::<Memcached>::namespaced(client.clone(), &ns)
        .get("cache")
        .await
        .unwrap();
    assert_eq!(
        mc.status.as_ref().unwrap().servers,
        (0..3)
            .map(|i| format!("cache-{i}.cache.{ns}.svc:11211"))
            .collect::<Vec<_>>()
    );
    for pod in member_pods(&client, &ns, "cache").await {
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Memcached", mc.uid().unwrap().as_str(), Some(true))
        );
        let pod_spec = pod.spec.unwrap();
        assert_eq!(
            pod_spec
                .security_context
                .unwrap()
                .seccomp_profile
                .unwrap()
                .type_,
            "RuntimeDefault"
        );
    }
    assert!(
        absent::<StatefulSet>(&client, &ns, "cache").await,
        "a new Memcached's members are the operator's own"
    );
    let svc = Api::<Service>::namespaced(client.clone(), &ns)
        .get("cache")
        .await
        .unwrap();
    assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    assert!(svc.metadata.owner_references.unwrap()[0].controller == Some(true));

    // What a user types.
    let (ok, out) = kubectl(&[
        "wait",
        "-n",
        &ns,
        "--for=condition=Available",
        "memcached/cache",
        "--timeout=30s",
    ])
    .await;
    assert!(ok, "kubectl wait: {out}");
    let (ok, out) = kubectl(&["get", "mc", "-n", &ns]).await;
    assert!(
        ok && out.contains("SIZE") && out.contains("READY") && out.contains("AVAILABLE"),
        "{out}"
    );

    // Scaling down removes the highest members: those left keep their names.
    for size in [5, 1, 0] {
        set_size(&client, &ns, "cache", size).await;
        let pods = wait_converged(&client, &ns, "cache", size).await;
        let members: Vec<String> = (0..size).map(|i| format!("cache-{i}")).collect();
        assert_eq!(pods, members);
    }

    // The scale subresource: kubectl scale and autoscalers.
    let (ok, out) = kubectl(&["scale", "-n", &ns, "memcached/cache", "--replicas=2"]).await;
    assert!(ok, "kubectl scale: {out}");
    wait_converged(&client, &ns, "cache", 2).await;
    let (ok, out) = kubectl(&[
        "get",
        "--raw",
        &format!("/apis/cache.example.com/v1alpha1/namespaces/{ns}/memcacheds/cache/scale"),
    ])
    .await;
    assert!(ok, "{out}");
    let scale: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(scale["status"]["replicas"], 2);
    assert_eq!(
        scale["status"]["selector"],
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
    );

    // Events on real changes.
    let reasons: Vec<String> = events_for(&client, &ns, "cache")
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    // What a reconcile created is one; each member deleted is one.
    assert!(reasons.iter().any(|r| r == "Created"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "Deleted"), "{reasons:?}");

    // Endpoints.
    assert_eq!(op.health("/healthz").await, Some(200));
    assert_eq!(op.health("/readyz").await, Some(200));
    assert!(op.reconciles().await >= 5.0, "{}", op.metrics_text().await);
    assert!(
        op.metrics_text()
            .await
            .contains("controller_runtime_reconcile_time_seconds_bucket")
    );
}

#[tokio::test]
async fn converged_memcached_makes_no_writes() {
    let client = admin().await;
    let ns = namespace(&client, "noop").await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("quiet", 2)).await;
    wait_converged(&client, &ns, "quiet", 2).await;
    // Ready pods become available after minReadySeconds, and the status reports that too.
    let mcs = Api::<Memcached>::namespaced(client.clone(), &ns);
    wait_for("both members available", CONVERGE, || async {
        (mcs.get("quiet").await.ok()?.status?.available_replicas == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mc = mcs.get("quiet").await.unwrap();
    let before = op.reconciles().await;

    // Touching a pod's labels triggers a reconcile; with nothing to change it must write nothing.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let members = member_pods(&client, &ns, "quiet").await;
    let patch = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
    let touched = pods
        .patch(
            &members[0].name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    wait_for(
        "a reconcile after the pod change",
        Duration::from_secs(20),
        || async { (op.reconciles().await > before).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let versions = |pods: &[Pod]| -> Vec<Option<String>> {
        pods.iter().map(|p| p.resource_version()).collect()
    };
    assert_eq!(
        versions(&member_pods(&client, &ns, "quiet").await),
        versions(&[touched, members[1].clone()]),
        "a member was written by a no-op reconcile"
    );
    assert_eq!(
        mc.resource_version(),
        mcs.get("quiet").await.unwrap().resource_version(),
        "status was written by a no-op reconcile"
    );
}

/// A restarted operator (or a new leader) digests every owned object from what the API server
/// stored, defaults and all: nothing in them may read as drift, or each restart applies every
/// object again and tells the user it was updated.
#[tokio::test]
async fn a_restarted_operator_finds_nothing_to_apply() {
    let client = admin().await;
    let ns = namespace(&client, "restarted").await;
    let mut first = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("kept", 2)).await;
    wait_converged(&client, &ns, "kept", 2).await;
    first.stop("TERM").await;

    let second = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    second.wait_reconciled(1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        second.reconciles().await >= 1.0,
        "the new process reconciled"
    );
    let updated: Vec<String> = events_with_reason(&client, &ns, "kept", "Updated")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert!(updated.is_empty(), "{updated:?}");
}

#[tokio::test]
async fn drift_is_put_back() {
    let client = admin().await;
    let ns = namespace(&client, "drift").await;
    // The members are made again when lost (own_pods.rs); here, the Service.
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 2)).await;
    wait_converged(&client, &ns, "cache", 2).await;

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let (ok, out) = kubectl(&[
        "label",
        "-n",
        &ns,
        "service/cache",
        "--overwrite",
        "app.kubernetes.io/instance=theirs",
    ])
    .await;
    assert!(ok, "{out}");
    wait_for("the label put back", Duration::from_secs(20), || async {
        let labels = services.get("cache").await.ok()?.metadata.labels?;
        (labels.get("app.kubernetes.io/instance")? == "cache").then_some(())
    })
    .await;

    let old_uid = services.get("cache").await.unwrap().uid();
    services
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the Service made again",
        Duration::from_secs(20),
        || async {
            let s = services.get_opt("cache").await.ok()??;
            (s.uid() != old_uid && s.metadata.deletion_timestamp.is_none()).then_some(())
        },
    )
    .await;
    wait_converged(&client, &ns, "cache", 2).await;
    let notes: Vec<String> = events_with_reason(&client, &ns, "cache", "Updated")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n == "Updated Service cache to match the Memcached spec"),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_pod_in_a_members_name_is_left_alone() {
    let client = admin().await;
    let ns = namespace(&client, "foreign-pod").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    // A StatefulSet of the Memcached's name holds cache-0: the members leave that pod alone
    // and say so; the others run.
    let in_the_way = left_alone(&client, &ns, "Pod").await;
    assert!(
        in_the_way.contains(&format!("Pod {ns}/cache-0")),
        "{in_the_way}"
    );
    let theirs = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("cache-0")
        .await
        .unwrap();
    assert_eq!(
        theirs.metadata.owner_references.unwrap()[0].kind,
        "StatefulSet"
    );
    assert!(
        !theirs
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some("memcached-operator")),
        "the operator wrote to their pod"
    );
    wait_for("the other members", CONVERGE, || async {
        let mine: Vec<String> = member_pods(&client, &ns, "cache")
            .await
            .iter()
            .map(|p| p.name_any())
            .collect();
        (mine == ["cache-1", "cache-2"]).then_some(())
    })
    .await;
    // Its recheck finds the name free: no event says so.
    converges_once_theirs_goes(&client, &ns).await;
}

/// Once their StatefulSet is gone, the Memcached converges.
async fn converges_once_theirs_goes(client: &Client, ns: &str) {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    wait_converged(client, ns, "cache", 3).await;
}

/// Someone else's StatefulSet `cache` with one pod (`cache-0`) in `ns`, then a Memcached
/// `cache` of 3: it reports ResourceExists, a Warning event naming `what` is in the way, and
/// the StatefulSet is never written to. The event's note.
async fn left_alone(client: &Client, ns: &str, what: &str) -> String {
    let client = client.clone();
    let ns = ns.to_string();

    let foreign: StatefulSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "cache", "namespace": ns, "labels": {"team": "other"}},
        "spec": {"replicas": 1, "serviceName": "theirs", "selector": {"matchLabels": {"app": "theirs"}},
                 "template": {"metadata": {"labels": {"app": "theirs"}},
                              "spec": {"containers": [{"name": "c", "image": "theirs:1"}]}}}
    }))
    .unwrap();
    let stateful_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let before = apply(&stateful_sets, &foreign).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for("their pod cache-0", CONVERGE, || async {
        pods.get_opt("cache-0").await.ok()?
    })
    .await;

    create(&client, &ns, &memcached("cache", 3)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "Degraded=True ResourceExists",
        Duration::from_secs(30),
        || async {
            let mc = mcs.get("cache").await.ok()?;
            (condition(&mc, "Degraded")? == ("True".into(), "ResourceExists".into())).then_some(())
        },
    )
    .await;
    let warning = wait_for("a Warning event", Duration::from_secs(10), || async {
        events_for(&client, &ns, "cache")
            .await
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("ResourceExists")
            })
    })
    .await;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains(what),
        "the event names what is in the way: {note}"
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = stateful_sets.get("cache").await.unwrap();
    // Its status moves on as its own pods start; its spec and metadata must not.
    assert_eq!(
        before.metadata.generation, after.metadata.generation,
        "foreign StatefulSet spec was modified"
    );
    assert_eq!(before.metadata.labels, after.metadata.labels);
    let managers: Vec<_> = after
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m == "memcached-operator"),
        "the operator wrote to it: {managers:?}"
    );
    assert!(after.metadata.owner_references.is_none());
    note
}

#[tokio::test]
async fn deleting_a_memcached_garbage_collects_what_it_owns() {
    let client = admin().await;
    let ns = namespace(&client, "gc").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 2)).await;
    wait_converged(&client, &ns, "cache", 2).await;

    Api::<Memcached>::namespaced(client.clone(), &ns)
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "StatefulSet, Service and pods garbage-collected",
        Duration::from_secs(60),
        || async {
            let d = Api::<StatefulSet>::namespaced(client.clone(), &ns)
                .get_opt("cache")
                .await
                .ok()?;
            let s = Api::<Service>::namespaced(client.clone(), &ns)
                .get_opt("cache")
                .await
                .ok()?;
            let pods = Api::<Pod>::namespaced(client.clone(), &ns)
                .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
                .await
                .ok()?;
            (d.is_none() && s.is_none() && pods.items.is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_namespace_being_deleted_is_not_a_failure() {
    let client = admin().await;
    let ns = namespace(&client, "ns-deleted").await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 2)).await;
    wait_converged(&client, &ns, "cache", 2).await;
    // Reconciles of the last pod changes have run.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The namespace controller deletes what is in a namespace in no set order; held here, the
    // Memcached outlives its members, as it can by chance.
    let policy = format!("keep-memcacheds-{ns}");
    admission_policy(
        &client,
        &policy,
        &ns,
        serde_json::json!({
            "apiGroups": ["cache.example.com"], "apiVersions": ["v1alpha1"],
            "operations": ["DELETE"], "resources": ["memcacheds"]}),
        serde_json::json!({"expression": "false", "message": "kept until the test ends"}),
    )
    .await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    wait_for("the policy to deny", Duration::from_secs(30), || async {
        let dry_run = DeleteParams {
            dry_run: true,
            ..Default::default()
        };
        mcs.delete("cache", &dry_run).await.is_err().then_some(())
    })
    .await;
    let reconciles = || async {
        let series = |result: &str| {
            format!(
                r#"controller_runtime_reconcile_total{{controller="memcached",result="{result}"}}"#
            )
        };
        op.metric(&series("success")).await + op.metric(&series("error")).await
    };
    let before = reconciles().await;

    Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the members deleted with the namespace",
        CONVERGE,
        || async {
            member_pods(&client, &ns, "cache")
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    // The operator sees its members go and reconciles the Memcached still there: creating them
    // again is refused, which is no failure to retry or alert on.
    wait_for("a reconcile after the deletion", CONVERGE, || async {
        (reconciles().await > before).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    op.assert_no_failed_reconciles().await;
    assert!(
        member_pods(&client, &ns, "cache").await.is_empty(),
        "nothing was created in the namespace being deleted"
    );
    let mc = mcs.get("cache").await.unwrap();
    assert_eq!(
        condition(&mc, "Degraded").map(|c| c.1).as_deref(),
        Some("AsExpected"),
        "nothing to report of a namespace being deleted"
    );

    remove_admission_policy(&client, &policy).await;
    let namespaces = Api::<Namespace>::all(client.clone());
    wait_gone(
        "the namespace gone",
        Duration::from_secs(120),
        &namespaces,
        &ns,
    )
    .await;
}

#[tokio::test]
async fn invalid_memcacheds_are_refused_naming_the_field() {
    let client = admin().await;
    let ns = namespace(&client, "invalid").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let raw: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<Memcached>(&()),
    );
    let cases = [
        (serde_json::json!({"size": -1}), "spec.size"),
        (serde_json::json!({"size": 1001}), "spec.size"),
        (serde_json::json!({"size": "three"}), "spec.size"),
        (serde_json::json!({}), "spec.size"),
        (
            serde_json::json!({"size": 1, "containerPort": 70000}),
            "spec.containerPort",
        ),
        (
            serde_json::json!({"size": 1, "maxMemoryMiB": 0}),
            "spec.maxMemoryMiB",
        ),
        (
            serde_json::json!({"size": 1, "resources": {"limits": {"memory": "1".repeat(70)}}}),
            "spec.resources.limits.memory",
        ),
        (
            serde_json::json!({"size": 1, "resources": {"requests": {"cpu": "-1"}}}),
            "spec.resources.requests[cpu]",
        ),
        (
            serde_json::json!({"size": 1, "resources": {"limits": {"memory": -5}}}),
            "spec.resources.limits[memory]",
        ),
        (
            serde_json::json!({"size": 1, "resources": {"requests": {"memory": "lots"}}}),
            "spec.resources.requests[memory]",
        ),
        (
            serde_json::json!({"size": 1, "threads": -1}),
            "spec.threads",
        ),
        (
            serde_json::json!({"size": 1, "maxConnections": 0}),
            "spec.maxConnections",
        ),
        (
            serde_json::json!({"size": 1, "maxMemoryMiB": 64, "maxItemSizeMiB": 40}),
            "spec.maxItemSizeMiB",
        ),
        (
            serde_json::json!({"size": 1, "rollout": {"maxUnavailable": -1}}),
            "spec.rollout.maxUnavailable",
        ),
        (
            serde_json::json!({"size": 1, "containerPort": 9150, "monitoring": {"enabled": true}}),
            "spec.containerPort",
        ),
        (
            serde_json::json!({"size": 1, "monitoring": {"enabled": true, "image": ""}}),
            "spec.monitoring.image",
        ),
        (
            serde_json::json!({"size": 1, "podDisruptionBudget": {"maxUnavailable": 0}}),
            "spec.podDisruptionBudget.maxUnavailable",
        ),
        (
            serde_json::json!({"size": 1, "podLabels": {"app.kubernetes.io/instance": "other"}}),
            "spec.podLabels",
        ),
        (
            serde_json::json!({"size": 1, "spread": "Sometimes"}),
            "spec.spread",
        ),
    ];
    for (i, (spec, field)) in cases.into_iter().enumerate() {
        let obj: kube::core::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
            "metadata": {"name": format!("bad-{i}")}, "spec": spec,
        }))
        .unwrap();
        let err = raw
            .create(&PostParams::default(), &obj)
            .await
            .expect_err(&format!("{spec} must be refused"));
        let kube::Error::Api(status) = err else {
            panic!("{err}")
        };
        assert_eq!(status.code, 422, "{status:?}");
        assert!(
            status.message.contains(field),
            "message for {spec} does not name {field}: {}",
            status.message
        );
    }
    assert!(
        mcs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was stored"
    );

    let (ok, out) = kubectl(&["explain", "memcached.spec.size"]).await;
    assert!(ok && out.contains("Number of memcached pods"), "{out}");
}

#[tokio::test]
async fn memory_limit_below_the_cache_size_is_reported_not_applied() {
    let client = admin().await;
    let ns = namespace(&client, "memory").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 1)).await;
    wait_converged(&client, &ns, "cache", 1).await;

    let patch = serde_json::json!({"spec": {"maxMemoryMiB": 128, "resources": {"limits": {"memory": "64Mi"}}}});
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    mcs.patch(
        "cache",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let message = wait_degraded(&mcs, "cache", "InvalidSpec", Duration::from_secs(20)).await;
    assert!(
        message.contains("spec.resources.limits.memory") && message.contains("spec.maxMemoryMiB"),
        "{message}"
    );
    let members = member_pods(&client, &ns, "cache").await;
    let limits: Vec<_> = members
        .iter()
        .flat_map(|p| &p.spec.as_ref().unwrap().containers)
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("memory"))
        .map(|q| q.0.as_str())
        .collect();
    assert!(
        members.len() == 1 && !limits.contains(&"64Mi"),
        "an unworkable spec was applied: {limits:?}"
    );
    // Events go out in the background, after the status: under load, a moment later.
    wait_for(
        "an InvalidSpec warning event",
        Duration::from_secs(10),
        || async {
            events_for(&client, &ns, "cache")
                .await
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("InvalidSpec"))
                .then_some(())
        },
    )
    .await;
    let mc = mcs.get("cache").await.unwrap();
    assert_eq!(
        condition(&mc, "Available").map(|c| c.0).as_deref(),
        Some("True"),
        "the running pod still serves"
    );

    let fix =
        serde_json::json!({"spec": {"size": 2, "resources": {"limits": {"memory": "160Mi"}}}});
    mcs.patch(
        "cache",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&fix),
    )
    .await
    .unwrap();
    wait_converged(&client, &ns, "cache", 2).await;
}

#[tokio::test]
async fn watch_namespace_limits_the_operator_to_its_namespaces() {
    let client = admin().await;
    let watched = namespace(&client, "watched").await;
    let other = namespace(&client, "ignored").await;
    // Namespaced RBAC only, as OLM grants for OwnNamespace/SingleNamespace installs.
    let options = OperatorOptions {
        rbac: Rbac::Namespaces(vec![watched.clone()]),
        watch_namespace: Some(watched.clone()),
        ..Default::default()
    };
    let op = Operator::start(&client, options).await;
    create(&client, &other, &memcached("cache", 1)).await;
    create(&client, &watched, &memcached("cache", 1)).await;
    wait_converged(&client, &watched, "cache", 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        absent::<Service>(&client, &other, "cache").await,
        "a Memcached outside WATCH_NAMESPACE was reconciled"
    );
    assert_eq!(op.health("/readyz").await, Some(200));
    let log = op.log_text();
    assert!(
        !log.contains("forbidden"),
        "namespaced RBAC was not enough:\n{log}"
    );
}

#[tokio::test]
async fn multi_namespace_install_reconciles_each_listed_namespace() {
    let client = admin().await;
    let first = namespace(&client, "multi-a").await;
    let second = namespace(&client, "multi-b").await;
    let other = namespace(&client, "multi-ignored").await;
    // OLM's MultiNamespace mode: a Role in each target namespace, WATCH_NAMESPACE a comma list.
    let options = OperatorOptions {
        rbac: Rbac::Namespaces(vec![first.clone(), second.clone()]),
        watch_namespace: Some(format!("{first},{second}")),
        ..Default::default()
    };
    let op = Operator::start(&client, options).await;
    create(&client, &other, &memcached("cache", 1)).await;
    create(&client, &first, &memcached("cache", 1)).await;
    create(&client, &second, &memcached("cache", 2)).await;
    wait_converged(&client, &first, "cache", 1).await;
    wait_converged(&client, &second, "cache", 2).await;
    // Changes keep flowing in every listed namespace, not just the first one watched.
    set_size(&client, &second, "cache", 3).await;
    wait_converged(&client, &second, "cache", 3).await;
    assert!(
        absent::<Service>(&client, &other, "cache").await,
        "a Memcached outside WATCH_NAMESPACE was reconciled"
    );
    assert_eq!(op.health("/readyz").await, Some(200));
    let log = op.log_text();
    assert!(
        !log.contains("forbidden"),
        "per-namespace RBAC was not enough:\n{log}"
    );
}

#[tokio::test]
async fn one_leader_reconciles_and_hands_over() {
    let client = admin().await;
    let ns = namespace(&client, "leader").await;
    let lease = format!("lock-{ns}");
    // Only this test's Memcacheds: a reconcile of another test's, in flight at SIGTERM, would
    // hold the release for as long as it runs (the drain comes first).
    let options = || OperatorOptions {
        leader_elect: true,
        lease: lease.clone(),
        ..OperatorOptions::watching(&ns)
    };
    let mut first = Operator::start(&client, options()).await;
    wait_for("a leader", Duration::from_secs(20), || async {
        first.is_leader(&lease).await.then_some(())
    })
    .await;
    let second = Operator::replica(&first, &options()).await;
    create(&client, &ns, &memcached("a", 1)).await;
    wait_converged(&client, &ns, "a", 1).await;
    assert!(!second.is_leader(&lease).await);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), harness::OPERATOR_NAMESPACE);
    let holder = leases
        .get(&lease)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    assert_eq!(holder.as_deref(), Some(first.identity.as_str()));
    assert_eq!(second.reconciles().await, 0.0, "the follower reconciled");
    assert_eq!(
        second.health("/readyz").await,
        Some(200),
        "followers are ready"
    );
    assert_eq!(first.health("/readyz").await, Some(200));

    // SIGKILL: the lease must expire before the follower takes over.
    let killed = Instant::now();
    first.signal("KILL");
    first.wait().await;
    create(&client, &ns, &memcached("b", 1)).await;
    wait_for(
        "the follower to take over",
        Duration::from_secs(40),
        || async { second.is_leader(&lease).await.then_some(()) },
    )
    .await;
    wait_converged(&client, &ns, "b", 1).await;
    let kill_gap = killed.elapsed();

    // SIGTERM: the leader drains, releases the lease, and a follower takes over at once.
    let third = Operator::replica(&second, &options()).await;
    let mut second = second;
    let termed = Instant::now();
    second.signal("TERM");
    wait_for(
        "the third process to lead",
        Duration::from_secs(20),
        || async { third.is_leader(&lease).await.then_some(()) },
    )
    .await;
    let term_gap = termed.elapsed();
    assert_eq!(second.wait().await, Some(0), "a graceful shutdown exits 0");
    create(&client, &ns, &memcached("c", 1)).await;
    wait_converged(&client, &ns, "c", 1).await;

    // Holder changes are counted as client-go counts them: the KILL takeover and the TERM one.
    let transitions = leases
        .get(&lease)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(2), "leaseTransitions after two takeovers");

    println!(
        "leader handover: SIGKILL -> new leader reconciled in {kill_gap:?}; SIGTERM -> new leader in {term_gap:?}"
    );
    // Without expiry (15 s lease) no takeover can happen earlier; with release, no wait for it.
    assert!(
        kill_gap >= Duration::from_secs(10),
        "took over before the lease could expire: {kill_gap:?}"
    );
    assert!(
        term_gap < Duration::from_secs(5),
        "release on SIGTERM did not hand over promptly: {term_gap:?}; the old leader's log ends:\n{}",
        second.log_tail(30)
    );
}

/// Accepts OTLP/HTTP export requests and reports the path and content type of each.
async fn fake_otlp_collector() -> (u16, tokio::sync::mpsc::UnboundedReceiver<(String, String)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 20];
                let mut len = 0;
                // Read the head, then the body by Content-Length.
                let (head, body_len) = loop {
                    let n = stream.read(&mut buf[len..]).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    len += n;
                    let text = String::from_utf8_lossy(&buf[..len]).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let head = text[..end].to_lowercase();
                        let cl = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0usize);
                        break (head.clone(), end + 4 + cl);
                    }
                };
                while len < body_len {
                    let n = stream.read(&mut buf[len..]).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    len += n;
                }
                let path = head
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                let content_type = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-type:"))
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                let _ = tx.send((path, content_type));
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    (port, rx)
}

#[tokio::test]
async fn reconcile_traces_are_exported_over_otlp() {
    let client = admin().await;
    let ns = namespace(&client, "otlp").await;
    let (port, mut exports) = fake_otlp_collector().await;
    let options = OperatorOptions {
        watch_namespace: Some(ns.clone()),
        env: vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://127.0.0.1:{port}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "500".into()),
        ],
        ..Default::default()
    };
    let op = Operator::start(&client, options).await;
    create(&client, &ns, &memcached("traced", 1)).await;
    wait_converged(&client, &ns, "traced", 1).await;
    let (path, content_type) = tokio::time::timeout(Duration::from_secs(30), exports.recv())
        .await
        .expect("no OTLP export within 30s")
        .unwrap();
    assert_eq!(
        (path.as_str(), content_type.as_str()),
        ("/v1/traces", "application/x-protobuf")
    );
    let log = op.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("reconcile{") && l.contains("trace_id=")),
        "no trace id in logs:\n{log}"
    );
}

/// Status code of an HTTPS GET through curl (the certificate is self-signed), with a token.
async fn curl_status(url: &str, token: Option<&str>) -> (String, String) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sk", "-w", "\n%{http_code}", url]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.output().await.expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_string(), body.to_string())
}

async fn token_for(client: &Client, name: &str) -> String {
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), harness::OPERATOR_NAMESPACE);
    let sa = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    apply(&sas, &sa).await;
    let (ok, out) = kubectl(&["create", "token", "-n", harness::OPERATOR_NAMESPACE, name]).await;
    assert!(ok, "{out}");
    out.trim().to_string()
}

#[tokio::test]
async fn secure_metrics_admit_only_authorized_scrapers() {
    let client = admin().await;
    let options = OperatorOptions {
        extra_args: vec!["--metrics-secure".into()],
        ..Default::default()
    };
    let op = Operator::start(&client, options).await;
    let scraper = format!("scraper-{:06x}", rand::random::<u32>() & 0xff_ffff);
    harness::bind_cluster_role(
        &client,
        &scraper,
        harness::shipped_rules("metrics_reader_role.yaml"),
        &scraper,
        harness::OPERATOR_NAMESPACE,
    )
    .await;
    let allowed = token_for(&client, &scraper).await;
    let denied = token_for(
        &client,
        &format!("nobody-{:06x}", rand::random::<u32>() & 0xff_ffff),
    )
    .await;
    let url = format!("https://127.0.0.1:{}/metrics", op.metrics_port);

    assert_eq!(curl_status(&url, None).await.0, "401");
    // The operator's own TokenReview permission was granted a moment ago; until the API server's
    // RBAC cache has it, reviews fail closed (403).
    wait_for(
        "RBAC for TokenReview in effect",
        Duration::from_secs(15),
        || async { (curl_status(&url, Some("not-a-token")).await.0 == "401").then_some(()) },
    )
    .await;
    assert_eq!(curl_status(&url, Some(&denied)).await.0, "403");
    let (code, body) = curl_status(&url, Some(&allowed)).await;
    assert_eq!(code, "200");
    assert!(
        body.contains("controller_runtime_reconcile_total"),
        "{body}"
    );
    // Plain HTTP is not served on the secure port.
    assert_ne!(
        curl_status(
            &format!("http://127.0.0.1:{}/metrics", op.metrics_port),
            None
        )
        .await
        .0,
        "200"
    );
}

/// A ValidatingAdmissionPolicy denying memcached images tagged "untrusted" in `ns`: something
/// only the API server's answer reveals, as a cluster's own policies are.
async fn deny_untrusted_images(client: &Client, ns: &str) {
    admission_policy(
        client,
        &format!("untrusted-images-{ns}"),
        ns,
        serde_json::json!({
            "apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}),
        serde_json::json!({
            "expression": "object.spec.containers.all(c, !c.image.endsWith(':untrusted'))",
            "message": "images tagged untrusted are not allowed in this namespace"}),
    )
    .await;
    // The policy takes effect once the API server's informers have it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut probe: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "memcached:untrusted"}]}
    }))
    .unwrap();
    probe.metadata.namespace = Some(ns.into());
    wait_for("the policy to deny", Duration::from_secs(30), || async {
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        pods.create(&dry_run, &probe).await.is_err().then_some(())
    })
    .await;
}

/// Applies a ValidatingAdmissionPolicy named `name` with one rule and one validation, bound to
/// namespace `ns`; `remove_admission_policy(name)` takes both away.
async fn admission_policy(
    client: &Client,
    name: &str,
    ns: &str,
    rule: serde_json::Value,
    validation: serde_json::Value,
) {
    let objects = [
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [validation]
            }
        }),
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
            }
        }),
    ];
    for object in objects {
        let object: kube::core::DynamicObject = serde_json::from_value(object).unwrap();
        apply(
            &admission_api(client, object.types.as_ref().unwrap()),
            &object,
        )
        .await;
    }
}

/// Deletes the binding and the policy `admission_policy` applied.
async fn remove_admission_policy(client: &Client, name: &str) {
    for kind in [
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
    ] {
        let types = kube::core::TypeMeta {
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
        };
        admission_api(client, &types)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
}

fn admission_api(client: &Client, types: &kube::core::TypeMeta) -> Api<kube::core::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::try_from(types).unwrap();
    Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::from_gvk(&gvk),
    )
}

#[tokio::test]
async fn a_member_the_api_server_refuses_is_reported_not_retried_hot() {
    let client = admin().await;
    let ns = namespace(&client, "refused").await;
    deny_untrusted_images(&client, &ns).await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut mc = memcached("cache", 2);
    mc.spec.image = Some("memcached:untrusted".into());
    create(&client, &ns, &mc).await;

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let degraded = wait_degraded(&mcs, "cache", "PodCreationRefused", CONVERGE).await;
    assert!(
        degraded.contains("images tagged untrusted are not allowed in this namespace"),
        "the server's message is on the Memcached: {degraded}"
    );
    let (ok, out) = kubectl(&["get", "mc", "-n", &ns, "cache"]).await;
    assert!(
        ok && out.contains("False"),
        "kubectl get mc shows it: {out}"
    );

    // Not retried hot: rechecked every few seconds, not at the backoff's pace, and said once.
    let before = op.reconciles().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reconciles = op.reconciles().await - before;
    assert!(reconciles <= 4.0, "reconciles in 10 s: {reconciles}");
    let warnings: Vec<_> = events_for(&client, &ns, "cache")
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect();
    assert_eq!(warnings.len(), 1, "one Warning event: {warnings:?}");
    assert_eq!(warnings[0].reason.as_deref(), Some("PodCreationRefused"));
    assert!(
        member_pods(&client, &ns, "cache").await.is_empty(),
        "nothing was created"
    );
    let stored = mcs.get("cache").await.unwrap();
    assert_eq!(
        stored.spec.image.as_deref(),
        Some("memcached:untrusted"),
        "what the user wrote is kept"
    );

    // The next spec change is taken at once.
    let fix = serde_json::json!({"spec": {"image": null}});
    mcs.patch(
        "cache",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&fix),
    )
    .await
    .unwrap();
    wait_converged(&client, &ns, "cache", 2).await;
    let mc = mcs.get("cache").await.unwrap();
    assert_eq!(
        condition(&mc, "Degraded"),
        Some(("False".into(), "AsExpected".into()))
    );
}

#[tokio::test]
async fn every_admitted_spec_yields_objects_the_api_server_accepts() {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    use memcached_operator::validation::validate;
    use memcached_operator::{arbitrary, resources};
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRng, TestRunner};

    let client = admin().await;
    let ns = namespace(&client, "property").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let revisions: Api<k8s_openapi::api::apps::v1::ControllerRevision> =
        Api::namespaced(client.clone(), &ns);
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let mut made_classes = vec![];
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let apply = kube::api::PatchParams::apply("memcached-operator")
        .force()
        .dry_run();
    // A fixed seed: a failure names a spec that fails again on the next run.
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[7; 32]),
    );
    let (mut cases, mut valid) = (0, 0);
    for i in 0..60 {
        let spec = arbitrary::spec().new_tree(&mut runner).unwrap().current();
        let mut mc = Memcached::new(&format!("prop-{i}"), spec.clone());
        mc.metadata.namespace = Some(ns.clone());
        // Admission: the schema admits every generated spec.
        let admitted = mcs
            .create(&dry_run, &mc)
            .await
            .unwrap_or_else(|e| panic!("admission refused {spec:?}: {e}"));
        cases += 1;
        if validate(&spec).is_err() {
            continue;
        }
        valid += 1;
        mc.metadata.uid = admitted.metadata.uid.or(Some(format!("uid-{i}")));
        let template = resources::pod_template(&mc, &resources::Images::default());
        // A member of that template, and its revision. A pod's admission also wants its
        // PriorityClass to exist, which is the cluster's to have.
        if let Some(name) = &spec.priority_class_name {
            let class: PriorityClass =
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "value": 0}))
                    .unwrap();
            match classes.create(&PostParams::default(), &class).await {
                Ok(_) => made_classes.push(name.clone()),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("PriorityClass {name}: {e}"),
            }
        }
        let revision = resources::members::revision(&mc, &template);
        let member = memcached_operator::controller::member(&mc, &template, &revision, 0);
        // The Priority admission plugin reads PriorityClasses from its informer: one just made
        // may not be there for a moment.
        let mut tries = 0;
        let admitted = loop {
            match pods.create(&dry_run, &member).await {
                Err(kube::Error::Api(e))
                    if e.message.contains("no PriorityClass with name") && tries < 50 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other,
            }
        };
        admitted.unwrap_or_else(|e| panic!("the API server refused the member for {spec:?}: {e}"));
        let history = resources::members::controller_revision(&mc, &template, &revision);
        revisions
            .create(&dry_run, &history)
            .await
            .unwrap_or_else(|e| panic!("the API server refused the revision for {spec:?}: {e}"));
        let s = resources::service(&mc);
        services
            .patch(&s.name_any(), &apply, &kube::api::Patch::Apply(&s))
            .await
            .unwrap_or_else(|e| panic!("the API server refused the Service for {spec:?}: {e}"));
        if let Some(b) = resources::pod_disruption_budget(&mc) {
            budgets
                .patch(&b.name_any(), &apply, &kube::api::Patch::Apply(&b))
                .await
                .unwrap_or_else(|e| panic!("the API server refused the budget for {spec:?}: {e}"));
        }
        if let Some(p) = resources::network_policy(&mc, None) {
            policies
                .patch(&p.name_any(), &apply, &kube::api::Patch::Apply(&p))
                .await
                .unwrap_or_else(|e| panic!("the API server refused the policy for {spec:?}: {e}"));
        }
    }
    for name in made_classes {
        classes
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    println!("{cases} generated specs admitted; {valid} passed validation and were accepted");
    assert!(valid >= 20, "too few valid specs to mean anything: {valid}");
}

/// A kwok node of this test's own, tainted so that only pods that ask for it land there.
async fn dedicated_node(client: &Client, name: &str, pool: &str, schedulable: bool) {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "pool": pool},
        },
        "spec": {
            "unschedulable": !schedulable,
            "taints": [{"key": "pool", "value": pool, "effect": "NoSchedule"}],
        },
        "status": {
            "allocatable": {"cpu": "100", "memory": "100Gi", "pods": "110"},
            "capacity": {"cpu": "100", "memory": "100Gi", "pods": "110"},
        },
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
}

#[tokio::test]
async fn a_drain_evicts_one_memcached_pod_at_a_time() {
    let client = admin().await;
    let ns = namespace(&client, "drain").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let (from, to) = (format!("{ns}-a"), format!("{ns}-b"));
    dedicated_node(&client, &from, &ns, true).await;
    dedicated_node(&client, &to, &ns, false).await;
    let nodes: Api<Node> = Api::all(client.clone());

    // All three pods on one node, through the scheduling fields (nothing else may land there).
    let mut mc = memcached("cache", 3);
    mc.spec.node_selector = Some([("pool".to_string(), ns.clone())].into());
    mc.spec.tolerations = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"key": "pool", "operator": "Equal", "value": ns, "effect": "NoSchedule"}
        ))
        .unwrap(),
    ]);
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    // The disruption controller's count (kube-controller-manager's). Right after the CRD is
    // installed its RESTMapper does not know the Memcached that owns the pods (it is reset every
    // 30 s), and a budget that fails so is tried again only on a change: a change of the
    // budget's annotations (none of them ours) brings that.
    wait_for("the budget to allow one disruption", CONVERGE, || async {
        let b = budgets.get("cache").await.ok()?;
        let status = b.status?;
        let failed = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.reason == "SyncFailed");
        if failed {
            let nudge = serde_json::json!({"metadata": {"annotations": {
                "e2e.memcached-operator/resync": std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
                    .to_string()}}});
            budgets
                .patch(
                    "cache",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&nudge),
                )
                .await
                .ok()?;
        }
        (status.disruptions_allowed == 1 && status.current_healthy == 3).then_some(())
    })
    .await;

    // The Eviction API: one pod may go; while it is down (its replacement has nowhere to run,
    // both nodes being cordoned), the next is refused.
    let cordon =
        |unschedulable: bool| serde_json::json!({"spec": {"unschedulable": unschedulable}});
    nodes
        .patch(
            &from,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cordon(true)),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // kube's client retries 429 for minutes; a refused eviction must be seen as the API says it.
    let mut config = harness::cluster().admin_config().await.unwrap();
    config.default_retry = false;
    let evictions: Api<Pod> = Api::namespaced(Client::try_from(config).unwrap(), &ns);
    let names: Vec<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
        .await
        .unwrap()
        .iter()
        .map(|p| p.name_any())
        .collect();
    let evict = |name: String| {
        let evictions = evictions.clone();
        async move {
            evictions
                .evict(&name, &kube::api::EvictParams::default())
                .await
        }
    };
    evict(names[0].clone())
        .await
        .expect("the first eviction is allowed");
    match evict(names[1].clone()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429, "{status:?}");
            assert!(
                status.message.contains("disruption budget"),
                "{}",
                status.message
            );
        }
        other => panic!("the second eviction must be refused while one pod is down: {other:?}"),
    }

    // With room on the other node the replacement runs there; then a drain moves the other two
    // one at a time.
    nodes
        .patch(
            &to,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&cordon(false)),
        )
        .await
        .unwrap();
    wait_converged(&client, &ns, "cache", 3).await;
    let watching = tokio::spawn({
        let (pods, to) = (pods.clone(), to.clone());
        async move {
            let mut fewest = i32::MAX;
            loop {
                let list = pods
                    .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
                    .await
                    .unwrap();
                let ready = list.iter().filter(|p| is_ready(p)).count() as i32;
                fewest = fewest.min(ready);
                let moved = list.iter().filter(|p| is_ready(p)).all(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(to.as_str())
                });
                if moved && ready == 3 {
                    return fewest;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let started = Instant::now();
    let (ok, out) = kubectl(&[
        "drain",
        &from,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ])
    .await;
    assert!(ok, "kubectl drain: {out}");
    let fewest = tokio::time::timeout(CONVERGE, watching)
        .await
        .expect("every pod moved to the other node")
        .unwrap();
    println!(
        "drain: {:.1} s, at least {fewest} of 3 pods ready throughout",
        started.elapsed().as_secs_f64()
    );
    assert!(fewest >= 2, "the drain took {} pods at once", 3 - fewest);
    assert!(
        out.matches("evicted").count() >= 2,
        "kubectl evicted each pod left on the node: {out}"
    );
    for node in [from, to] {
        nodes.delete(&node, &DeleteParams::default()).await.ok();
    }
}

fn is_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && harness::pod_is_ready(p)
}

#[tokio::test]
async fn an_operator_upgrade_rolls_memcacheds_one_budget_at_a_time() {
    let client = admin().await;
    let ns = namespace(&client, "upgrade").await;
    let options = |image: &str, extra: &[&str]| {
        let mut options = OperatorOptions::watching(&ns);
        options.env = vec![("RELATED_IMAGE_MEMCACHED".into(), image.into())];
        options
            .extra_args
            .extend(extra.iter().map(|s| s.to_string()));
        options
    };
    let names = ["a", "b", "c"];
    let old = Operator::start(&client, options("memcached:old", &[])).await;
    let mut made = vec![];
    for name in names {
        made.push(create(&client, &ns, &memcached(name, 1)).await);
    }
    for name in names {
        wait_converged(&client, &ns, name, 1).await;
    }
    drop(old);

    // The new operator version brings a new default image; one Memcached may roll at a time.
    // Rolling: its member runs the new image and has not yet taken the new revision.
    let new_revision = |mc: &Memcached| {
        let images = memcached_operator::resources::Images::new("memcached:new");
        let template = memcached_operator::resources::pod_template(mc, &images);
        memcached_operator::resources::members::revision(mc, &template)
    };
    let _new = Operator::start(
        &client,
        options("memcached:new", &["--max-concurrent-rollouts=1"]),
    )
    .await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    let (mut most_rolling, mut queued_seen) = (0, false);
    loop {
        let mut rolling = 0;
        let mut done = 0;
        for mc in &made {
            let pods = member_pods(&client, &ns, &mc.name_any()).await;
            let image = |p: &Pod| {
                p.spec.as_ref().unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap_or_default()
            };
            let updated =
                |p: &Pod| p.labels().get("controller-revision-hash") == Some(&new_revision(mc));
            if pods
                .iter()
                .any(|p| image(p) == "memcached:new" && !updated(p))
            {
                rolling += 1;
            }
            if pods.len() == 1 && pods.iter().all(|p| updated(p) && is_ready(p)) {
                done += 1;
            }
        }
        most_rolling = most_rolling.max(rolling);
        queued_seen |= mcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .iter()
            .any(|mc| {
                condition(mc, "Progressing").is_some_and(|(_, reason)| reason == "RolloutQueued")
            });
        if done == names.len() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the upgrade did not finish: {done} of {} done",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "upgrade of {} Memcacheds: {:.1} s, at most {most_rolling} rolling at once",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(most_rolling, 1, "one Memcached rolled at a time");
    assert!(
        queued_seen,
        "the waiting Memcacheds said so (Progressing RolloutQueued)"
    );
    for name in names {
        wait_converged(&client, &ns, name, 1).await;
    }
}

/// The prometheus-operator's CRDs (hack/monitoring-crds.sh): their directory.
fn monitoring_crds() -> std::path::PathBuf {
    let out = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/monitoring-crds.sh"),
    )
    .output()
    .expect("hack/monitoring-crds.sh runs");
    assert!(
        out.status.success(),
        "hack/monitoring-crds.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().into()
}

const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";

/// Whether the API server serves ServiceMonitors (what the operator asks at start).
async fn service_monitors_served(client: &Client) -> bool {
    client
        .list_api_group_resources("monitoring.coreos.com/v1")
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.name == "servicemonitors"))
}

fn service_monitors(client: &Client, ns: &str) -> Api<kube::core::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
    Api::namespaced_with(
        client.clone(),
        ns,
        &kube::discovery::ApiResource::from_gvk_with_plural(&gvk, "servicemonitors"),
    )
}

fn monitored(name: &str, size: i32, enabled: bool) -> Memcached {
    let mut mc = memcached(name, size);
    mc.spec.monitoring = Some(memcached_operator::api::MonitoringSpec {
        enabled,
        image: None,
    });
    mc
}

async fn set_monitoring(client: &Client, ns: &str, name: &str, enabled: bool) {
    Api::<Memcached>::namespaced(client.clone(), ns)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"monitoring": {"enabled": enabled}}}),
            ),
        )
        .await
        .unwrap();
}

/// The containers of the Memcached's first member and the port names of its Service, as applied.
async fn exporter_and_port(client: &Client, ns: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let member = member_pods(client, ns, name).await.remove(0);
    // The agent (warm restart's save) is in every pod of a cache this size.
    let containers = member.spec.unwrap().containers;
    let containers = containers.into_iter().filter(|c| c.name != "agent");
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let ports = svc.spec.unwrap().ports.unwrap_or_default();
    (
        containers.map(|c| c.name).collect(),
        ports.into_iter().filter_map(|p| p.name).collect(),
    )
}

#[tokio::test]
async fn monitoring_adds_an_exporter_and_where_served_a_service_monitor() {
    let client = admin().await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    // Without the ServiceMonitor API (a fresh cluster has none; an earlier run may have left it).
    if crds.get_opt(SERVICE_MONITOR_CRD).await.unwrap().is_some() {
        crds.delete(SERVICE_MONITOR_CRD, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("the ServiceMonitor API gone", CONVERGE, || async {
        (!service_monitors_served(&client).await).then_some(())
    })
    .await;

    let ns = namespace(&client, "monitoring").await;
    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &monitored("cache", 2, true)).await;
    create(&client, &ns, &memcached("plain", 1)).await;
    wait_converged(&client, &ns, "cache", 2).await;
    wait_converged(&client, &ns, "plain", 1).await;

    // The sidecar, as restricted as memcached, and the Service's metrics port.
    let member = member_pods(&client, &ns, "cache").await.remove(0);
    let pod = member.spec.unwrap();
    let exporter = pod
        .containers
        .iter()
        .find(|c| c.name == "exporter")
        .expect("an exporter container");
    let port = &exporter.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 9150)
    );
    let sc = exporter.security_context.clone().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(65534));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    assert_eq!(
        pod.security_context.unwrap().seccomp_profile.unwrap().type_,
        "RuntimeDefault"
    );
    assert!(exporter.liveness_probe.is_some());
    assert_eq!(
        exporter_and_port(&client, &ns, "cache").await,
        (
            vec!["memcached".to_string(), "exporter".to_string()],
            vec!["memcached".to_string(), "metrics".to_string()]
        )
    );
    assert_eq!(
        exporter_and_port(&client, &ns, "plain").await,
        (vec!["memcached".to_string()], vec!["memcached".to_string()]),
        "monitoring is off by default"
    );
    // No ServiceMonitor API: Available, not Degraded, and no reconcile failed.
    let mc = Api::<Memcached>::namespaced(client.clone(), &ns)
        .get("cache")
        .await
        .unwrap();
    assert_eq!(condition(&mc, "Available").unwrap().0, "True");
    assert_eq!(condition(&mc, "Degraded").unwrap().0, "False");
    op.assert_no_failed_reconciles().await;
    let text = op.metrics_text().await;
    assert!(text.contains(
        &format!(r#"memcached_operator_memcached_condition{{memcached="cache",namespace="{ns}",type="Available"}} 1"#)
    ), "{text}");
    drop(op);

    // The CRD installed (the operator asks at start: restarted), a ServiceMonitor per monitored
    // Memcached, owned by it.
    let dir = monitoring_crds();
    let (ok, out) = kubectl(&[
        "apply",
        "--server-side",
        "-f",
        dir.join("monitoring.coreos.com_servicemonitors.yaml")
            .to_str()
            .unwrap(),
    ])
    .await;
    assert!(ok, "{out}");
    wait_for("the ServiceMonitor API served", CONVERGE, || async {
        service_monitors_served(&client).await.then_some(())
    })
    .await;
    // An install whose RBAC leaves ServiceMonitors out: the API is served, but the operator keeps
    // none, is ready, and reconciles as before.
    let without: Vec<_> = harness::shipped_rules("role.yaml")
        .into_iter()
        .filter(|r| {
            !r.resources
                .iter()
                .flatten()
                .any(|res| res == "servicemonitors")
        })
        .collect();
    let restricted_ns = namespace(&client, "monitoring-no-rbac").await;
    let restricted = Operator::start(
        &client,
        OperatorOptions {
            rbac: Rbac::ClusterRules(without),
            watch_namespace: Some(restricted_ns.clone()),
            ..Default::default()
        },
    )
    .await;
    restricted
        .wait_health("/readyz", Duration::from_secs(20))
        .await
        .expect("ready without the servicemonitors rule");
    create(&client, &restricted_ns, &monitored("cache", 1, true)).await;
    wait_converged(&client, &restricted_ns, "cache", 1).await;
    assert_eq!(
        exporter_and_port(&client, &restricted_ns, "cache").await.1,
        ["memcached", "metrics"]
    );
    assert!(
        service_monitors(&client, &restricted_ns)
            .get_opt("cache")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        restricted
            .log_text()
            .contains("may not list and watch servicemonitors"),
        "the operator says why it keeps none"
    );
    drop(restricted);

    let op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let monitors = service_monitors(&client, &ns);
    let monitor = wait_for("the owned ServiceMonitor", CONVERGE, || async {
        monitors.get_opt("cache").await.ok()?
    })
    .await;
    let owner = &monitor.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Memcached", mc.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(
        monitor.data["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/instance": "cache", "app.kubernetes.io/name": "memcached"})
    );
    assert_eq!(monitor.data["spec"]["endpoints"][0]["port"], "metrics");
    // The selector picks the Service, and only that one.
    let (ok, out) = kubectl(&[
        "get",
        "svc",
        "-n",
        &ns,
        "-l",
        "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached",
        "-o",
        "name",
    ])
    .await;
    assert_eq!((ok, out.trim()), (true, "service/cache"));
    assert!(
        monitors.get_opt("plain").await.unwrap().is_none(),
        "none without monitoring"
    );

    // Turned off: the ServiceMonitor, the sidecar and the port go.
    set_monitoring(&client, &ns, "cache", false).await;
    let monitor_gone = || async {
        monitors
            .get_opt("cache")
            .await
            .ok()?
            .is_none()
            .then_some(())
    };
    wait_for("the ServiceMonitor deleted", CONVERGE, monitor_gone).await;
    wait_for("the exporter and its port removed", CONVERGE, || async {
        let applied = exporter_and_port(&client, &ns, "cache").await;
        (applied == (vec!["memcached".to_string()], vec!["memcached".to_string()])).then_some(())
    })
    .await;
    wait_converged(&client, &ns, "cache", 2).await;

    // On again, then the Memcached deleted: the garbage collector takes the ServiceMonitor.
    set_monitoring(&client, &ns, "cache", true).await;
    wait_for("the ServiceMonitor back", CONVERGE, || async {
        monitors.get_opt("cache").await.ok()?
    })
    .await;
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the ServiceMonitor garbage-collected",
        CONVERGE,
        monitor_gone,
    )
    .await;
    op.assert_no_failed_reconciles().await;
    drop(op);
    // Leave the cluster as later tests expect it.
    crds.delete(SERVICE_MONITOR_CRD, &DeleteParams::default())
        .await
        .unwrap();
}
