//! The manager process: wires telemetry, the admin endpoints, leader election and the
//! controller, and shuts them down in order: stop taking work, drain running reconciles (bounded),
//! release the lease, exit.

use std::process::ExitCode;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::FusedFuture;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::certificate::Certificate;
use crate::config::RunArgs;
use crate::controller::{self, InitialList, Settings};
use crate::metrics::Metrics;
use crate::resources::Images;
use crate::service_monitor::ServiceMonitor;
use operator_runtime::admin::{self, Endpoints, Limits};
use operator_runtime::leader::{LeaderElector, LeaseConfig};
use operator_runtime::readiness::Readiness;
use operator_runtime::watch_namespace::{Scope, forbidden_scopes, served};

const IN_CLUSTER_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

pub fn main(args: RunArgs) -> ExitCode {
    let telemetry = operator_runtime::telemetry::init("memcached-operator", args.log_format);
    if telemetry.exporting() {
        info!("exporting traces over OTLP");
    }
    // One thread: the work is waiting on the API server, and a second worker thread only adds
    // wakeups and task stealing (docs/performance.md, CPU).
    let runtime = match tokio::runtime::Builder::new_current_thread()
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

/// The operator's client, and one for evictions that does not retry a 429 itself: the API
/// server answers an eviction that the disruption budget does not allow with 429, and kube's
/// default retry would hold the reconcile for minutes where the operator only has to look again.
async fn clients() -> Result<(Client, Client), kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let client = Client::try_from(config.clone())?;
    let mut once = config;
    once.default_retry = false;
    Ok((client, Client::try_from(once)?))
}

async fn run(args: RunArgs) -> ExitCode {
    let (client, evictions) = match clients().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot configure a Kubernetes client (KUBECONFIG or in-cluster config)");
            return ExitCode::FAILURE;
        }
    };
    let identity = args.identity();
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    let shutdown = CancellationToken::new();
    tokio::spawn(operator_runtime::shutdown::on_signal(shutdown.clone()));

    // Built before the endpoints listen: building it registers its watches for readiness. It runs
    // from the start, also on a follower, so its caches are warm at takeover; it reconciles
    // nothing until `leading` says so.
    let scopes = args.watch_namespace.scopes();
    let settings = Settings {
        watch_namespace: args.watch_namespace.clone(),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        max_concurrent_rollouts: args.max_concurrent_rollouts,
        images: Images {
            memcached: args.memcached_image.clone(),
            exporter: args.exporter_image.clone(),
            agent: args.agent_image.clone(),
        },
        service_monitors: keep::<ServiceMonitor>(&client, &scopes, Origin::Crd).await,
        certificates: keep::<Certificate>(&client, &scopes, Origin::Crd).await,
        network_policies: keep::<NetworkPolicy>(&client, &scopes, Origin::Builtin).await,
        autoscalers: keep::<HorizontalPodAutoscaler>(&client, &scopes, Origin::Builtin).await,
        initial_list: match scopes.first() {
            Some(scope) => InitialList::probe(&scope.api::<crate::api::Memcached>(&client)).await,
            None => InitialList::Paged,
        },
        operator_namespace: in_cluster_namespace(),
        instance: identity.clone(),
    };
    let (leading_tx, leading) = watch::channel(!args.leader_elect);
    let stop_controller = shutdown.child_token();
    let controller = controller::run(
        controller::Clients {
            api: client.clone(),
            evictions,
        },
        settings,
        metrics.clone(),
        readiness.watches(),
        stop_controller.clone(),
        leading,
    );

    // Endpoints outlive the controller so /metrics and probes answer during the drain.
    let endpoints_stop = CancellationToken::new();
    if let Err(code) = serve_endpoints(&args, &client, &metrics, &readiness, &endpoints_stop).await
    {
        return code;
    }

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
        let elector = LeaderElector::new(client, config);
        let controller = Controller {
            run: controller,
            stop: stop_controller,
            leading: leading_tx,
        };
        run_as_leader(elector, controller, &metrics, &readiness, &shutdown, &args).await
    } else {
        drain(controller.fuse(), &stop_controller, &readiness, &args).await;
        ExitCode::SUCCESS
    };
    endpoints_stop.cancel();
    info!("stopped");
    code
}

/// Where a kind the operator may keep comes from.
#[derive(Clone, Copy)]
enum Origin {
    /// Kubernetes' own: always served.
    Builtin,
    /// A CRD's (prometheus-operator's, cert-manager's): served only where it is installed.
    Crd,
}

