//! A memcached text-protocol client with just what the tests ask of a server: set, get, stats and
//! login.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

pub struct Connection<S = TcpStream> {
    stream: BufReader<S>,
    /// How long a line of an answer may take.
    patience: Duration,
}

const PATIENCE: Duration = Duration::from_secs(2);
const CLOSED: &str = "memcached closed the connection";

/// Whether `error` is the connection's (closed by the server, reset, refused), not an answer.
pub fn connection_lost(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.to_string() == CLOSED)
        || error.downcast_ref::<std::io::Error>().is_some()
}

impl Connection {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        Ok(Self {
            stream: BufReader::new(tcp(addr).await?),
            patience: PATIENCE,
        })
    }
}

async fn tcp(addr: SocketAddr) -> Result<TcpStream> {
    Ok(
        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
            .await
            .with_context(|| format!("connecting to {addr}"))??,
    )
}

impl Connection<TlsStream<TcpStream>> {
    /// TLS to `addr`, verifying the server as `server_name` under `config`'s roots (and
    /// presenting its client certificate, if it has one).
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<ClientConfig>,
    ) -> Result<Self> {
        let tcp = tcp(addr).await?;
        let name = ServerName::try_from(server_name.to_string())?;
        let tls = tokio::time::timeout(
            Duration::from_secs(2),
            TlsConnector::from(config).connect(name, tcp),
        )
        .await
        .with_context(|| format!("TLS handshake with {addr}"))?
        .with_context(|| format!("TLS handshake with {addr} as {server_name}"))?;
        Ok(Self {
            stream: BufReader::new(tls),
            patience: PATIENCE,
        })
    }

    /// The certificate the server presented, DER.
    pub fn server_certificate(&self) -> Option<Vec<u8>> {
        let (_, session) = self.stream.get_ref().get_ref();
        Some(session.peer_certificates()?.first()?.to_vec())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Waits up to `patience` (2 s unless set) for each line of an answer.
    pub fn patient(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    async fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let read = tokio::time::timeout(self.patience, self.stream.read_line(&mut line));
        if read.await.context("memcached answered nothing")?? == 0 {
            bail!(CLOSED);
        }
        Ok(line.trim_end().to_string())
    }

    async fn send(&mut self, command: &str) -> Result<()> {
        let stream = self.stream.get_mut();
        stream.write_all(command.as_bytes()).await?;
        // A TLS stream holds what it has not sealed yet.
        stream.flush().await?;
        Ok(())
    }

    pub async fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        // One write: over TLS, one record rather than three.
        let mut command = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        command.extend_from_slice(value);
        command.extend_from_slice(b"\r\n");
        let stream = self.stream.get_mut();
        stream.write_all(&command).await?;
        stream.flush().await?;
        match self.line().await?.as_str() {
            "STORED" => Ok(()),
            other => bail!("set {key}: {other}"),
        }
    }

    /// memcached's ASCII authentication (`-Y`): a `set` of any key whose data is
    /// `<username> <password>`. An error carries memcached's answer.
    pub async fn login(&mut self, username: &str, password: &str) -> Result<()> {
        self.set("auth", format!("{username} {password}").as_bytes())
            .await
            .map_err(|e| anyhow::anyhow!("login as {username}: {e}"))
    }

    pub async fn get(&mut self, key: &str) -> Result<Option<String>> {
        self.send(&format!("get {key}\r\n")).await?;
        let header = self.line().await?;
        if header == "END" {
            return Ok(None);
        }
        if !header.starts_with("VALUE ") {
            bail!("get {key}: {header}");
        }
        let value = self.line().await?;
        let end = self.line().await?;
        if end != "END" {
            bail!("get {key}: expected END, got {end}");
        }
        Ok(Some(value))
    }

    /// `stats` (`""`) or `stats settings`, `stats items`, ...: name → value.
    pub async fn stats(&mut self, group: &str) -> Result<Vec<(String, String)>> {
        let command = if group.is_empty() {
            "stats\r\n".to_string()
        } else {
            format!("stats {group}\r\n")
        };
        self.send(&command).await?;
        let mut stats = Vec::new();
        loop {
            let line = self.line().await?;
            if line == "END" {
                return Ok(stats);
            }
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("STAT"), Some(name), Some(value)) => {
                    stats.push((name.to_string(), value.to_string()))
                }
                _ => bail!("stats: {line}"),
            }
        }
    }

    pub async fn stat(&mut self, group: &str, name: &str) -> Result<String> {
        self.stats(group)
            .await?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .with_context(|| format!("no stat {name} in `stats {group}`"))
    }
}
