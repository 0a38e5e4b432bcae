//! `--floor <shape>`: the control plane's part of bringing up new Memcacheds, with no operator.
//! The benchmark plays a perfect operator: 8 workers, each creating a Memcached and then, one
//! after the other, its objects in a given shape, and nothing else (no status, no Events). What
//! it measures is how long the control plane takes from there to every pod Ready, and what that
//! costs it, so that shapes of the owned objects (a StatefulSet, or the pods themselves) can be
//! compared before an operator is built for each.

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
            let sts = stateful_set(&mc, images)?;
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .patch(name, &apply, &Patch::Apply(&sts))
                .await?;
            apply_service(client, &mc, &apply).await
        }
        Shape::Pods => {
            let template = resources::pod_template(&mc, images);
            let revision = resources::members::revision(&mc, &template);
            let pod = memcached_operator::controller::member(&mc, &template, &revision, 0);
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

/// A StatefulSet of `mc`'s members, as releases up to 0.6.0 of this operator kept them.
fn stateful_set(mc: &Memcached, images: &Images) -> Result<StatefulSet> {
    let template = resources::pod_template(mc, images);
    Ok(serde_json::from_value(json!({
        "metadata": resources::service(mc).metadata,
        "spec": {
            "replicas": mc.spec.size,
            "selector": {"matchLabels": resources::selector_labels(mc)},
            "serviceName": mc.name_any(),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "minReadySeconds": mc.spec.rollout.clone().unwrap_or_default().min_ready_seconds,
            "template": template,
        },
    }))?)
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
    fn the_stateful_set_shape_runs_the_members_template_under_the_headless_service() {
        let mc = created("mc-00001");
        let images = Images::new(FALLBACK_MEMCACHED_IMAGE);
        let sts = stateful_set(&mc, &images).unwrap();
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(spec.service_name.as_deref(), Some("mc-00001"));
        assert_eq!(spec.template, resources::pod_template(&mc, &images));
        assert_eq!(sts.owner_references()[0].uid, "6f1c");
        // The Service selects its pods.
        let selector = resources::service(&mc).spec.unwrap().selector.unwrap();
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
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
