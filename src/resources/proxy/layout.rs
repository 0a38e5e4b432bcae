//! The proxy's layout: the members it routes to, as the operator declares it and the agent
//! checks it, and the route configuration rendered from it (see the parent module).

use serde::{Deserialize, Serialize};

use super::MAX_LAYOUT_BYTES;
use crate::api::Memcached;
use crate::resources::member_addresses_on;

/// Longest address of a member (a DNS name of 253, a colon and a port).
const MAX_ADDRESS: usize = 253 + 6;

/// What the proxy routes to: the members' addresses, in ordinal order; during a handover, the
/// layout before the last change too, where reads that miss fall back and deletes also go.
/// While the members are updated (`hold`), a request no member answered is tried again.
/// With zone-local reads (`zones`), each member's zone, in the same order.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub members: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// The zone of each of `members` ("" for a member whose pod has none); empty without
    /// zone-local reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// The zone of each of `previous`, likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_zones: Vec<String>,
}

/// The operator's own route handlers (`route_hold`, `route_deleteall`, `route_zwrite`), loaded
/// with the route library (`-o proxy_config=routelib:<this file>`): the agent writes it beside
/// the configuration.
pub const ROUTES_LIBRARY: &str = include_str!("routes.lua");
/// How long a request is held for a member that does not answer while the members are
/// updated: a member restarted in place is out 0.7 to 1.6 s, and the proxy tries a member it
/// lost again every second. Tried every quarter second.
const HOLD_SECONDS: u32 = 5;
const HOLD_PAUSE: f64 = 0.25;

/// The commands that read a key: on a miss in the layout, they ask the previous one.
const READS: [&str; 5] = ["get", "gets", "gat", "gats", "mg"];
/// The commands that delete a key: sent to both layouts, so no old value comes back
/// (`route_deleteall`: the answer says deleted if either held the key).
const DELETES: [&str; 2] = ["delete", "md"];

impl Layout {
    /// The first `members` of `mc`'s members; `previous` the first that many, during a
    /// handover.
    pub fn of(mc: &Memcached, members: i32, previous: Option<i32>) -> Self {
        // With auth or TLS, each member's agent's relay (front.rs).
        let addresses = |n| member_addresses_on(mc, n, super::backend_port(mc));
        Self {
            members: addresses(members),
            previous: previous.map(addresses).unwrap_or_default(),
            ..Self::default()
        }
    }

    /// With zone-local reads (`mc`'s): the layout with each member's zone, as `zone` gives it
    /// by ordinal (the members are the first so many).
    pub fn in_zones(mut self, mc: &Memcached, zone: impl Fn(i32) -> Option<String>) -> Self {
        if !mc.spec.proxy_on().is_some_and(|p| p.zone_local_reads) {
            return self;
        }
        let zones = |n: usize| (0..n as i32).map(|m| zone(m).unwrap_or_default()).collect();
        self.zones = zones(self.members.len());
        self.previous_zones = zones(self.previous.len());
        self
    }

    /// The layout in `text`, if it is one memcached can load: JSON of this shape, within
    /// `MAX_LAYOUT_BYTES`, every member a `host:port` whose host is a DNS name or an IPv4
    /// address and whose port is 1 to 65535, none twice.
    pub fn check(text: &str) -> Result<Self, String> {
        if text.len() > MAX_LAYOUT_BYTES {
            return Err(format!(
                "the layout has {} bytes, more than {MAX_LAYOUT_BYTES}",
                text.len()
            ));
        }
        let layout: Layout =
            serde_json::from_str(text).map_err(|e| format!("the layout is not JSON: {e}"))?;
        for list in [&layout.members, &layout.previous] {
            let mut seen = std::collections::HashSet::new();
            for member in list {
                check_address(member)?;
                if !seen.insert(member) {
                    return Err(format!("member {member:?} is listed twice"));
                }
            }
        }
        if layout.members.is_empty() && !layout.previous.is_empty() {
            return Err("a previous layout without members".to_string());
        }
        let zoned = !layout.zones.is_empty();
        for (list, zones) in [
            (&layout.members, &layout.zones),
            (&layout.previous, &layout.previous_zones),
        ] {
            if (zoned || !zones.is_empty()) && zones.len() != list.len() {
                return Err(format!(
                    "{} zones for {} members: one for each, or none",
                    zones.len(),
                    list.len()
                ));
            }
            zones.iter().try_for_each(|z| check_zone(z))?;
        }
        Ok(layout)
    }

