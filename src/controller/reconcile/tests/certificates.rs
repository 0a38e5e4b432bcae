//! `spec.tls.issuerRef`: a Certificate where cert-manager's API is served, and where it is not,
//! nothing applied rather than pods waiting for a certificate nobody will issue.

use serde_json::json;

use super::*;

const CERTIFICATE: &str = "/apis/cert-manager.io/v1/namespaces/default/certificates/cache";

/// A converged Memcached whose spec now asks cert-manager's Issuer `ca` for its certificate.
fn turning_issued_tls_on(ctx: &Context, caches: &mut apiserver::Caches) -> Memcached {
    let mut mc = memcached("cache", 1);
    converged(ctx, &mut mc, caches);
    mc.spec.tls =
        serde_json::from_value(json!({"enabled": true, "issuerRef": {"name": "ca"}})).unwrap();
    mc.metadata.generation = Some(2);
    // The members' update to the template that mounts it is members.rs's.
    members_run(ctx, &mc);
    mc
}

#[tokio::test]
async fn an_issuer_where_cert_manager_is_served_gets_a_certificate_applied() {
    let (ctx, api, mut caches) = apiserver::context();
    let mc = turning_issued_tls_on(&ctx, &mut caches);
    let answered = mc.clone();
    let outcome = scenario(mc, ctx, api, |mut api| async move {
        // The issued Secret is read (not there yet: the pods wait for it), then the
        // Certificate is applied and the status says what the members wait for.
        api.expect("GET", "/api/v1/namespaces/default/secrets/cache-tls", http::StatusCode::NOT_FOUND, |_| {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
        })
        .await;
        let seen = api.echo_any_order(3, &answered).await;
        let paths: Vec<_> = seen.iter().map(|r| (r.method.as_str(), r.path())).collect();
        let certificate = seen
            .iter()
            .find(|r| r.path() == CERTIFICATE)
            .expect("the Certificate applied");
        assert_eq!(certificate.method, "PATCH");
        assert_eq!(certificate.body["spec"]["secretName"], "cache-tls");
        assert_eq!(certificate.body["spec"]["issuerRef"]["name"], "ca");
        assert!(seen.iter().any(|r| r.path() == STATUS), "{paths:?}");
        api
    })
    .await;
    assert_eq!(outcome.unwrap(), Outcome::Converged);
}

#[tokio::test]
async fn an_issuer_where_cert_manager_is_not_served_applies_nothing_and_says_so() {
    let (ctx, api, mut caches) = apiserver::context();
    let mut ctx = Arc::into_inner(ctx).expect("not shared yet");
    ctx.cached.certificates = None;
    let mc = turning_issued_tls_on(&ctx, &mut caches);
    let answered = mc.clone();
    let outcome = scenario(mc, Arc::new(ctx), api, |mut api| async move {
        // What the pods would mount is read whatever the plan: nothing else is.
        api.expect("GET", "/api/v1/namespaces/default/secrets/cache-tls", http::StatusCode::NOT_FOUND, |_| {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
        })
        .await;
        let (events, status) = events_and_status(api.echo_any_order(2, &answered).await);
        assert_eq!(
            condition(&status.body, DEGRADED),
            ("True".into(), "InvalidSpec".into())
        );
        assert!(
            events[0].body["note"]
                .as_str()
                .unwrap()
                .contains("certificates.cert-manager.io"),
            "{}",
            events[0].body
        );
        api
    })
    .await
    .unwrap();
    assert!(matches!(outcome, Outcome::Blocked(_)), "{outcome:?}");
}
