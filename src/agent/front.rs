//! The proxy's front door with `spec.auth` or `spec.tls` (`agent route --listen`): memcached's
//! proxy neither asks its clients for a login (its listeners never run the ASCII authentication)
//! nor speaks TLS on them without its own build options, so the agent beside it does both, as
//! memcached would on a member, and relays each connection to the proxy on the pod's loopback.
//!
//! The login is memcached's own: a connection's first `set` carries `<username> <password>`
//! (`STORED`); before it every command answers `CLIENT_ERROR unauthenticated`, a wrong one
//! `CLIENT_ERROR authentication failure`, and the connection stays open, as on a member. The
//! passwords honoured are the Secret's, with the previous one kept for the rotation's grace; a
//! renewed certificate serves the next connection.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tracing::{debug, info, warn};

use super::fingerprint;
use super::loopback::next_connection;
use super::passwords::{Credentials, Passwords};
use crate::resources::tls::{CA_KEY, CERT_KEY, PRIVATE_KEY_KEY};

/// How often the agent reads the mounted Secrets (the kubelet's refresh, up to a minute,
/// dominates a rotation's time).
const POLL: Duration = Duration::from_secs(5);
/// memcached's own bounds on a login: a first line longer than this without a line end is junk
/// and one shorter than `MIN_LINE` cannot be a login (the connection is closed), and the
/// login's data is at most `MAX_LOGIN` bytes.
const MAX_LINE: usize = 2048;
const MIN_LINE: usize = 6;
const MAX_LOGIN: usize = 16384;
/// A client has this long for its TLS handshake and its login.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the readiness check waits for memcached on the loopback.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Args, Debug, Clone, Default)]
pub struct FrontArgs {
    /// Where clients connect (memcached's proxy then listens on `--memcached` only): with TLS,
    /// TLS only.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// With TLS, a second address serving plain text (spec.tls.plaintextPort).
    #[arg(long, requires = "listen")]
    pub plain_listen: Option<SocketAddr>,
    /// Client connections served at once (memcached's -c); more are told so and closed, as
    /// memcached does.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Serves `GET /readyz` here: 200 while memcached in proxy mode accepts connections (the
    /// pod's readiness, which the client port alone would claim while memcached is down).
    #[arg(long, requires = "listen")]
    pub ready_address: Option<SocketAddr>,
    /// With authentication: the mounted Secret (files `username` and `password`).
    #[arg(long, requires = "listen")]
    pub credentials: Option<PathBuf>,
    /// How long the previous password keeps working after the Secret changes.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub rotation_grace: Duration,
    /// With TLS: the mounted certificate Secret (`tls.crt`, `tls.key`).
    #[arg(long, requires = "listen")]
    pub tls_dir: Option<PathBuf>,
    /// With client verification: the mounted Secret holding `ca.crt`.
    #[arg(long, requires = "tls_dir")]
    pub client_ca_dir: Option<PathBuf>,
}

/// What each connection is held to: the passwords in force when it logs in (None: no login
/// asked), and, for a TLS listener, the TLS configuration when it connects.
#[derive(Clone)]
struct Door {
    logins: watch::Receiver<Option<Vec<Credentials>>>,
    tls: watch::Receiver<Option<TlsAcceptor>>,
    slots: Arc<Semaphore>,
    memcached: SocketAddr,
}

/// Serves `args.listen` (and `plain_listen`) until the process ends, relaying to `memcached`.
pub async fn serve(args: FrontArgs, memcached: SocketAddr) -> io::Result<()> {
    let Some(listen) = args.listen else {
        return Ok(());
    };
    let mut keeper = Keeper::start(&args)?;
    let (logins, _) = watch::channel(keeper.logins());
    let (tls, _) = watch::channel(keeper.load_tls()?);
    let door = Door {
        logins: logins.subscribe(),
        tls: tls.subscribe(),
        slots: Arc::new(Semaphore::new(args.max_connections)),
        memcached,
    };
    for (address, with_tls) in [(Some(listen), true), (args.plain_listen, false)] {
        let Some(address) = address else { continue };
        let listener = TcpListener::bind(address).await?;
        info!(%address, tls = with_tls && args.tls_dir.is_some(), login = args.credentials.is_some(), "serving the proxy's clients");
        tokio::spawn(accept(listener, door.clone(), with_tls));
    }
    if let Some(address) = args.ready_address {
        let listener = TcpListener::bind(address).await?;
        tokio::spawn(super::endpoint::serve(listener, move |_| ready(memcached)));
    }
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            if keeper.sync_passwords(Instant::now()) {
                logins.send_replace(keeper.logins());
            }
            match keeper.sync_tls() {
                Ok(Some(acceptor)) => {
                    tls.send_replace(Some(acceptor));
                }
                Ok(None) => {}
                // The last good certificate keeps serving; tried again at the next look.
                Err(error) => warn!(%error, "cannot load the renewed certificate"),
            }
        }
    });
    Ok(())
}