    /// memcached's route configuration (its embedded route library's) for this layout, for a
    /// proxy in zone `local` (with zone-local reads; "" if its pod has none): one pool of the
    /// members, every command routed to the member its key hashes to; or, with zones, a pool
    /// of each zone's members (`pools`), writes to all of them and reads to the proxy's zone
    /// first. Without members every command gets a miss (`route_null`): memcached refuses an
    /// empty pool. With `hold`, each route is wrapped in `route_hold` (`ROUTES_LIBRARY`).
    /// Only called on a checked layout: each address is plain `[a-z0-9.-]+:port`, so it is
    /// written into a Lua string as is.
    pub fn render(&self, local: &str) -> String {
        let mut lua = String::from(
            "-- Written by memcached-operator's agent from the layout the operator keeps.\n",
        );
        // A member that is down fails its requests within 0.75 s (a read's wait, then a
        // reconnection's), and at once after the third (the route library's defaults wait
        // seconds); it is tried again every second.
        lua.push_str(
            "settings{\n    backend_connect_timeout = 0.25,\n    backend_read_timeout = 0.5,\n    backend_retry_waittime = 1,\n}\n",
        );
        if self.members.is_empty() {
            lua.push_str("routes{\n    default = route_null{},\n}\n");
            return lua;
        }
        let pools = self.pools(local);
        lua.push_str("pools{\n");
        for pool in &pools {
            if let Some(zone) = pool.zone {
                lua.push_str(&format!("    -- zone {zone:?}\n"));
            }
            lua.push_str(&format!("    {} = {{\n        backends = {{\n", pool.name));
            for member in &pool.members {
                lua.push_str(&format!("            \"{member}\",\n"));
            }
            lua.push_str("        },\n    },\n");
        }
        lua.push_str("}\nroutes{\n");
        let tries = (f64::from(HOLD_SECONDS) / HOLD_PAUSE) as u32 + 1;
        let held = |route: String| match self.hold {
            true => {
                format!("route_hold{{ child = {route}, tries = {tries}, pause = {HOLD_PAUSE} }}")
            }
            false => route,
        };
        let children = |pools: &[&Pool]| {
            let quoted: Vec<String> = pools.iter().map(|p| format!("\"{}\"", p.name)).collect();
            format!("children = {{ {} }}", quoted.join(", "))
        };
        let all: Vec<&Pool> = pools.iter().collect();
        if all.len() > 1 {
            lua.push_str("    cmap = {\n");
            let all = children(&all);
            for read in READS {
                let route = held(format!("route_failover{{ {all}, miss = true }}"));
                lua.push_str(&format!("        {read} = {route},\n"));
            }
            for delete in DELETES {
                let route = held(format!("route_deleteall{{ {all} }}"));
                lua.push_str(&format!("        {delete} = {route},\n"));
            }
            lua.push_str("    },\n");
        }
        let writes: Vec<&Pool> = pools.iter().filter(|p| !p.previous).collect();
        let route = match writes.as_slice() {
            [one] => format!("route_direct{{ child = \"{}\" }}", one.name),
            zones => format!("route_zwrite{{ {} }}", children(zones)),
        };
        lua.push_str(&format!("    default = {},\n}}\n", held(route)));
        lua
    }

    /// The pools, in the order a read that misses asks them: the members, then the previous
    /// layout's; with zones, the proxy's own zone first, then the others by name, each
    /// zone's members and then its members of the previous layout.
    fn pools<'a>(&'a self, local: &str) -> Vec<Pool<'a>> {
        fn in_zone<'a>(members: &'a [String], zones: &[String], zone: &str) -> Vec<&'a String> {
            let zoned = members.iter().zip(zones);
            zoned.filter(|(_, z)| *z == zone).map(|(m, _)| m).collect()
        }
        let mut pools = Vec::new();
        if self.zones.is_empty() {
            pools.push(Pool::new("members".into(), None, &self.members, false));
            pools.push(Pool::new("previous".into(), None, &self.previous, true));
        }
        let mut zones: Vec<&str> = self
            .zones
            .iter()
            .chain(&self.previous_zones)
            .map(String::as_str)
            .collect();
        zones.sort_by_key(|z| (*z != local, *z));
        zones.dedup();
        for (i, zone) in zones.into_iter().enumerate() {
            let members = in_zone(&self.members, &self.zones, zone);
            let previous = in_zone(&self.previous, &self.previous_zones, zone);
            pools.push(Pool::new(format!("zone{i}"), Some(zone), members, false));
            pools.push(Pool::new(
                format!("zone{i}_previous"),
                Some(zone),
                previous,
                true,
            ));
        }
        pools.retain(|p| !p.members.is_empty());
        pools
    }
}

/// One of the route configuration's pools.
struct Pool<'a> {
    name: String,
    /// With zones, its zone.
    zone: Option<&'a str>,
    members: Vec<&'a String>,
    /// Of the previous layout: reads that miss and deletes go there, writes not.
    previous: bool,
}

impl<'a> Pool<'a> {
    fn new(
        name: String,
        zone: Option<&'a str>,
        members: impl IntoIterator<Item = &'a String>,
        previous: bool,
    ) -> Self {
        let members = members.into_iter().collect();
        Self {
            name,
            zone,
            members,
            previous,
        }
    }
}

/// The member (by its place in a layout of `members`) memcached's proxy sends `key` to: its
/// pools' defaults, XXH3 of the whole key with seed 0, then the jump hash over the backends
/// (`proxy_lua.c`, `proxy_jump_hash.c`).
pub fn owner(key: &[u8], members: usize) -> usize {
    let mut hash = xxhash_rust::xxh3::xxh3_64_with_seed(key, 0);
    let (mut b, mut j) = (-1_i64, 0_i64);
    while j < members as i64 {
        b = j;
        hash = hash.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1_i64 << 31) as f64 / ((hash >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as usize
}

/// A zone as a label's value may name it (or "", none): it is written into the configuration
/// only as a comment, but checked all the same.
fn check_zone(zone: &str) -> Result<(), String> {
    let inner = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let edge = |b: Option<&u8>| b.is_none_or(u8::is_ascii_alphanumeric);
    let bytes = zone.as_bytes();
    match bytes.len() <= 63
        && bytes.iter().all(|b| inner(*b))
        && edge(bytes.first())
        && edge(bytes.last())
    {
        true => Ok(()),
        false => Err(format!("zone {zone:?} is not a label's value")),
    }
}

/// A member's address as the layout may hold it (see `Layout::check`).
fn check_address(address: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("member {address:?}: {why}"));
    if address.len() > MAX_ADDRESS {
        return bad("too long");
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return bad("not host:port");
    };
    if !matches!(port.parse::<u16>(), Ok(p) if p > 0) || port.starts_with('0') {
        return bad("the port is not 1 to 65535");
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.is_empty() || !host.split('.').all(label_ok) {
        return bad("the host is not a DNS name or IPv4 address");
    }
    Ok(())
}
