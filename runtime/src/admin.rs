//! HTTP endpoints: /metrics on one address, /healthz and /readyz on another (controller-runtime's
//! layout), served by hyper until shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::render;
use crate::metrics_auth::{Decision, MetricsAuth};
use crate::readiness::Readiness;

/// What the endpoints read from.
pub struct State {
    pub metrics: prometheus::Registry,
    pub readiness: Arc<Readiness>,
    pub client: Client,
    /// Set with --metrics-secure: who may read /metrics.
    pub metrics_auth: Option<MetricsAuth>,
}

#[derive(Clone, Copy, Debug)]
pub enum Endpoints {
    Metrics,
    Health,
}

/// What one client may take of an endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// How long a client has to send a request's headers, on a new connection and between the
    /// requests of a kept-alive one: a slow or silent client is dropped after this.
    pub header_read_timeout: Duration,
    /// How long a client has to complete a TLS handshake.
    pub handshake_timeout: Duration,
    /// Connections served at once; past this a new one is closed at once. Each costs a task and
    /// a socket (about 16 KiB), so this bounds what a flood of connections can take.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 512,
        }
    }
}

/// Back-off after a failed `accept` (e.g. at the open-file limit): from the first to the last,
/// doubling, so a persistent failure costs no CPU.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));
/// A failing accept is logged at most this often.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(1);

/// Binds `addr` now (so a busy port is reported at start-up) and serves until `shutdown`, over
/// TLS when `tls` is given. HTTP/1 only: HTTP/2 stays off, as in controller-runtime, for its
/// rapid-reset attack (CVE-2023-44487).
pub async fn bind(
    addr: SocketAddr,
    endpoints: Endpoints,
    state: Arc<State>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let listener = TcpListener::bind(addr).await?;
    info!(address = %listener.local_addr()?, ?endpoints, "serving");
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    Ok(tokio::spawn(async move {
        let mut failures = AcceptFailures::default();
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => { failures.reset(); a }
                    Err(error) => {
                        let (delay, warn_now) = failures.next(tokio::time::Instant::now());
                        if warn_now {
                            warn!(%error, failures = failures.count, retry_in = ?delay, "accept failed");
                        }
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                },
            };
            // Over the cap: closed now rather than left in the backlog, where it would hold up
            // the connections behind it (a probe among them).
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!(
                    ?endpoints,
                    "connection limit reached; closing a new connection"
                );
                continue;
            };
            let state = state.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = service_fn(move |req| handle(req, endpoints, state.clone()));
                let mut http = http1::Builder::new();
                http.timer(TokioTimer::new())
                    .header_read_timeout(limits.header_read_timeout);
                let _ = match tls {
                    Some(tls) => {
                        match tokio::time::timeout(limits.handshake_timeout, tls.accept(stream))
                            .await
                        {
                            Ok(Ok(stream)) => {
                                http.serve_connection(TokioIo::new(stream), service).await
                            }
                            _ => return,
                        }
                    }
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                };
            });
        }
    }))
}

/// Consecutive failed accepts: how long to wait before the next, and when to say so.
#[derive(Default)]
struct AcceptFailures {
    count: u64,
    delay: Option<Duration>,
    last_warning: Option<tokio::time::Instant>,
}

impl AcceptFailures {
    /// After one more failure: how long to wait, and whether to log it.
    fn next(&mut self, now: tokio::time::Instant) -> (Duration, bool) {
        self.count += 1;
        let delay = self
            .delay
            .map_or(ACCEPT_BACKOFF.0, |d| (d * 2).min(ACCEPT_BACKOFF.1));
        self.delay = Some(delay);
        let warn_now = self
            .last_warning
            .is_none_or(|at| now - at >= ACCEPT_WARNING_EVERY);
        if warn_now {
            self.last_warning = Some(now);
        }
        (delay, warn_now)
    }

    /// After an accept that worked. The warning's rate is kept: at the open-file limit, accepts
    /// that fail and accepts that work (as connections close) alternate.
    fn reset(&mut self) {
        self.count = 0;
        self.delay = None;
    }
}

