//! `--floor <shape>`: the control plane's part of bringing up new Memcacheds, with no operator.
//! The benchmark plays a perfect operator: 8 workers, each creating a Memcached and then, one
//! after the other, its objects in a given shape, and nothing else (no status, no Events). What
//! it measures is how long the control plane takes from there to every pod Ready, and what that
//! costs it, so that shapes of the owned objects (a StatefulSet, or the pods themselves) can be
//! compared before an operator is built for each.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::{self, FALLBACK_MEMCACHED_IMAGE, Images};
use serde_json::{Value, json};

use crate::{control_plane, procs, speed, top_cpu, wait_count, watched};

/// What each new Memcached gets, created by the benchmark itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Today's objects: the StatefulSet, then the headless Service, each by server-side apply.
    #[value(name = "statefulsets")]
    StatefulSets,
    /// The StatefulSet's pod template as one pod `<name>-0` (hostname and subdomain set, as the
    /// statefulset controller sets them), then the Service; each by server-side apply.
    #[value(name = "pods")]
    Pods,
    /// The reference's Deployment, created (POST), and no Service.
    #[value(name = "deployments")]
    Deployments,
}

const WORKERS: usize = 8;
const MANAGER: &str = "memcached-operator";

pub async fn run(
    client: &Client,
    names: &[(String, String)],
    shape: Shape,
    calibration: f64,
    timeout: Duration,
) -> Result<Value> {
    let pods: Store<Pod> = watched(Api::all(client.clone()), ()).await;
    let images = Images::new(FALLBACK_MEMCACHED_IMAGE);
    let cpu_before = procs::snapshot();
    let counters_before = control_plane::Counters::read(client).await?;
    let probe = speed::Probe::start();
    let started = Instant::now();
    stream::iter(names)
        .map(|(ns, name)| create(client, ns, name, shape, &images))
        .buffer_unordered(WORKERS)
        .try_collect::<Vec<()>>()
        .await?;
    let created = started.elapsed();
    wait_count(&pods, "pods Ready", names.len(), timeout, is_ready).await?;
    let ready = started.elapsed();
    let speed = probe.finish(calibration);
    let cpu_used = cpu_before.used_since(&procs::snapshot(), &[(std::process::id(), "benchmark")]);
    let control_plane = control_plane::Counters::read(client)
        .await?
        .since(&counters_before);
    Ok(json!({
        "shape": format!("{shape:?}"),
        "workers": WORKERS,
        "objects_created_seconds": created.as_secs_f64(),
        "pods_ready_seconds": ready.as_secs_f64(),
        "cpu_seconds": top_cpu(&cpu_used),
        "cpu_seconds_all": cpu_used.iter().map(|(_, s)| s).sum::<f64>(),
        "control_plane": control_plane,
        "speed": speed,
    }))
}

/// A Ready pod of the benchmark's namespaces.
fn is_ready(pod: &Pod) -> bool {
    pod.namespace().is_some_and(|ns| ns.starts_with("bench-"))
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One worker's part for one Memcached: the Memcached, then its objects in order.
async fn create(
    client: &Client,
    ns: &str,
    name: &str,
    shape: Shape,
    images: &Images,
) -> Result<()> {
    let mc = crate::create(client, ns, name).await?;
    let apply = PatchParams::apply(MANAGER).force();
    match shape {
        Shape::StatefulSets => {
            let sts = resources::stateful_set(&mc, images);
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .patch(name, &apply, &Patch::Apply(&sts))
                .await?;
            apply_service(client, &mc, &apply).await
        }
        Shape::Pods => {
            let pod = member(&resources::stateful_set(&mc, images), 0);
            Api::<Pod>::namespaced(client.clone(), ns)
                .patch(&pod.name_any(), &apply, &Patch::Apply(&pod))
                .await?;
            apply_service(client, &mc, &apply).await
        }
        Shape::Deployments => {
            Api::<Deployment>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &reference_deployment(&mc)?)
                .await?;
            Ok(())
        }
    }
}

