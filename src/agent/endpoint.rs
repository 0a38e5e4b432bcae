//! The agent's endpoints on the pod's address: `GET /save` for memcached's preStop and
//! `GET /stats` for the operator's autoscaler, each only with the pod's token; beside the proxy,
//! `GET /metrics` (proxy_metrics.rs).

use std::convert::Infallible;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::sleep;
use tracing::{debug, warn};

use super::save::Saver;
// The header memcached's preStop sends (resources/warm_restart.rs).
use crate::resources::warm_restart::TOKEN_HEADER;

/// The longest `delay` honoured: the kubelet's grace period ends the pod well before anyway.
const MAX_DELAY: Duration = Duration::from_secs(600);
/// A client has this long to send its request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (the kubelet makes one per stop); more are closed at once.
const MAX_CONNECTIONS: usize = 32;

/// The shared secret of the save endpoint: anyone reaching the pod's IP could otherwise stop
/// memcached.
#[derive(Clone)]
pub struct SaveToken(String);

impl FromStr for SaveToken {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err("the save token is empty".to_string());
        }
        Ok(SaveToken(s.to_string()))
    }
}

// Kept out of logs (the agent's arguments are Debug).
impl std::fmt::Debug for SaveToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SaveToken(..)")
    }
}

impl SaveToken {
    /// Every byte is compared whatever the first difference, so the time taken tells nothing of
    /// how much of `given` was right.
    pub(super) fn matches(&self, given: &[u8]) -> bool {
        let want = self.0.as_bytes();
        want.len() == given.len()
            && std::hint::black_box(
                want.iter()
                    .zip(given)
                    .fold(0u8, |diff, (a, b)| diff | (a ^ b)),
            ) == 0
    }
}

/// The `delay` of a save's query, in whole seconds (none: 0), at most `MAX_DELAY`.
fn parse_delay(query: Option<&str>) -> Result<Duration, String> {
    let Some(value) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("delay="))
    else {
        return Ok(Duration::ZERO);
    };
    let seconds: u64 = value
        .parse()
        .map_err(|_| format!("delay must be whole seconds, not {value:?}"))?;
    Ok(Duration::from_secs(seconds).min(MAX_DELAY))
}

/// Serves `GET /save` and `GET /stats` on `listener`, each only with the pod's token.
pub(super) async fn serve_save(listener: TcpListener, token: SaveToken, saver: Arc<Saver>) {
    let token = Arc::new(token);
    serve(listener, move |req| {
        handle(req, token.clone(), saver.clone())
    })
    .await
}

/// Serves `handle`'s answers on `listener` (HTTP/1 only, as the runtime's admin endpoints), at
/// most `MAX_CONNECTIONS` connections at once.
pub(super) async fn serve<H, F>(listener: TcpListener, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // E.g. at the open-file limit: retried without spinning.
                warn!(%error, "accept");
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("connection limit reached; closing a new connection");
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            if let Err(error) = http.serve_connection(TokioIo::new(stream), service).await {
                debug!(%error, "connection ended");
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    token: Arc<SaveToken>,
    saver: Arc<Saver>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path != "/save" && path != "/stats" {
        return text(StatusCode::NOT_FOUND, "not found\n".to_string());
    }
    let authorised = req
        .headers()
        .get(TOKEN_HEADER)
        .is_some_and(|value| token.matches(value.as_bytes()));
    if !authorised {
        warn!(
            path = req.uri().path(),
            "a request without the right token: refused"
        );
        return text(StatusCode::FORBIDDEN, "forbidden\n".to_string());
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string());
    }
    if req.uri().path() == "/stats" {
        let (status, body) = saver.stats().await;
        return text(status, body);
    }
    let delay = match parse_delay(req.uri().query()) {
        Ok(delay) => delay,
        Err(message) => return text(StatusCode::BAD_REQUEST, message + "\n"),
    };
    let (status, body) = saver.save_after(delay).await;
    text(status, body)
}

pub(super) fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cret-token";

    #[test]
    fn the_delay_is_read_in_seconds_and_capped() {
        assert_eq!(parse_delay(None), Ok(Duration::ZERO));
        assert_eq!(parse_delay(Some("other=1")), Ok(Duration::ZERO));
        assert_eq!(parse_delay(Some("delay=5")), Ok(Duration::from_secs(5)));
        assert_eq!(parse_delay(Some("x=1&delay=7")), Ok(Duration::from_secs(7)));
        assert_eq!(parse_delay(Some("delay=100000")), Ok(MAX_DELAY));
        assert!(parse_delay(Some("delay=1.5")).is_err());
        assert!(parse_delay(Some("delay=-1")).is_err());
    }

    #[test]
    fn the_token_matches_itself_only() {
        let token: SaveToken = TOKEN.parse().unwrap();
        assert!(token.matches(TOKEN.as_bytes()));
        assert!(!token.matches(b"s3cret-tokeN"));
        assert!(!token.matches(b"s3cret"));
        assert!(!token.matches(b""));
        assert!("".parse::<SaveToken>().is_err());
        assert_eq!(format!("{token:?}"), "SaveToken(..)");
    }
}
