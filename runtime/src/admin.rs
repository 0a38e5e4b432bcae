//! HTTP endpoints: /metrics on one address, /healthz and /readyz on another (controller-runtime's
//! layout), served by hyper until shutdown.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::Client;
use tokio::net::TcpListener;
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
    /// Connections served at once, and at most a quarter of the process's open-file limit (read
    /// at each accept, so a limit lowered meanwhile counts), which leaves half of it to the
    /// operator's own files with both endpoints full. Past the cap a new connection takes the
    /// place of the oldest one that is not in the middle of a request: a kubelet probe sends its
    /// request at once, so it gets through a flood of clients that never finish theirs.
    pub max_connections: usize,
}

impl Limits {
    /// The cap now, under an open-file limit of `open_files` (its soft value, if any).
    fn cap(&self, open_files: Option<u64>) -> usize {
        let share = open_files.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
        self.max_connections.min(share).max(1)
    }
}

/// The process's soft open-file limit, if it has one.
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
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
    let connections = Arc::new(Mutex::new(Connections::default()));
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
            // Every connection mid-request: closed now rather than left in the backlog, where
            // it would hold up the connections behind it (a probe among them).
            let cap = limits.cap(open_file_limit());
            let Some(slot) = Connections::admit(&connections, cap) else {
                debug!(
                    ?endpoints,
                    cap, "every connection is mid-request; closing a new one"
                );
                continue;
            };
            let state = state.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let busy = slot.busy.clone();
                let service = service_fn(move |req| {
                    let busy = Busy::mark(&busy);
                    let state = state.clone();
                    async move {
                        let _busy = busy;
                        handle(req, endpoints, state).await
                    }
                });
                let mut http = http1::Builder::new();
                http.timer(TokioTimer::new())
                    .header_read_timeout(limits.header_read_timeout);
                let served = async {
                    let _ = match tls {
                        Some(tls) => {
                            let handshake = tls.accept(stream);
                            match tokio::time::timeout(limits.handshake_timeout, handshake).await {
                                Ok(Ok(stream)) => {
                                    http.serve_connection(TokioIo::new(stream), service).await
                                }
                                _ => return,
                            }
                        }
                        None => http.serve_connection(TokioIo::new(stream), service).await,
                    };
                };
                tokio::select! {
                    () = served => {}
                    () = slot.dropped.cancelled() => {}
                }
            });
        }
    }))
}

/// The connections of one endpoint, oldest first.
#[derive(Default)]
struct Connections {
    next: u64,
    open: BTreeMap<u64, (Arc<AtomicBool>, CancellationToken)>,
}

/// One admitted connection: leaves the set when its task ends.
struct Slot {
    id: u64,
    set: Arc<Mutex<Connections>>,
    /// In the middle of a request (its handler running).
    busy: Arc<AtomicBool>,
    /// Cancelled when a new connection takes its place.
    dropped: CancellationToken,
}

impl Connections {
    /// A slot for a new connection under `cap`, the oldest connection not mid-request dropped to
    /// make room; none if every one is mid-request.
    fn admit(set: &Arc<Mutex<Connections>>, cap: usize) -> Option<Slot> {
        let mut this = set.lock().unwrap_or_else(|e| e.into_inner());
        while this.open.len() >= cap {
            let idle = this
                .open
                .iter()
                .find(|(_, (busy, _))| !busy.load(Ordering::Acquire))
                .map(|(id, _)| *id)?;
            if let Some((_, dropped)) = this.open.remove(&idle) {
                dropped.cancel();
            }
        }
        let (id, busy, dropped) = (this.next, Arc::default(), CancellationToken::new());
        this.next += 1;
        this.open.insert(id, (Arc::clone(&busy), dropped.clone()));
        Some(Slot {
            id,
            set: Arc::clone(set),
            busy,
            dropped,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        set.open.remove(&self.id);
    }
}

/// Marks a connection mid-request while a handler runs.
struct Busy(Arc<AtomicBool>);

impl Busy {
    fn mark(flag: &Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::Release);
        Self(Arc::clone(flag))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
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
        let (service, api) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        // An API server that never answers: /readyz waits in its handler until its timeout.
        Box::leak(Box::new(api));
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
        sent(addr, n, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await
    }

    /// `n` connections that have each sent `bytes`, kept open.
    async fn sent(addr: SocketAddr, n: usize, bytes: &[u8]) -> Vec<TcpStream> {
        let mut streams = Vec::with_capacity(n);
        for _ in 0..n {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(bytes).await.unwrap();
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

    /// Whether the server has closed `stream` (it reads the end of the stream, or an error).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut byte)).await;
        matches!(read, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test]
    async fn past_the_cap_the_oldest_stalled_connection_makes_way_for_a_probe() {
        let limits = Limits {
            max_connections: 20,
            ..Limits::default()
        };
        let (addr, _stop) = health_endpoint(limits).await;
        let mut held = stalled(addr, 20).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(exchange(addr, HEALTHZ).await.starts_with("HTTP/1.1 200"));
        assert!(
            closed(&mut held[0]).await,
            "the oldest stalled one is dropped"
        );
        assert!(!closed(&mut held[19]).await, "the newest stays");
        // The probe's place, once it has gone, is a stalled one's again: the next probe drops
        // the second oldest.
        held.extend(stalled(addr, 1).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(exchange(addr, HEALTHZ).await.starts_with("HTTP/1.1 200"));
        assert!(closed(&mut held[1]).await);
        assert!(!closed(&mut held[20]).await);
    }

    #[tokio::test]
    async fn past_the_cap_with_every_connection_mid_request_a_new_one_is_closed() {
        let limits = Limits {
            max_connections: 5,
            ..Limits::default()
        };
        // /readyz asks an API server that never answers: each request stays in its handler (2 s).
        let (addr, _stop) = health_endpoint(limits).await;
        let mut waiting = sent(addr, 5, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        assert_eq!(exchange(addr, HEALTHZ).await, "", "closed unanswered");
        assert!(started.elapsed() < Duration::from_secs(1), "at once");
        for stream in &mut waiting {
            assert!(
                !closed(stream).await,
                "a request in flight is never dropped"
            );
        }
    }

    #[test]
    fn the_cap_is_a_quarter_of_the_open_file_limit_at_most() {
        let limits = Limits::default();
        assert_eq!(limits.cap(None), 512);
        assert_eq!(limits.cap(Some(1 << 20)), 512);
        assert_eq!(limits.cap(Some(512)), 128);
        assert_eq!(limits.cap(Some(2)), 1);
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
