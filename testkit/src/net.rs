//! Free ports and a minimal HTTP/1.1 GET, for the operator's plain-HTTP endpoints.

use std::net::TcpListener;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range: a
/// port the kernel handed out (bind to port 0) goes back to that range once released, where any
/// outgoing connection of the busy suite can take it before the process meant to listen on it.
pub fn free_port() -> u16 {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let below = ephemeral_from.saturating_sub(FIRST_PORT);
    for _ in 0..1000 {
        if below == 0 {
            break;
        }
        // RandomState's keys are random per instance: a random number without a dependency.
        let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), ());
        let port = FIRST_PORT + (random % u64::from(below)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// Ports chosen start above the well-known and the commonly configured ones.
const FIRST_PORT: u16 = 20000;

/// GET `path` from 127.0.0.1:`port`: the status code and body, or None if nothing answered.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_from(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// GET `path` from `addr` (a pod's, say): the status code and body, or None if nothing answered.
pub async fn http_get_from(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The value of one series in a Prometheus text exposition, by its exact name and labels as
/// rendered (`name{label="v"}`).
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        l.strip_prefix(series)
            .filter(|rest| rest.starts_with(' '))
            .and_then(|rest| rest.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_found_by_its_exact_labels() {
        let text = "# HELP x\nx_total{a=\"1\"} 3\nx_total{a=\"10\"} 7\nx_total 2\n";
        assert_eq!(metric_value(text, "x_total{a=\"1\"}"), Some(3.0));
        assert_eq!(metric_value(text, "x_total{a=\"10\"}"), Some(7.0));
        assert_eq!(metric_value(text, "x_total"), Some(2.0));
        assert_eq!(metric_value(text, "y_total"), None);
    }
}