/// Whether to keep objects of kind `K`: the cluster serves it and this process may list and
/// watch it where it watches Memcacheds. Asked a few times while the API server does not
/// answer; after that taken as no (logged), so that a start never waits long for an optional kind.
async fn keep<K>(client: &Client, scopes: &[Scope], origin: Origin) -> bool
where
    K: kube::Resource<DynamicType = ()>,
{
    let kind = K::kind(&());
    let ask = || async {
        if matches!(origin, Origin::Crd) && !served::<K>(client).await? {
            return Ok::<_, kube::Error>((false, vec![]));
        }
        let forbidden = forbidden_scopes::<K>(client, scopes).await?;
        Ok((true, forbidden))
    };
    let mut delay = std::time::Duration::from_millis(500);
    for attempt in 1..=5 {
        match ask().await {
            Ok((served, forbidden)) if forbidden.is_empty() => {
                info!(%kind, served, "served and watchable");
                return served;
            }
            Ok((_, forbidden)) => {
                let plural = K::plural(&());
                warn!(
                    %kind,
                    scopes = ?forbidden,
                    "this ServiceAccount may not list and watch {plural} in these scopes: keeping none (grant the {plural} rule of config/rbac/role.yaml, then restart)"
                );
                return false;
            }
            Err(error) if attempt == 5 => {
                warn!(%kind, %error, "cannot tell whether it is served and watchable; keeping none until restarted");
            }
            Err(error) => {
                warn!(%kind, %error, "discovery failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
    false
}

async fn serve_endpoints(
    args: &RunArgs,
    client: &Client,
    metrics: &Arc<Metrics>,
    readiness: &Arc<Readiness>,
    stop: &CancellationToken,
) -> Result<(), ExitCode> {
    let metrics_tls = match args.metrics_secure {
        false => None,
        true => match operator_runtime::metrics_auth::tls_config(args.metrics_cert_path.as_deref())
        {
            Ok(tls) => Some(tls),
            Err(e) => {
                error!(error = %e, "cannot set up TLS for /metrics");
                return Err(ExitCode::FAILURE);
            }
        },
    };
    let state = Arc::new(admin::State {
        metrics: metrics.controller.registry().clone(),
        readiness: readiness.clone(),
        client: client.clone(),
        metrics_auth: args
            .metrics_secure
            .then(|| operator_runtime::metrics_auth::MetricsAuth::new(client.clone())),
    });
    for (addr, endpoints, tls) in [
        (args.metrics_bind_address.0, Endpoints::Metrics, metrics_tls),
        (args.health_probe_bind_address.0, Endpoints::Health, None),
    ] {
        let Some(addr) = addr else { continue };
        if let Err(e) = admin::bind(
            addr,
            endpoints,
            state.clone(),
            tls,
            Limits::default(),
            stop.clone(),
        )
        .await
        {
            error!(%addr, error = %e, "cannot listen");
            return Err(ExitCode::FAILURE);
        }
    }
    Ok(())
}

/// The running controller, and the handles that gate and stop it.
struct Controller<F> {
    run: F,
    stop: CancellationToken,
    leading: watch::Sender<bool>,
}

async fn run_as_leader(
    mut elector: LeaderElector,
    controller: Controller<impl Future<Output = ()>>,
    metrics: &Metrics,
    readiness: &Readiness,
    shutdown: &CancellationToken,
    args: &RunArgs,
) -> ExitCode {
    let lease = elector.lease_name().to_string();
    metrics.controller.set_leader(&lease, false);
    let Controller { run, stop, leading } = controller;
    // Fused: the controller may end first in either select below (it stops on `shutdown` too),
    // and `drain` must not poll it again then.
    let run = run.fuse();
    tokio::pin!(run);
    let acquired = tokio::select! {
        acquired = elector.acquire(shutdown) => acquired,
        _ = &mut run => false,
    };
    if !acquired {
        stop.cancel();
        drain(&mut run, &stop, readiness, args).await;
        return ExitCode::SUCCESS;
    }
    metrics.controller.set_leader(&lease, true);
    leading.send_replace(true);

    let outcome = tokio::select! {
        held = elector.hold(shutdown) => held,
        _ = &mut run => Ok(()),
    };
    metrics.controller.set_leader(&lease, false);
    match outcome {
        Ok(()) => {
            stop.cancel();
            drain(&mut run, &stop, readiness, args).await;
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
/// Not while the caches are still filling: no reconcile does anything before they are filled
/// (each ends at once with `CachesFilling`), so there is nothing to wait for.
async fn drain(
    controller: impl FusedFuture<Output = ()>,
    stop: &CancellationToken,
    readiness: &Readiness,
    args: &RunArgs,
) {
    if controller.is_terminated() {
        return;
    }
    tokio::pin!(controller);
    tokio::select! {
        _ = &mut controller => return,
        _ = stop.cancelled() => {}
    }
    if !readiness.watches().synced() {
        info!("stopping before the caches synced: nothing to drain");
        return;
    }
    let started = std::time::Instant::now();
    match tokio::time::timeout(args.graceful_shutdown_timeout, controller).await {
        Ok(()) => info!(took = ?started.elapsed(), "reconciles in flight drained"),
        Err(_) => {
            warn!(timeout = ?args.graceful_shutdown_timeout, "reconciles still running at shutdown timeout")
        }
    }
}

fn in_cluster_namespace() -> Option<String> {
    std::fs::read_to_string(IN_CLUSTER_NAMESPACE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[tokio::test]
    async fn draining_a_controller_that_already_ended_returns_at_once() {
        let args = crate::config::Cli::try_parse_from(["memcached-operator"])
            .unwrap()
            .run;
        let run = futures::future::ready(()).fuse();
        tokio::pin!(run);
        (&mut run).await;
        let (stop, readiness) = (CancellationToken::new(), Readiness::default());
        stop.cancel();
        let drained = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            drain(&mut run, &stop, &readiness, &args),
        );
        assert!(drained.await.is_ok(), "waited out the shutdown timeout");
    }
}
