//! HTTP endpoints: /metrics on one address, /healthz and /readyz on another (controller-runtime's
//! layout), served by hyper until shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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

/// Binds `addr` now (so a busy port is reported at start-up) and serves until `shutdown`, over
/// TLS when `tls` is given.
pub async fn bind(
    addr: SocketAddr,
    endpoints: Endpoints,
    state: Arc<State>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let listener = TcpListener::bind(addr).await?;
    info!(address = %listener.local_addr()?, ?endpoints, "serving");
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                },
            };
            let state = state.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, endpoints, state.clone()));
                let http = http1::Builder::new();
                let _ = match tls {
                    Some(tls) => match tls.accept(stream).await {
                        Ok(stream) => http.serve_connection(TokioIo::new(stream), service).await,
                        Err(_) => return,
                    },
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                };
            });
        }
    }))
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
