//! How fast this machine's cores are: before a run (the calibration) and during it (a probe).
//!
//! The same build has taken a third longer from one run to the next, back to back, with every
//! process's CPU up by as much for the same work: the host's contention reaches this VM as
//! slower cores, mid-run, where a calibration before the run does not see it. The probe does the
//! calibration's work in small pieces on a thread of its own while a scenario runs, timed by that
//! thread's CPU clock, so that waiting for a core does not count and only a slower core does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::time::{ClockId, clock_gettime};
use serde_json::{Value, json};

use crate::percentile;

/// Rounds in the calibration's unit of work.
const UNIT: u32 = 100_000;
/// Rounds the probe runs each `PROBE_EVERY`: about 5 ms of one core, 0.5 % of it.
const PROBE_ROUNDS: u32 = 2_000;
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The fixed work: JSON round trips of a Deployment, what the operator and the API server spend
/// most of their time on.
fn work(rounds: u32) {
    let object = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "mc-00000", "namespace": "bench-0", "generation": 3,
            "labels": {"app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": "mc-00000"},
        },
        "spec": {
            "replicas": 3,
            "template": {"spec": {"containers": [{
                "name": "memcached", "image": "memcached:1.6",
                "args": ["-m", "64", "-c", "1024", "-t", "4", "-I", "1m"],
                "ports": [{"containerPort": 11211, "name": "memcached", "protocol": "TCP"}],
            }]}},
        },
        "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "observedGeneration": 3},
    });
    for _ in 0..rounds {
        let text = serde_json::to_string(std::hint::black_box(&object)).unwrap_or_default();
        let parsed: Value = serde_json::from_str(&text).unwrap_or_default();
        std::hint::black_box(parsed);
    }
}

/// Seconds one core takes for the unit of work now: the best of five, taken before the cluster
/// starts. Runs on different days compare only after scaling by it: the same machine has been
/// half again slower from one day to the next.
pub fn calibration_seconds() -> f64 {
    (0..5)
        .map(|_| {
            let started = Instant::now();
            work(UNIT);
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn thread_cpu_seconds() -> f64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// The probe: from `start` until `finish`.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<f64>>,
}

impl Probe {
    pub fn start() -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let before = thread_cpu_seconds();
                work(PROBE_ROUNDS);
                let seconds = thread_cpu_seconds() - before;
                samples.push(seconds * f64::from(UNIT) / f64::from(PROBE_ROUNDS));
                std::thread::sleep(PROBE_EVERY);
            }
            samples
        });
        Probe { stop, thread }
    }

    /// The probe's seconds per unit of work over its life (p50, p90, samples), and its p50 over
    /// `calibration`: how much slower a core was during the run than before it.
    pub fn finish(self, calibration: f64) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self.thread.join().unwrap_or_default();
        summary(&samples, calibration)
    }
}

/// Without samples the figures are null (JSON has no NaN).
fn summary(samples: &[f64], calibration: f64) -> Value {
    let p50 = percentile(samples, 0.5);
    json!({
        "samples": samples.len(),
        "seconds_per_unit_p50": p50,
        "seconds_per_unit_p90": percentile(samples, 0.9),
        "slowdown_p50": p50 / calibration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reports_the_median_piece_against_the_calibration() {
        let figures = summary(&[0.30, 0.26, 0.52, 0.27, 0.28], 0.26);
        assert_eq!(figures["samples"], 5);
        assert_eq!(figures["seconds_per_unit_p50"], 0.28);
        assert_eq!(figures["seconds_per_unit_p90"], 0.52);
        let slowdown = figures["slowdown_p50"].as_f64().unwrap();
        assert!((slowdown - 0.28 / 0.26).abs() < 1e-9, "{slowdown}");
        assert_eq!(summary(&[], 0.26)["slowdown_p50"], Value::Null);
    }

    #[test]
    fn a_probe_measures_its_own_work_in_the_calibrations_unit() {
        let before = thread_cpu_seconds();
        work(PROBE_ROUNDS);
        let here = (thread_cpu_seconds() - before) * f64::from(UNIT) / f64::from(PROBE_ROUNDS);
        let probe = Probe::start();
        std::thread::sleep(Duration::from_millis(50));
        let figures = probe.finish(here);
        assert_eq!(figures["samples"], 1);
        // The same work on another idle core: about the same time.
        let slowdown = figures["slowdown_p50"].as_f64().unwrap();
        assert!((0.3..3.0).contains(&slowdown), "{figures}");
    }
}
