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

impl Launch {
    /// The command with its ports and identity filled in.
    fn command_line(&self, metrics_port: u16, health_port: u16) -> String {
        self.command
            .replace("{metrics}", &metrics_port.to_string())
            .replace("{health}", &health_port.to_string())
            .replace("{identity}", &self.identity)
    }
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
        let command = launch.command_line(metrics_port, health_port);
        let mut words = command.split_whitespace();
        let Some(program) = words.next() else {
            bail!("empty operator command")
        };
        std::fs::create_dir_all(&launch.log_dir)?;
        let log = launch.log_dir.join(format!("{}.log", launch.identity));
        // Appended: a restarted process (same identity, as a restarted container) keeps one log.
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)?;
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

    /// Waits for the process to exit, however long that takes; its exit code.
    pub async fn exited(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        child.wait().await.ok()?.code()
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
    /// Fails at once if the process exits first; either failure ends with the log's last lines.
    pub async fn wait_health(&self, path: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.health(path).await != Some(200) {
            if !self.is_running() {
                bail!(
                    "operator {} exited before {path} answered 200; its log ends:\n{}",
                    self.identity,
                    self.log_tail(20)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "operator {}: {path} not 200 after {timeout:?}; its log ends:\n{}",
                    self.identity,
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Whether the process is still running (not exited, whether or not reaped).
    fn is_running(&self) -> bool {
        self.stat_fields()
            .and_then(|fields| fields.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    }

    /// /proc/<pid>/stat after the command name, which is in parentheses and may hold spaces: the
    /// state first.
    fn stat_fields(&self) -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        Some(stat.rsplit_once(") ")?.1.to_string())
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
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
        let fields: Vec<f64> = self
            .stat_fields()
            .unwrap_or_default()
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect();
        // utime and stime are fields 14 and 15 of stat, so 12 and 13 after the name.
        (fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0))
            / CLOCK_TICKS
    }
}

/// An operator process under the local cluster's own supervisor (hack/supervise.sh, which keeps
/// the control plane's components running as a kubelet keeps static pods): started again
/// `delay` after it exits, on the same ports and with the same identity, credentials and log.
/// Its log and pid file are in `{log_dir}/{identity}/`.
pub struct Supervised {
    dir: PathBuf,
    supervisor: Child,
    metrics_port: u16,
    health_port: u16,
    pub identity: String,
    pub log: PathBuf,
}

/// The process running now.
#[derive(Clone, Copy, Debug)]
pub struct Running {
    pub pid: u32,
    pub metrics_port: u16,
    pub health_port: u16,
}

impl Supervised {
    pub fn start(delay: Duration, launch: Launch) -> Result<Self> {
        let (metrics_port, health_port) = (free_port(), free_port());
        let dir = launch.log_dir.join(&launch.identity);
        for sub in ["logs", "pids"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let command = launch.command_line(metrics_port, health_port);
        let delay = delay.as_secs().max(1).to_string();
        let supervisor = Command::new(crate::repo_root().join("hack/supervise.sh"))
            .arg(&dir)
            .arg(&launch.identity)
            .args(command.split_whitespace())
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .env("KUBECONFIG", &launch.kubeconfig)
            .env("RESTART_BACKOFF", &delay)
            .env("RESTART_BACKOFF_MAX", &delay)
            .envs(launch.env)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting hack/supervise.sh")?;
        Ok(Self {
            log: dir.join("logs").join(format!("{}.log", launch.identity)),
            dir,
            supervisor,
            metrics_port,
            health_port,
            identity: launch.identity,
        })
    }

    pub fn running(&self) -> Option<Running> {
        let pidfile = self.dir.join("pids").join(format!("{}.pid", self.identity));
        let pid: u32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit_once(") ")?.1.chars().next()?;
        (state != 'Z' && state != 'X').then_some(Running {
            pid,
            metrics_port: self.metrics_port,
            health_port: self.health_port,
        })
    }

    /// How many times the supervisor started it again.
    pub fn restarts(&self) -> usize {
        std::fs::read_to_string(self.dir.join("logs/restarts.log"))
            .map(|log| log.lines().count())
            .unwrap_or(0)
    }

    /// Sends `signal` to the process running now, if any.
    pub fn signal(&self, signal: &str) -> bool {
        let Some(running) = self.running() else {
            return false;
        };
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(running.pid.to_string())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// One series' value from the process running now (0 when absent or not running).
    pub async fn metric(&self, series: &str) -> f64 {
        if self.running().is_none() {
            return 0.0;
        }
        match http_get(self.metrics_port, "/metrics").await {
            Some((200, text)) => metric_value(&text, series).unwrap_or(0.0),
            _ => 0.0,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops restarting (as `cluster.sh down` does), then the process with SIGTERM, and waits
    /// (at most a minute) for it.
    pub async fn stop(mut self) {
        self.stop_restarting().await;
        let running = self.running();
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(60);
        while running.is_some_and(|r| self.running().is_some_and(|now| now.pid == r.pid))
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop_restarting(&mut self) {
        let _ = std::fs::File::create(self.dir.join("pids/stopping"));
        // Its TERM trap exits without touching the process it runs.
        if let Some(pid) = self.supervisor.id() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        let _ = self.supervisor.wait().await;
    }
}

impl Drop for Supervised {
    /// A test that ends without `stop` leaves nothing running: no restart, and the process
    /// killed.
    fn drop(&mut self) {
        let _ = std::fs::File::create(self.dir.join("pids/stopping"));
        let _ = self.supervisor.start_kill();
        self.signal("KILL");
    }
}
