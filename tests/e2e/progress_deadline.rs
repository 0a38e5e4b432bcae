//! A rollout that cannot finish says so: members that never become Ready (kwok reports them as a
//! kubelet does whose readiness probe never passes: hack/templates/kwok-in-place-restart.yaml)
//! end in `ProgressDeadlineExceeded` once `spec.rollout.progressDeadlineSeconds` has passed, with
//! one Warning, as a Deployment past its deadline does.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Api;
use memcached_operator::api::{Memcached, RolloutSpec};

use super::harness::{
    CONVERGE, Operator, OperatorOptions, admin, condition, create, events_for, member_pods,
    memcached, namespace, wait_degraded, wait_for,
};

#[tokio::test]
async fn members_that_never_become_ready_end_in_progress_deadline_exceeded() {
    let client = admin().await;
    let ns = namespace(&client, "deadline").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut mc = memcached("cache", 2);
    mc.spec.rollout = Some(RolloutSpec {
        progress_deadline_seconds: 20,
        ..Default::default()
    });
    mc.spec.pod_annotations = Some(BTreeMap::from([(
        "memcached-operator.test/readiness".into(),
        "never".into(),
    )]));
    create(&client, &ns, &mc).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);

    // Running, never Ready: still progressing before the deadline.
    wait_for("2 members running, none Ready", CONVERGE, || async {
        let pods = member_pods(&client, &ns, "cache").await;
        let running = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        (running.count() == 2).then_some(())
    })
    .await;
    wait_for("Progressing=True, 0/2 ready", CONVERGE, || async {
        let mc = mcs.get("cache").await.ok()?;
        let (status, reason) = condition(&mc, "Progressing")?;
        let ready = mc.status.as_ref()?.ready_replicas;
        (status == "True" && reason != "ProgressDeadlineExceeded" && ready == 0).then_some(())
    })
    .await;

    let degraded = wait_degraded(&mcs, "cache", "ProgressDeadlineExceeded", CONVERGE).await;
    assert!(
        degraded.starts_with("0/2 pods are ready; cache-")
            && degraded.contains("not Ready for 20 s (spec.rollout.progressDeadlineSeconds)"),
        "{degraded}"
    );
    let stuck = mcs.get("cache").await.unwrap();
    for (type_, status) in [("Progressing", "False"), ("Available", "False")] {
        assert_eq!(
            condition(&stuck, type_),
            Some((status.into(), "ProgressDeadlineExceeded".into())),
            "{type_}"
        );
    }
    // Said once, not at each recheck.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let warnings: Vec<_> = events_for(&client, &ns, "cache")
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Memcached"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].reason.as_deref(),
        Some("ProgressDeadlineExceeded")
    );
}