async fn apply_service(client: &Client, mc: &Memcached, apply: &PatchParams) -> Result<()> {
    Api::<Service>::namespaced(client.clone(), &mc.namespace().unwrap_or_default())
        .patch(
            &mc.name_any(),
            apply,
            &Patch::Apply(&resources::service(mc)),
        )
        .await?;
    Ok(())
}

/// Member `ordinal` of `sts` as its own pod, owned by the Memcached as the StatefulSet is.
fn member(sts: &StatefulSet, ordinal: usize) -> Pod {
    let name = format!("{}-{ordinal}", sts.name_any());
    let spec = sts.spec.as_ref().expect("a StatefulSet has a spec");
    let template = &spec.template;
    let mut labels: BTreeMap<String, String> = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(
        "statefulset.kubernetes.io/pod-name".to_string(),
        name.clone(),
    );
    let mut pod_spec = template.spec.clone().unwrap_or_default();
    pod_spec.hostname = Some(name.clone());
    pod_spec.subdomain = spec.service_name.clone();
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            namespace: sts.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone()),
            owner_references: sts.metadata.owner_references.clone(),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The reference operator's Deployment (bench/reference-go/controller.go, deploymentFor).
fn reference_deployment(mc: &Memcached) -> Result<Deployment> {
    let labels = json!({
        "app.kubernetes.io/name": "memcached",
        "app.kubernetes.io/instance": mc.name_any(),
        "app.kubernetes.io/managed-by": "MemcachedController",
    });
    let owner = mc
        .controller_owner_ref(&())
        .expect("a created Memcached has a uid");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": mc.name_any(), "namespace": mc.namespace(), "ownerReferences": [owner]},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "memcached",
                        "image": FALLBACK_MEMCACHED_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "securityContext": {
                            "runAsNonRoot": true, "runAsUser": 1001, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "ports": [{"containerPort": 11211, "name": "memcached"}],
                        "command": ["memcached", "--memory-limit=64", "-o", "modern", "-v"],
                    }],
                },
            },
        },
    }))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcached_operator::api::MemcachedSpec;

    fn created(name: &str) -> Memcached {
        let spec: MemcachedSpec = serde_json::from_value(json!({"size": 1})).unwrap();
        let mut mc = Memcached::new(name, spec);
        mc.metadata.namespace = Some("bench-1".into());
        mc.metadata.uid = Some("6f1c".into());
        mc
    }

    #[test]
    fn a_member_is_the_stateful_sets_pod_as_the_statefulset_controller_would_make_it() {
        let mc = created("mc-00001");
        let sts = resources::stateful_set(&mc, &Images::new(FALLBACK_MEMCACHED_IMAGE));
        let pod = member(&sts, 0);
        assert_eq!(pod.name_any(), "mc-00001-0");
        assert_eq!(pod.namespace().as_deref(), Some("bench-1"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("mc-00001-0"));
        assert_eq!(spec.subdomain.as_deref(), Some("mc-00001"));
        let template = &sts.spec.as_ref().unwrap().template;
        assert_eq!(spec.containers, template.spec.as_ref().unwrap().containers);
        let owner = &pod.owner_references()[0];
        assert_eq!((owner.uid.as_str(), owner.controller), ("6f1c", Some(true)));
        // The Service selects it as it selects the StatefulSet's pods.
        let selector = resources::service(&mc).spec.unwrap().selector.unwrap();
        assert!(selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v)));
    }

    #[test]
    fn the_reference_deployment_is_owned_and_selects_its_own_template() {
        let deployment = reference_deployment(&created("mc-00002")).unwrap();
        assert_eq!(deployment.owner_references()[0].uid, "6f1c");
        let spec = deployment.spec.unwrap();
        let labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(spec.selector.match_labels.unwrap(), labels);
        assert_eq!(labels["app.kubernetes.io/instance"], "mc-00002");
    }
}
