//! The manager process: wires telemetry, the admin endpoints, leader election and the
//! controller, and shuts them down in order: stop taking work, drain running reconciles (bounded),
//! release the lease, exit.

use std::process::ExitCode;
use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, Endpoints};
use crate::config::RunArgs;
use crate::controller::{self, Settings};
use crate::health::Health;
use crate::leader::{LeaderElector, LeaseConfig};
use crate::metrics::Metrics;

const IN_CLUSTER_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

pub fn main(args: RunArgs) -> ExitCode {
    let telemetry = crate::telemetry::init(args.log_format);
    if telemetry.exporting() {
        info!("exporting traces over OTLP");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(args));
    // Reconciles still running after a lost lease are abandoned here, not awaited.
    runtime.shutdown_background();
    drop(telemetry);
    code
}

async fn run(args: RunArgs) -> ExitCode {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot configure a Kubernetes client (KUBECONFIG or in-cluster config)");
            return ExitCode::FAILURE;
        }
    };
    let identity = args.identity();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    tokio::spawn(crate::shutdown::on_signal(shutdown.clone()));

    // Endpoints outlive the controller so /metrics and probes answer during the drain.
    let endpoints_stop = CancellationToken::new();
    let metrics_tls = match args.metrics_secure {
        false => None,
        true => match crate::metrics_auth::tls_config(args.metrics_cert_path.as_deref()) {
            Ok(tls) => Some(tls),
            Err(e) => {
                error!(error = %e, "cannot set up TLS for /metrics");
                return ExitCode::FAILURE;
            }
        },
    };
    let state = Arc::new(admin::State {
        metrics: metrics.clone(),
        health: health.clone(),
        client: client.clone(),
        metrics_auth: args
            .metrics_secure
            .then(|| crate::metrics_auth::MetricsAuth::new(client.clone())),
    });
    for (addr, endpoints, tls) in [
        (args.metrics_bind_address.0, Endpoints::Metrics, metrics_tls),
        (args.health_probe_bind_address.0, Endpoints::Health, None),
    ] {
        let Some(addr) = addr else { continue };
        if let Err(e) =
            admin::bind(addr, endpoints, state.clone(), tls, endpoints_stop.clone()).await
        {
            error!(%addr, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    }

    let settings = Settings {
        scope: args.watch_namespace.clone(),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        default_image: args.memcached_image.clone(),
        instance: identity.clone(),
    };
    let code = if args.leader_elect {
        let Some(namespace) = args
            .leader_election_namespace
            .clone()
            .or_else(in_cluster_namespace)
        else {
            error!(
                "--leader-elect needs --leader-election-namespace (or POD_NAMESPACE) when run outside a cluster"
            );
            return ExitCode::from(2);
        };
        let config = LeaseConfig {
            name: args.leader_election_id.clone(),
            namespace,
            identity,
            lease_duration: args.leader_election_lease_duration,
            renew_deadline: args.leader_election_renew_deadline,
            retry_period: args.leader_election_retry_period,
        };
        run_as_leader(client, config, settings, metrics, health, shutdown, &args).await
    } else {
        let (_always, leading) = watch::channel(true);
        let controller = controller::run(
            client,
            settings,
            metrics,
            health.clone(),
            shutdown.clone(),
            leading,
        );
        drain(controller, &shutdown, &health, &args).await;
        ExitCode::SUCCESS
    };
    endpoints_stop.cancel();
    info!("stopped");
    code
}

async fn run_as_leader(
    client: Client,
    config: LeaseConfig,
    settings: Settings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    args: &RunArgs,
) -> ExitCode {
    let lease = config.name.clone();
    metrics.set_leader(&lease, false);
    let mut elector = LeaderElector::new(client.clone(), config);

    // The controller runs from the start so its caches are warm at takeover; it reconciles
    // nothing until `leading` says so.
    let (leading_tx, leading) = watch::channel(false);
    let stop_controller = CancellationToken::new();
    let controller = controller::run(
        client,
        settings,
        metrics.clone(),
        health.clone(),
        stop_controller.clone(),
        leading,
    );
    tokio::pin!(controller);
    let acquired = tokio::select! {
        acquired = elector.acquire(&shutdown) => acquired,
        _ = &mut controller => false,
    };
    if !acquired {
        stop_controller.cancel();
        drain(controller, &stop_controller, &health, args).await;
        return ExitCode::SUCCESS;
    }
    metrics.set_leader(&lease, true);
    health.set_leading(true);
    leading_tx.send_replace(true);

    let outcome = tokio::select! {
        held = elector.hold(&shutdown) => held,
        _ = &mut controller => Ok(()),
    };
    metrics.set_leader(&lease, false);
    match outcome {
        Ok(()) => {
            stop_controller.cancel();
            drain(controller, &stop_controller, &health, args).await;
            elector.release().await;
            ExitCode::SUCCESS
        }
        Err(lost) => {
            // Another process may lead now: stop acting at once, and let the restart make us a follower.
            error!(error = %lost, "lost leadership; exiting");
            ExitCode::FAILURE
        }
    }
}

/// Waits for the controller to finish after `stop`, for at most the graceful shutdown timeout.
///
/// Not while the caches are still filling: nothing can be in flight then, and kube's controller
/// does not finish a graceful shutdown begun before its first list (it waits for a store that
/// will never be ready), which held the lease for the whole timeout.
async fn drain(
    controller: impl Future<Output = ()>,
    stop: &CancellationToken,
    health: &Health,
    args: &RunArgs,
) {
    tokio::pin!(controller);
    tokio::select! {
        _ = &mut controller => return,
        _ = stop.cancelled() => {}
    }
    if !health.caches_synced() {
        info!("stopping before the caches synced: nothing to drain");
        return;
    }
    if tokio::time::timeout(args.graceful_shutdown_timeout, controller)
        .await
        .is_err()
    {
        warn!(timeout = ?args.graceful_shutdown_timeout, "reconciles still running at shutdown timeout");
    }
}

fn in_cluster_namespace() -> Option<String> {
    std::fs::read_to_string(IN_CLUSTER_NAMESPACE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
