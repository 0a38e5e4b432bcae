//! Availability through an upgrade: every second until stopped, each watched namespace's
//! Memcacheds' Available conditions (status and reason), the reasons of their Progressing
//! conditions (e.g. `ReplacingMembers` while the operator replaces the members one at a time,
//! `RestartingInPlace` while it restarts them in place) and, where asked, how many of each
//! Memcached's pods are serving (Ready, not terminating) and how many are not terminating,
//! against its size; a line each in a log
//! (`name=<Available>/<its reason>/<Progressing's reason> ... name:<serving>/<pods>/<size> ...`).

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

/// The label naming the Memcached a pod is a member of (src/resources/mod.rs).
const INSTANCE: &str = "app.kubernetes.io/instance";

/// Memcacheds that must stay Available, and the label selector of their pods when those are
/// counted.
pub struct Watched {
    pub namespace: String,
    pub names: Vec<String>,
    pub pods: Option<String>,
}

/// A watched Memcached's pods in one sample.
#[derive(Clone, Copy, Debug)]
pub struct Members {
    /// Its `spec.size`.
    pub size: usize,
    /// Ready and not terminating.
    pub serving: usize,
    /// Not terminating.
    pub pods: usize,
}

/// One read of one namespace.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Whether every watched Memcached was Available ("ERROR" lines for a failed read).
    pub available: bool,
    /// The reasons of the watched Memcacheds' Available and Progressing conditions.
    pub reasons: Vec<String>,
    /// Each watched Memcached's pods, when counted and read.
    pub members: Option<BTreeMap<String, Members>>,
    /// As logged: seconds since the start, the namespace, each Memcached's conditions.
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

/// A Memcached's state in one read: Available, its reason, Progressing's reason, its size.
struct State {
    available: String,
    reason: String,
    progressing: String,
    size: usize,
}

async fn read(client: &Client, watched: &Watched, t: f64) -> Sample {
    let timeout = Duration::from_secs(5);
    let ns = &watched.namespace;
    let memcacheds: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let list = tokio::time::timeout(timeout, memcacheds.list(&ListParams::default())).await;
    let states: Option<BTreeMap<String, State>> = match &list {
        Ok(Ok(list)) => Some(
            list.items
                .iter()
                .map(|mc| {
                    let (available, reason) =
                        harness::condition(mc, "Available").unwrap_or_default();
                    let (_, progressing) =
                        harness::condition(mc, "Progressing").unwrap_or_default();
                    let size = usize::try_from(mc.spec.size).unwrap_or_default();
                    let state = State {
                        available,
                        reason,
                        progressing,
                        size,
                    };
                    (mc.name_any(), state)
                })
                .collect(),
        ),
        _ => None,
    };
    let (available, reasons, mut line) = match (&list, &states) {
        (_, Some(states)) => {
            let available = watched
                .names
                .iter()
                .all(|n| states.get(n).is_some_and(|s| s.available == "True"));
            let reasons = watched
                .names
                .iter()
                .filter_map(|n| states.get(n))
                .flat_map(|s| [s.reason.clone(), s.progressing.clone()])
                .collect();
            let line: Vec<String> = states
                .iter()
                .map(|(n, s)| format!("{n}={}/{}/{}", s.available, s.reason, s.progressing))
                .collect();
            (available, reasons, line.join(" "))
        }
        (Ok(Err(e)), None) => (false, vec![], format!("ERROR {e}")),
        _ => (false, vec![], "ERROR timed out after 5s".into()),
    };
    let members: Option<BTreeMap<String, Members>> = match (&watched.pods, &states) {
        (Some(selector), Some(states)) => {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let params = ListParams::default().labels(selector);
            match tokio::time::timeout(timeout, api.list(&params)).await {
                Ok(Ok(list)) => Some(
                    watched
                        .names
                        .iter()
                        .map(|name| {
                            let live: Vec<&Pod> = list
                                .items
                                .iter()
                                .filter(|p| {
                                    p.metadata.deletion_timestamp.is_none()
                                        && p.labels().get(INSTANCE) == Some(name)
                                })
                                .collect();
                            let members = Members {
                                size: states.get(name).map_or(0, |s| s.size),
                                serving: live.iter().filter(|p| harness::pod_is_ready(p)).count(),
                                pods: live.len(),
                            };
                            (name.clone(), members)
                        })
                        .collect(),
                ),
                _ => None,
            }
        }
        _ => None,
    };
    line = format!("{t:7.1} {ns} {line}");
    if !available {
        line.push_str(" NOT-AVAILABLE");
    }
    match (&watched.pods, &members) {
        (Some(_), Some(members)) => {
            for (name, m) in members {
                line.push_str(&format!(" {name}:{}/{}/{}", m.serving, m.pods, m.size));
            }
        }
        (Some(_), None) => line.push_str(" pods=?"),
        (None, _) => {}
    }
    Sample {
        available,
        reasons,
        members,
        line,
    }
}

pub struct Samples(pub Vec<Sample>);

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

    /// Every count of a watched Memcached's pods.
    fn members(&self) -> impl Iterator<Item = &Members> {
        self.0
            .iter()
            .filter_map(|s| s.members.as_ref())
            .flat_map(|m| m.values())
    }

    /// The samples that did not count the pods (a failed read).
    pub fn uncounted(&self) -> usize {
        self.0.iter().filter(|s| s.members.is_none()).count()
    }

    /// The most members of one Memcached out of service (its size less those serving) in any
    /// sample.
    pub fn most_out(&self) -> Option<usize> {
        self.members()
            .map(|m| m.size.saturating_sub(m.serving))
            .max()
    }

    /// The most pods of one Memcached above its size in any sample (0: never above it).
    pub fn most_over(&self) -> Option<usize> {
        self.members().map(|m| m.pods.saturating_sub(m.size)).max()
    }

    /// Sampled at all and Available in every sample.
    pub fn always_available(&self) -> bool {
        self.len() > 0 && self.unavailable().next().is_none()
    }

    /// That, with every sample's pods counted, no Memcached ever with more than `out` members
    /// out of service (at least `size - out` serving) or a pod over its size: an update within
    /// its rollout budget (`rollout.maxUnavailable`; a member cannot surge).
    pub fn within_budget(&self, out: usize) -> bool {
        self.always_available()
            && self.uncounted() == 0
            && self.most_out().is_some_and(|most| most <= out)
            && self.most_over() == Some(0)
    }

    /// For figures and failure messages: "samples WHEN: ...".
    pub fn summary(&self, when: &str) -> String {
        let mut summary = format!(
            "samples {when}: {}, not Available: {}",
            self.len(),
            self.unavailable().count()
        );
        if self.members().next().is_some() {
            summary.push_str(&format!(
                ", most members of a Memcached out of service: {}, most pods over its size: {}, pods not counted: {}",
                self.most_out().unwrap_or_default(),
                self.most_over().unwrap_or_default(),
                self.uncounted()
            ));
        }
        summary
    }
}
