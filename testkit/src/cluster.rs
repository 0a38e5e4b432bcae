//! A local cluster directory written by `hack/cluster.sh up`: its admin kubeconfig, kubectl as the
//! admin, and kubeconfigs for ServiceAccounts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
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

    /// Writes a kubeconfig at `out` (mode 600) that authenticates as ServiceAccount `sa` in
    /// `namespace` with a token valid for `valid_for`, as `kubectl create token` would issue it.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        sa: &str,
        out: &Path,
        valid_for: Duration,
    ) -> Result<()> {
        let admin = Kubeconfig::read_from(self.kubeconfig())?;
        let cluster = admin
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .context("the admin kubeconfig names no cluster")?;
        let server = cluster.server.clone().context("no server")?;
        let ca = cluster
            .certificate_authority_data
            .clone()
            .context("no certificate-authority-data")?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(valid_for.as_secs() as i64),
                ..Default::default()
            },
            ..Default::default()
        };
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin().await?, namespace);
        let token = accounts
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token for ServiceAccount {namespace}/{sa}"))?
            .status
            .context("the TokenRequest has no status")?
            .token;
        let kubeconfig = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: \"{server}\", certificate-authority-data: \"{ca}\"}}
users:
- name: {sa}
  user: {{token: \"{token}\"}}
contexts:
- name: operator
  context: {{cluster: local, user: {sa}, namespace: {namespace}}}
current-context: operator
"
        );
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(out)
            .and_then(|mut f| f.write_all(kubeconfig.as_bytes()))
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(())
    }
}
