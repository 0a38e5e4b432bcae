//! The manager process: wires telemetry, the admin server, leader election and the controller,
//! and shuts them down in order.

use std::process::ExitCode;
use std::sync::Arc;

use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::RunArgs;
use crate::controller::{self, Settings};
use crate::metrics::Metrics;

pub fn main(args: RunArgs) -> ExitCode {
    crate::telemetry::init(args.log_format);
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
    runtime.block_on(run(args))
}

async fn run(args: RunArgs) -> ExitCode {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "cannot configure a Kubernetes client (KUBECONFIG or in-cluster config)");
            return ExitCode::FAILURE;
        }
    };
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    tokio::spawn(crate::shutdown::on_signal(shutdown.clone()));

    let settings = Settings {
        scope: args.watch_namespace.clone(),
        max_concurrent_reconciles: args.max_concurrent_reconciles,
        default_image: args.memcached_image.clone(),
        instance: crate::shutdown::identity(args.identity.as_deref()),
    };
    info!(scope = ?settings.scope, image = %settings.default_image, "starting controller");
    controller::run(client, settings, metrics, shutdown).await;
    info!("stopped");
    ExitCode::SUCCESS
}
