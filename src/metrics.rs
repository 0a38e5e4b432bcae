//! Prometheus metrics under controller-runtime's names and buckets, so dashboards and alerts
//! written for Go operators work unchanged.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge as GaugeProto, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::status::CONDITION_TYPES;

/// Value of the `controller` label.
pub const CONTROLLER: &str = "memcached";

/// controller-runtime's `controller_runtime_reconcile_time_seconds` buckets.
const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// controller-runtime's workqueue histogram buckets: 10 ns to 1000 s, ×10 each.
fn workqueue_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1e-8, 10.0, 12).expect("valid buckets")
}

/// The work queue's series (controller-runtime's `workqueue_*`), labelled for this controller.
#[derive(Clone)]
pub struct QueueMetrics {
    pub depth: IntGauge,
    pub adds: IntCounter,
    pub retries: IntCounter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub unfinished_work: Gauge,
    pub longest_running: Gauge,
}

/// Result label of `controller_runtime_reconcile_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    Error,
    Requeue,
    RequeueAfter,
}

impl ReconcileResult {
    pub fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }
}

pub struct Metrics {
    pub registry: Registry,
    /// Every registered metric's name, whether or not it has a series yet.
    names: Vec<String>,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_errors_by_reason: IntCounterVec,
    reconcile_time: HistogramVec,
    active_workers: IntGaugeVec,
    max_concurrent: IntGaugeVec,
    leader: IntGaugeVec,
    pub invalid_objects: IntGauge,
    conditions: ConditionGauges,
    workqueue_depth: IntGaugeVec,
    workqueue_adds: IntCounterVec,
    workqueue_retries: IntCounterVec,
    workqueue_queue_duration: HistogramVec,
    workqueue_work_duration: HistogramVec,
    workqueue_unfinished_work: GaugeVec,
    workqueue_longest_running: GaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconcile_total = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
            ),
            &["controller", "result"],
        )
        .unwrap();
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
            ),
            &["controller"],
        )
        .unwrap();
        let reconcile_errors_by_reason = IntCounterVec::new(
            Opts::new(
                "memcached_operator_reconcile_errors_total",
                "Reconciliation errors by reason",
            ),
            &["controller", "reason"],
        )
        .unwrap();
        let reconcile_time = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
            )
            .buckets(RECONCILE_BUCKETS.to_vec()),
            &["controller"],
        )
        .unwrap();
        let active_workers = IntGaugeVec::new(
            Opts::new(
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
            ),
            &["controller"],
        )
        .unwrap();
        let max_concurrent = IntGaugeVec::new(
            Opts::new(
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
            ),
            &["controller"],
        )
        .unwrap();
        let leader = IntGaugeVec::new(
            Opts::new("leader_election_master_status", "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease."),
            &["name"],
        )
        .unwrap();
        let invalid_objects = IntGauge::new(
            "memcached_operator_invalid_objects",
            "Memcached objects skipped because they could not be parsed",
        )
        .unwrap();
        let conditions = ConditionGauges::new();
        let queue_labels = &["controller", "name"];
        let workqueue_depth = IntGaugeVec::new(
            Opts::new("workqueue_depth", "Current depth of workqueue"),
            queue_labels,
        )
        .unwrap();
        let workqueue_adds = IntCounterVec::new(
            Opts::new(
                "workqueue_adds_total",
                "Total number of adds handled by workqueue",
            ),
            queue_labels,
        )
        .unwrap();
        let workqueue_retries = IntCounterVec::new(
            Opts::new(
                "workqueue_retries_total",
                "Total number of retries handled by workqueue",
            ),
            queue_labels,
        )
        .unwrap();
        let workqueue_queue_duration = HistogramVec::new(
            HistogramOpts::new(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
            )
            .buckets(workqueue_buckets()),
            queue_labels,
        )
        .unwrap();
        let workqueue_work_duration = HistogramVec::new(
            HistogramOpts::new(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
            )
            .buckets(workqueue_buckets()),
            queue_labels,
        )
        .unwrap();
        // In flight, so a stuck reconcile shows before it ends (the histograms only see ends).
        let workqueue_unfinished_work = GaugeVec::new(
            Opts::new(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been \
                 observed by work_duration. Large values indicate stuck threads.",
            ),
            queue_labels,
        )
        .unwrap();
        let workqueue_longest_running = GaugeVec::new(
            Opts::new(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
            ),
            queue_labels,
        )
        .unwrap();
        let mut names = Vec::new();
        for c in [
            Box::new(reconcile_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_errors_by_reason.clone()),
            Box::new(reconcile_time.clone()),
            Box::new(active_workers.clone()),
            Box::new(max_concurrent.clone()),
            Box::new(leader.clone()),
            Box::new(invalid_objects.clone()),
            Box::new(conditions.clone()),
            Box::new(workqueue_depth.clone()),
            Box::new(workqueue_adds.clone()),
            Box::new(workqueue_retries.clone()),
            Box::new(workqueue_queue_duration.clone()),
            Box::new(workqueue_work_duration.clone()),
            Box::new(workqueue_unfinished_work.clone()),
            Box::new(workqueue_longest_running.clone()),
        ] {
            names.extend(c.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(c).unwrap();
        }
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            use prometheus::core::Collector;
            names.extend(process.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(Box::new(process)).unwrap();
        }
        // Series appear at 0 from the start, as in controller-runtime.
        for result in ["success", "error", "requeue", "requeue_after"] {
            reconcile_total.with_label_values(&[CONTROLLER, result]);
        }
        reconcile_errors.with_label_values(&[CONTROLLER]);
        active_workers.with_label_values(&[CONTROLLER]);
        Self {
            registry,
            names,
            reconcile_total,
            reconcile_errors,
            reconcile_errors_by_reason,
            reconcile_time,
            active_workers,
            max_concurrent,
            leader,
            invalid_objects,
            conditions,
            workqueue_depth,
            workqueue_adds,
            workqueue_retries,
            workqueue_queue_duration,
            workqueue_work_duration,
            workqueue_unfinished_work,
            workqueue_longest_running,
        }
    }

    /// The work queue's series; they appear (at 0) from this call on.
    pub fn queue(&self) -> QueueMetrics {
        let labels = &[CONTROLLER, CONTROLLER];
        QueueMetrics {
            depth: self.workqueue_depth.with_label_values(labels),
            adds: self.workqueue_adds.with_label_values(labels),
            retries: self.workqueue_retries.with_label_values(labels),
            queue_duration: self.workqueue_queue_duration.with_label_values(labels),
            work_duration: self.workqueue_work_duration.with_label_values(labels),
            unfinished_work: self.workqueue_unfinished_work.with_label_values(labels),
            longest_running: self.workqueue_longest_running.with_label_values(labels),
        }
    }

    pub fn set_max_concurrent_reconciles(&self, n: u16) {
        self.max_concurrent
            .with_label_values(&[CONTROLLER])
            .set(i64::from(n));
    }

    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader
            .with_label_values(&[lease])
            .set(i64::from(leading));
    }

    /// The conditions of a Memcached as its status now reports them.
    pub fn set_conditions(&self, namespace: &str, name: &str, conditions: &[Condition]) {
        self.conditions.set(namespace, name, conditions);
    }

    /// Drops the series of a Memcached that is gone.
    pub fn forget_memcached(&self, namespace: &str, name: &str) {
        self.conditions.forget(namespace, name);
    }

    /// Every metric name this process exports, for checking the names that dashboards and alerts
    /// use (config/grafana, config/prometheus).
    pub fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// Marks a reconcile as running until the returned guard is dropped.
    pub fn start_reconcile(&self) -> ReconcileGuard<'_> {
        self.active_workers.with_label_values(&[CONTROLLER]).inc();
        ReconcileGuard {
            metrics: self,
            started: std::time::Instant::now(),
        }
    }

    fn finish(&self, started: std::time::Instant) {
        self.active_workers.with_label_values(&[CONTROLLER]).dec();
        self.reconcile_time
            .with_label_values(&[CONTROLLER])
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn record(&self, result: ReconcileResult, error_reason: Option<&str>) {
        self.reconcile_total
            .with_label_values(&[CONTROLLER, result.label()])
            .inc();
        if let Some(reason) = error_reason {
            self.reconcile_errors.with_label_values(&[CONTROLLER]).inc();
            self.reconcile_errors_by_reason
                .with_label_values(&[CONTROLLER, reason])
                .inc();
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

pub struct ReconcileGuard<'a> {
    metrics: &'a Metrics,
    started: std::time::Instant,
}

impl Drop for ReconcileGuard<'_> {
    fn drop(&mut self) {
        self.metrics.finish(self.started);
    }
}

/// `memcached_operator_memcached_condition`: one small entry per Memcached, turned into series
/// only when scraped. An `IntGaugeVec` keeps each of a Memcached's three series as a labelled
/// child of its own, about 870 bytes each: 25 MiB at 10,000 Memcacheds.
#[derive(Clone)]
struct ConditionGauges(Arc<ConditionGaugesInner>);

struct ConditionGaugesInner {
    desc: Desc,
    states: Mutex<ConditionStates>,
}

/// (namespace, name) → the status of each of `CONDITION_TYPES`, where reported.
type ConditionStates = BTreeMap<(String, String), [Option<bool>; CONDITION_TYPES.len()]>;

impl ConditionGauges {
    fn new() -> Self {
        let desc = Desc::new(
            "memcached_operator_memcached_condition".into(),
            "Status of each condition of each Memcached the leader reconciled: 1 True, 0 otherwise"
                .into(),
            vec!["namespace".into(), "memcached".into(), "type".into()],
            HashMap::new(),
        )
        .unwrap();
        Self(Arc::new(ConditionGaugesInner {
            desc,
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
                state[i] = Some(c.status == "True");
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
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let label = |name: &str, value: &str| {
            let mut pair = LabelPair::default();
            pair.set_name(name.into());
            pair.set_value(value.into());
            pair
        };
        let states = self.states();
        let mut metrics = Vec::with_capacity(states.len() * CONDITION_TYPES.len());
        for ((namespace, name), state) in states.iter() {
            for (type_, status) in CONDITION_TYPES.iter().zip(state) {
                let Some(status) = status else { continue };
                let mut gauge = GaugeProto::default();
                gauge.set_value(if *status { 1.0 } else { 0.0 });
                // Sorted by label name, as the text format expects.
                let mut metric = Metric::from_label(vec![
                    label("memcached", name),
                    label("namespace", namespace),
                    label("type", type_),
                ]);
                metric.set_gauge(gauge);
                metrics.push(metric);
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(self.0.desc.fq_name.clone());
        family.set_help(self.0.desc.help.clone());
        family.set_field_type(MetricType::GAUGE);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_and_labels() {
        let m = Metrics::new();
        m.set_max_concurrent_reconciles(4);
        m.set_leader("memcached-operator-lock", true);
        {
            let _g = m.start_reconcile();
            m.record(ReconcileResult::Success, None);
        }
        m.record(ReconcileResult::Error, Some("apply"));
        let text = m.render();
        for line in [
            r#"controller_runtime_reconcile_total{controller="memcached",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="memcached",result="error"} 1"#,
            r#"controller_runtime_reconcile_total{controller="memcached",result="requeue_after"} 0"#,
            r#"controller_runtime_reconcile_errors_total{controller="memcached"} 1"#,
            r#"memcached_operator_reconcile_errors_total{controller="memcached",reason="apply"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="memcached"} 1"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{controller="memcached",le="0.005"}"#,
            r#"controller_runtime_reconcile_time_seconds_bucket{controller="memcached",le="60"}"#,
            r#"controller_runtime_active_workers{controller="memcached"} 0"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="memcached"} 4"#,
            r#"leader_election_master_status{name="memcached-operator-lock"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes"));
    }

    #[test]
    fn conditions_are_reported_per_memcached_until_it_is_gone() {
        let m = Metrics::new();
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
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
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        m.forget_memcached("ns", "cache");
        assert!(
            !m.render()
                .contains("memcached_operator_memcached_condition{")
        );
    }

    #[test]
    fn active_workers_counts_running_reconciles() {
        let m = Metrics::new();
        let a = m.start_reconcile();
        let _b = m.start_reconcile();
        assert!(
            m.render()
                .contains(r#"controller_runtime_active_workers{controller="memcached"} 2"#)
        );
        drop(a);
        assert!(
            m.render()
                .contains(r#"controller_runtime_active_workers{controller="memcached"} 1"#)
        );
    }
}
