//! `agent route`: beside memcached in proxy mode, keeps its route configuration current.
//!
//! The operator writes the layout (the members' addresses) into a ConfigMap; the kubelet
//! refreshes the mounted file. The agent checks each new layout, renders memcached's
//! configuration from it, and has memcached load it by SIGHUP, in the same process and with its
//! clients' connections kept. memcached exits on a configuration it cannot load, so a layout
//! that fails the check is never rendered: the proxy keeps routing by the last good one.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use rustix::process::Signal;
use tracing::{info, warn};

use super::front::{self, FrontArgs};
use super::loopback::stats_answers;
use super::proxy_metrics::{View, serve_metrics, stat_lines};
use super::{MEMCACHED, signal_processes};
use crate::resources::proxy::{Layout, ROUTES_FILE, ROUTES_LIBRARY};

/// How often the agent reads the mounted layout.
const POLL: Duration = Duration::from_secs(1);
/// How long memcached may take to say it loaded a configuration (it does so at its next tick).
const LOAD_WAIT: Duration = Duration::from_secs(5);

#[derive(Args, Debug, Clone)]
pub struct RouteArgs {
    /// The layout the operator keeps (the mounted ConfigMap's `layout.json`).
    #[arg(long)]
    pub layout: PathBuf,
    /// memcached's route configuration (its `proxy_arg`), rendered from the layout.
    #[arg(long)]
    pub config: PathBuf,
    /// Render the configuration once and exit (the pod's init container): memcached starts
    /// with it.
    #[arg(long)]
    pub once: bool,
    /// Serve the proxy's metrics (`GET /metrics`) on this address.
    #[arg(long)]
    pub metrics_address: Option<SocketAddr>,
    /// memcached's listener, where the agent reads whether it loaded a configuration, and the
    /// metrics its stats.
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub memcached: SocketAddr,
    /// The proxy's zone (its pod's `topology.kubernetes.io/zone` label): with zone-local
    /// reads, reads ask that zone's members first.
    #[arg(long, default_value = "")]
    pub zone: String,
    /// With spec.auth or spec.tls: the agent serves the proxy's clients (front.rs).
    #[command(flatten)]
    pub front: FrontArgs,
}

/// Reads the layout; when it is new (not `view.rendered`, the one last written) and passes the
/// check, writes the configuration, keeps it as rendered and returns true. A layout that fails
/// the check is logged, left unrendered and marked refused in `view`.
fn sync(view: &Mutex<View>, args: &RouteArgs) -> io::Result<bool> {
    let text = std::fs::read_to_string(&args.layout)?;
    let layout = match Layout::check(&text) {
        Ok(layout) => layout,
        Err(why) => {
            let mut view = view.lock().expect("not poisoned");
            if !view.refused {
                warn!(layout = %args.layout.display(), %why, "layout refused: memcached keeps the last one");
            }
            view.refused = true;
            return Ok(false);
        }
    };
    let mut view = view.lock().expect("not poisoned");
    view.refused = false;
    if view.rendered.as_ref() == Some(&layout) {
        return Ok(false);
    }
    write_atomically(&args.config, &layout.render(&args.zone))?;
    info!(
        members = layout.members.len(),
        zones = layout.zones.len(),
        "configuration written"
    );
    view.rendered = Some(layout);
    Ok(true)
}

/// The mounted layout, if the configuration memcached reads is already its rendering.
fn already_rendered(args: &RouteArgs) -> Option<Layout> {
    let layout = Layout::check(&std::fs::read_to_string(&args.layout).ok()?).ok()?;
    let config = std::fs::read_to_string(&args.config).ok()?;
    (config == layout.render(&args.zone)).then_some(layout)
}

/// Writes the operator's route handlers beside the configuration: memcached loads both at
/// its start and at each SIGHUP.
fn write_library(args: &RouteArgs) -> io::Result<()> {
    write_atomically(&args.config.with_file_name(ROUTES_FILE), ROUTES_LIBRARY)
}

/// Writes `text` to `path` by a rename, so that memcached never reads half a file.
fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

