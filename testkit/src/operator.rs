//! An operator (ours, or the reference) as a child process on free ports, killed when dropped,
//! with its endpoints and what /proc says of it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use crate::net::{free_port, http_get, metric_value};

/// Linux reports utime/stime in clock ticks of 1/100 s.
const CLOCK_TICKS: f64 = 100.0;

/// How to start an operator process.
pub struct Launch {
    /// Program and arguments, split on whitespace; `{metrics}`, `{health}` and `{identity}` are
    /// replaced by the metrics port, the health port and the identity.
    pub command: String,
    pub identity: String,
    /// The credentials it runs with (a ServiceAccount's, as in a cluster).
    pub kubeconfig: PathBuf,
    /// Its stdout and stderr go to `{identity}.log` here.
    pub log_dir: PathBuf,
    /// Environment beyond KUBECONFIG; WATCH_NAMESPACE and POD_NAMESPACE are unset unless given.
    pub env: Vec<(String, String)>,
}

/// Flags that put our operator (or one with the same flags) on the launch's ports.
pub const ENDPOINT_ARGS: &str = "--metrics-bind-address=127.0.0.1:{metrics} --health-probe-bind-address=127.0.0.1:{health} --identity={identity}";

pub struct OperatorProcess {
    child: Option<Child>,
    pid: u32,
    pub metrics_port: u16,
    pub health_port: u16,
    pub identity: String,
    pub log: PathBuf,
    pub kubeconfig: PathBuf,
}

impl OperatorProcess {
    pub fn spawn(launch: Launch) -> Result<Self> {
        let (metrics_port, health_port) = (free_port(), free_port());
        let command = launch
            .command
            .replace("{metrics}", &metrics_port.to_string())
            .replace("{health}", &health_port.to_string())
            .replace("{identity}", &launch.identity);
        let mut words = command.split_whitespace();
        let Some(program) = words.next() else {
            bail!("empty operator command")
        };
        std::fs::create_dir_all(&launch.log_dir)?;
        let log = launch.log_dir.join(format!("{}.log", launch.identity));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(program)
            .args(words)
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env("KUBECONFIG", &launch.kubeconfig)
            .envs(launch.env)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        Ok(Self {
            pid: child.id().unwrap_or(0),
            child: Some(child),
            metrics_port,
            health_port,
            identity: launch.identity,
            log,
            kubeconfig: launch.kubeconfig,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` ("TERM", "KILL", ...).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {}", self.pid);
    }

    /// Waits (at most a minute) for the process to exit; its exit code.
    pub async fn wait(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .ok()?
            .ok()?;
        status.code()
    }

    /// Sends `signal` and waits for the exit.
    pub async fn stop(&mut self, signal: &str) -> Option<i32> {
        self.signal(signal);
        self.wait().await
    }

    /// The status code of GET `path` on the health port.
    pub async fn health(&self, path: &str) -> Option<u16> {
        http_get(self.health_port, path).await.map(|(s, _)| s)
    }

    /// The plain-HTTP /metrics text, if it answered 200.
    pub async fn metrics(&self) -> Option<String> {
        match http_get(self.metrics_port, "/metrics").await {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// One series' value (0 when absent, as Prometheus counters start).
    pub async fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .await
            .and_then(|text| metric_value(&text, series))
            .unwrap_or(0.0)
    }

    /// `controller_runtime_reconcile_total` with result="success", summed over controllers.
    pub async fn reconciles(&self) -> f64 {
        let text = self.metrics().await.unwrap_or_default();
        text.lines()
            .filter(|l| {
                l.starts_with("controller_runtime_reconcile_total{")
                    && l.contains(r#"result="success""#)
            })
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum()
    }

    pub async fn is_leader(&self, lease: &str) -> bool {
        self.metric(&format!(
            "leader_election_master_status{{name=\"{lease}\"}}"
        ))
        .await
            == 1.0
    }

    /// Polls `path` on the health port until it answers 200.
    pub async fn wait_health(&self, path: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.health(path).await != Some(200) {
            if Instant::now() > deadline {
                bail!(
                    "operator {}: {path} not 200 after {timeout:?}",
                    self.identity
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Polls until `n` reconciles have succeeded; an operator without the metric gets the whole
    /// timeout.
    pub async fn wait_reconciled(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && self.reconciles().await < n as f64 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
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
}
