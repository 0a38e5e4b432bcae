//! Availability through an upgrade: every second until stopped, each watched namespace's
//! Memcacheds' Available conditions (status and reason) and the reasons of their Progressing
//! conditions (e.g. `Migrating` while a Memcached moves from its Deployment to its StatefulSet)
//! and, where asked, how many of their pods are serving (Ready, not terminating) and how many are
//! not terminating, whichever workload runs them; a line each in a log
//! (`name=<Available>/<its reason>/<Progressing's reason>`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;

use crate::harness;

/// Memcacheds that must stay Available, and the label selector of their pods when those are
/// counted.
pub struct Watched {
    pub namespace: String,
    pub names: Vec<String>,
    pub pods: Option<String>,
}

/// One read of one namespace.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Whether every watched Memcached was Available ("ERROR" lines for a failed read).
    pub available: bool,
    /// The reasons of the watched Memcacheds' Available and Progressing conditions.
    pub reasons: Vec<String>,
    /// Serving and all pods, those terminating left out; `None` when not counted or unread.
    pub pods: Option<(usize, usize)>,
    /// As logged: seconds since the start, the namespace, each Memcached's Available status.
    pub line: String,
}

pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(client: Client, watched: Vec<Watched>, log: PathBuf) -> Sampler {
        let samples = Arc::new(Mutex::new(vec![]));
        let task = tokio::spawn({
            let samples = samples.clone();
            async move {
                let start = Instant::now();
                let mut file = std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .ok();
                loop {
                    for watched in &watched {
                        let t = start.elapsed().as_secs_f64();
                        let sample = read(&client, watched, t).await;
                        if let Some(f) = file.as_mut() {
                            let _ = writeln!(f, "{}", sample.line);
                        }
                        samples.lock().unwrap().push(sample);
                    }
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

async fn read(client: &Client, watched: &Watched, t: f64) -> Sample {
    let timeout = Duration::from_secs(5);
    let ns = &watched.namespace;
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let list = tokio::time::timeout(timeout, memcacheds.list(&ListParams::default())).await;
    let (available, reasons, states) = match list {
        Ok(Ok(list)) => {
            // name -> (Available, its reason, Progressing's reason)
            let states: BTreeMap<String, (String, String, String)> = list
                .items
                .iter()
                .map(|mc| {
                    let (status, reason) = harness::condition(mc, "Available").unwrap_or_default();
                    let progressing = harness::condition(mc, "Progressing").unwrap_or_default();
                    (mc.name_any(), (status, reason, progressing.1))
                })
                .collect();
            let available = watched
                .names
                .iter()
                .all(|n| states.get(n).is_some_and(|(s, _, _)| s == "True"));
            let reasons = watched
                .names
                .iter()
                .filter_map(|n| states.get(n))
                .flat_map(|(_, available, progressing)| [available.clone(), progressing.clone()])
                .collect();
            let states: Vec<String> = states
                .iter()
                .map(|(n, (s, r, p))| format!("{n}={s}/{r}/{p}"))
                .collect();
            (available, reasons, states.join(" "))
        }
        Ok(Err(e)) => (false, vec![], format!("ERROR {e}")),
        Err(_) => (false, vec![], "ERROR timed out after 5s".into()),
    };
    let pods = match &watched.pods {
        Some(selector) => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let params = ListParams::default().labels(selector);
            match tokio::time::timeout(timeout, api.list(&params)).await {
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
            }
        }
        None => None,
    };
    let mut line = format!("{t:7.1} {ns} {states}");
    if !available {
        line.push_str(" NOT-AVAILABLE");
    }
    match (&watched.pods, pods) {
        (Some(_), Some((ready, all))) => line.push_str(&format!(" ready={ready} pods={all}")),
        (Some(_), None) => line.push_str(" ready=? pods=?"),
        (None, _) => {}
    }
    Sample {
        available,
        reasons,
        pods,
        line,
    }
}

pub struct Samples(pub Vec<Sample>);

// Pods are counted only by run_bundle's scenes, which need the real node.
#[cfg_attr(not(feature = "real-node"), allow(dead_code))]
impl Samples {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The samples in which a watched Memcached was not Available (or the read failed).
    pub fn unavailable(&self) -> impl Iterator<Item = &Sample> {
        self.0.iter().filter(|s| !s.available)
    }

    /// The samples in which some watched Memcached's Available or Progressing condition had
    /// `reason`.
    pub fn with_reason(&self, reason: &str) -> usize {
        self.0
            .iter()
            .filter(|s| s.reasons.iter().any(|r| r == reason))
            .count()
    }

    /// The fewest serving pods in any sample that counted them.
    pub fn min_ready(&self) -> Option<usize> {
        self.0.iter().filter_map(|s| s.pods).map(|p| p.0).min()
    }

    /// The most pods in any sample that counted them.
    pub fn max_pods(&self) -> Option<usize> {
        self.0.iter().filter_map(|s| s.pods).map(|p| p.1).max()
    }

    /// Sampled at all and Available in every sample.
    pub fn always_available(&self) -> bool {
        self.len() > 0 && self.unavailable().next().is_none()
    }

    /// That, with `size` pods serving in each sample that counted them.
    pub fn always_serving(&self, size: usize) -> bool {
        self.always_available() && self.min_ready() >= Some(size)
    }

    fn fmt_opt(v: Option<usize>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }

    /// For figures and failure messages: "samples WHEN: ...".
    pub fn summary(&self, when: &str) -> String {
        let mut summary = format!(
            "samples {when}: {}, not Available: {}",
            self.len(),
            self.unavailable().count()
        );
        if let Some(ready) = self.min_ready() {
            summary.push_str(&format!(", fewest serving pods: {ready}"));
        }
        summary
    }

    pub fn most_pods(&self) -> String {
        Self::fmt_opt(self.max_pods())
    }
}
