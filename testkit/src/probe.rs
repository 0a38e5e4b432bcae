//! Whether each member answers, from the host, every 100 ms: a `get` through memcached's text
//! protocol on a new connection to its pod's address (a member restarted in place keeps it),
//! given 300 ms. What it measures: the fewest members answering at once, and each member's
//! stretches without an answer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::memcached::Connection;

const EVERY: Duration = Duration::from_millis(100);
const WITHIN: Duration = Duration::from_millis(300);

pub struct Prober {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Probed>,
}

/// What the probes found.
pub struct Probed {
    /// Rounds of probes (each member once a round).
    pub rounds: usize,
    /// The fewest members that answered in one round.
    pub fewest: usize,
    /// member -> each stretch in which it did not answer, from the first probe it missed to the
    /// first it answered again (or the end).
    pub down: BTreeMap<String, Vec<Duration>>,
}

impl Probed {
    /// "<member>: <windows>" for a figure: each member's stretches without an answer.
    pub fn windows(&self) -> String {
        self.down
            .iter()
            .map(|(member, windows)| {
                let windows: Vec<String> = windows
                    .iter()
                    .map(|w| format!("{:.1} s", w.as_secs_f64()))
                    .collect();
                let windows = if windows.is_empty() {
                    "none".to_string()
                } else {
                    windows.join(" + ")
                };
                format!("{member}: {windows}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

async fn answers(addr: SocketAddr) -> bool {
    let probe = async {
        let mut conn = Connection::connect(addr).await?;
        conn.get("probe").await
    };
    matches!(tokio::time::timeout(WITHIN, probe).await, Ok(Ok(_)))
}

impl Prober {
    pub fn start(members: Vec<(String, SocketAddr)>) -> Prober {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut probed = Probed {
                rounds: 0,
                fewest: members.len(),
                down: members.iter().map(|(m, _)| (m.clone(), vec![])).collect(),
            };
            let mut down_since: BTreeMap<String, Instant> = BTreeMap::new();
            while !*stopped.borrow() {
                let round = Instant::now();
                let up = futures::future::join_all(members.iter().map(|(_, a)| answers(*a))).await;
                probed.rounds += 1;
                probed.fewest = probed.fewest.min(up.iter().filter(|u| **u).count());
                for ((member, _), up) in members.iter().zip(up) {
                    match (up, down_since.get(member)) {
                        (true, Some(since)) => {
                            let window = since.elapsed();
                            down_since.remove(member);
                            probed.down.get_mut(member).unwrap().push(window);
                        }
                        (false, None) => {
                            down_since.insert(member.clone(), round);
                        }
                        _ => {}
                    }
                }
                tokio::time::sleep(EVERY.saturating_sub(round.elapsed())).await;
            }
            for (member, since) in down_since {
                probed.down.get_mut(&member).unwrap().push(since.elapsed());
            }
            probed
        });
        Prober { stop, task }
    }

    pub async fn stop(self) -> Probed {
        let _ = self.stop.send(true);
        self.task.await.expect("the prober")
    }
}
