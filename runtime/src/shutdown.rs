//! SIGTERM/SIGINT handling: the first signal starts a graceful shutdown.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Cancels `token` on the first SIGTERM or SIGINT.
pub async fn on_signal(token: CancellationToken) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = token.cancelled() => return,
    };
    info!(signal = name, "shutting down");
    token.cancel();
}
