//! cert-manager's controllers (hack/certmanager, built by `hack/build-controlplane.sh`) as a
//! process against a local cluster, watching one namespace, with its CRDs installed: what
//! `spec.tls.issuerRef` asks of a cluster.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::LocalCluster;
use crate::process::Process;

/// cert-manager for one namespace; stopped (killed) when dropped.
pub struct CertManager {
    pub process: Process,
}

impl CertManager {
    /// Installs the cert-manager.io CRDs (idempotent) and starts the controllers for
    /// `namespace` (so tests running side by side each have their own), logging to `log_dir`.
    pub async fn start(cluster: &LocalCluster, namespace: &str, log_dir: &Path) -> Result<Self> {
        let env = built()?;
        let crds = &env["CERT_MANAGER_CRDS"];
        // Server-side: the Issuer CRDs are too large for kubectl's last-applied annotation.
        let (ok, out) = cluster
            .kubectl(&["apply", "--server-side", "--force-conflicts", "-f", crds])
            .await;
        if !ok {
            bail!("installing cert-manager's CRDs: {out}");
        }
        let (ok, out) = cluster
            .kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "-f",
                crds,
            ])
            .await;
        if !ok {
            bail!("cert-manager's CRDs not established: {out}");
        }
        std::fs::create_dir_all(log_dir)?;
        let kubeconfig = cluster.kubeconfig();
        let process = Process::start(
            "cert-manager",
            Path::new(&env["CERT_MANAGER_BIN"]),
            &[
                "--kubeconfig",
                kubeconfig.to_str().context("kubeconfig path")?,
                "--namespace",
                namespace,
            ],
            &[],
            log_dir.join(format!("cert-manager-{namespace}.log")),
        );
        Ok(Self { process })
    }
}

/// Builds cert-manager unless it is cached (`hack/build-controlplane.sh --cert-manager`; tests
/// run one at a time, and the script builds one at a time), and says where it and its CRDs are.
fn built() -> Result<BTreeMap<String, String>> {
    let script = crate::repo_root().join("hack/build-controlplane.sh");
    let build = std::process::Command::new(&script)
        .arg("--cert-manager")
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !build.success() {
        bail!(
            "{} --cert-manager failed (its output is above)",
            script.display()
        );
    }
    let out = std::process::Command::new(&script)
        .arg("--print-env")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let env = crate::env_lines(&String::from_utf8_lossy(&out.stdout));
    let bin = env.get("CERT_MANAGER_BIN").context("CERT_MANAGER_BIN")?;
    if !Path::new(bin).exists() {
        bail!("{bin} is not built: run hack/build-controlplane.sh");
    }
    Ok(env)
}
