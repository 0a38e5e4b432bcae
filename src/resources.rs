//! Pure builders for the objects a Memcached owns: its Deployment and its headless Service.
//! No API calls here; the controller applies what these return.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::Memcached;

/// memcached image used when neither `spec.image` nor `RELATED_IMAGE_MEMCACHED` is set.
pub const FALLBACK_MEMCACHED_IMAGE: &str = "memcached:1.6.45-alpine";
/// Name of the operator as field manager, event reporter and `managed-by` label.
pub const MANAGER_NAME: &str = "memcached-operator";
/// uid of the `memcache` user in the official memcached image. Set explicitly because the image
/// names its user rather than numbering it, and the kubelet refuses runAsNonRoot for named users.
pub const MEMCACHED_UID: i64 = 11211;

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";

/// Label selector (as a string) that finds everything this operator manages.
pub fn managed_by_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGER_NAME}")
}

/// Labels that pick out one Memcached's pods. Also the Deployment's (immutable) selector.
pub fn selector_labels(mc: &Memcached) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "memcached".to_string()),
        (LABEL_INSTANCE.to_string(), mc.name_any()),
    ])
}

/// `status.selector` for the scale subresource, e.g. `app.kubernetes.io/instance=x,...`.
pub fn selector_string(mc: &Memcached) -> String {
    selector_labels(mc)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The recommended `app.kubernetes.io/*` labels on every owned object and pod.
pub fn labels(mc: &Memcached) -> BTreeMap<String, String> {
    let mut labels = selector_labels(mc);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGER_NAME.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "cache".to_string());
    labels.insert(LABEL_PART_OF.to_string(), "memcached-operator".to_string());
    labels
}

/// Controller reference, as controller-runtime's SetControllerReference: foreground deletion of
/// the Memcached waits for what it owns.
fn owner_reference(mc: &Memcached) -> OwnerReference {
    let mut owner = mc
        .controller_owner_ref(&())
        .expect("a Memcached read from the API server has a name and uid");
    owner.block_owner_deletion = Some(true);
    owner
}

fn owned_metadata(mc: &Memcached) -> ObjectMeta {
    ObjectMeta {
        name: Some(mc.name_any()),
        namespace: mc.namespace(),
        labels: Some(labels(mc)),
        owner_references: Some(vec![owner_reference(mc)]),
        ..ObjectMeta::default()
    }
}

/// The memcached image for this CR: its own override, else the operator's default.
pub fn image<'a>(mc: &'a Memcached, default_image: &'a str) -> &'a str {
    mc.spec.image.as_deref().unwrap_or(default_image)
}

