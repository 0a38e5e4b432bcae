//! The agent beside memcached (`memcached-operator agent`), for `spec.auth`.
//!
//! memcached reads its password file (`-Y`) at start and again on SIGHUP, in the same process
//! and without losing an item. The kubelet refreshes the mounted Secret within about a minute
//! of a change; the agent notices, writes the file with the new password and, for the rotation's
//! grace period, the old one too, and sends SIGHUP. It shares the pod's process namespace and
//! runs as memcached's user, so it needs no capability to signal it.
//!
//! It also logs in for the exporter: memcached's exporter cannot send the ASCII authentication,
//! so it reads `stats` through the agent's port on the pod's loopback.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::resources::auth::{self, PASSWORD_KEY, USERNAME_KEY};

/// How often the agent reads the mounted Secret. The kubelet's own refresh (up to a minute)
/// dominates the time a rotation takes.
const POLL: Duration = Duration::from_secs(5);
/// memcached keeps at most 8 entries of its password file.
const MAX_ENTRIES: usize = 8;

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write memcached's password file from the Secret and exit (the pod's init container).
    Init(Paths),
    /// Keep the password file current, signal memcached, and log in for the exporter.
    Run(RunArgs),
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
    /// memcached's plain-text address on the pod's loopback.
    #[arg(long)]
    pub memcached: std::net::SocketAddr,
}

/// One `user:password` entry of memcached's file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl Credentials {
    /// The Secret's files as mounted; refused if memcached's file could not hold them (the
    /// operator checks this too before it mounts a Secret, but the Secret may change after).
    pub fn read(dir: &Path) -> io::Result<Credentials> {
        let read = |key: &str| -> io::Result<String> {
            let value = std::fs::read_to_string(dir.join(key))?;
            match auth::value_problem(value.as_bytes()) {
                Some(problem) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{key} {problem}"),
                )),
                None => Ok(value),
            }
        };
        Ok(Credentials {
            username: read(USERNAME_KEY)?,
            password: read(PASSWORD_KEY)?,
        })
    }

    fn line(&self) -> String {
        format!("{}:{}\n", self.username, self.password)
    }

    /// The entries of a password file (lines without a colon are skipped, as memcached would
    /// refuse the file).
    fn parse_file(text: &str) -> Vec<Credentials> {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(u, p)| Credentials {
                username: u.to_string(),
                password: p.to_string(),
            })
            .collect()
    }

    /// memcached's ASCII login: a `set` whose data is `<username> <password>`.
    fn login_command(&self) -> String {
        let data = format!("{} {}", self.username, self.password);
        format!("set auth 0 0 {}\r\n{data}\r\n", data.len())
    }
}

/// The passwords memcached accepts: the current one, and earlier ones until their grace ends.
#[derive(Debug)]
pub struct Passwords {
    current: Credentials,
    retiring: Vec<(Credentials, Instant)>,
    grace: Duration,
}

impl Passwords {
    pub fn new(current: Credentials, grace: Duration) -> Self {
        Passwords {
            current,
            retiring: Vec::new(),
            grace,
        }
    }

    /// Keeps `earlier` (e.g. read back from the file after the agent restarted) working for a
    /// grace period from `now`.
    pub fn retire(&mut self, earlier: Vec<Credentials>, now: Instant) {
        for c in earlier {
            if c != self.current && !self.retiring.iter().any(|(r, _)| *r == c) {
                self.retiring.push((c, now + self.grace));
            }
        }
        // The newest first, as many as memcached keeps.
        self.retiring
            .sort_by_key(|(_, until)| std::cmp::Reverse(*until));
        self.retiring.truncate(MAX_ENTRIES - 1);
    }

    /// A new current password; whether the set changed.
    pub fn rotate(&mut self, new: Credentials, now: Instant) -> bool {
        if new == self.current {
            return false;
        }
        let old = std::mem::replace(&mut self.current, new);
        self.retiring.retain(|(c, _)| *c != self.current);
        if !self.grace.is_zero() {
            self.retire(vec![old], now);
        }
        true
    }

    /// Drops passwords whose grace has ended; whether any was.
    pub fn expire(&mut self, now: Instant) -> bool {
        let before = self.retiring.len();
        self.retiring.retain(|(_, until)| *until > now);
        self.retiring.len() != before
    }

    /// The file's text: the current password first.
    pub fn file(&self) -> String {
        std::iter::once(&self.current)
            .chain(self.retiring.iter().map(|(c, _)| c))
            .map(Credentials::line)
            .collect()
    }

    pub fn current(&self) -> &Credentials {
        &self.current
    }
}

