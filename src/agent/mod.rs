//! The agent beside memcached (`memcached-operator agent`), for `spec.auth` and `spec.tls`
//! (and, beside the proxy, for its routes: route.rs).
//!
//! memcached reads its password file (`-Y`) at start and again on SIGHUP, in the same process
//! and without losing an item. The kubelet refreshes the mounted Secret within about a minute
//! of a change; the agent notices, writes the file with the new password and, for the rotation's
//! grace period, the old one too, and sends SIGHUP. It shares the pod's process namespace and
//! runs as memcached's user, so it needs no capability to signal it.
//!
//! With TLS it sees renewed certificate files and has memcached load them (`refresh_certs`).
//! It also logs in for the exporter: memcached's exporter cannot send the ASCII authentication,
//! so it reads `stats` through the agent's port on the pod's loopback.
//!
//! With a memory file (`-e`), it saves memcached's items when the kubelet is about to stop
//! memcached (`save`), so that the next memcached restores them, and restarts memcached with its
//! items when the pod asks for other settings: a larger cache, threads, connections (`settings`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use rustix::process::{Pid, Signal};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

mod endpoint;
mod front;
mod loopback;
mod passwords;
mod proxy_metrics;
mod route;
mod save;
mod settings;

use endpoint::SaveToken;
use loopback::{proxy, refresh_certs};
use passwords::{Credentials, PasswordFile, write_file};
pub use proxy_metrics::names as proxy_metric_names;
use save::Saver;

/// How long memcached may take to act on SIGHUP: it does so at its next clock tick, once a second.
const RELOAD_TICK: Duration = Duration::from_secs(2);
/// How often the agent reads the mounted Secret. The kubelet's own refresh (up to a minute)
/// dominates the time a rotation takes.
const POLL: Duration = Duration::from_secs(5);
/// memcached's process name in the pod.
const MEMCACHED: &str = "memcached";
/// How long, after SIGTERM, the agent waits for memcached to be gone (see `run`).
const OUTLIVE_MEMCACHED: Duration = Duration::from_secs(60);

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write memcached's password file from the Secret and exit (the pod's init container).
    Init(Paths),
    /// Keep the password file current, signal memcached, and log in for the exporter.
    // Boxed: the operator's command line holds this enum beside variants far smaller.
    Run(Box<RunArgs>),
    /// Beside memcached in proxy mode: render its route configuration from the operator's
    /// layout, and have it load each new one (SIGHUP).
    Route(Box<route::RouteArgs>),
}

#[derive(Args, Debug, Clone)]
pub struct Paths {
    /// The mounted Secret: files `username` and `password`.
    #[arg(long)]
    pub credentials: PathBuf,
    /// memcached's password file (its -Y flag).
    #[arg(long)]
    pub auth_file: PathBuf,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// With authentication: the mounted Secret (files `username` and `password`).
    #[arg(long, requires = "auth_file")]
    pub credentials: Option<PathBuf>,
    /// With authentication: memcached's password file (its -Y flag).
    #[arg(long, requires = "credentials")]
    pub auth_file: Option<PathBuf>,
    /// How long the previous password keeps working after the Secret changes.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub rotation_grace: Duration,
    /// With TLS: mounted Secrets whose files memcached reads; when one changes (a renewal), the
    /// agent asks memcached to `refresh_certs`.
    #[arg(long = "tls-dir")]
    pub tls_dirs: Vec<PathBuf>,
    /// Where the exporter connects (the pod's loopback only: whoever connects is logged in).
    #[arg(long, requires = "credentials")]
    pub proxy: Option<std::net::SocketAddr>,
    /// With spec.proxy and auth or TLS: where memcached's proxy reaches this member, which it
    /// cannot log in to or speak TLS to. Each connection is logged in and relayed to memcached's
    /// plain loopback listener; the NetworkPolicy admits only the proxy's pods and the operator's.
    #[arg(long)]
    pub backend_listen: Option<std::net::SocketAddr>,
    /// memcached's plain-text address on the pod's loopback.
    #[arg(long)]
    pub memcached: std::net::SocketAddr,
    /// With a memory file: where memcached's preStop hook asks the agent to save memcached's
    /// items (`GET /save`) before the kubelet stops it, and the operator reads `stats` (`GET /stats`).
    #[arg(long, requires = "save_token", requires = "memory_file")]
    pub save_listen: Option<std::net::SocketAddr>,
    /// What a save request's `X-Save-Token` header must hold.
    #[arg(long, env = crate::resources::warm_restart::TOKEN_ENV, hide_env_values = true)]
    pub save_token: Option<SaveToken>,
    /// memcached's memory file (its -e flag): memcached writes `<file>.meta` as it saves.
    #[arg(long)]
    pub memory_file: Option<PathBuf>,
    /// With a memory file: the file of the pod annotation memcached takes its `-m` from, beside
    /// those of its other settings; when they say more memory or other threads or connections,
    /// memcached is restarted with its items (settings.rs).
    #[arg(long, requires = "save_listen")]
    pub max_memory_file: Option<PathBuf>,
}

