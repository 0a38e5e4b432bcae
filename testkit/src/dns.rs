//! DNS lookups against one name server (the cluster's CoreDNS), uncached, so each answer is the
//! cluster's current one.

use std::net::{Ipv4Addr, SocketAddr};

use anyhow::Result;
use hickory_resolver::Resolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;

/// The A records of `name` (fully qualified) as `server` answers now.
pub async fn lookup_a(server: SocketAddr, name: &str) -> Result<Vec<Ipv4Addr>> {
    let mut config = ResolverConfig::new();
    config.add_name_server(NameServerConfig::new(server, Protocol::Udp));
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.attempts = 1;
    let resolver = Resolver::builder_with_config(config, TokioConnectionProvider::default())
        .with_options(opts)
        .build();
    let fqdn = if name.ends_with('.') {
        name.to_string()
    } else {
        format!("{name}.")
    };
    let mut addresses: Vec<Ipv4Addr> = resolver
        .ipv4_lookup(fqdn)
        .await?
        .into_iter()
        .map(|a| a.0)
        .collect();
    addresses.sort();
    Ok(addresses)
}
