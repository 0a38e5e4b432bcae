//! The operator under test, started as the benchmark runs it: the operator's ServiceAccount, the
//! namespace of a cluster install, its log beside the cluster's.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use memcached_operator_testkit::{Launch, OperatorProcess};

use memcached_operator::config::{LEASE_NAME, OPERATOR_NAMESPACE};

use crate::cluster::Cluster;

/// Starts `command` (see `Launch::command`) as `identity`.
pub async fn start(cluster: &Cluster, command: &str, identity: &str) -> Result<OperatorProcess> {
    OperatorProcess::spawn(Launch {
        command: command.to_string(),
        identity: format!("operator-{identity}"),
        kubeconfig: cluster.operator_kubeconfig().await?,
        log_dir: cluster.local.dir.clone(),
        env: vec![("POD_NAMESPACE".into(), OPERATOR_NAMESPACE.into())],
    })
}

/// Waits until `op` holds the operator's Lease.
pub async fn wait_leader(op: &OperatorProcess, client: &Client, timeout: Duration) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let deadline = Instant::now() + timeout;
    loop {
        let holder = leases
            .get_opt(LEASE_NAME)
            .await?
            .and_then(|l| l.spec?.holder_identity);
        if holder.as_deref() == Some(op.identity.as_str()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} did not become leader", op.identity);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
