//! Free ports and a minimal HTTP/1.1 GET, for the operator's plain-HTTP endpoints.

use std::net::TcpListener;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// GET `path` from 127.0.0.1:`port`: the status code and body, or None if nothing answered.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
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