/// Writes the file whole (a rename), so memcached never reads half of it; only memcached's user
/// may read it.
fn write_file(path: &Path, text: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    io::Write::write_all(&mut file, text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(tmp, path)
}

/// Sends SIGHUP to every memcached in the pod (the shared process namespace shows them), so it
/// re-reads its password file. None running (it is starting) reads the file as it starts.
fn reload_memcached() -> io::Result<usize> {
    let mut signalled = 0;
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != "memcached" {
            continue;
        }
        let Some(pid) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        match rustix::process::kill_process(pid, rustix::process::Signal::HUP) {
            Ok(()) => signalled += 1,
            Err(e) => {
                warn!(pid = pid.as_raw_nonzero().get(), error = %e, "cannot signal memcached")
            }
        }
    }
    Ok(signalled)
}

/// `agent init`: the first password file, before memcached starts.
pub fn init(paths: &Paths) -> io::Result<()> {
    let credentials = Credentials::read(&paths.credentials)?;
    write_file(&paths.auth_file, &credentials.line())
}

/// memcached's password file as the agent keeps it: the passwords in force, and the text last
/// written.
struct PasswordFile {
    paths: Paths,
    passwords: Passwords,
    written: String,
}

impl PasswordFile {
    fn open(paths: Paths, grace: Duration) -> io::Result<PasswordFile> {
        let mut passwords = Passwords::new(Credentials::read(&paths.credentials)?, grace);
        // A restarted agent keeps the passwords its predecessor still honoured, for a new grace
        // period.
        let written = std::fs::read_to_string(&paths.auth_file).unwrap_or_default();
        passwords.retire(Credentials::parse_file(&written), Instant::now());
        Ok(PasswordFile {
            paths,
            passwords,
            written,
        })
    }

    /// Reads the Secret and drops expired passwords; rewrites the file and signals memcached if
    /// that changed it. The new current password, if it changed.
    fn sync(&mut self, now: Instant) -> io::Result<Option<Credentials>> {
        let mut rotated = None;
        match Credentials::read(&self.paths.credentials) {
            Ok(new) => {
                if self.passwords.rotate(new, now) {
                    info!(grace = ?self.passwords.grace, "the Secret changed: a new password");
                    rotated = Some(self.passwords.current().clone());
                }
            }
            Err(error) => warn!(%error, "cannot read the Secret; keeping the passwords in force"),
        }
        if self.passwords.expire(now) {
            info!("a previous password's grace period ended");
        }
        let text = self.passwords.file();
        if text != self.written {
            write_file(&self.paths.auth_file, &text)?;
            self.written = text;
            let signalled = reload_memcached()?;
            info!(
                signalled,
                entries = self.written.lines().count(),
                "password file rewritten"
            );
        }
        Ok(rotated)
    }
}