/// The Deployment a Memcached should have.
pub fn deployment(mc: &Memcached, default_image: &str) -> Deployment {
    let port = mc.spec.container_port;
    let tcp_probe = |initial_delay, period| Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String("memcached".to_string()),
            ..TCPSocketAction::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        ..Probe::default()
    };
    let container = Container {
        name: "memcached".to_string(),
        image: Some(image(mc, default_image).to_string()),
        command: Some(vec!["memcached".to_string()]),
        args: Some(vec![
            "-m".to_string(),
            mc.spec.max_memory_mib.to_string(),
            "-p".to_string(),
            port.to_string(),
            "-o".to_string(),
            "modern".to_string(),
            "-v".to_string(),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("memcached".to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(tcp_probe(1, 5)),
        liveness_probe: Some(tcp_probe(10, 10)),
        resources: mc.spec.resources.clone(),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(MEMCACHED_UID),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    Deployment {
        metadata: owned_metadata(mc),
        spec: Some(DeploymentSpec {
            replicas: Some(mc.spec.size),
            selector: LabelSelector {
                match_labels: Some(selector_labels(mc)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(mc)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![container],
                    // memcached needs no API access.
                    automount_service_account_token: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_string(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// The headless Service through which clients find every memcached pod by DNS.
pub fn service(mc: &Memcached) -> Service {
    Service {
        metadata: owned_metadata(mc),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector_labels(mc)),
            ports: Some(vec![ServicePort {
                name: Some("memcached".to_string()),
                port: mc.spec.container_port,
                target_port: Some(IntOrString::String("memcached".to_string())),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// True when `object` has a controller owner reference pointing at this Memcached (by uid).
pub fn is_controlled_by(object: &ObjectMeta, mc: &Memcached) -> bool {
    let uid = mc.uid();
    object
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;

    #[test]
    fn deployment_runs_size_replicas_of_memcached_owned_by_the_cr() {
        let mc = memcached("cache", 3);
        let d = deployment(&mc, "memcached:test");
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(d.metadata.name.as_deref(), Some("cache"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
        assert!(is_controlled_by(&d.metadata, &mc));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.block_owner_deletion),
            ("Memcached", Some(true))
        );

        let c = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("memcached:test"));
        assert_eq!(
            c.args.as_ref().unwrap(),
            &["-m", "64", "-p", "11211", "-o", "modern", "-v"]
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 11211);
        assert!(c.readiness_probe.as_ref().unwrap().tcp_socket.is_some());
        assert!(c.liveness_probe.as_ref().unwrap().tcp_socket.is_some());
    }

    #[test]
    fn selector_is_a_subset_of_pod_labels() {
        let mc = memcached("cache", 1);
        let d = deployment(&mc, "img");
        let spec = d.spec.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (k, v) in spec.selector.match_labels.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        assert_eq!(
            pod_labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGER_NAME)
        );
        assert_eq!(
            selector_string(&mc),
            "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
        );
    }

    #[test]
    fn pod_meets_the_restricted_pod_security_profile() {
        let d = deployment(&memcached("cache", 1), "img");
        let pod = d.spec.unwrap().template.spec.unwrap();
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let sc = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_user, Some(MEMCACHED_UID));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }

    #[test]
    fn spec_overrides_reach_the_container() {
        let mut mc = memcached("cache", 2);
        mc.spec.image = Some("memcached:custom".into());
        mc.spec.max_memory_mib = 256;
        mc.spec.container_port = 12345;
        let d = deployment(&mc, "default-image");
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("memcached:custom"));
        assert_eq!(c.args.as_ref().unwrap()[..4], ["-m", "256", "-p", "12345"]);
        let svc = service(&mc);
        assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 12345);
    }

    #[test]
    fn service_is_headless_and_selects_the_pods() {
        let mc = memcached("cache", 1);
        let svc = service(&mc);
        assert!(is_controlled_by(&svc.metadata, &mc));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap(), selector_labels(&mc));
    }

    #[test]
    fn foreign_owner_is_not_control() {
        let mc = memcached("cache", 1);
        let mut meta = deployment(&mc, "img").metadata;
        meta.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        assert!(!is_controlled_by(&meta, &mc));
        meta.owner_references = None;
        assert!(!is_controlled_by(&meta, &mc));
    }

    proptest::proptest! {
        /// Whatever the schema admits, the builders do not panic, and a spec the reconciler
        /// accepts comes out in the objects as written.
        #[test]
        fn every_admitted_spec_builds_objects_that_reflect_it(spec in crate::arbitrary::spec()) {
            let mut mc = memcached("cache", 1);
            mc.spec = spec.clone();
            let d = deployment(&mc, FALLBACK_MEMCACHED_IMAGE);
            let svc = service(&mc);
            if crate::validation::validate(&spec).is_err() {
                return Ok(());
            }
            let d_spec = d.spec.unwrap();
            proptest::prop_assert_eq!(d_spec.replicas, Some(spec.size));
            let pod = d_spec.template.spec.unwrap();
            let c = &pod.containers[0];
            proptest::prop_assert_eq!(c.image.as_deref(), Some(spec.image.as_deref().unwrap_or(FALLBACK_MEMCACHED_IMAGE)));
            let args = c.args.clone().unwrap();
            let memory = spec.max_memory_mib.to_string();
            proptest::prop_assert!(args.windows(2).any(|w| w[0] == "-m" && w[1] == memory));
            proptest::prop_assert_eq!(c.ports.as_ref().unwrap()[0].container_port, spec.container_port);
            proptest::prop_assert_eq!(&c.resources, &spec.resources);
            let selector = d_spec.selector.match_labels.unwrap();
            let template_labels = d_spec.template.metadata.unwrap().labels.unwrap();
            proptest::prop_assert!(selector.iter().all(|(k, v)| template_labels.get(k) == Some(v)));
            let ports = svc.spec.unwrap().ports.unwrap();
            proptest::prop_assert_eq!(ports[0].port, spec.container_port);
        }
    }
}
