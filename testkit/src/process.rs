//! A background process of a test (OLM's operators, cert-manager): its output goes to a log
//! file, and it is killed when its handle is dropped, so a failing test leaves none behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A background process whose output goes to a log file; killed (SIGKILL) when dropped.
pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Process {
    /// Starts `program args` with `env`, stdout and stderr appended to `log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: PathBuf,
    ) -> Process {
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", program.display()));
        eprintln!(
            "started {name} (pid {:?}, log {})",
            child.id(),
            log.display()
        );
        Process {
            name: name.into(),
            log,
            child,
        }
    }

    /// SIGTERM, then waits (at most 30 s, then SIGKILL) for the exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}
