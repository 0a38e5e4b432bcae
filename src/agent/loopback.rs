//! The agent's connections to memcached's plain listener on the pod's loopback: `refresh_certs`,
//! `stats` for the operator's autoscaler and the proxy's metrics, and the login proxy through
//! which the exporter reads `stats`.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::passwords::Credentials;

/// memcached's `refresh_certs`, over its plain loopback listener (logged in when needed).
pub(super) async fn refresh_certs(
    memcached: std::net::SocketAddr,
    logins: &[Credentials],
) -> io::Result<()> {
    let mut conn = connect(memcached, logins).await?;
    expect(&mut conn, "refresh_certs\r\n", "OK").await
}

/// memcached's `stats` answer, up to and with its `END` line.
pub(super) async fn stats(
    memcached: std::net::SocketAddr,
    logins: &[Credentials],
) -> io::Result<String> {
    let mut conn = connect(memcached, logins).await?;
    stats_of(&mut conn, "stats").await
}

/// The answers to each of `commands` (`stats`, `stats proxy`, ...), over one connection, within
/// `STATS_TIMEOUT`.
pub(super) async fn stats_answers<const N: usize>(
    memcached: std::net::SocketAddr,
    commands: [&str; N],
) -> io::Result<[String; N]> {
    let exchange = async {
        let mut conn = connect(memcached, &[]).await?;
        let mut answers = [const { String::new() }; N];
        for (command, answer) in commands.iter().zip(&mut answers) {
            *answer = stats_of(&mut conn, command).await?;
        }
        Ok(answers)
    };
    tokio::time::timeout(STATS_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to stats in time"))?
}

/// How long memcached on the pod's loopback has to answer `stats_answers`.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `command` and reads its answer up to and with the `END` line.
async fn stats_of(conn: &mut BufReader<TcpStream>, command: &str) -> io::Result<String> {
    conn.get_mut()
        .write_all(format!("{command}\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    while !answer.ends_with("END\r\n") {
        if conn.read_line(&mut answer).await? == 0 || answer.len() > 256 * 1024 {
            return Err(io::Error::other(format!("{command} did not end with END")));
        }
    }
    Ok(answer)
}

/// A connection to memcached's loopback listener, logged in with the first of `logins` it takes
/// (none: without auth).
async fn connect(
    memcached: std::net::SocketAddr,
    logins: &[Credentials],
) -> io::Result<BufReader<TcpStream>> {
    let mut refused = None;
    for credentials in logins {
        let mut conn = BufReader::new(TcpStream::connect(memcached).await?);
        match expect(&mut conn, &credentials.login_command(), "STORED").await {
            Ok(()) => return Ok(conn),
            Err(error) => refused = Some(error),
        }
    }
    match refused {
        Some(error) => Err(error),
        None => Ok(BufReader::new(TcpStream::connect(memcached).await?)),
    }
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

/// Each connection to `listener` is logged in to memcached with the current password, then
/// relayed byte for byte.
pub(super) async fn proxy(
    listener: TcpListener,
    memcached: std::net::SocketAddr,
    login: watch::Receiver<Vec<Credentials>>,
) {
    loop {
        let (client, _) = next_connection(&listener).await;
        let logins = login.borrow().clone();
        tokio::spawn(async move {
            if let Err(error) = relay(client, memcached, &logins).await {
                debug!(%error, "relay ended");
            }
        });
    }
}

/// The next connection to `listener`; a failed accept (out of file descriptors, say) is logged
/// and tried again shortly.
pub(super) async fn next_connection(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(error) => {
                warn!(%error, "accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn relay(
    mut client: TcpStream,
    memcached: std::net::SocketAddr,
    logins: &[Credentials],
) -> io::Result<()> {
    let mut upstream = connect(memcached, logins).await?;
    // Nothing else is buffered: memcached sent only the reply.
    tokio::io::copy_bidirectional(&mut client, upstream.get_mut()).await?;
    Ok(())
}
