//! Emptying a member (`flush_all`) before it rejoins the proxy's layout within a handover: it
//! holds what it held when it left, and a key set meanwhile on the layout without it would read
//! back at its old value from it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A member that takes longer is tried again at the next reconcile.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `flush_all` to memcached at `addr`; Ok once it answered `OK`.
pub async fn flush(addr: SocketAddr) -> io::Result<()> {
    let exchange = async {
        let mut conn = BufReader::new(TcpStream::connect(addr).await?);
        conn.get_mut().write_all(b"flush_all\r\n").await?;
        let mut reply = String::new();
        conn.read_line(&mut reply).await?;
        match reply.trim_end() {
            "OK" => Ok(()),
            other => Err(io::Error::other(format!("memcached answered {other:?}"))),
        }
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to flush_all in time"))?
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A memcached stand-in that answers one command with `reply`; what it was sent.
    async fn one_answer(reply: &'static [u8]) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 64];
            let n = conn.read(&mut request).await.unwrap();
            conn.write_all(reply).await.unwrap();
            request.truncate(n);
            request
        });
        (addr, served)
    }

    #[tokio::test]
    async fn a_member_is_emptied_by_flush_all_and_an_error_is_one() {
        let (addr, served) = one_answer(b"OK\r\n").await;
        flush(addr).await.unwrap();
        assert_eq!(served.await.unwrap(), b"flush_all\r\n");
        let (addr, _) = one_answer(b"ERROR\r\n").await;
        assert!(flush(addr).await.is_err());
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        assert!(flush(addr).await.is_err(), "nothing listening");
    }
}
