//! The members, pods the operator keeps itself: member `<name>-<ordinal>` is the pod template
//! (pod_template.rs) with a stable hostname under the headless Service, labelled with the
//! revision of that template, and owned by the Memcached. Since 0.9.0 each member records what an
//! update compares of its template (controller::member); releases before kept the template of
//! each revision in a ControllerRevision (`data.spec.template`, the form Kubernetes' own
//! controllers use), which the adoption of a StatefulSet still makes (controller/legacy.rs).

use std::collections::BTreeMap;
use std::hash::Hasher;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::ResourceExt;
use serde_json::json;

use super::{REVISION_LABEL, owned_metadata, selector_labels};
use crate::api::Memcached;

/// Kubernetes' label naming a numbered pod's ordinal, so that tools which read it find the
/// members.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The revision of the members' template: `<name>-<hash of the template>`, as a
/// ControllerRevision's name.
pub fn revision(mc: &Memcached, template: &PodTemplateSpec) -> String {
    // FNV-1a over the template's JSON: stable across processes and versions of this crate,
    // unlike the digests of owned objects (foldhash).
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(&serde_json::to_vec(template).expect("a pod template serialises"));
    format!(
        "{}-{:010x}",
        mc.name_any(),
        hasher.finish() & 0xff_ffff_ffff
    )
}

/// The ControllerRevision that keeps `revision`'s template.
pub fn controller_revision(
    mc: &Memcached,
    template: &PodTemplateSpec,
    revision: &str,
) -> ControllerRevision {
    let mut metadata = owned_metadata(mc);
    metadata.name = Some(revision.to_string());
    metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(selector_labels(mc));
    ControllerRevision {
        metadata,
        data: Some(RawExtension(json!({"spec": {"template": template}}))),
        // Only one revision is the current one; the number only orders them for people.
        revision: 1,
    }
}

/// Member `ordinal` of `mc`, made from `template` of `revision`.
pub fn member(mc: &Memcached, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let PodTemplateSpec {
        metadata,
        spec: pod_spec,
    } = template.clone();
    let name = format!("{}-{ordinal}", mc.name_any());
    let mut meta = metadata.unwrap_or_default();
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(REVISION_LABEL.to_string(), revision.to_string());
    labels.insert(POD_INDEX_LABEL.to_string(), ordinal.to_string());
    meta.name = Some(name.clone());
    meta.namespace = mc.namespace();
    meta.owner_references = owned_metadata(mc).owner_references;
    let mut pod_spec = pod_spec.unwrap_or_default();
    pod_spec.hostname = Some(name);
    // The headless Service gives each member its DNS name, `<pod>.<name>.<ns>.svc`.
    pod_spec.subdomain = Some(mc.name_any());
    Pod {
        metadata: meta,
        spec: Some(pod_spec),
        status: None,
    }
}

/// The member's ordinal, from its name `<memcached>-<ordinal>`; None for a pod not so named.
pub fn ordinal(mc: &Memcached, pod_name: &str) -> Option<i32> {
    let rest = pod_name.strip_prefix(&mc.name_any())?.strip_prefix('-')?;
    // "01" is not member 1: the name must be the one `member` gives.
    let n: i32 = rest.parse().ok()?;
    (n >= 0 && n.to_string() == rest).then_some(n)
}

/// What keeping `size` members asks, given the names of the pods there are (not being deleted)
/// and of those being deleted: the ordinals to create, and the members to delete (beyond the
/// size). A member being deleted holds its name until it is gone. A pod not named as a member is
/// left alone.
pub fn plan<'a>(
    mc: &Memcached,
    size: i32,
    pods: &[&'a str],
    terminating: &[&str],
) -> (Vec<i32>, Vec<&'a str>) {
    let taken: Vec<i32> = pods
        .iter()
        .chain(terminating)
        .filter_map(|p| ordinal(mc, p))
        .collect();
    let create = (0..size).filter(|n| !taken.contains(n)).collect();
    let delete = pods
        .iter()
        .filter(|p| ordinal(mc, p).is_some_and(|n| n >= size))
        .copied()
        .collect();
    (create, delete)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use crate::resources::{Images, pod_template};

    #[test]
    fn a_member_is_the_template_under_its_stable_name() {
        let mc = memcached("cache", 3);
        let template = pod_template(&mc, &Images::default());
        let rev = revision(&mc, &template);
        let pod = member(&mc, &template, &rev, 2);
        assert_eq!(pod.name_any(), "cache-2");
        assert_eq!(pod.namespace().as_deref(), Some("default"));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("cache-2"));
        assert_eq!(
            spec.subdomain.as_deref(),
            Some("cache"),
            "the headless Service"
        );
        assert_eq!(pod.labels()[REVISION_LABEL], rev);
        assert_eq!(pod.labels()[POD_INDEX_LABEL], "2");
        for (k, v) in selector_labels(&mc) {
            assert_eq!(pod.labels().get(&k), Some(&v), "the Service selects it");
        }
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("Memcached", Some(true))
        );
        assert_eq!(spec.containers, template.spec.unwrap().containers);
    }

    #[test]
    fn the_revision_changes_with_the_template_only() {
        let mc = memcached("cache", 3);
        let template = |mc: &Memcached| pod_template(mc, &Images::default());
        let rev = revision(&mc, &template(&mc));
        assert!(rev.starts_with("cache-") && rev.len() == "cache-".len() + 10);
        let mut larger = mc.clone();
        larger.spec.size = 5;
        assert_eq!(
            revision(&larger, &template(&larger)),
            rev,
            "the size is not the template"
        );
        let mut newer = mc.clone();
        newer.spec.image = Some("memcached:1.6.46".into());
        assert_ne!(revision(&newer, &template(&newer)), rev);
    }

    #[test]
    fn the_revision_keeps_the_template() {
        let mc = memcached("cache", 1);
        let template = pod_template(&mc, &Images::default());
        let cr = controller_revision(&mc, &template, "cache-abc");
        assert_eq!(cr.name_any(), "cache-abc");
        let kept = cr.data.unwrap().0["spec"]["template"].clone();
        assert_eq!(kept, serde_json::to_value(template).unwrap());
        assert_eq!(cr.metadata.owner_references.unwrap()[0].name, "cache");
    }

    #[test]
    fn the_plan_creates_missing_ordinals_and_deletes_the_rest() {
        let mc = memcached("cache", 3);
        assert_eq!(plan(&mc, 3, &[], &[]), (vec![0, 1, 2], vec![]));
        assert_eq!(
            plan(&mc, 3, &["cache-0", "cache-2"], &[]),
            (vec![1], vec![]),
            "a member lost is made again under its name"
        );
        assert_eq!(
            plan(&mc, 3, &["cache-0"], &["cache-1"]),
            (vec![2], vec![]),
            "a member being deleted is made again once it is gone"
        );
        assert_eq!(
            plan(&mc, 1, &["cache-0", "cache-1", "cache-2"], &[]),
            (vec![], vec!["cache-1", "cache-2"]),
            "scaling down takes the highest ordinals"
        );
        assert_eq!(
            plan(&mc, 1, &["cache-0", "cache-01", "cache-x"], &[]),
            (vec![], vec![]),
            "a pod that no member is named as is not ours to delete"
        );
        assert_eq!(ordinal(&mc, "cache-extra-1"), None);
        assert_eq!(ordinal(&mc, "cache-10"), Some(10));
    }
}
