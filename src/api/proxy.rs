//! One address for every client: memcached's own proxy in front of the members.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// memcached in proxy mode (`-o proxy_config=routelib`) in front of the members: a Deployment
/// `<name>-proxy` and a ClusterIP Service of the same name that any client uses by one address.
/// The proxy hashes each key to one member; the operator writes its route configuration
/// (ConfigMap `<name>-proxy`) from the members, and the proxy loads a new one in the same
/// process (SIGHUP), keeping its clients' connections.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// true: the proxy runs and `status.proxy` (and the binding's `host`) name its Service.
    #[serde(default)]
    pub enabled: bool,

    /// Proxy pods. Each holds no data: any of them serves any key.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,

    /// Container image of the proxy: a memcached built with its proxy and route library (1.6.33
    /// or later). Defaults to the members' image. One older by its tag, or whose memcached
    /// refuses the proxy's option when its pods start, gives Degraded (InvalidSpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Seconds after a change of members (a scale, by hand or by the autoscaler) during which
    /// reads that miss on the new layout ask the previous one, and deletes go to both, so keys
    /// written before are still found. A member leaving the layout keeps serving until then and
    /// is deleted after (`status.proxy.draining`). 0: no handover.
    #[serde(default = "default_handover_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub handover_seconds: i32,

    /// Compute resources of the proxy container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::bounded_resources)]
    pub resources: Option<Box<ResourceRequirements>>,

    /// true: each zone the members run in (a pod's `topology.kubernetes.io/zone` label, which
    /// Kubernetes copies from its node) holds a copy of every key. Writes and deletes go to
    /// every zone; a read goes to the proxy's own zone first and, on a miss, to the others.
    /// Reads stay in the zone; memory holds as many copies as there are zones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zone_local_reads: bool,
}

impl crate::api::MemcachedSpec {
    /// `spec.proxy`, while it is on.
    pub fn proxy_on(&self) -> Option<&ProxySpec> {
        self.proxy.as_ref().filter(|p| p.enabled)
    }
}

impl Default for ProxySpec {
    fn default() -> Self {
        Self {
            enabled: false,
            replicas: default_replicas(),
            image: None,
            handover_seconds: default_handover_seconds(),
            resources: None,
            zone_local_reads: false,
        }
    }
}

fn default_replicas() -> i32 {
    2
}

fn default_handover_seconds() -> i32 {
    600
}

/// Where clients reach the proxy, while `spec.proxy` is on.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// The proxy's address for clients: `<name>-proxy.<namespace>.svc:<port>`.
    pub address: String,

    /// Proxy pods that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Members the proxy routes to: the first this many by ordinal. A new member joins once it
    /// is Ready (and all before it).
    #[serde(default)]
    pub members: i32,

    /// While reads that miss ask the layout before the last change of members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<Handover>,

    /// Members beyond `spec.size` kept serving the previous layout's keys until the handover
    /// ends, then deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,

    /// While the members are updated: since when the proxies hold a request a member does not
    /// answer (one restarting in place), trying it again for up to 5 s instead of failing it.
    /// The members' restarts wait until the proxies have had 5 s to load that layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding_since: Option<Time>,

    /// With `zoneLocalReads`: the members of the layout by zone, each zone a copy of every
    /// key. "" is the zone of members whose pods have no zone label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<ZoneMembers>,
}

/// The members of the proxy's layout in one zone.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ZoneMembers {
    pub zone: String,
    pub members: Vec<String>,
}

/// A handover from one layout of members to the next.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// Members of the previous layout (the first this many by ordinal).
    pub previous_members: i32,
    /// When the previous layout is dropped.
    pub until: Time,
}
