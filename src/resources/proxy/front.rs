//! The proxy with `spec.auth` or `spec.tls`. memcached's proxy neither asks its clients for a
//! login nor speaks TLS on its listener without build options, and it cannot log in to the
//! members or verify them. So its agent serves the clients (`agent route --listen`: the login
//! and TLS, as memcached does on a member) and relays them to the proxy on the pod's loopback,
//! and each member's agent relays the proxy's connections, logged in, to memcached's plain
//! loopback listener (`agent run --backend-listen`). That port asks no login: the Memcached's
//! NetworkPolicy, which admission requires here, admits only the proxy's pods and the
//! operator's to it.

use k8s_openapi::api::core::v1::{ContainerPort, ResourceRequirements, Volume, VolumeMount};

use crate::api::Memcached;
use crate::resources::ports::LocalPorts;
use crate::resources::relay::fronted;
use crate::resources::{auth, tls};

/// Where memcached in proxy mode listens: on every address at memcached's port, or, fronted,
/// on the pod's loopback only (the agent serves memcached's port).
pub fn memcached_listener(mc: &Memcached) -> (&'static str, i32) {
    match fronted(mc) {
        true => ("127.0.0.1", LocalPorts::of(mc).plain),
        false => ("0.0.0.0", mc.spec.container_port),
    }
}

/// The ports clients use: memcached's, and tls.plaintextPort's.
pub fn client_ports(mc: &Memcached) -> Vec<ContainerPort> {
    std::iter::once(super::super::container_port(
        "memcached",
        mc.spec.container_port,
    ))
    .chain(
        tls::plaintext_port(mc).map(|p| super::super::container_port(tls::PLAINTEXT_PORT_NAME, p)),
    )
    .collect()
}

/// Where the proxy's agent answers the pod's readiness (`GET /readyz`: memcached in proxy mode
/// answers on the loopback). The proxy's pods have no save endpoint: its port serves this.
pub fn ready_port(mc: &Memcached) -> i32 {
    LocalPorts::of(mc).save
}

/// The proxy's agent's flags to serve the clients; none unless fronted.
pub fn agent_args(mc: &Memcached) -> Vec<String> {
    if !fronted(mc) {
        return Vec::new();
    }
    let mut args = vec![
        format!("--listen=0.0.0.0:{}", mc.spec.container_port),
        format!("--ready-address=0.0.0.0:{}", ready_port(mc)),
        // memcached's own default for -c.
        format!(
            "--max-connections={}",
            mc.spec.max_connections.unwrap_or(1024)
        ),
    ];
    if let Some(plain) = tls::plaintext_port(mc) {
        args.push(format!("--plain-listen=0.0.0.0:{plain}"));
    }
    if auth::enabled(mc) {
        args.push(format!("--credentials={}", auth::CREDENTIALS_DIR));
        args.push(format!(
            "--rotation-grace={}s",
            auth::rotation_grace_seconds(mc)
        ));
    }
    if tls::enabled(mc) {
        args.push(format!("--tls-dir={}", tls::TLS_DIR));
        if tls::client_ca_secret_name(mc).is_some() {
            args.push(format!("--client-ca-dir={}", tls::CLIENT_CA_DIR));
        }
    }
    args
}

/// The proxy's agent's resources when it carries the clients' connections: TLS and two copy
/// buffers per connection, up to `--max-connections` of them (about 40 KiB each with TLS).
pub fn agent_resources() -> ResourceRequirements {
    crate::resources::requirements("50m", "32Mi", Some("256Mi"))
}

/// The Secrets the proxy's agent reads.
pub fn volumes(mc: &Memcached) -> Vec<Volume> {
    if !fronted(mc) {
        return Vec::new();
    }
    auth::credentials_volume(mc)
        .into_iter()
        .chain(tls::volumes(mc))
        .collect()
}

pub fn mounts(mc: &Memcached) -> Vec<VolumeMount> {
    if !fronted(mc) {
        return Vec::new();
    }
    auth::enabled(mc)
        .then(auth::credentials_mount)
        .into_iter()
        .chain(tls::mounts(mc))
        .collect()
}