/// Sends SIGHUP to every memcached in the pod (the shared process namespace shows them), so it
/// re-reads its password file. None running (it is starting) reads the file as it starts.
fn reload_memcached() -> io::Result<usize> {
    Ok(signal_processes(MEMCACHED, Signal::HUP)?.pids.len())
}

/// The processes signalled by `signal_processes`.
struct Signalled {
    pids: Vec<Pid>,
    /// Those that could not be signalled (logged).
    failed: usize,
}

/// Sends `signal` to every live process of the pod named `name` (see `processes_named`).
fn signal_processes(name: &str, signal: Signal) -> io::Result<Signalled> {
    let mut signalled = Signalled {
        pids: Vec::new(),
        failed: 0,
    };
    for pid in processes_named(name)? {
        match rustix::process::kill_process(pid, signal) {
            Ok(()) => signalled.pids.push(pid),
            Err(e) => {
                signalled.failed += 1;
                warn!(pid = pid.as_raw_nonzero().get(), process = name, error = %e, "cannot signal")
            }
        }
    }
    Ok(signalled)
}

/// The live processes of the pod whose name (`comm`: the executable's file name, cut to 15
/// bytes) is `name`.
fn processes_named(name: &str) -> io::Result<Vec<Pid>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        if is_alive(pid, name) {
            found.push(pid);
        }
    }
    Ok(found)
}

/// Whether `pid` is still a process named `name`: not gone, not a zombie (whose parent, the
/// pod's pause process, has yet to reap it) and not a new process that took its number.
fn is_alive(pid: Pid, name: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())) else {
        return false;
    };
    // `pid (comm) state ...`; comm may itself hold spaces and parentheses.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 1..].trim_start().chars().next();
    comm == name && !matches!(state, Some('Z' | 'X' | 'x'))
}

/// `agent init`: the first password file, before memcached starts.
pub fn init(paths: &Paths) -> io::Result<()> {
    let credentials = Credentials::read(&paths.credentials)?;
    write_file(&paths.auth_file, &credentials.line())
}

/// What `agent run` keeps current: the password file, and the certificates memcached serves.
struct Agent {
    args: RunArgs,
    passwords: Option<PasswordFile>,
    /// The certificate files as memcached last loaded them.
    certificates: u64,
    /// The logins to try, in order (none without auth).
    login: watch::Sender<Vec<Credentials>>,
}

impl Agent {
    fn start(args: RunArgs) -> io::Result<Agent> {
        let passwords = match (&args.credentials, &args.auth_file) {
            (Some(credentials), Some(auth_file)) => Some(PasswordFile::open(
                Paths {
                    credentials: credentials.clone(),
                    auth_file: auth_file.clone(),
                },
                args.rotation_grace,
            )?),
            _ => None,
        };
        // memcached read these files as it started, as the agent does now.
        let certificates = fingerprint(&args.tls_dirs);
        let (login, _) = watch::channel(
            passwords
                .iter()
                .map(|p| p.passwords.current().clone())
                .collect(),
        );
        Ok(Agent {
            args,
            passwords,
            certificates,
            login,
        })
    }

