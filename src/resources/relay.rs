//! The members' relay for the proxy, with `spec.proxy` and `spec.auth` or `spec.tls` (see
//! proxy/front.rs): memcached's proxy cannot log in to a member or speak TLS to it, so each
//! member's agent takes the proxy's connections on a port of its own and relays them, logged
//! in, to memcached's plain loopback listener. Beneath both the members' agent and the proxy.

use k8s_openapi::api::core::v1::ContainerPort;

use super::ports::LocalPorts;
use super::{auth, tls};
use crate::api::Memcached;

/// The members' agents' port for the proxy, named in their pods.
pub const BACKEND_PORT_NAME: &str = "proxy-backend";

/// Whether the proxy's agent serves its clients (and the members' agents relay the proxy).
pub fn fronted(mc: &Memcached) -> bool {
    mc.spec.proxy_on().is_some() && (auth::enabled(mc) || tls::enabled(mc))
}

/// Where the proxy reaches each member: memcached's own port, or its agent's relay.
pub fn backend_port(mc: &Memcached) -> i32 {
    match fronted(mc) {
        true => LocalPorts::of(mc).backend,
        false => mc.spec.container_port,
    }
}

/// A member's agent's flag for the proxy's connections; none unless fronted.
pub fn member_agent_args(mc: &Memcached) -> Vec<String> {
    match fronted(mc) {
        true => vec![format!(
            "--backend-listen=0.0.0.0:{}",
            LocalPorts::of(mc).backend
        )],
        false => Vec::new(),
    }
}

/// A member's agent's port for the proxy; none unless fronted.
pub fn member_agent_ports(mc: &Memcached) -> Option<Vec<ContainerPort>> {
    fronted(mc).then(|| {
        vec![super::container_port(
            BACKEND_PORT_NAME,
            LocalPorts::of(mc).backend,
        )]
    })
}
