//! The benchmark's own control plane (hack/cluster.sh), with an audit log and the
//! kube-controller-manager and scheduler limits raised so they are not what is measured.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::process::Command;

use crate::audit;

pub struct Cluster {
    base: PathBuf,
    pub dir: PathBuf,
    audit_log: PathBuf,
}

impl Cluster {
    pub async fn up() -> Result<Cluster> {
        let base =
            std::env::temp_dir().join(format!("memcached-operator-bench.{}", std::process::id()));
        let dir = base.join("cluster");
        std::fs::create_dir_all(&dir)?;
        let policy = base.join("audit-policy.yaml");
        std::fs::write(&policy, audit::POLICY)?;
        let audit_log = base.join("audit.log");
        let status = Command::new("hack/cluster.sh")
            .arg("up")
            .arg(&dir)
            .env(
                "APISERVER_EXTRA_ARGS",
                format!(
                    "--audit-policy-file={} --audit-log-path={} --max-requests-inflight=2000 --max-mutating-requests-inflight=1000",
                    policy.display(),
                    audit_log.display()
                ),
            )
            .env("KCM_QPS", "1000")
            .env("KCM_BURST", "2000")
            .env("KCM_CONCURRENT_DEPLOYMENT_SYNCS", "20")
            .env("KCM_CONCURRENT_REPLICASET_SYNCS", "20")
            .env("SCHEDULER_QPS", "1000")
            .env("SCHEDULER_BURST", "2000")
            .status()
            .await
            .context("hack/cluster.sh up")?;
        if !status.success() {
            bail!("the control plane did not start");
        }
        Ok(Cluster {
            base,
            dir,
            audit_log,
        })
    }

    pub async fn down(&self) {
        let _ = Command::new("hack/cluster.sh")
            .arg("down")
            .arg(&self.dir)
            .status()
            .await;
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.base.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub async fn admin(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig())?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(Client::try_from(config)?)
    }

    async fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// The CRD under test, and the operator's ServiceAccount and RBAC from a kustomize directory
    /// (by default config/local: config/default without the in-cluster Deployment).
    pub async fn install(&self, crd: &Path, rbac: &Path) -> Result<()> {
        self.kubectl(&["apply", "--server-side", "-f", &crd.display().to_string()])
            .await?;
        self.kubectl(&["apply", "--server-side", "-k", &rbac.display().to_string()])
            .await?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/memcacheds.cache.example.com",
            "--timeout=60s",
        ])
        .await?;
        Ok(())
    }

    /// A kubeconfig with a token of the operator's ServiceAccount.
    pub async fn operator_kubeconfig(&self) -> Result<PathBuf> {
        let path = self.dir.join("operator.kubeconfig");
        if path.exists() {
            return Ok(path);
        }
        let status = Command::new("bash")
            .arg("-c")
            .arg(r#"source hack/lib.sh && write_sa_kubeconfig "$@""#)
            .arg("write_sa_kubeconfig")
            .args([
                "memcached-operator-system",
                "memcached-operator-controller-manager",
            ])
            .arg(&path)
            .arg("10h")
            .env("KUBECONFIG", self.kubeconfig())
            .status()
            .await?;
        if !status.success() {
            bail!("could not write the operator's kubeconfig");
        }
        Ok(path)
    }

    pub fn audit_counts(&self, from: Timestamp, to: Timestamp) -> Result<audit::Counts> {
        audit::count(&self.audit_log, from, to)
    }
}
