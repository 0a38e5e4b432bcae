//! memcached's `stats`, read from a member over its ASCII protocol, or through the agent beside
//! it where memcached wants a login or speaks only TLS.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::decide::MemberStats;

/// A member that takes longer is counted as not answering this round.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// `stats` answers in about 4 KiB; more is not memcached.
const MAX_ANSWER: usize = 64 * 1024;

/// One member's `stats`, within `TIMEOUT`.
pub async fn read(addr: SocketAddr) -> io::Result<MemberStats> {
    tokio::time::timeout(TIMEOUT, exchange(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to stats in time"))?
}

/// One member's `stats` through its agent's `GET /stats`, within `TIMEOUT`.
pub async fn read_through_agent(
    addr: SocketAddr,
    header: &str,
    token: &str,
) -> io::Result<MemberStats> {
    tokio::time::timeout(TIMEOUT, ask_agent(addr, header, token))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer to stats in time"))?
}

async fn ask_agent(addr: SocketAddr, header: &str, token: &str) -> io::Result<MemberStats> {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let request = hyper::Request::get("/stats")
        .header(hyper::header::HOST, addr.to_string())
        .header(header, token)
        .body(Empty::<Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    if !status.is_success() {
        return Err(io::Error::other(format!(
            "the agent answered {status}: {}",
            body.trim()
        )));
    }
    parse(&body)
}

async fn exchange(addr: SocketAddr) -> io::Result<MemberStats> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(b"stats\r\n").await?;
    let mut answer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while !answer.ends_with(b"END\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || answer.len() + n > MAX_ANSWER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "stats did not end with END",
            ));
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    parse(&String::from_utf8_lossy(&answer))
}

/// The counters the autoscaler reads from a `stats` answer; one memcached does not have (an
/// older version) reads as 0. An error answer (authentication required) is an error.
pub fn parse(answer: &str) -> io::Result<MemberStats> {
    let mut stats = MemberStats::default();
    let mut seen = false;
    for line in answer.lines() {
        let mut words = line.split_ascii_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("STAT"), Some(name), Some(value)) => {
                let field = match name {
                    "uptime" => &mut stats.uptime,
                    "evictions" => &mut stats.evictions,
                    "bytes" => &mut stats.bytes,
                    "limit_maxbytes" => &mut stats.limit_maxbytes,
                    "curr_connections" => &mut stats.curr_connections,
                    "max_connections" => &mut stats.max_connections,
                    "get_hits" => &mut stats.get_hits,
                    "get_misses" => &mut stats.get_misses,
                    "store_too_large" => &mut stats.store_too_large,
                    _ => continue,
                };
                *field = value.parse().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("stats {name}: {value:?} is not a number"),
                    )
                })?;
                seen = true;
            }
            (Some("END"), None, None) => break,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unexpected answer to stats: {line:?}"),
                ));
            }
        }
    }
    if !seen {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "stats said nothing",
        ));
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    const ANSWER: &str = "STAT pid 1\r\nSTAT uptime 120\r\nSTAT version 1.6.18\r\n\
        STAT curr_connections 12\r\nSTAT max_connections 1024\r\nSTAT get_hits 90\r\n\
        STAT get_misses 10\r\nSTAT bytes 1048576\r\nSTAT limit_maxbytes 67108864\r\n\
        STAT evictions 7\r\nSTAT store_too_large 2\r\nEND\r\n";

    #[test]
    fn the_counters_are_read_and_the_rest_skipped() {
        assert_eq!(
            parse(ANSWER).unwrap(),
            MemberStats {
                uptime: 120,
                evictions: 7,
                bytes: 1_048_576,
                limit_maxbytes: 67_108_864,
                curr_connections: 12,
                max_connections: 1024,
                get_hits: 90,
                get_misses: 10,
                store_too_large: 2,
            }
        );
    }

    #[test]
    fn an_error_answer_is_an_error() {
        let error = parse("CLIENT_ERROR unauthenticated\r\n").unwrap_err();
        assert!(error.to_string().contains("unauthenticated"), "{error}");
        assert!(parse("END\r\n").is_err(), "nothing said");
    }

    /// A member that sends its answer in pieces.
    #[tokio::test]
    async fn a_member_is_read_over_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 7];
            stream.read_exact(&mut request).await.unwrap();
            assert_eq!(&request, b"stats\r\n");
            for piece in ANSWER.as_bytes().chunks(50) {
                stream.write_all(piece).await.unwrap();
                stream.flush().await.unwrap();
            }
        });
        assert_eq!(read(addr).await.unwrap().evictions, 7);
    }

    /// An agent's endpoint: the stats for the token, 403 otherwise.
    #[tokio::test]
    async fn a_member_is_read_through_its_agent_with_the_token() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap();
                let request = String::from_utf8_lossy(&request[..n]).to_lowercase();
                let (status, body) = if request.starts_with("get /stats ")
                    && request.contains("x-save-token: uid-1\r\n")
                {
                    ("200 OK", ANSWER)
                } else {
                    ("403 Forbidden", "forbidden\n")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(response.as_bytes()).await.unwrap();
            }
        });
        let stats = read_through_agent(addr, "X-Save-Token", "uid-1")
            .await
            .unwrap();
        assert_eq!(stats.evictions, 7);
        let refused = read_through_agent(addr, "X-Save-Token", "other")
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("403"), "{refused}");
    }

    #[tokio::test]
    async fn a_member_that_does_not_answer_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Connected (the listener's backlog), never answered.
        let error = read(addr).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(listener);
    }
}
