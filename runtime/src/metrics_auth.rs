//! Who may read /metrics when it is served securely (`--metrics-secure`), as kubebuilder v4's
//! filter does: the caller's bearer token must pass a TokenReview, and its user a
//! SubjectAccessReview for `get` on the non-resource URL `/metrics` (the `metrics-reader` role).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer, pki_types::pem::PemObject};
use tracing::warn;

/// Decisions are reused this long, so a scrape every few seconds costs the API server two
/// requests a minute, not two a scrape.
const CACHE_TTL: Duration = Duration::from_secs(60);
/// Decisions on authenticated tokens kept at once (Prometheus and a few others).
const DECIDED_MAX: usize = 256;
/// Rejected tokens remembered at once, so a caller repeating a bad token costs one review.
const REJECTED_MAX: usize = 4096;
/// Reviews of tokens not in the cache: at most this many a second after a burst of
/// `REVIEW_BURST`, so callers with ever-new tokens cannot make each request a TokenReview and a
/// SubjectAccessReview. Past it, unknown tokens get 401 without a review.
const REVIEWS_PER_SECOND: f64 = 5.0;
const REVIEW_BURST: f64 = 20.0;
/// While reviews are rate-limited, a decision past its TTL still counts up to this age, so
/// Prometheus keeps scraping through a flood of bad tokens.
const STALE_MAX: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// No token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A valid token whose user may not get /metrics: 403.
    Forbidden,
}

pub struct MetricsAuth {
    client: Client,
    memory: Mutex<Memory>,
}

/// What the last reviews decided, and the budget for new ones.
struct Memory {
    /// Authenticated tokens: allowed or forbidden, and when decided. Attackers' tokens never
    /// land here, so they cannot push Prometheus's decision out.
    decided: HashMap<String, (Decision, Instant)>,
    /// Tokens the API server did not accept, and when.
    rejected: HashMap<String, Instant>,
    /// Reviews that may start now (a token bucket), as of `refilled`.
    budget: f64,
    refilled: Instant,
    /// When a rate-limited review was last logged.
    limited_warning: Option<Instant>,
}

impl Memory {
    fn new(now: Instant) -> Self {
        Self {
            decided: HashMap::new(),
            rejected: HashMap::new(),
            budget: REVIEW_BURST,
            refilled: now,
            limited_warning: None,
        }
    }

    /// The cached decision on `token`, if fresh.
    fn cached(&self, token: &str, now: Instant) -> Option<Decision> {
        if let Some(&(decision, at)) = self.decided.get(token)
            && now - at < CACHE_TTL
        {
            return Some(decision);
        }
        self.rejected
            .get(token)
            .is_some_and(|&at| now - at < CACHE_TTL)
            .then_some(Decision::Unauthenticated)
    }

    /// Whether a review may start now; takes one from the budget if so.
    fn take_review(&mut self, now: Instant) -> bool {
        let refill = (now - self.refilled).as_secs_f64() * REVIEWS_PER_SECOND;
        self.budget = (self.budget + refill).min(REVIEW_BURST);
        self.refilled = now;
        if self.budget < 1.0 {
            return false;
        }
        self.budget -= 1.0;
        true
    }

