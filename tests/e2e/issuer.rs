//! `spec.tls.issuerRef` on the API server, with cert-manager's controllers running: the operator
//! keeps a Certificate for the Service's names, cert-manager issues it, and the pods mount what
//! it issued. (memcached serving it, and a renewal in place, are shown on the real node.)

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::certificate::Certificate;
use memcached_operator_testkit::cert_manager::CertManager;
use serde_json::json;

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, cluster, create, member_pods, memcached, namespace,
    wait_converged, wait_for, wait_gone,
};

/// cert-manager for `ns`, with a self-signing Issuer `selfsigned` there.
pub async fn cert_manager_with_issuer(client: &Client, ns: &str) -> CertManager {
    let cluster = cluster();
    let cert_manager = CertManager::start(&cluster, ns, &cluster.dir.join("logs"))
        .await
        .expect("cert-manager starts");
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Issuer");
    let issuers: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let issuer: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
        "metadata": {"name": "selfsigned"}, "spec": {"selfSigned": {}},
    }))
    .unwrap();
    issuers
        .create(&PostParams::default(), &issuer)
        .await
        .unwrap();
    cert_manager
}

fn issued_by(issuer: &str) -> serde_json::Value {
    json!({"enabled": true, "issuerRef": {"name": issuer}})
}

#[tokio::test]
async fn cert_manager_issues_the_certificate_the_pods_mount_and_the_binding_trusts() {
    let client = admin().await;
    let ns = namespace(&client, "issuer").await;
    // Installs cert-manager's CRDs first: the operator asks at start which kinds are served.
    let _cert_manager = cert_manager_with_issuer(&client, &ns).await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mut mc = memcached("cache", 2);
    mc.spec = serde_json::from_value(json!({
        "size": 2, "tls": issued_by("selfsigned"), "binding": {"enabled": true},
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;

    let certificates: Api<Certificate> = Api::namespaced(client.clone(), &ns);
    let certificate = certificates
        .get("cache")
        .await
        .expect("a Certificate `cache`");
    assert_eq!(certificate.owner_references()[0].name, "cache");
    assert_eq!(certificate.spec.secret_name, "cache-tls");
    assert!(
        certificate
            .spec
            .dns_names
            .contains(&format!("cache.{ns}.svc")),
        "{:?}",
        certificate.spec.dns_names
    );
    assert_eq!(certificate.spec.issuer_ref.name, "selfsigned");

    // cert-manager issues it; the pods mount that Secret.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let issued = wait_for("cert-manager to issue cache-tls", CONVERGE, || async {
        let secret = secrets.get_opt("cache-tls").await.ok()??;
        secret.data.as_ref()?.get("tls.crt")?;
        Some(secret)
    })
    .await;
    assert_eq!(issued.type_.as_deref(), Some("kubernetes.io/tls"));
    wait_for(
        "the members to mount the issued Secret",
        CONVERGE,
        || async {
            let members = member_pods(&client, &ns, "cache").await;
            let mounted: Vec<_> = members
                .iter()
                .map(|p| {
                    let volumes = p.spec.as_ref()?.volumes.as_ref()?;
                    volumes
                        .iter()
                        .find_map(|v| v.secret.as_ref()?.secret_name.clone())
                })
                .collect();
            (!mounted.is_empty() && mounted.iter().all(|m| m.as_deref() == Some("cache-tls")))
                .then_some(())
        },
    )
    .await;
    // Clients learn whom to trust from the binding (its Secrets are read again every 30 s).
    wait_for("the binding to carry the issued CA", CONVERGE, || async {
        let bound = secrets.get_opt("cache-binding").await.ok()??.data?;
        (bound.get("ca.crt")? == issued.data.as_ref()?.get("ca.crt")?).then_some(())
    })
    .await;

    // A Certificate edited or deleted by hand is put back.
    certificates
        .delete("cache", &Default::default())
        .await
        .unwrap();
    wait_for("the Certificate back", CONVERGE, || async {
        let back = certificates.get_opt("cache").await.ok()??;
        back.metadata.deletion_timestamp.is_none().then_some(())
    })
    .await;

    // TLS off: the Certificate goes (cert-manager's Secret stays, as cert-manager leaves it).
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tls": null}})),
        )
        .await
        .unwrap();
    wait_gone("the Certificate", CONVERGE, &certificates, "cache").await;
}

#[tokio::test]
async fn admission_refuses_a_secret_and_an_issuer_together() {
    let client = admin().await;
    let ns = namespace(&client, "issuer-admission").await;
    let mut mc = memcached("both", 1);
    mc.spec.tls = serde_json::from_value(json!({
        "enabled": true, "secretName": "mine", "issuerRef": {"name": "ca"},
    }))
    .unwrap();
    let refused = Api::<Memcached>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &mc)
        .await;
    let Err(kube::Error::Api(e)) = refused else {
        panic!("admitted: {refused:?}")
    };
    assert!(
        e.message.contains("spec.tls.issuerRef") && e.message.contains("exclusive"),
        "{}",
        e.message
    );
}
