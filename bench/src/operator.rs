//! The operator under test as a child process, measured through /proc.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::cluster::Cluster;

/// Linux reports utime/stime in clock ticks of 1/100 s.
const CLOCK_TICKS: f64 = 100.0;

pub struct Operator {
    child: Option<Child>,
    pid: u32,
    metrics: u16,
    health: u16,
    identity: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Operator {
    pub async fn start(cluster: &Cluster, template: &str, identity: &str) -> Result<Operator> {
        let (metrics, health) = (free_port(), free_port());
        let command = template
            .replace("{metrics}", &metrics.to_string())
            .replace("{health}", &health.to_string())
            .replace("{identity}", identity);
        let mut words = command.split_whitespace();
        let Some(program) = words.next() else {
            bail!("empty operator command")
        };
        let log = std::fs::File::create(cluster.dir.join(format!("operator-{identity}.log")))?;
        let child = Command::new(program)
            .args(words)
            .env("KUBECONFIG", cluster.operator_kubeconfig().await?)
            .env("POD_NAMESPACE", "memcached-operator-system")
            .env_remove("WATCH_NAMESPACE")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or(0);
        Ok(Operator {
            child: Some(child),
            pid,
            metrics,
            health,
            identity: identity.to_string(),
        })
    }

    fn status_kib(&self, field: &str) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(field))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(f64::NAN)
    }

    pub fn rss_mib(&self) -> f64 {
        self.status_kib("VmRSS:") / 1024.0
    }

    pub fn peak_rss_mib(&self) -> f64 {
        self.status_kib("VmHWM:") / 1024.0
    }

    /// User plus system CPU time so far.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<f64> = rest
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect();
        // utime and stime are fields 14 and 15 of stat, so 12 and 13 after the name.
        (fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0))
            / CLOCK_TICKS
    }

    async fn get(port: u16, path: &str) -> Option<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        Some((
            code,
            out.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default(),
        ))
    }

    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Self::get(self.health, "/readyz").await.map(|r| r.0) != Some(200) {
            if Instant::now() > deadline {
                bail!("operator {} not ready after {timeout:?}", self.identity);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Waits until the operator reports `n` successful reconciles (controller-runtime metric
    /// name); an operator without the metric is given the whole timeout.
    pub async fn wait_reconciled(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let done = Self::get(self.metrics, "/metrics")
                .await
                .and_then(|(_, body)| {
                    body.lines()
                        .find(|l| {
                            l.starts_with("controller_runtime_reconcile_total")
                                && l.contains("result=\"success\"")
                        })
                        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                });
            if done.is_some_and(|d| d >= n as f64) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn wait_leader(&self, client: &Client, timeout: Duration) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "memcached-operator-system");
        let deadline = Instant::now() + timeout;
        loop {
            let holder = leases
                .get_opt("memcached-operator-lock")
                .await?
                .and_then(|l| l.spec?.holder_identity);
            if holder.as_deref() == Some(self.identity.as_str()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not become leader", self.identity);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(&mut self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .await;
        if let Some(mut child) = self.child.take() {
            let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
        }
    }
}
