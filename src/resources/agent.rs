//! The agent beside memcached (the operator's own binary, `memcached-operator agent`; see
//! `crate::agent`) in pods with `spec.auth` or `spec.tls`: it delivers what changes in the
//! Secrets to the running memcached (SIGHUP for the password file, `refresh_certs` for the
//! certificates), and logs in for the exporter. Without either, a pod has no agent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::{EXPORTER_PORT, Memcached};

use super::{MEMCACHED_UID, auth, stateful_set::restricted, tls};

/// The operator's binary in its image, which is also the agent's.
const BINARY: &str = "/memcached-operator";

/// Ports on the pod's loopback: the agent's login proxy for the exporter, and memcached's plain
/// listener when TLS is on. Moved off the ports the user picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPorts {
    pub agent: i32,
    pub plain: i32,
}

impl LocalPorts {
    pub fn of(mc: &Memcached) -> Self {
        let taken = [
            mc.spec.container_port,
            tls::plaintext_port(mc).unwrap_or(0),
            EXPORTER_PORT,
        ];
        let free = |candidates: [i32; 3]| {
            candidates
                .into_iter()
                .find(|p| !taken.contains(p))
                .expect("three candidates, two of them taken at most")
        };
        LocalPorts {
            agent: free([11299, 11289, 11279]),
            plain: free([11298, 11288, 11278]),
        }
    }
}

/// Whether the pods run the agent.
pub fn needed(mc: &Memcached) -> bool {
    auth::enabled(mc) || tls::enabled(mc)
}

/// Where the exporter reads `stats`: through the agent, which logs in, when authentication is
/// on; memcached's plain loopback listener when only TLS is; memcached's port otherwise.
pub fn exporter_target(mc: &Memcached) -> i32 {
    let ports = LocalPorts::of(mc);
    if auth::enabled(mc) {
        ports.agent
    } else if tls::enabled(mc) {
        ports.plain
    } else {
        mc.spec.container_port
    }
}

/// Adds the agent (and, with authentication, the init container writing the first password
/// file) to `pod`. With authentication the pod shares its process namespace, so the agent can
/// send memcached SIGHUP: it runs as memcached's user, so it needs no capability for that.
pub fn add_to_pod(mc: &Memcached, pod: &mut PodSpec, image: &str) {
    if !needed(mc) {
        return;
    }
    let ports = LocalPorts::of(mc);
    let memcached_port = if tls::enabled(mc) {
        ports.plain
    } else {
        mc.spec.container_port
    };
    let mut args = vec![
        "run".to_string(),
        format!("--memcached=127.0.0.1:{memcached_port}"),
    ];
    let mut mounts = Vec::new();
    if auth::enabled(mc) {
        args.extend(auth::agent_args(mc));
        args.push(format!("--proxy=127.0.0.1:{}", ports.agent));
        mounts.extend(auth::agent_mounts());
    }
    args.extend(
        tls::watched_dirs(mc)
            .into_iter()
            .map(|dir| format!("--tls-dir={dir}")),
    );
    mounts.extend(tls::mounts(mc));
    let container = |name: &str, args: Vec<String>, resources| Container {
        name: name.to_string(),
        image: Some(image.to_string()),
        command: Some(vec![BINARY.to_string(), "agent".to_string()]),
        args: Some(args),
        volume_mounts: Some(mounts.clone()),
        resources,
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    if auth::enabled(mc) {
        pod.init_containers
            .get_or_insert_with(Vec::new)
            .push(container("auth-init", auth::init_args(), None));
        pod.share_process_namespace = Some(true);
    }
    // Idle but for a few file reads every 5 s; its RSS is a few MiB.
    let resources = ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("5m".to_string())),
            ("memory".to_string(), Quantity("8Mi".to_string())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity("32Mi".to_string()),
        )])),
        ..ResourceRequirements::default()
    };
    pod.containers
        .push(container("agent", args, Some(resources)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;

    #[test]
    fn loopback_ports_move_off_the_users() {
        let mut mc = memcached("cache", 1);
        assert_eq!(
            LocalPorts::of(&mc),
            LocalPorts {
                agent: 11299,
                plain: 11298
            }
        );
        mc.spec.container_port = 11299;
        mc.spec.tls = Some(crate::api::TlsSpec {
            enabled: true,
            secret_name: Some("c".into()),
            plaintext_port: Some(11298),
            ..Default::default()
        });
        let ports = LocalPorts::of(&mc);
        assert_eq!(
            ports,
            LocalPorts {
                agent: 11289,
                plain: 11288
            }
        );
    }

    #[test]
    fn no_auth_and_no_tls_means_no_agent() {
        let mc = memcached("cache", 1);
        let mut pod = PodSpec::default();
        add_to_pod(&mc, &mut pod, "img");
        assert_eq!(pod, PodSpec::default());
        assert_eq!(exporter_target(&mc), 11211);
    }
}
