//! `spec.autoscaling` and `status.autoscaling`: the operator sizes the Memcached from memcached's
//! own signals (see `crate::autoscaling`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Sizing from the cache's own signals, through `spec.size`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || self.minSize <= self.maxSize")
    .message("must not exceed maxSize")
    .field_path(".minSize"))]
pub struct AutoscalingSpec {
    /// true: the operator keeps `spec.size` between minSize and maxSize from what the members
    /// report; a size set by hand is put back at its next decision. false: `spec.size` is
    /// the user's.
    #[serde(default)]
    pub enabled: bool,

    /// Fewest pods.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1000))]
    pub min_size: i32,

    /// Most pods.
    #[serde(default = "default_max_size")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_size: i32,

    /// A member is under pressure while it evicts at least this many items a second: items
    /// still live, pushed out for room, which memcached does only once its whole memory is
    /// taken.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1000000))]
    pub evictions_per_second: i32,

    /// How full, in item bytes (`bytes` against `limit_maxbytes`), the members left after a
    /// scale-in may be. Below 100 because items take more room in memcached's slabs than
    /// their bytes (up to a quarter with the default growth factor).
    #[serde(default = "default_memory_percent")]
    #[schemars(range(min = 10, max = 100))]
    pub memory_percent: i32,

    /// How long pressure must last before one pod is added (and again after each scale).
    #[serde(default = "default_scale_out_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_out_stabilization_seconds: i32,

    /// How long every member must be calm (no evictions, and the items would fit one pod fewer
    /// below memoryPercent) before one pod is removed. Long, because the removed member's keys
    /// miss at once.
    #[serde(default = "default_scale_in_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub scale_in_stabilization_seconds: i32,
}

impl Default for AutoscalingSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            min_size: 1,
            max_size: default_max_size(),
            evictions_per_second: 1,
            memory_percent: default_memory_percent(),
            scale_out_stabilization_seconds: default_scale_out_seconds(),
            scale_in_stabilization_seconds: default_scale_in_seconds(),
        }
    }
}

impl crate::api::MemcachedSpec {
    /// `spec.autoscaling`, while it is on.
    pub fn autoscaling_on(&self) -> Option<&AutoscalingSpec> {
        self.autoscaling.as_ref().filter(|a| a.enabled)
    }
}

fn one() -> i32 {
    1
}

fn default_max_size() -> i32 {
    10
}

fn default_memory_percent() -> i32 {
    75
}

fn default_scale_out_seconds() -> i32 {
    30
}

fn default_scale_in_seconds() -> i32 {
    300
}

/// What the autoscaler last saw and decided.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// The size the autoscaler keeps in `spec.size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i32>,

    /// Why it holds or scales now, e.g. Evicting, Calm, Stabilizing, AtMaxSize.
    pub reason: String,

    /// The decision in words, with the figures it rests on.
    pub message: String,

    /// The members' signals at the last reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<Signals>,

    /// While pressure or calm waits out its window: when the window ends, and one pod is added
    /// or removed if it lasts until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scale_time: Option<Time>,

    /// The last scale: when, from and to which size, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale: Option<LastScale>,

    /// Advice the operator cannot apply alone (e.g. raise maxConnections or maxItemSizeMiB).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recommendations: Vec<String>,
}

/// The members' signals, summed or at their worst member.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Signals {
    /// Members that answered `stats`, of those the Memcached should have.
    pub members_answering: i32,
    /// Items evicted per second, all members together.
    pub evictions_per_second: i64,
    /// The fullest member's memory, in percent of its limit.
    pub memory_percent: i32,
    /// Hits in percent of gets since the last reading, all members together; none without gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_percent: Option<i32>,
}

/// One scale the autoscaler made.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastScale {
    /// When the autoscaler set spec.size.
    pub time: Time,
    /// spec.size before.
    pub from: i32,
    /// spec.size after.
    pub to: i32,
    /// Why: Evicting, Calm, BelowMinSize or AboveMaxSize.
    pub reason: String,
}