/// `GET /readyz`: whether memcached in proxy mode accepts a connection on the loopback.
async fn ready(memcached: SocketAddr) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
    let reached = tokio::time::timeout(READY_TIMEOUT, TcpStream::connect(memcached)).await;
    match reached {
        Ok(Ok(_)) => super::endpoint::text(hyper::StatusCode::OK, "ok\n".to_string()),
        _ => super::endpoint::text(
            hyper::StatusCode::SERVICE_UNAVAILABLE,
            format!("memcached does not answer on {memcached}\n"),
        ),
    }
}

/// Keeps the passwords and the certificate current from the mounted Secrets.
struct Keeper {
    args: FrontArgs,
    passwords: Option<Passwords>,
    /// The certificate files as last loaded.
    certificates: u64,
}

impl Keeper {
    fn start(args: &FrontArgs) -> io::Result<Keeper> {
        let passwords = match &args.credentials {
            Some(dir) => Some(Passwords::new(Credentials::read(dir)?, args.rotation_grace)),
            None => None,
        };
        Ok(Keeper {
            args: args.clone(),
            passwords,
            certificates: 0,
        })
    }

    fn tls_dirs(&self) -> Vec<PathBuf> {
        self.args
            .tls_dir
            .iter()
            .chain(&self.args.client_ca_dir)
            .cloned()
            .collect()
    }

    /// The passwords honoured now; None without auth.
    fn logins(&self) -> Option<Vec<Credentials>> {
        self.passwords
            .as_ref()
            .map(|p| p.in_force().cloned().collect())
    }

    /// One look at the credentials Secret; whether the passwords honoured changed.
    fn sync_passwords(&mut self, now: Instant) -> bool {
        let (Some(passwords), Some(dir)) = (&mut self.passwords, &self.args.credentials) else {
            return false;
        };
        let mut changed = false;
        match Credentials::read(dir) {
            Ok(new) if passwords.rotate(new.clone(), now) => {
                info!(grace = ?self.args.rotation_grace, "the Secret changed: a new password");
                changed = true;
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "cannot read the Secret; keeping the passwords in force"),
        }
        if passwords.expire(now) {
            info!("a previous password's grace period ended");
            changed = true;
        }
        changed
    }

    /// The TLS configuration from the files as they are now; None without TLS.
    fn load_tls(&mut self) -> io::Result<Option<TlsAcceptor>> {
        let Some(dir) = &self.args.tls_dir else {
            return Ok(None);
        };
        let fingerprint = fingerprint(&self.tls_dirs());
        let config = server_config(dir, self.args.client_ca_dir.as_deref())?;
        self.certificates = fingerprint;
        Ok(Some(TlsAcceptor::from(config)))
    }

    /// A renewed certificate's configuration, once it loads; None while the files are as last
    /// loaded.
    fn sync_tls(&mut self) -> io::Result<Option<TlsAcceptor>> {
        if self.args.tls_dir.is_none() || fingerprint(&self.tls_dirs()) == self.certificates {
            return Ok(None);
        }
        let acceptor = self.load_tls()?;
        info!("the certificate changed: new connections get the new one");
        Ok(acceptor)
    }
}

