//! A local cluster directory written by `hack/cluster.sh up`: its admin kubeconfig, kubectl as the
//! admin, and kubeconfigs for ServiceAccounts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::process::Command;

#[derive(Clone, Debug)]
pub struct LocalCluster {
    pub dir: PathBuf,
}

impl LocalCluster {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `DIR/env` (KUBECONFIG, ETCD_ENDPOINT, REAL_NODE_*, ... as `hack/cluster.sh up` wrote it).
    pub fn env(&self) -> Result<BTreeMap<String, String>> {
        let text = std::fs::read_to_string(self.dir.join("env"))
            .with_context(|| format!("{}/env (is the cluster up?)", self.dir.display()))?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// The cluster admin's kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A client with the cluster admin's credentials.
    pub async fn admin(&self) -> Result<Client> {
        Ok(Client::try_from(self.admin_config().await?)?)
    }

    /// The admin's client configuration, e.g. to turn off kube's retries of 429 (which would
    /// hide a refused eviction for minutes).
    pub async fn admin_config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig())?;
        let mut config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(config)
    }

    /// Runs kubectl as the admin: whether it succeeded, and its stdout then stderr.
    pub async fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .await
            .expect("kubectl runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Writes a kubeconfig at `out` that authenticates as ServiceAccount `sa` in `namespace` with
    /// a token valid for `duration` (e.g. "2h"), through `hack/lib.sh`'s `write_sa_kubeconfig`.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        sa: &str,
        out: &Path,
        duration: &str,
    ) -> Result<()> {
        let lib = crate::repo_root().join("hack/lib.sh");
        let status = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$0" && write_sa_kubeconfig "$@""#)
            .arg(&lib)
            .args([namespace, sa])
            .arg(out)
            .arg(duration)
            .env("KUBECONFIG", self.kubeconfig())
            .status()
            .await
            .context("bash hack/lib.sh")?;
        if !status.success() {
            bail!("could not write a kubeconfig for ServiceAccount {namespace}/{sa}");
        }
        Ok(())
    }
}
