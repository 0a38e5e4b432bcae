//! A controller's Prometheus metrics under controller-runtime's names and buckets, so dashboards
//! and alerts written for Go operators work unchanged. The operator registers its own collectors
//! in the same registry.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

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

/// The work queue's series (controller-runtime's `workqueue_*`), labelled for one controller.
#[derive(Clone)]
pub struct QueueMetrics {
    pub depth: prometheus::IntGauge,
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

/// The metrics of one controller (its `controller` label) and the process.
pub struct ControllerMetrics {
    registry: Registry,
    controller: &'static str,
    /// Every registered metric's name, whether or not it has a series yet.
    names: Vec<String>,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_errors_by_reason: IntCounterVec,
    reconcile_time: HistogramVec,
    active_workers: IntGaugeVec,
    max_concurrent: IntGaugeVec,
    leader: IntGaugeVec,
    workqueue_depth: IntGaugeVec,
    workqueue_adds: IntCounterVec,
    workqueue_retries: IntCounterVec,
    workqueue_queue_duration: HistogramVec,
    workqueue_work_duration: HistogramVec,
    workqueue_unfinished_work: GaugeVec,
    workqueue_longest_running: GaugeVec,
}

impl ControllerMetrics {
    /// `controller` is the value of the `controller` label; `prefix` names the one series that
    /// controller-runtime lacks, `<prefix>_reconcile_errors_total` by reason.
    pub fn new(controller: &'static str, prefix: &str) -> Self {
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
                format!("{prefix}_reconcile_errors_total"),
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
        let mut metrics = Self {
            registry: Registry::new(),
            controller,
            names: Vec::new(),
            reconcile_total,
            reconcile_errors,
            reconcile_errors_by_reason,
            reconcile_time,
            active_workers,
            max_concurrent,
            leader,
            workqueue_depth,
            workqueue_adds,
            workqueue_retries,
            workqueue_queue_duration,
            workqueue_work_duration,
            workqueue_unfinished_work,
            workqueue_longest_running,
        };
        for c in [
            Box::new(metrics.reconcile_total.clone()) as Box<dyn Collector>,
            Box::new(metrics.reconcile_errors.clone()),
            Box::new(metrics.reconcile_errors_by_reason.clone()),
            Box::new(metrics.reconcile_time.clone()),
            Box::new(metrics.active_workers.clone()),
            Box::new(metrics.max_concurrent.clone()),
            Box::new(metrics.leader.clone()),
            Box::new(metrics.workqueue_depth.clone()),
            Box::new(metrics.workqueue_adds.clone()),
            Box::new(metrics.workqueue_retries.clone()),
            Box::new(metrics.workqueue_queue_duration.clone()),
            Box::new(metrics.workqueue_work_duration.clone()),
            Box::new(metrics.workqueue_unfinished_work.clone()),
            Box::new(metrics.workqueue_longest_running.clone()),
        ] {
            metrics.register(c);
        }
        #[cfg(target_os = "linux")]
        metrics.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        // Series appear at 0 from the start, as in controller-runtime.
        for result in ["success", "error", "requeue", "requeue_after"] {
            metrics
                .reconcile_total
                .with_label_values(&[controller, result]);
        }
        metrics.reconcile_errors.with_label_values(&[controller]);
        metrics.active_workers.with_label_values(&[controller]);
        metrics
    }

    /// Adds a collector of the operator's own to what /metrics renders.
    pub fn register(&mut self, collector: Box<dyn Collector>) {
        self.names
            .extend(collector.desc().iter().map(|d| d.fq_name.clone()));
        self.registry
            .register(collector)
            .expect("metric registered once");
    }

    /// The work queue's series; they appear (at 0) from this call on.
    pub fn queue(&self) -> QueueMetrics {
        let labels = &[self.controller, self.controller];
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
            .with_label_values(&[self.controller])
            .set(i64::from(n));
    }

    pub fn set_leader(&self, lease: &str, leading: bool) {
        self.leader
            .with_label_values(&[lease])
            .set(i64::from(leading));
    }

    /// Every metric name this process exports, for checking the names that dashboards and alerts
    /// use.
    pub fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// Marks a reconcile as running until the returned guard is dropped.
    pub fn start_reconcile(&self) -> ReconcileGuard<'_> {
        self.active_workers
            .with_label_values(&[self.controller])
            .inc();
        ReconcileGuard {
            metrics: self,
            started: std::time::Instant::now(),
        }
    }

    fn finish(&self, started: std::time::Instant) {
        self.active_workers
            .with_label_values(&[self.controller])
            .dec();
        self.reconcile_time
            .with_label_values(&[self.controller])
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn record(&self, result: ReconcileResult, error_reason: Option<&str>) {
        self.reconcile_total
            .with_label_values(&[self.controller, result.label()])
            .inc();
        if let Some(reason) = error_reason {
            self.reconcile_errors
                .with_label_values(&[self.controller])
                .inc();
            self.reconcile_errors_by_reason
                .with_label_values(&[self.controller, reason])
                .inc();
        }
    }

    /// What /metrics serves: every metric registered here.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

/// Prometheus text exposition of every metric in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding cannot fail");
    String::from_utf8(buf).expect("prometheus text is UTF-8")
}

pub struct ReconcileGuard<'a> {
    metrics: &'a ControllerMetrics,
    started: std::time::Instant,
}

impl Drop for ReconcileGuard<'_> {
    fn drop(&mut self) {
        self.metrics.finish(self.started);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_and_labels() {
        let m = ControllerMetrics::new("memcached", "memcached_operator");
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
    fn active_workers_counts_running_reconciles() {
        let m = ControllerMetrics::new("memcached", "memcached_operator");
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
