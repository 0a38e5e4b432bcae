//! The workload the operator under test owns for each Memcached, of the Memcached's name: a
//! StatefulSet (this operator) or a Deployment (the reference, as the operator-sdk tutorial
//! writes it). Both are apps/v1 objects with `spec.replicas`, `status.readyReplicas` and
//! `status.availableReplicas`, which is all the benchmark reads of them, so one cache of those
//! fields (`Workload`, kube's `Object` over the chosen kind's `ApiResource`) serves both.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, Object};
use serde::Deserialize;

use crate::audit;

/// Which apps/v1 kind the operator under test runs a Memcached's pods as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// This operator with `--members=statefulset` (the shape up to 0.6.0): a StatefulSet of the
    /// Memcached's name, pods `<name>-0…`.
    #[value(name = "statefulsets")]
    StatefulSets,
    /// The reference: a Deployment of the Memcached's name.
    #[value(name = "deployments")]
    Deployments,
    /// This operator keeping the members' pods itself (the default): pods `<name>-0…`, no
    /// workload between.
    #[value(name = "pods")]
    Pods,
}

impl Kind {
    pub fn api_resource(self) -> ApiResource {
        match self {
            Kind::StatefulSets => ApiResource::erase::<StatefulSet>(&()),
            Kind::Deployments => ApiResource::erase::<Deployment>(&()),
            Kind::Pods => ApiResource::erase::<Pod>(&()),
        }
    }

    /// The resource's name in the API (and in the audit log and the results).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::StatefulSets => "statefulsets",
            Kind::Deployments => "deployments",
            Kind::Pods => "pods",
        }
    }

    /// For messages: "StatefulSets", "Deployments".
    pub fn title(self) -> &'static str {
        match self {
            Kind::StatefulSets => "StatefulSets",
            Kind::Deployments => "Deployments",
            Kind::Pods => "Pods",
        }
    }

    /// The control plane's first write after the workload's replicas change, and the resource
    /// it writes: the statefulset controller creates or deletes pods itself; the deployment
    /// controller scales a ReplicaSet, whose controller then creates the pods. None where the
    /// operator writes the pods itself.
    pub fn controller(self) -> Option<(audit::By, &'static str)> {
        match self {
            Kind::StatefulSets => Some((audit::By::StatefulSetController, "pods")),
            Kind::Deployments => Some((audit::By::DeploymentController, "replicasets")),
            Kind::Pods => None,
        }
    }

    /// The pods it wants: a pod is its own one, if it is a benchmark's.
    pub fn replicas(self, w: &Workload) -> Option<i32> {
        match self {
            Kind::Pods => benchmarks(w).then_some(1),
            _ => w.spec.replicas,
        }
    }

    /// What the benchmark watches for Memcached `name` of `size`: its workload, of its name
    /// (with `size` replicas), or its highest member, `<name>-<size - 1>` (there).
    pub fn watched_name(self, name: &str, size: i32) -> String {
        match self {
            Kind::Pods => format!("{name}-{}", size - 1),
            _ => name.to_string(),
        }
    }

    /// Whether the watched object (`watched_name`) shows the Memcached at `size`.
    pub fn reached(self, w: &Workload, size: i32) -> bool {
        match self {
            Kind::Pods => true,
            _ => w.spec.replicas == Some(size),
        }
    }

    /// Every pod it wants is ready and available: a pod of ours is its own.
    pub fn settled(self, w: &Workload) -> bool {
        match self {
            Kind::Pods => self.ready_replicas(w) == Some(1),
            _ => settled(w),
        }
    }

    pub fn ready_replicas(self, w: &Workload) -> Option<i32> {
        let status = w.status.as_ref();
        match self {
            Kind::Pods if !benchmarks(w) => None,
            Kind::Pods => Some(i32::from(status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            }))),
            _ => status.and_then(|s| s.ready_replicas),
        }
    }
}

/// In the benchmark's namespaces.
fn benchmarks(w: &Workload) -> bool {
    w.metadata
        .namespace
        .as_deref()
        .is_some_and(|ns| ns.starts_with("bench-"))
}

/// The fields of the workload's spec the benchmark reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Spec {
    #[serde(default)]
    pub replicas: Option<i32>,
}

/// The fields of the workload's status the benchmark reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub ready_replicas: Option<i32>,
    #[serde(default)]
    pub available_replicas: Option<i32>,
    /// A pod's (Kind::Pods): its Ready condition.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

/// A StatefulSet or Deployment, as much of it as the benchmark reads.
pub type Workload = Object<Spec, Status>;

/// Every pod it wants is ready and available (with minReadySeconds, available comes later).
fn settled(w: &Workload) -> bool {
    let want = w.spec.replicas;
    w.status
        .as_ref()
        .is_some_and(|s| s.ready_replicas == want && s.available_replicas == want)
}

