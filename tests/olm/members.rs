//! What a Memcached that moved to its StatefulSet has, as both upgrade tests check it.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// An object's controller (its owner reference with `controller: true`): its uid.
pub fn controller_uid<K: kube::Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// What `pods` lack of being exactly the members `<name>-0 … <name>-<size-1>` of the StatefulSet
/// whose uid is `sts_uid` (None: there is none, so no pod is its).
pub fn members_missing(
    pods: &[Pod],
    name: &str,
    size: usize,
    sts_uid: Option<&str>,
) -> Vec<String> {
    let mut missing = vec![];
    let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    names.sort();
    let mut want: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
    want.sort();
    if names != want {
        missing.push(format!(
            "pods [{}], not [{}]",
            names.join(" "),
            want.join(" ")
        ));
    }
    for pod in pods {
        if sts_uid.is_none() || controller_uid(pod).as_deref() != sts_uid {
            missing.push(format!("pod {} not the StatefulSet's", pod.name_any()));
        }
    }
    missing
}
