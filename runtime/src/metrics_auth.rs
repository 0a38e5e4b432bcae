//! Who may read /metrics when it is served securely (`--metrics-secure`), as kubebuilder v4's
//! filter does: the caller's bearer token must pass a TokenReview, and its user a
//! SubjectAccessReview for `get` on the non-resource URL `/metrics` (the `metrics-reader` role).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer, pki_types::pem::PemObject};
use tracing::warn;

/// Decisions are reused this long, so a scrape every few seconds costs the API server two
/// requests a minute, not two a scrape.
const CACHE_TTL: Duration = Duration::from_secs(60);
const CACHE_MAX: usize = 256;

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
    cache: Mutex<HashMap<String, (Decision, Instant)>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Decides on the value of the Authorization header.
    pub async fn check(&self, authorization: Option<&str>) -> Decision {
        let Some(token) = authorization.and_then(bearer_token) else {
            return Decision::Unauthenticated;
        };
        if let Some(&(decision, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            && at.elapsed() < CACHE_TTL
        {
            return decision;
        }
        let decision = match self.review(token).await {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "cannot review a /metrics caller");
                // Not cached: an API hiccup must not lock Prometheus out for a minute.
                return Decision::Forbidden;
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(token.to_string(), (decision, Instant::now()));
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
    use super::*;

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