/// The controller's first write of each workload, keyed by the workload: a ReplicaSet is named
/// `<deployment>-<pod-template-hash>`, a StatefulSet's pod `<statefulset>-<ordinal>`.
pub fn by_workload(
    writes: BTreeMap<(String, String), audit::Write>,
) -> BTreeMap<(String, String), audit::Write> {
    let mut first = BTreeMap::new();
    for ((ns, name), write) in writes {
        if let Some((workload, _suffix)) = name.rsplit_once('-') {
            audit::keep_earliest(&mut first, (ns, workload.to_string()), write);
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use kube::Resource;
    use serde_json::json;

    fn key(ns: &str, name: &str) -> (String, String) {
        (ns.to_string(), name.to_string())
    }

    fn write(received: &str) -> audit::Write {
        let at = received.parse::<Timestamp>().unwrap();
        audit::Write {
            received: at,
            answered: at,
        }
    }

    #[test]
    fn each_kind_is_its_apps_v1_resource_and_controller() {
        let sts = Kind::StatefulSets.api_resource();
        assert_eq!(
            (sts.group.as_str(), sts.version.as_str(), sts.kind.as_str()),
            ("apps", "v1", "StatefulSet")
        );
        assert_eq!(sts.plural, Kind::StatefulSets.plural());
        assert_eq!(Workload::plural(&sts), "statefulsets");
        let deploy = Kind::Deployments.api_resource();
        assert_eq!(deploy.kind, "Deployment");
        assert_eq!(deploy.plural, Kind::Deployments.plural());
        assert_eq!(
            Kind::StatefulSets.controller(),
            Some((audit::By::StatefulSetController, "pods"))
        );
        assert_eq!(
            Kind::Deployments.controller(),
            Some((audit::By::DeploymentController, "replicasets"))
        );
        assert_eq!(
            Kind::Pods.controller(),
            None,
            "the operator writes the pods"
        );
    }

    #[test]
    fn a_stateful_set_and_a_deployment_read_alike() {
        let stateful_set = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "mc-00001", "namespace": "bench-1"},
            "spec": {
                "replicas": 2, "serviceName": "mc-00001", "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": "memcached"}},
                "template": {"spec": {"containers": [{"name": "memcached", "image": "m"}]}},
            },
            "status": {
                "replicas": 2, "readyReplicas": 2, "availableReplicas": 1, "currentReplicas": 2,
                "updateRevision": "mc-00001-7d9f8b", "collisionCount": 0,
            },
        });
        let sts: Workload = serde_json::from_value(stateful_set).unwrap();
        assert!(Kind::StatefulSets.reached(&sts, 2));
        assert!(!Kind::StatefulSets.reached(&sts, 3));
        assert_eq!(Kind::StatefulSets.ready_replicas(&sts), Some(2));
        assert!(
            !Kind::StatefulSets.settled(&sts),
            "one pod not yet available"
        );

        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "mc-00001", "namespace": "bench-1"},
            "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate"}},
            "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                       "conditions": [{"type": "Available", "status": "True"}]},
        });
        let deploy: Workload = serde_json::from_value(deployment).unwrap();
        assert!(Kind::Deployments.reached(&deploy, 1));
        assert_eq!(Kind::Deployments.ready_replicas(&deploy), Some(1));
        assert!(Kind::Deployments.settled(&deploy));

        let new: Workload = serde_json::from_value(json!({
            "metadata": {"name": "mc-00002"}, "spec": {"replicas": 1},
        }))
        .unwrap();
        assert_eq!(Kind::StatefulSets.ready_replicas(&new), None);
        assert!(!Kind::StatefulSets.settled(&new), "no status yet");
    }

    #[test]
    fn a_pod_is_one_replica_ready_by_its_condition() {
        let pod = |ready: &str| -> Workload {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "mc-00001-0", "namespace": "bench-1"},
                "spec": {"containers": [{"name": "memcached"}]},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap()
        };
        assert_eq!(Kind::Pods.replicas(&pod("False")), Some(1));
        assert_eq!(Kind::Pods.ready_replicas(&pod("False")), Some(0));
        assert_eq!(Kind::Pods.ready_replicas(&pod("True")), Some(1));
        assert_eq!(Kind::StatefulSets.ready_replicas(&pod("True")), None);
        assert!(Kind::Pods.settled(&pod("True")) && !Kind::Pods.settled(&pod("False")));
        assert_eq!(
            Kind::Pods.watched_name("mc-00001", 2),
            "mc-00001-1",
            "at size 2, its second member"
        );
        assert_eq!(Kind::StatefulSets.watched_name("mc-00001", 2), "mc-00001");
        let mut elsewhere = pod("True");
        elsewhere.metadata.namespace = Some("kube-system".into());
        assert_eq!(Kind::Pods.replicas(&elsewhere), None, "not the benchmark's");
    }

    #[test]
    fn a_replica_set_write_counts_for_its_deployment_and_the_earliest_wins() {
        let writes = BTreeMap::from([
            (key("a", "mc-00001-7d9f8b"), write("2026-01-01T00:00:03Z")),
            (key("a", "mc-00001-55c4d6"), write("2026-01-01T00:00:02Z")),
            (key("b", "mc-00001-7d9f8b"), write("2026-01-01T00:00:05Z")),
        ]);
        assert_eq!(
            by_workload(writes),
            BTreeMap::from([
                (key("a", "mc-00001"), write("2026-01-01T00:00:02Z")),
                (key("b", "mc-00001"), write("2026-01-01T00:00:05Z")),
            ])
        );
    }

    #[test]
    fn a_pod_write_counts_for_its_stateful_set_by_its_ordinal() {
        let writes = BTreeMap::from([
            (key("a", "mc-00001-1"), write("2026-01-01T00:00:03Z")),
            (key("a", "mc-00001-2"), write("2026-01-01T00:00:02Z")),
            (key("a", "mc-00010-1"), write("2026-01-01T00:00:04Z")),
            (key("b", "mc-00001-1"), write("2026-01-01T00:00:05Z")),
        ]);
        assert_eq!(
            by_workload(writes),
            BTreeMap::from([
                (key("a", "mc-00001"), write("2026-01-01T00:00:02Z")),
                (key("a", "mc-00010"), write("2026-01-01T00:00:04Z")),
                (key("b", "mc-00001"), write("2026-01-01T00:00:05Z")),
            ])
        );
    }
}
