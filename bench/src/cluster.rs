//! The benchmark's own control plane (hack/cluster.sh), with an audit log and the
//! kube-controller-manager and scheduler limits raised so they are not what is measured.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use memcached_operator_testkit::LocalCluster;
use tokio::process::Command;

use memcached_operator::config::{OPERATOR_NAMESPACE, SERVICE_ACCOUNT};

use crate::audit;

pub struct Cluster {
    base: PathBuf,
    pub local: LocalCluster,
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
                // BENCH_APISERVER_ARGS adds to them, e.g. `--feature-gates=WatchList=false` to
                // measure paged lists, as Kubernetes 1.33 serves them.
                // Profiling on: the size change records where the API server's CPU went.
                format!(
                    "--audit-policy-file={} --audit-log-path={} --max-requests-inflight=2000 --max-mutating-requests-inflight=1000 --profiling=true {}",
                    policy.display(),
                    audit_log.display(),
                    std::env::var("BENCH_APISERVER_ARGS").unwrap_or_default()
                ),
            )
            .env("KCM_QPS", "1000")
            .env("KCM_BURST", "2000")
            .env("KCM_CONCURRENT_DEPLOYMENT_SYNCS", "20")
            .env("KCM_CONCURRENT_REPLICASET_SYNCS", "20")
            .env("KCM_CONCURRENT_STATEFULSET_SYNCS", "20")
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
            local: LocalCluster::at(dir),
            audit_log,
        })
    }

    pub async fn down(&self) {
        let _ = Command::new("hack/cluster.sh")
            .arg("down")
            .arg(&self.local.dir)
            .status()
            .await;
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.base.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    pub async fn admin(&self) -> Result<Client> {
        self.local.admin().await
    }

    async fn kubectl(&self, args: &[&str]) -> Result<String> {
        match self.local.kubectl(args).await {
            (true, out) => Ok(out),
            (false, out) => bail!("kubectl {}: {out}", args.join(" ")),
        }
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
        let path = self.local.dir.join("operator.kubeconfig");
        if !path.exists() {
            self.local
                .service_account_kubeconfig(
                    OPERATOR_NAMESPACE,
                    SERVICE_ACCOUNT,
                    &path,
                    Duration::from_secs(10 * 3600),
                )
                .await?;
        }
        Ok(path)
    }

    pub fn audit_counts(&self, from: Timestamp, to: Timestamp) -> Result<audit::Counts> {
        audit::count(&self.audit_log, from, to)
    }

    /// The first successful write by `by` to each object of `resource` since `from`.
    pub fn first_writes(
        &self,
        by: audit::By,
        resource: &str,
        from: Timestamp,
    ) -> std::collections::BTreeMap<(String, String), audit::Write> {
        audit::first_writes(&self.audit_log, by, resource, from)
    }

    /// A CPU profile of the API server over the next `seconds` (pprof's protobuf, gzipped).
    pub fn api_server_profile(
        &self,
        seconds: u64,
    ) -> impl std::future::Future<Output = Result<Vec<u8>>> + Send + 'static {
        let kubeconfig = self.local.kubeconfig();
        async move {
            let out = Command::new("kubectl")
                .args([
                    "get",
                    "--raw",
                    &format!("/debug/pprof/profile?seconds={seconds}"),
                    "--request-timeout",
                    &format!("{}s", seconds + 60),
                ])
                .env("KUBECONFIG", kubeconfig)
                .output()
                .await
                .context("kubectl get --raw /debug/pprof/profile")?;
            if !out.status.success() {
                bail!(
                    "the API server's profile: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(out.stdout)
        }
    }
}