/// The TLS configuration from a `kubernetes.io/tls` Secret's files, verifying clients against
/// `client_ca`'s `ca.crt` when given (a client without a certificate signed by it is refused).
fn server_config(dir: &Path, client_ca: Option<&Path>) -> io::Result<Arc<ServerConfig>> {
    let invalid = |what: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", what.display()),
        )
    };
    let read_certs = |file: PathBuf| -> io::Result<Vec<CertificateDer<'static>>> {
        CertificateDer::pem_file_iter(&file)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| invalid(&file, &e))
    };
    let certs = read_certs(dir.join(CERT_KEY))?;
    let key_file = dir.join(PRIVATE_KEY_KEY);
    let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|e| invalid(&key_file, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?;
    let builder = match client_ca {
        Some(ca_dir) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca_dir.join(CA_KEY))? {
                roots.add(cert).map_err(|e| invalid(ca_dir, &e))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| invalid(ca_dir, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(dir, &e))?;
    Ok(Arc::new(config))
}

async fn accept(listener: TcpListener, door: Door, with_tls: bool) {
    loop {
        let (mut client, peer) = next_connection(&listener).await;
        let Ok(slot) = door.slots.clone().try_acquire_owned() else {
            // memcached's words when it is at its -c.
            let _ = client
                .write_all(b"ERROR Too many open connections\r\n")
                .await;
            continue;
        };
        let _ = client.set_nodelay(true);
        let tls = with_tls.then(|| door.tls.borrow().clone()).flatten();
        let door = door.clone();
        tokio::spawn(async move {
            let served = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(LOGIN_TIMEOUT, acceptor.accept(client)).await {
                        Ok(Ok(stream)) => relay(stream, &door).await,
                        Ok(Err(error)) => Err(error),
                        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake")),
                    }
                }
                None => relay(client, &door).await,
            };
            if let Err(error) = served {
                debug!(%peer, %error, "client connection ended");
            }
            drop(slot);
        });
    }
}

/// Holds `client` to the login (while passwords are in force), then relays it to memcached.
async fn relay<S>(client: S, door: &Door) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut client = BufReader::new(client);
    if door.logins.borrow().is_some() {
        let logged_in = tokio::time::timeout(LOGIN_TIMEOUT, log_in(&mut client, &door.logins))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no login in time"))??;
        if !logged_in {
            return Ok(());
        }
    }
    let mut upstream = TcpStream::connect(door.memcached).await?;
    upstream.set_nodelay(true)?;
    // What the client sent after its login (pipelined) goes first.
    upstream.write_all(client.buffer()).await?;
    let mut client = client.into_inner();
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// memcached's ASCII login (proto_text.c, `try_read_command_asciiauth`): true once a `set`
/// carried credentials in force when it came; false when the client left or sent junk.
async fn log_in<S>(
    client: &mut BufReader<S>,
    logins: &watch::Receiver<Option<Vec<Credentials>>>,
) -> io::Result<bool>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let mut line = Vec::new();
        let read = (&mut *client)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
            .await?;
        if read == 0 || !line.ends_with(b"\n") || line.len() - 1 < MIN_LINE {
            return Ok(false);
        }
        // memcached's tokenizer: runs of spaces separate words; a command starting `set` is
        // taken as one.
        let words: Vec<&[u8]> = line
            .trim_ascii()
            .split(|b| *b == b' ')
            .filter(|w| !w.is_empty())
            .collect();
        let size = match words.as_slice() {
            [command, _key, _flags, _exptime, size, ..] if command.starts_with(b"set") => {
                std::str::from_utf8(size)
                    .ok()
                    .and_then(|s| s.parse::<usize>().ok())
            }
            _ => None,
        };
        let Some(size) = size else {
            reply(client, "CLIENT_ERROR unauthenticated").await?;
            continue;
        };
        if size > MAX_LOGIN {
            reply(client, "CLIENT_ERROR auth token too long").await?;
            continue;
        }
        let mut data = vec![0; size + 2];
        client.read_exact(&mut data).await?;
        if !data.ends_with(b"\r\n") {
            reply(client, "CLIENT_ERROR bad command line termination").await?;
            continue;
        }
        let Some((username, password)) = std::str::from_utf8(&data[..size])
            .ok()
            .and_then(|d| d.split_once(' '))
        else {
            reply(client, "CLIENT_ERROR bad authentication token format").await?;
            continue;
        };
        // The passwords in force now, not when the connection came: a password whose grace
        // ended is refused on a connection opened before.
        let accepted = logins
            .borrow()
            .iter()
            .flatten()
            .any(|c| c.username == username && c.password == password);
        if accepted {
            reply(client, "STORED").await?;
            return Ok(true);
        }
        reply(client, "CLIENT_ERROR authentication failure").await?;
    }
}

async fn reply<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut BufReader<S>,
    line: &str,
) -> io::Result<()> {
    client
        .get_mut()
        .write_all(format!("{line}\r\n").as_bytes())
        .await
}

#[cfg(test)]
mod tests;
