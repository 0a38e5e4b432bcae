//! The watch and cache layer: the watches of Memcacheds, of what they own, of their pods and of
//! HorizontalPodAutoscalers; the caches they fill, as the reconciles read them; and the triggers
//! that decide which changes queue a Memcached, and how urgently. It knows nothing of the
//! reconcile: the controller's wiring (controller/run.rs) joins the two through the runtime's
//! queue.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::certificate::Certificate;
use crate::service_monitor::ServiceMonitor;
use operator_runtime::cache::Cache;
use operator_runtime::readiness::SyncGate;

pub mod digest;
pub mod feed;
pub mod hpa_index;
pub mod known_fields;
pub mod managed_fields;
pub mod memcached;
pub mod meta;
pub mod own_writes;
pub mod owned;
pub mod pod_index;
mod pod_protobuf;
pub mod triggers;
mod watching;

pub use memcached::parse_event;
pub use watching::Watching;

use hpa_index::HpaIndex;
use owned::OwnedObject;
use pod_index::PodIndex;

/// The optional kinds this process keeps: served by the cluster and watchable by it (a watch it
/// may not run, or of an API not served, fails for ever).
#[derive(Clone, Copy, Debug)]
pub struct Kept {
    pub network_policies: bool,
    pub service_monitors: bool,
    pub certificates: bool,
    /// HorizontalPodAutoscalers, read only: one that targets an autoscaled Memcached stops the
    /// operator's autoscaler.
    pub autoscalers: bool,
}

/// One scope's caches, as its watches keep them: what a reconcile reads instead of the API
/// server.
pub struct Cached {
    pub services: Cache<OwnedObject<Service>>,
    pub budgets: Cache<OwnedObject<PodDisruptionBudget>>,
    /// The proxies' (`spec.proxy`), and the ConfigMaps of their routes.
    pub deployments: Cache<OwnedObject<Deployment>>,
    pub config_maps: Cache<OwnedObject<ConfigMap>>,
    /// None where this process does not keep NetworkPolicies.
    pub network_policies: Option<Cache<OwnedObject<NetworkPolicy>>>,
    /// None where the cluster does not serve their API.
    pub service_monitors: Option<Cache<OwnedObject<ServiceMonitor>>>,
    /// None where the cluster does not serve their API or this process may not watch them.
    pub certificates: Option<Cache<OwnedObject<Certificate>>>,
    pub pods: Arc<PodIndex>,
    /// By the Memcached they target; None where this process may not watch them.
    pub hpas: Option<Arc<HpaIndex>>,
    /// Whether every watch of the scope has listed once: reconciling before would report a
    /// wrong status (no pods yet) and correct it a moment later, two needless writes per object.
    pub synced: SyncGate,
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The layer stays beneath the reconcile: none of its files names the controller.
    #[test]
    fn the_watch_layer_names_nothing_of_the_controller() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/watch");
        let controller = concat!("crate::", "controller");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).expect("src/watch") {
            let path = entry.expect("an entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            assert!(
                !text.contains(controller) && !text.contains(concat!("super::", "super")),
                "{} names the controller",
                path.display()
            );
            read += 1;
        }
        assert!(read > 10, "read {read} files of {}", dir.display());
    }
}
