//! The operator's metrics: the controller's (controller-runtime's names, from the runtime crate)
//! and per Memcached the status and the reason of each condition.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use operator_runtime::metrics::ControllerMetrics;
use prometheus::IntGauge;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge as GaugeProto, LabelPair, Metric, MetricFamily, MetricType};

use crate::status::{CONDITION_TYPES, Reason};

mod autoscaling;
pub use autoscaling::AutoscalingMetrics;

/// Value of the `controller` label.
pub const CONTROLLER: &str = "memcached";

/// The controller's metrics (controller-runtime's) and the Memcached series of this operator.
pub struct Metrics {
    pub controller: Arc<ControllerMetrics>,
    pub invalid_objects: IntGauge,
    pub autoscaling: AutoscalingMetrics,
    conditions: ConditionGauges,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut controller = ControllerMetrics::new(CONTROLLER, "memcached_operator");
        let invalid_objects = IntGauge::new(
            "memcached_operator_invalid_objects",
            "Memcached objects skipped because they could not be parsed",
        )
        .unwrap();
        let conditions = ConditionGauges::new();
        controller.register(Box::new(invalid_objects.clone()));
        controller.register(Box::new(conditions.clone()));
        let autoscaling = AutoscalingMetrics::new();
        for collector in autoscaling.collectors() {
            controller.register(collector);
        }
        Self {
            controller: Arc::new(controller),
            invalid_objects,
            autoscaling,
            conditions,
        }
    }

    /// The conditions of a Memcached as its status now reports them.
    pub fn set_conditions(&self, namespace: &str, name: &str, conditions: &[Condition]) {
        self.conditions.set(namespace, name, conditions);
    }

    /// Drops the series of a Memcached that is gone.
    pub fn forget_memcached(&self, namespace: &str, name: &str) {
        self.conditions.forget(namespace, name);
        self.autoscaling.forget(namespace, name);
    }

    /// Every metric name this process exports, for checking the names that dashboards and alerts
    /// use (config/grafana, config/prometheus).
    pub fn names(&self) -> Vec<String> {
        self.controller.names()
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.controller.render()
    }
}

/// `memcached_operator_memcached_condition` and its companion `..._condition_reason`: one small
/// entry per Memcached, turned into series only when scraped. An `IntGaugeVec` keeps each of a
/// Memcached's series as a labelled child of its own, about 870 bytes each: 25 MiB for three
/// series at 10,000 Memcacheds.
#[derive(Clone)]
struct ConditionGauges(Arc<ConditionGaugesInner>);

struct ConditionGaugesInner {
    status: Desc,
    reason: Desc,
    states: Mutex<ConditionStates>,
}

/// A condition as the series report it: True or not, and its reason where it is one of ours.
type ConditionState = (bool, Option<Reason>);

/// (namespace, name) → the state of each of `CONDITION_TYPES`, where reported.
type ConditionStates = BTreeMap<(String, String), [Option<ConditionState>; CONDITION_TYPES.len()]>;

impl ConditionGauges {
    fn new() -> Self {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            Desc::new(name.into(), help.into(), labels, HashMap::new()).unwrap()
        };
        Self(Arc::new(ConditionGaugesInner {
            status: desc(
                "memcached_operator_memcached_condition",
                "Status of each condition of each Memcached the leader reconciled: 1 True, 0 otherwise",
                &["namespace", "memcached", "type"],
            ),
            // A label of its own series, not of the one above: a reason that changes does not
            // restart an alert's `for` on the condition.
            reason: desc(
                "memcached_operator_memcached_condition_reason",
                "Reason of each condition of each Memcached the leader reconciled: 1 for the reason it has now",
                &["namespace", "memcached", "type", "reason"],
            ),
            states: Mutex::default(),
        }))
    }

    fn set(&self, namespace: &str, name: &str, conditions: &[Condition]) {
        let mut states = self.states();
        let state = states
            .entry((namespace.to_string(), name.to_string()))
            .or_default();
        for c in conditions {
            if let Some(i) = CONDITION_TYPES.iter().position(|t| *t == c.type_) {
                state[i] = Some((c.status == "True", Reason::parse(&c.reason)));
            }
        }
    }

    /// A panic while holding the map leaves at worst a stale entry: used as is.
    fn states(&self) -> MutexGuard<'_, ConditionStates> {
        self.0
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.states()
            .remove(&(namespace.to_string(), name.to_string()));
    }
}

impl Collector for ConditionGauges {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.status, &self.0.reason]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let label = |name: &str, value: &str| {
            let mut pair = LabelPair::default();
            pair.set_name(name.into());
            pair.set_value(value.into());
            pair
        };
        let gauge = |labels: Vec<LabelPair>, value: f64| {
            let mut gauge = GaugeProto::default();
            gauge.set_value(value);
            let mut metric = Metric::from_label(labels);
            metric.set_gauge(gauge);
            metric
        };
        let states = self.states();
        let mut statuses = Vec::with_capacity(states.len() * CONDITION_TYPES.len());
        let mut reasons = Vec::with_capacity(states.len() * CONDITION_TYPES.len());
        for ((namespace, name), state) in states.iter() {
            for (type_, state) in CONDITION_TYPES.iter().zip(state) {
                let Some((status, reason)) = state else {
                    continue;
                };
                // Sorted by label name, as the text format expects.
                let labels = vec![
                    label("memcached", name),
                    label("namespace", namespace),
                    label("type", type_),
                ];
                if let Some(reason) = reason {
                    let mut labels = labels.clone();
                    labels.insert(2, label("reason", reason.as_str()));
                    reasons.push(gauge(labels, 1.0));
                }
                statuses.push(gauge(labels, if *status { 1.0 } else { 0.0 }));
            }
        }
        let family = |desc: &Desc, metrics| {
            let mut family = MetricFamily::default();
            family.set_name(desc.fq_name.clone());
            family.set_help(desc.help.clone());
            family.set_field_type(MetricType::GAUGE);
            family.set_metric(metrics);
            family
        };
        vec![
            family(&self.0.status, statuses),
            family(&self.0.reason, reasons),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_reported_per_memcached_until_it_is_gone() {
        let m = Metrics::new();
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "ImagePullFailed".into(),
            message: String::new(),
            last_transition_time: crate::fixtures::time(0),
            observed_generation: None,
        };
        m.set_conditions(
            "ns",
            "cache",
            &[
                condition("Available", "False"),
                condition("Degraded", "True"),
            ],
        );
        let text = m.render();
        for line in [
            r#"memcached_operator_memcached_condition{memcached="cache",namespace="ns",type="Available"} 0"#,
            r#"memcached_operator_memcached_condition{memcached="cache",namespace="ns",type="Degraded"} 1"#,
            r#"memcached_operator_memcached_condition_reason{memcached="cache",namespace="ns",reason="ImagePullFailed",type="Available"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        m.forget_memcached("ns", "cache");
        let text = m.render();
        assert!(!text.contains("memcached_operator_memcached_condition{"));
        assert!(!text.contains("memcached_operator_memcached_condition_reason{"));
    }
}