/// What `agent run` keeps current: the password file, and the certificates memcached serves.
struct Agent {
    args: RunArgs,
    passwords: Option<PasswordFile>,
    /// The certificate files as memcached last loaded them.
    certificates: u64,
    login: watch::Sender<Option<Credentials>>,
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
        let (login, _) = watch::channel(passwords.as_ref().map(|p| p.passwords.current().clone()));
        Ok(Agent {
            args,
            passwords,
            certificates,
            login,
        })
    }

    /// One look at the Secrets: a changed password file is written and memcached signalled; a
    /// renewed certificate is loaded by `refresh_certs`.
    async fn sync(&mut self) -> io::Result<()> {
        if let Some(passwords) = &mut self.passwords
            && let Some(current) = passwords.sync(Instant::now())?
        {
            self.login.send_replace(Some(current));
        }
        let certificates = fingerprint(&self.args.tls_dirs);
        if certificates != self.certificates {
            let login = self.login.borrow().clone();
            match refresh_certs(self.args.memcached, login.as_ref()).await {
                Ok(()) => {
                    self.certificates = certificates;
                    info!("certificates changed: memcached reloaded them");
                }
                // Tried again at the next look.
                Err(error) => warn!(%error, "memcached did not reload the certificates"),
            }
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

/// memcached's `refresh_certs`, over its plain loopback listener (logged in when needed).
async fn refresh_certs(
    memcached: std::net::SocketAddr,
    login: Option<&Credentials>,
) -> io::Result<()> {
    let mut conn = BufReader::new(TcpStream::connect(memcached).await?);
    if let Some(credentials) = login {
        expect(&mut conn, &credentials.login_command(), "STORED").await?;
    }
    expect(&mut conn, "refresh_certs\r\n", "OK").await
}

/// Sends `command` and reads one line, which must be `want`.
async fn expect(conn: &mut BufReader<TcpStream>, command: &str, want: &str) -> io::Result<()> {
    conn.get_mut().write_all(command.as_bytes()).await?;
    let mut reply = String::new();
    conn.read_line(&mut reply).await?;
    if reply.trim_end() != want {
        return Err(io::Error::other(format!(
            "memcached answered {:?}",
            reply.trim_end()
        )));
    }
    Ok(())
}

/// `agent run`, until SIGTERM.
pub async fn run(args: RunArgs) -> io::Result<()> {
    let mut agent = Agent::start(args)?;
    if let Some(addr) = agent.args.proxy {
        let listener = TcpListener::bind(addr).await?;
        tokio::spawn(proxy(
            listener,
            agent.args.memcached,
            agent.login.subscribe(),
        ));
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        agent.sync().await?;
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = terminate.recv() => return Ok(()),
        }
    }
}

/// Each connection to `listener` is logged in to memcached with the current password, then
/// relayed byte for byte.
async fn proxy(
    listener: TcpListener,
    memcached: std::net::SocketAddr,
    login: watch::Receiver<Option<Credentials>>,
) {
    loop {
        let (client, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(credentials) = login.borrow().clone() else {
            continue;
        };
        tokio::spawn(async move {
            if let Err(error) = relay(client, memcached, &credentials).await {
                debug!(%error, "relay ended");
            }
        });
    }
}

async fn relay(
    mut client: TcpStream,
    memcached: std::net::SocketAddr,
    credentials: &Credentials,
) -> io::Result<()> {
    let mut upstream = BufReader::new(TcpStream::connect(memcached).await?);
    expect(&mut upstream, &credentials.login_command(), "STORED").await?;
    // Nothing else is buffered: memcached sent only the reply.
    tokio::io::copy_bidirectional(&mut client, upstream.get_mut()).await?;
    Ok(())
}

/// Runs an agent command: the process's main for `memcached-operator agent`.
pub fn main(command: Command) -> std::process::ExitCode {
    let _telemetry = operator_runtime::telemetry::init(
        "memcached-agent",
        operator_runtime::telemetry::LogFormat::Text,
    );
    let result = match command {
        Command::Init(paths) => init(&paths),
        Command::Run(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .and_then(|rt| rt.block_on(run(args))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(password: &str) -> Credentials {
        Credentials {
            username: "app".into(),
            password: password.into(),
        }
    }

    #[test]
    fn a_rotation_keeps_the_old_password_for_the_grace_period() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut p = Passwords::new(creds("one"), grace);
        assert_eq!(p.file(), "app:one\n");
        assert!(!p.rotate(creds("one"), t0), "unchanged");
        assert!(p.rotate(creds("two"), t0));
        assert_eq!(p.file(), "app:two\napp:one\n");
        assert!(!p.expire(t0 + grace - Duration::from_secs(1)));
        assert!(p.expire(t0 + grace));
        assert_eq!(p.file(), "app:two\n");
    }

    #[test]
    fn no_grace_drops_the_old_password_at_once() {
        let mut p = Passwords::new(creds("one"), Duration::ZERO);
        assert!(p.rotate(creds("two"), Instant::now()));
        assert_eq!(p.file(), "app:two\n");
    }

    #[test]
    fn rotating_back_does_not_list_a_password_twice() {
        let t0 = Instant::now();
        let mut p = Passwords::new(creds("one"), Duration::from_secs(60));
        p.rotate(creds("two"), t0);
        p.rotate(creds("one"), t0);
        assert_eq!(p.file(), "app:one\napp:two\n");
    }

    #[test]
    fn a_restarted_agent_honours_what_its_file_held_and_memcacheds_limit() {
        let t0 = Instant::now();
        let mut p = Passwords::new(creds("new"), Duration::from_secs(60));
        let file: String = (0..12).map(|i| format!("app:old{i}\n")).collect();
        p.retire(Credentials::parse_file(&format!("app:new\n{file}")), t0);
        assert_eq!(p.file().lines().count(), MAX_ENTRIES);
        assert!(p.file().starts_with("app:new\n"));
    }

    #[test]
    fn the_login_is_memcacheds_ascii_authentication() {
        assert_eq!(creds("pw").login_command(), "set auth 0 0 6\r\napp pw\r\n");
    }

    #[test]
    fn secret_files_memcached_cannot_hold_are_refused() {
        let dir = std::env::temp_dir().join(format!("agent-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("username"), "app").unwrap();
        std::fs::write(dir.join("password"), "pw\n").unwrap();
        assert!(Credentials::read(&dir).is_err(), "a trailing newline");
        std::fs::write(dir.join("password"), "pw").unwrap();
        assert_eq!(Credentials::read(&dir).unwrap(), creds("pw"));
        let file = dir.join("auth");
        write_file(&file, "app:pw\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
