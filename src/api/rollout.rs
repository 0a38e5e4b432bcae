//! How members are updated, how a pod leaves, and how the pods spread: the rollout, the
//! disruption budget and the spread.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The operator's PodDisruptionBudget for a Memcached's pods.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudgetSpec {
    /// false: no PodDisruptionBudget (e.g. a one-node cluster, where a budget would stall drains).
    #[serde(default = "yes")]
    pub enabled: bool,

    /// Pods a voluntary disruption (a drain's eviction) may take down at once.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub max_unavailable: i32,
}

impl Default for DisruptionBudgetSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            max_unavailable: 1,
        }
    }
}

/// How members are updated, and how a pod leaves.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Unused since 0.3.0, kept so that specs written for 0.2.0 still apply: a member is
    /// updated under its own name, so an update cannot add one first.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_surge: i32,

    /// Members updated at once (0 and 1 both mean one at a time).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub max_unavailable: i32,

    /// Seconds a new pod must stay Ready before the rollout counts it and moves on.
    #[serde(default = "default_min_ready_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: i32,

    /// Seconds a pod being deleted (scale-down, eviction, drain) keeps serving after it has left
    /// the Service, so clients that still hold its address (DNS caches) are not refused. With
    /// warm restart, a restart in place keeps the address and does not wait. The grace period is
    /// this plus 20 (plus 5 for warm restart's save).
    #[serde(default = "default_pre_stop_delay_seconds")]
    #[schemars(range(min = 0, max = 300))]
    pub pre_stop_delay_seconds: i32,

    /// Seconds a member may take to become Ready (after it is made, or restarted for an
    /// update) before the Memcached reports `Progressing=False` and `Degraded=True` with reason
    /// `ProgressDeadlineExceeded`, as a Deployment does.
    #[serde(default = "default_progress_deadline_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub progress_deadline_seconds: i32,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_surge: 1,
            max_unavailable: 0,
            min_ready_seconds: default_min_ready_seconds(),
            pre_stop_delay_seconds: default_pre_stop_delay_seconds(),
            progress_deadline_seconds: default_progress_deadline_seconds(),
        }
    }
}

/// How a Memcached's pods are spread over nodes. Preferred (the default): over nodes and zones
/// where the scheduler can. Required: never two pods of this Memcached on one node (pods stay
/// Pending while there are fewer nodes than size, and a rollout needs a spare node for its extra
/// pod). Off: the scheduler's defaults and `affinity` only.
#[derive(
    schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum Spread {
    /// Spread over nodes and zones where the scheduler can (topology spread, ScheduleAnyway).
    #[default]
    Preferred,
    /// At most one pod per node (required pod anti-affinity); zones stay preferred.
    Required,
    /// No spreading of the operator's own.
    Off,
}

fn yes() -> bool {
    true
}

fn one() -> i32 {
    1
}

fn default_min_ready_seconds() -> i32 {
    5
}

fn default_pre_stop_delay_seconds() -> i32 {
    10
}

/// A Deployment's default.
fn default_progress_deadline_seconds() -> i32 {
    600
}