    /// One look at the Secrets: a renewed certificate is loaded by `refresh_certs`; a changed
    /// password file is written and memcached signalled.
    async fn sync(&mut self) -> io::Result<()> {
        // Certificates first, logged in as memcached knows us now: a password rotated in the same
        // look is in force only once memcached has re-read its file.
        let certificates = fingerprint(&self.args.tls_dirs);
        if certificates != self.certificates {
            let logins = self.login.borrow().clone();
            match refresh_certs(self.args.memcached, &logins).await {
                Ok(()) => {
                    self.certificates = certificates;
                    info!("certificates changed: memcached reloaded them");
                }
                // Tried again at the next look.
                Err(error) => warn!(%error, "memcached did not reload the certificates"),
            }
        }
        if let Some(passwords) = &mut self.passwords
            && let Some(current) = passwords.sync(Instant::now())?
        {
            // memcached takes the new password once it has re-read its file, at its next clock
            // tick (once a second) after the signal, and the old one (unless kept for a grace)
            // until then: both are tried meanwhile.
            let previous = self.login.borrow().first().cloned();
            self.login
                .send_replace(std::iter::once(current.clone()).chain(previous).collect());
            tokio::time::sleep(RELOAD_TICK).await;
            self.login.send_replace(vec![current]);
        }
        Ok(())
    }
}

/// A digest of the files in `dirs` (the kubelet swaps a Secret's files all at once).
fn fingerprint(dirs: &[PathBuf]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            // The kubelet's own `..data` links and timestamped directories.
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        files.sort();
        for file in files {
            file.hash(&mut hasher);
            std::fs::read(&file).unwrap_or_default().hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// `agent run`, until SIGTERM; with saves, until memcached is gone too.
pub async fn run(args: RunArgs) -> io::Result<()> {
    let mut agent = Agent::start(args)?;
    for addr in [agent.args.proxy, agent.args.backend_listen]
        .into_iter()
        .flatten()
    {
        let listener = TcpListener::bind(addr).await?;
        tokio::spawn(proxy(
            listener,
            agent.args.memcached,
            agent.login.subscribe(),
        ));
    }
    let saver = match (
        agent.args.save_listen,
        &agent.args.save_token,
        &agent.args.memory_file,
    ) {
        (Some(addr), Some(token), Some(memory_file)) => {
            let saver = Saver::new(memory_file, MEMCACHED)
                .with_stats(agent.args.memcached, agent.login.subscribe());
            let saver = Arc::new(saver);
            let listener = TcpListener::bind(addr).await?;
            info!(address = %listener.local_addr()?, "serving saves");
            tokio::spawn(endpoint::serve_save(listener, token.clone(), saver.clone()));
            if let Some(file) = &agent.args.max_memory_file {
                tokio::spawn(settings::watch(saver.clone(), file.clone()));
            }
            Some(saver)
        }
        _ => None,
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        agent.sync().await?;
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = terminate.recv() => break,
        }
    }
    // A deleted pod's containers are all stopped at once, while memcached's preStop hook may be
    // asking this agent to save: it stays (serving) until memcached is gone. Stopped alone (its
    // own image changed in place), it is asked nothing and leaves memcached running.
    if let Some(saver) = saver {
        saver.stop();
        save::outlive(&saver, save::SAVE_EXPECTED_WITHIN, OUTLIVE_MEMCACHED).await;
    }
    Ok(())
}

/// Runs `task` on a runtime of one thread: the agent's work is a few reads a second.
fn block_on(task: impl Future<Output = io::Result<()>>) -> io::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|rt| rt.block_on(task))
}

/// Runs an agent command: the process's main for `memcached-operator agent`.
pub fn main(command: Command) -> std::process::ExitCode {
    let _telemetry = operator_runtime::telemetry::init(
        "memcached-agent",
        operator_runtime::telemetry::LogFormat::Text,
    );
    let result = match command {
        Command::Init(paths) => init(&paths),
        Command::Run(args) => block_on(run(*args)),
        Command::Route(args) => block_on(route::run(*args)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}