async fn handle(
    req: Request<Incoming>,
    endpoints: Endpoints,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into()));
    }
    let response = match (endpoints, req.uri().path()) {
        (Endpoints::Metrics, "/metrics") => {
            if let Some(auth) = &state.metrics_auth {
                let header = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                match auth.check(header).await {
                    Decision::Allowed => {}
                    Decision::Unauthenticated => {
                        return Ok(text(StatusCode::UNAUTHORIZED, "Unauthorized\n".into()));
                    }
                    Decision::Forbidden => {
                        return Ok(text(StatusCode::FORBIDDEN, "Forbidden\n".into()));
                    }
                }
            }
            let mut r = text(StatusCode::OK, render(&state.metrics));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        (Endpoints::Health, "/healthz") => text(StatusCode::OK, "ok\n".into()),
        (Endpoints::Health, "/readyz") => match state.readiness.check(&state.client).await {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason:?}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    };
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// The health endpoint on a free port of 127.0.0.1, with `limits`.
    async fn health_endpoint(limits: Limits) -> (SocketAddr, CancellationToken) {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let (service, _api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let state = Arc::new(State {
            metrics: prometheus::Registry::new(),
            readiness: Arc::new(Readiness::default()),
            client: Client::new(service, "default"),
            metrics_auth: None,
        });
        let stop = CancellationToken::new();
        bind(addr, Endpoints::Health, state, None, limits, stop.clone())
            .await
            .unwrap();
        (addr, stop)
    }

    /// What the server answers `request` with, until it closes the connection or 2 s pass.
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// `n` connections that each send the start of a request and stop there.
    async fn stalled(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        let mut streams = Vec::with_capacity(n);
        for _ in 0..n {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            streams.push(stream);
        }
        streams
    }

    const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    #[tokio::test]
    async fn healthz_answers_at_once_while_hundreds_of_clients_stall() {
        let (addr, _stop) = health_endpoint(Limits::default()).await;
        let _stalled = stalled(addr, 300).await;
        let started = std::time::Instant::now();
        let answer = exchange(addr, HEALTHZ).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_client_that_does_not_finish_its_headers_is_dropped() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let (addr, _stop) = health_endpoint(limits).await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(2), slow.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "still open after 2 s");
        // A kept-alive connection that sends nothing more is dropped too.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(2), idle.read_to_end(&mut answer)).await;
        assert!(closed.is_ok(), "an idle kept-alive connection stays open");
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_and_the_rest_still_served() {
        let limits = Limits {
            max_connections: 20,
            ..Limits::default()
        };
        let (addr, _stop) = health_endpoint(limits).await;
        let mut held = stalled(addr, 20).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(exchange(addr, HEALTHZ).await, "", "closed unanswered");
        held.truncate(10);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(exchange(addr, HEALTHZ).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn http2_is_not_spoken() {
        let (addr, _stop) = health_endpoint(Limits::default()).await;
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
        let answer = exchange(addr, preface).await;
        // An HTTP/2 server answers the preface with a SETTINGS frame (type 4 in the fourth byte).
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 "),
            "{answer:?}"
        );
    }

    #[test]
    fn a_failing_accept_backs_off_to_a_second_and_warns_once_a_second() {
        let mut failures = AcceptFailures::default();
        let start = tokio::time::Instant::now();
        let (mut at, mut warnings, mut delays) = (start, 0, Vec::new());
        for _ in 0..40 {
            let (delay, warn_now) = failures.next(at);
            warnings += usize::from(warn_now);
            delays.push(delay);
            at += delay;
        }
        assert_eq!(delays[0], Duration::from_millis(10));
        assert_eq!(delays[1], Duration::from_millis(20));
        assert_eq!(*delays.last().unwrap(), Duration::from_secs(1));
        let seconds = (at - start).as_secs_f64();
        assert!(
            (warnings as f64) <= seconds + 1.0,
            "{warnings} warnings in {seconds:.1} s"
        );
        assert!(failures.next(at).1, "a second after the last warning");
        failures.reset();
        let (delay, warn_now) = failures.next(at + Duration::from_millis(10));
        assert_eq!(delay, Duration::from_millis(10), "the back-off starts over");
        assert!(
            !warn_now,
            "a failure right after a success is not warned again at once"
        );
    }
}
