//! The ports inside a member's pod beside the user's.

use super::tls;
use crate::api::{EXPORTER_PORT, Memcached};

/// Ports in the pod: the agent's login proxy for the exporter and memcached's plain listener
/// when TLS is on (both on the loopback), the agent's save endpoint, and, with the proxy and
/// auth or TLS, the agent's relay for the proxy (see proxy/front.rs). Moved off the ports the
/// user picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPorts {
    pub agent: i32,
    pub plain: i32,
    pub save: i32,
    pub backend: i32,
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
            save: free([11297, 11287, 11277]),
            backend: free([11296, 11286, 11276]),
        }
    }
}
