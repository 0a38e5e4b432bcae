//! The Memcached controller: the reconcile in its phases, the events it records, and the wiring
//! (run.rs) that joins the watch layer (crate::watch) to the runtime's queue and workers.

mod autoscale;
mod binding;
mod context;
mod ensure;
mod events;
mod legacy;
mod members;
mod outcome;
mod reconcile;
pub(crate) mod rollouts;
mod run;
mod secrets;
mod status_writes;
mod sweep;

pub use context::{Config, Context, Remembered};
pub use events::Events;
pub use members::{TEMPLATE_ANNOTATION, member};
pub use operator_runtime::initial_list::InitialList;
pub use operator_runtime::queue::Priority;
pub use outcome::Outcome;
pub use reconcile::reconcile;
pub use rollouts::Rollouts;
pub use run::{Clients, run};

use operator_runtime::watch_namespace::WatchNamespace;

/// Settings of the controller, from flags and environment.
#[derive(Clone, Debug)]
pub struct Settings {
    pub watch_namespace: WatchNamespace,
    pub max_concurrent_reconciles: u16,
    /// Memcacheds whose members may roll at once for a pod template change of the operator's
    /// own.
    pub max_concurrent_rollouts: u16,
    /// Images for CRs that name none (RELATED_IMAGE_MEMCACHED, RELATED_IMAGE_MEMCACHED_EXPORTER).
    pub images: crate::resources::Images,
    /// Whether the cluster serves ServiceMonitors: only then are they watched and kept.
    pub service_monitors: bool,
    /// Whether this process may watch NetworkPolicies: only then are they kept.
    pub network_policies: bool,
    /// Whether the cluster serves cert-manager's Certificates: only then is `tls.issuerRef` kept.
    pub certificates: bool,
    /// Whether this process may watch HorizontalPodAutoscalers: only then does an HPA of an
    /// autoscaled Memcached stop the operator's autoscaler.
    pub autoscalers: bool,
    /// How the watches fill their caches (streaming where the API server serves it).
    pub initial_list: InitialList,
    /// Where this operator runs, when in a cluster.
    pub operator_namespace: Option<String>,
    /// Identity in events (the pod name when in a cluster).
    pub instance: String,
}