    fn remember(&mut self, token: &str, decision: Decision, now: Instant) {
        if decision == Decision::Unauthenticated {
            if self.rejected.len() >= REJECTED_MAX {
                self.rejected.clear();
            }
            self.rejected.insert(token.to_string(), now);
            return;
        }
        if self.decided.len() >= DECIDED_MAX {
            self.decided.retain(|_, (_, at)| now - *at < CACHE_TTL);
            if self.decided.len() >= DECIDED_MAX {
                self.decided.clear();
            }
        }
        self.decided.insert(token.to_string(), (decision, now));
    }
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            memory: Mutex::new(Memory::new(Instant::now())),
        }
    }

    /// Decides on the value of the Authorization header.
    pub async fn check(&self, authorization: Option<&str>) -> Decision {
        let Some(token) = authorization.and_then(bearer_token) else {
            return Decision::Unauthenticated;
        };
        let now = Instant::now();
        {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(decision) = memory.cached(token, now) {
                return decision;
            }
            if !memory.take_review(now) {
                let stale = memory
                    .decided
                    .get(token)
                    .filter(|(_, at)| now - *at < STALE_MAX)
                    .map(|(decision, _)| *decision);
                if memory
                    .limited_warning
                    .is_none_or(|at| now - at >= CACHE_TTL)
                {
                    memory.limited_warning = Some(now);
                    warn!(
                        "more unknown /metrics tokens than reviews allowed; answering 401 unreviewed"
                    );
                }
                return stale.unwrap_or(Decision::Unauthenticated);
            }
        }
        let decision = match self.review(token).await {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "cannot review a /metrics caller");
                // Not cached: an API hiccup must not lock Prometheus out for a minute.
                return Decision::Forbidden;
            }
        };
        self.memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(token, decision, Instant::now());
        decision
    }

    async fn review(&self, token: &str) -> Result<Decision, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = reviewed.status.unwrap_or_default();
        let (true, Some(user)) = (status.authenticated == Some(true), status.user) else {
            return Ok(Decision::Unauthenticated);
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await?;
        Ok(if answered.status.is_some_and(|s| s.allowed) {
            Decision::Allowed
        } else {
            Decision::Forbidden
        })
    }
}

fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// TLS for the metrics endpoint: `tls.crt`/`tls.key` from `cert_dir` (e.g. a cert-manager
/// Secret), else a self-signed certificate made at start-up, as kubebuilder does.
pub fn tls_config(cert_dir: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, String> {
    let (certs, key) = match cert_dir {
        Some(dir) => {
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(dir.join("tls.crt"))
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", dir.join("tls.crt").display()))?;
            let key = PrivateKeyDer::from_pem_file(dir.join("tls.key"))
                .map_err(|e| format!("{}: {e}", dir.join("tls.key").display()))?;
            (certs, key)
        }
        None => {
            // Scrapers verify nothing here (self-signed); the names only make the cert well-formed.
            let mut names = vec!["localhost".to_string()];
            names.extend(crate::host_name());
            let generated = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
                .map_err(|e| e.to_string())?;
            (vec![generated.cert.der().clone()], key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    /// An API server that accepts only the token "prometheus" (whose user may get /metrics),
    /// counting the TokenReviews it answers.
    fn api_server() -> (Client, Arc<AtomicUsize>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let path = request.uri().path().to_string();
                let body = request.into_body().collect_bytes().await.unwrap();
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let answer = if path.ends_with("/tokenreviews") {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let good = body["spec"]["token"] == "prometheus";
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                           "spec": body["spec"],
                           "status": {"authenticated": good, "user": {"username": "prometheus"}}})
                } else {
                    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                           "spec": body["spec"], "status": {"allowed": true}})
                };
                send.send_response(
                    Response::builder()
                        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), reviews)
    }

    fn bearer(token: &str) -> String {
        format!("Bearer {token}")
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_new_tokens_costs_a_bounded_number_of_reviews() {
        let (client, reviews) = api_server();
        let auth = MetricsAuth::new(client);
        assert_eq!(
            auth.check(Some(&bearer("prometheus"))).await,
            Decision::Allowed
        );
        for i in 0..400 {
            let token = bearer(&format!("random-{i}"));
            assert_eq!(auth.check(Some(&token)).await, Decision::Unauthenticated);
        }
        let spent = reviews.load(Ordering::SeqCst);
        assert!(spent <= 1 + REVIEW_BURST as usize, "{spent} TokenReviews");
        // Past its TTL, Prometheus's decision still holds while the budget is spent.
        tokio::time::advance(CACHE_TTL).await;
        for i in 0..REVIEW_BURST as usize + 10 {
            auth.check(Some(&bearer(&format!("again-{i}")))).await;
        }
        assert_eq!(
            auth.check(Some(&bearer("prometheus"))).await,
            Decision::Allowed
        );
        // And a bad token repeated is reviewed once.
        tokio::time::advance(Duration::from_secs(10)).await;
        let before = reviews.load(Ordering::SeqCst);
        for _ in 0..20 {
            auth.check(Some(&bearer("repeated"))).await;
        }
        assert_eq!(reviews.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn only_bearer_tokens_count() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn self_signed_certificate_is_made_when_none_is_given() {
        assert!(tls_config(None).is_ok());
        let err = tls_config(Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(err.contains("/nonexistent/tls.crt"), "{err}");
    }
}