/// `agent route`: with `--once`, the first configuration; else keeps it current until SIGTERM.
pub async fn run(args: RouteArgs) -> io::Result<()> {
    write_library(&args)?;
    if args.once {
        return match sync(&Mutex::default(), &args)? {
            true => Ok(()),
            false => Err(io::Error::other("the layout is refused: see the log")),
        };
    }
    // What memcached was started with (by the init container), or last loaded (before this
    // agent restarted), is taken as rendered only if it is this layout's: the first look then
    // signals nobody, and otherwise writes the layout and signals memcached.
    let view = Arc::new(Mutex::new(View {
        rendered: already_rendered(&args),
        ..View::default()
    }));
    if let Some(address) = args.metrics_address {
        serve_metrics(address, args.memcached, view.clone()).await?;
    }
    front::serve(args.front.clone(), args.memcached).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        match sync(&view, &args) {
            Ok(true) => {
                let before = reload_counts(args.memcached).await;
                let signalled = signal_processes(MEMCACHED, Signal::HUP)?;
                info!(
                    processes = signalled.pids.len(),
                    "memcached asked to load the new configuration"
                );
                let failed = match before {
                    Ok(before) => load_failed(args.memcached, before).await,
                    Err(error) => {
                        warn!(%error, "cannot read memcached's reload counts: its load is not known");
                        false
                    }
                };
                view.lock().expect("not poisoned").load_failed = failed;
            }
            Ok(false) => {}
            Err(error) => warn!(%error, "cannot read the layout"),
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = terminate.recv() => return Ok(()),
        }
    }
}

/// memcached's configuration loads and failed loads so far.
async fn reload_counts(memcached: SocketAddr) -> io::Result<(u64, u64)> {
    let [stats] = stats_answers(memcached, ["stats"]).await?;
    let lines = stat_lines(&stats);
    let count = |name: &str| lines.get(name).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((
        count("proxy_config_reloads"),
        count("proxy_config_reload_fails"),
    ))
}

/// Whether memcached failed to load the configuration it was just asked to (its failed loads
/// grew past `before`), waiting up to `LOAD_WAIT` for either count to move: it loads at its
/// next clock tick.
async fn load_failed(memcached: SocketAddr, before: (u64, u64)) -> bool {
    let deadline = tokio::time::Instant::now() + LOAD_WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match reload_counts(memcached).await {
            Ok((_, fails)) if fails > before.1 => {
                warn!(
                    "memcached failed to load the configuration: it keeps routing by the one before"
                );
                return true;
            }
            Ok((loads, _)) if loads > before.0 => return false,
            _ => {}
        }
    }
    warn!("memcached did not say it loaded the configuration");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path) -> RouteArgs {
        RouteArgs {
            layout: dir.join("layout.json"),
            config: dir.join("config.lua"),
            once: false,
            metrics_address: None,
            memcached: "127.0.0.1:11211".parse().unwrap(),
            zone: String::new(),
            front: FrontArgs::default(),
        }
    }

    #[test]
    fn a_new_layout_is_rendered_once_and_a_refused_one_never() {
        let dir = std::env::temp_dir().join(format!("agent-route-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = args(&dir);
        let rendered = Mutex::default();
        std::fs::write(&args.layout, r#"{"members": ["a-0.a.ns.svc:11211"]}"#).unwrap();
        assert!(sync(&rendered, &args).unwrap());
        let first = std::fs::read_to_string(&args.config).unwrap();
        assert!(first.contains("\"a-0.a.ns.svc:11211\""), "{first}");
        assert!(!sync(&rendered, &args).unwrap(), "the same layout again");

        std::fs::write(&args.layout, r#"{"members": ["a-0\"):11211"]}"#).unwrap();
        assert!(!sync(&rendered, &args).unwrap());
        assert_eq!(std::fs::read_to_string(&args.config).unwrap(), first);
        assert!(rendered.lock().unwrap().refused, "the metrics say so");

        std::fs::write(
            &args.layout,
            r#"{"members": ["a-0.a.ns.svc:11211", "a-1.a.ns.svc:11211"]}"#,
        )
        .unwrap();
        assert!(sync(&rendered, &args).unwrap());
        assert!(
            std::fs::read_to_string(&args.config)
                .unwrap()
                .contains("a-1.a.ns.svc:11211")
        );
        // An agent restarted meanwhile renders (and signals) unless memcached has this layout.
        assert!(already_rendered(&args).is_some());
        std::fs::write(&args.layout, r#"{"members": ["a-0.a.ns.svc:11211"]}"#).unwrap();
        assert!(already_rendered(&args).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
