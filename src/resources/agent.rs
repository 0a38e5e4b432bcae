//! The agent beside memcached (the operator's own binary, `memcached-operator agent`; see
//! `crate::agent`): it has memcached save its cache before the kubelet stops it (warm restart),
//! delivers what changes in the Secrets to the running memcached (SIGHUP for the password file,
//! `refresh_certs` for the certificates), and logs in for the exporter. A pod with none of these
//! (a cache too small for warm restart, without auth or TLS) has no agent.

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

use crate::api::Memcached;

use super::ports::LocalPorts;
use super::{MEMCACHED_UID, auth, restricted, tls, warm_restart};

/// The operator's binary in its image, which is also the agent's.
const BINARY: &str = "/memcached-operator";
/// The agent container's name in a member's pod.
pub const CONTAINER: &str = "agent";

/// Whether the pods run the agent.
pub fn needed(mc: &Memcached) -> bool {
    warm_restart::enabled(mc) || auth::enabled(mc) || tls::enabled(mc)
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

/// Where the operator's autoscaler reads a member's `stats`: memcached's port where it wants no
/// login and speaks plain text (true), else the agent's endpoint (false), which listens on the
/// pod's address only with warm restart; None without either.
pub fn stats_port(mc: &Memcached) -> Option<(i32, bool)> {
    if !auth::enabled(mc) && !tls::enabled(mc) {
        Some((mc.spec.container_port, true))
    } else if warm_restart::enabled(mc) {
        Some((LocalPorts::of(mc).save, false))
    } else {
        None
    }
}

/// Adds the agent (and, with authentication, the init container writing the first password
/// file) to `pod`. The pod shares its process namespace when the agent signals memcached: it runs
/// as memcached's user, so it needs no capability for that.
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
    let mut env = Vec::new();
    if warm_restart::enabled(mc) {
        args.extend(warm_restart::agent_args(mc));
        mounts.extend(warm_restart::agent_mounts());
        env.push(warm_restart::agent_env(mc));
    }
    if auth::enabled(mc) {
        args.extend(auth::agent_args(mc));
        args.push(format!("--proxy=127.0.0.1:{}", ports.agent));
        mounts.extend(auth::agent_mounts());
    }
    args.extend(super::relay::member_agent_args(mc));
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
        ports: (name == CONTAINER)
            .then(|| super::relay::member_agent_ports(mc))
            .flatten(),
        volume_mounts: Some(mounts.clone()),
        env: Some(env.clone()).filter(|e| !e.is_empty()),
        resources,
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    if auth::enabled(mc) {
        pod.init_containers
            .get_or_insert_with(Vec::new)
            .push(container("auth-init", auth::init_args(), None));
    }
    // The agent signals memcached: SIGUSR1 to save, SIGHUP to re-read its password file.
    if warm_restart::enabled(mc) || auth::enabled(mc) {
        pod.share_process_namespace = Some(true);
    }
    pod.containers
        .push(container(CONTAINER, args, Some(resources())));
}

/// The agent's, beside a member or a proxy: idle but for a few file reads every few seconds;
/// its RSS is a few MiB.
pub(super) fn resources() -> ResourceRequirements {
    super::requirements("5m", "8Mi", Some("32Mi"))
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
                plain: 11298,
                save: 11297,
                backend: 11296
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
                plain: 11288,
                save: 11297,
                backend: 11296
            }
        );
    }

    #[test]
    fn no_warm_restart_no_auth_and_no_tls_means_no_agent() {
        let mut mc = memcached("cache", 1);
        mc.spec.max_memory_mib = warm_restart::MIN_MEMORY_MIB - 1;
        let mut pod = PodSpec::default();
        add_to_pod(&mc, &mut pod, "img");
        assert_eq!(pod, PodSpec::default());
        assert_eq!(exporter_target(&mc), 11211);
    }
}
