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

/// This process's identity: the given one, else the host name, else a fixed name.
pub fn identity(given: Option<&str>) -> String {
    given
        .map(str::to_string)
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "memcached-operator".to_string())
}
