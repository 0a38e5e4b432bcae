//! The autoscaler's series, per autoscaled Memcached: what it read, its bounds, the decision it
//! holds and the scales it made. Few Memcacheds are autoscaled, so plain labelled vectors.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use crate::api::{AutoscalingSpec, AutoscalingStatus};
use crate::autoscaling::Reason;

const LABELS: &[&str] = &["namespace", "memcached"];

#[derive(Clone)]
pub struct AutoscalingMetrics {
    size: IntGaugeVec,
    min_size: IntGaugeVec,
    max_size: IntGaugeVec,
    members_answering: IntGaugeVec,
    evictions: IntGaugeVec,
    memory_percent: IntGaugeVec,
    hit_percent: IntGaugeVec,
    decision: IntGaugeVec,
    scales: IntCounterVec,
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).unwrap()
}

impl Default for AutoscalingMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AutoscalingMetrics {
    pub fn new() -> Self {
        let decision_labels = &["namespace", "memcached", "reason"];
        Self {
            size: gauge(
                "memcached_operator_autoscaling_size",
                "The size the autoscaler keeps in spec.size",
                LABELS,
            ),
            min_size: gauge(
                "memcached_operator_autoscaling_min_size",
                "spec.autoscaling.minSize",
                LABELS,
            ),
            max_size: gauge(
                "memcached_operator_autoscaling_max_size",
                "spec.autoscaling.maxSize",
                LABELS,
            ),
            members_answering: gauge(
                "memcached_operator_autoscaling_members_answering",
                "Members that answered stats at the autoscaler's last reading",
                LABELS,
            ),
            evictions: gauge(
                "memcached_operator_autoscaling_evictions_per_second",
                "Items evicted per second by all members, at the autoscaler's last reading",
                LABELS,
            ),
            memory_percent: gauge(
                "memcached_operator_autoscaling_memory_percent",
                "The fullest member's memory in percent of its limit, at the last reading",
                LABELS,
            ),
            hit_percent: gauge(
                "memcached_operator_autoscaling_hit_percent",
                "Hits in percent of gets between the last two readings that saw gets",
                LABELS,
            ),
            decision: gauge(
                "memcached_operator_autoscaling_decision",
                "The autoscaler's current reason to hold or scale: 1 for the reason it has now",
                decision_labels,
            ),
            scales: IntCounterVec::new(
                Opts::new(
                    "memcached_operator_autoscaling_scales_total",
                    "Scales the autoscaler made, by direction (out, in) and reason",
                ),
                &["namespace", "memcached", "direction", "reason"],
            )
            .unwrap(),
        }
    }

    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.size.clone()),
            Box::new(self.min_size.clone()),
            Box::new(self.max_size.clone()),
            Box::new(self.members_answering.clone()),
            Box::new(self.evictions.clone()),
            Box::new(self.memory_percent.clone()),
            Box::new(self.hit_percent.clone()),
            Box::new(self.decision.clone()),
            Box::new(self.scales.clone()),
        ]
    }

    /// The series of one Memcached from its autoscaling status; none while autoscaling is off
    /// (`spec` None).
    pub fn set(
        &self,
        namespace: &str,
        name: &str,
        spec: Option<&AutoscalingSpec>,
        status: Option<&AutoscalingStatus>,
    ) {
        let (Some(spec), Some(status)) = (spec, status) else {
            self.forget(namespace, name);
            return;
        };
        let labels = &[namespace, name];
        self.min_size
            .with_label_values(labels)
            .set(spec.min_size.into());
        self.max_size
            .with_label_values(labels)
            .set(spec.max_size.into());
        if let Some(size) = status.size {
            self.size.with_label_values(labels).set(size.into());
        }
        if let Some(s) = &status.signals {
            self.members_answering
                .with_label_values(labels)
                .set(s.members_answering.into());
            self.evictions
                .with_label_values(labels)
                .set(s.evictions_per_second);
            self.memory_percent
                .with_label_values(labels)
                .set(s.memory_percent.into());
            // Readings without gets keep the last ratio: a quiet cache did not stop hitting.
            if let Some(hits) = s.hit_percent {
                self.hit_percent.with_label_values(labels).set(hits.into());
            }
        }
        // One series per Memcached: the reason it has now.
        for reason in Reason::ALL {
            let _ = self
                .decision
                .remove_label_values(&[namespace, name, reason.as_str()]);
        }
        self.decision
            .with_label_values(&[namespace, name, &status.reason])
            .set(1);
    }

    /// A scale the autoscaler made.
    pub fn scaled(&self, namespace: &str, name: &str, from: i32, to: i32, reason: Reason) {
        let direction = if to > from { "out" } else { "in" };
        self.scales
            .with_label_values(&[namespace, name, direction, reason.as_str()])
            .inc();
    }

    pub fn forget(&self, namespace: &str, name: &str) {
        let labels = &[namespace, name];
        for g in [
            &self.size,
            &self.min_size,
            &self.max_size,
            &self.members_answering,
            &self.evictions,
            &self.memory_percent,
            &self.hit_percent,
        ] {
            let _ = g.remove_label_values(labels);
        }
        for reason in Reason::ALL {
            let _ = self
                .decision
                .remove_label_values(&[namespace, name, reason.as_str()]);
        }
        for direction in ["out", "in"] {
            for reason in Reason::ALL {
                let _ =
                    self.scales
                        .remove_label_values(&[namespace, name, direction, reason.as_str()]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Signals;

    #[test]
    fn an_autoscaled_memcached_has_its_signals_and_one_decision_until_autoscaling_is_off() {
        let metrics = crate::metrics::Metrics::new();
        let m = &metrics.autoscaling;
        let spec = AutoscalingSpec {
            enabled: true,
            max_size: 4,
            ..AutoscalingSpec::default()
        };
        let status = |reason: &str| AutoscalingStatus {
            size: Some(4),
            reason: reason.into(),
            signals: Some(Signals {
                members_answering: 4,
                evictions_per_second: 250,
                memory_percent: 97,
                hit_percent: Some(61),
            }),
            ..AutoscalingStatus::default()
        };
        m.set("ns", "cache", Some(&spec), Some(&status("Evicting")));
        m.scaled("ns", "cache", 3, 4, Reason::Evicting);
        m.set("ns", "cache", Some(&spec), Some(&status("AtMaxSize")));
        let text = metrics.render();
        for line in [
            r#"memcached_operator_autoscaling_evictions_per_second{memcached="cache",namespace="ns"} 250"#,
            r#"memcached_operator_autoscaling_memory_percent{memcached="cache",namespace="ns"} 97"#,
            r#"memcached_operator_autoscaling_hit_percent{memcached="cache",namespace="ns"} 61"#,
            r#"memcached_operator_autoscaling_max_size{memcached="cache",namespace="ns"} 4"#,
            r#"memcached_operator_autoscaling_decision{memcached="cache",namespace="ns",reason="AtMaxSize"} 1"#,
            r#"memcached_operator_autoscaling_scales_total{direction="out",memcached="cache",namespace="ns",reason="Evicting"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert!(
            !text.contains(r#"memcached_operator_autoscaling_decision{memcached="cache",namespace="ns",reason="Evicting"}"#),
            "one decision at a time:\n{text}"
        );
        m.set("ns", "cache", None, None);
        let after = metrics.render();
        assert!(!after.contains(r#"memcached="cache""#), "{after}");
    }
}
