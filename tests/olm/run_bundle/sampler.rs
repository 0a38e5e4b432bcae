//! Every second until stopped, during an upgrade: the Memcached's Available condition, how many
//! of its memcached pods are Ready and not terminating (serving), and how many are not
//! terminating; a line each in a log.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use memcached_operator::api::Memcached;

use super::MEMCACHED_PODS;
use crate::harness;

/// One sample; `None` where the read failed.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The Available condition's status ("True", "False", "" without one, "ERROR" if unread).
    pub available: String,
    /// Ready (serving) and all pods, those terminating left out.
    pub pods: Option<(usize, usize)>,
}

pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Samples Memcached `name` in `ns`; a line per sample appended to `log`.
    pub fn start(client: Client, ns: &str, name: &str, log: PathBuf) -> Sampler {
        let samples = Arc::new(Mutex::new(vec![]));
        let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let name = name.to_string();
        let task = tokio::spawn({
            let samples = samples.clone();
            async move {
                let start = Instant::now();
                let mut file = std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .ok();
                let timeout = Duration::from_secs(5);
                loop {
                    let available = match tokio::time::timeout(timeout, memcacheds.get(&name)).await
                    {
                        Ok(Ok(mc)) => harness::condition(&mc, "Available")
                            .map(|c| c.0)
                            .unwrap_or_default(),
                        _ => "ERROR".to_string(),
                    };
                    let params = ListParams::default().labels(MEMCACHED_PODS);
                    let pods = match tokio::time::timeout(timeout, pods.list(&params)).await {
                        Ok(Ok(list)) => {
                            let live: Vec<&Pod> = list
                                .items
                                .iter()
                                .filter(|p| p.metadata.deletion_timestamp.is_none())
                                .collect();
                            let ready = live.iter().filter(|p| harness::pod_is_ready(p)).count();
                            Some((ready, live.len()))
                        }
                        _ => None,
                    };
                    let counts = match pods {
                        Some((ready, all)) => format!("ready={ready} pods={all}"),
                        None => "ready=? pods=?".into(),
                    };
                    if let Some(f) = file.as_mut() {
                        let t = start.elapsed().as_secs_f64();
                        let _ = writeln!(f, "{t:7.1} available={available} {counts}");
                    }
                    samples.lock().unwrap().push(Sample { available, pods });
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
        Sampler { samples, task }
    }

    /// Stops it; what it sampled.
    pub fn stop(self) -> Samples {
        self.task.abort();
        Samples(self.samples.lock().unwrap().clone())
    }
}

pub struct Samples(pub Vec<Sample>);

impl Samples {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Samples without Available=True.
    pub fn not_available(&self) -> usize {
        self.0.iter().filter(|s| s.available != "True").count()
    }

    /// The fewest serving pods in any sample read.
    pub fn min_ready(&self) -> Option<usize> {
        self.0.iter().filter_map(|s| s.pods).map(|p| p.0).min()
    }

    /// The most pods in any sample read.
    pub fn max_pods(&self) -> Option<usize> {
        self.0.iter().filter_map(|s| s.pods).map(|p| p.1).max()
    }

    /// Sampled at all, Available in every sample, and `size` pods serving in each one read.
    pub fn always_available(&self, size: usize) -> bool {
        self.len() > 0 && self.not_available() == 0 && self.min_ready() >= Some(size)
    }

    fn fmt_opt(v: Option<usize>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }

    /// For figures and failure messages: "samples WHEN: ...".
    pub fn summary(&self, when: &str) -> String {
        format!(
            "samples {when}: {}, not Available: {}, fewest serving pods: {}",
            self.len(),
            self.not_available(),
            Self::fmt_opt(self.min_ready())
        )
    }

    pub fn most_pods(&self) -> String {
        Self::fmt_opt(self.max_pods())
    }
}
