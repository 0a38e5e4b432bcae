//! `spec.tls` on the API server: admission, and certificates the operator refuses to mount.
//! (memcached serving TLS is shown on the real node.)

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use memcached_operator::api::{Memcached, TlsSpec};
use memcached_operator::resources::tls::{CERT_KEY, PRIVATE_KEY_KEY};

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, create, member_pods, memcached, namespace,
    wait_converged, wait_degraded, wait_degraded_saying, wait_for, wait_not_degraded,
};

fn tls_secret(cert: &str, key: &str) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (CERT_KEY.into(), ByteString(cert.as_bytes().to_vec())),
            (PRIVATE_KEY_KEY.into(), ByteString(key.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    };
    s.metadata.name = Some("cert".into());
    s
}

#[tokio::test]
async fn admission_names_the_tls_field_that_is_wrong() {
    let client = admin().await;
    let ns = namespace(&client, "tls-admission").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let refused = |mut mc: Memcached, tls: TlsSpec| {
        mc.spec.tls = Some(tls);
        let mcs = mcs.clone();
        async move {
            match mcs.create(&PostParams::default(), &mc).await {
                Err(kube::Error::Api(e)) => e.message,
                other => panic!("admitted: {other:?}"),
            }
        }
    };
    let message = refused(
        memcached("a", 1),
        TlsSpec {
            enabled: true,
            ..TlsSpec::default()
        },
    )
    .await;
    assert!(
        message.contains("spec.tls.secretName") && message.contains("is required"),
        "{message}"
    );
    let message = refused(
        memcached("b", 1),
        TlsSpec {
            enabled: true,
            secret_name: Some("cert".into()),
            plaintext_port: Some(11211),
            ..TlsSpec::default()
        },
    )
    .await;
    assert!(
        message.contains("spec.tls.plaintextPort") && message.contains("containerPort"),
        "{message}"
    );
}

#[tokio::test]
async fn a_certificate_memcached_cannot_serve_degrades_and_changes_nothing() {
    let client = admin().await;
    let ns = namespace(&client, "tls-bad-secret").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 1)).await;
    wait_converged(&client, &ns, "cache", 1).await;
    // The member as it runs: its uid and its containers.
    let member = || async {
        let pod = member_pods(&client, &ns, "cache")
            .await
            .into_iter()
            .next()?;
        Some((pod.metadata.uid, pod.spec?.containers))
    };
    let before = member().await;

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let on = serde_json::json!({"spec": {"tls": {"enabled": true, "secretName": "cert"}}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&on))
        .await
        .unwrap();
    let missing = wait_degraded(&mcs, "cache", "InvalidSecret", CONVERGE).await;
    assert!(
        missing.contains("Secret cert (spec.tls.secretName) not found"),
        "{missing}"
    );

    // A key that is not the certificate's.
    let (a, b) = (
        rcgen::generate_simple_self_signed(vec!["cache".to_string()]).unwrap(),
        rcgen::generate_simple_self_signed(vec!["cache".to_string()]).unwrap(),
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &tls_secret(&a.cert.pem(), &b.signing_key.serialize_pem()),
        )
        .await
        .unwrap();
    let mismatch =
        wait_degraded_saying(&mcs, "cache", "InvalidSecret", "does not belong", CONVERGE).await;
    assert!(
        mismatch
            .contains("Secret cert: \"tls.key\" does not belong to the certificate in \"tls.crt\""),
        "{mismatch}"
    );
    assert!(member().await == before, "nothing applied");

    // Fixed: the pods get TLS and the agent that renews it.
    let fixed = tls_secret(&a.cert.pem(), &a.signing_key.serialize_pem());
    secrets
        .patch(
            "cert",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"data": fixed.data})),
        )
        .await
        .unwrap();
    wait_not_degraded(&mcs, "cache", CONVERGE).await;
    // The member is replaced (new flags and a new container cannot be taken in place).
    wait_for("the member with TLS and the agent", CONVERGE, || async {
        let (_, containers) = member().await?;
        let tls = containers[0].args.as_ref()?.contains(&"-Z".to_string());
        (tls && containers.iter().any(|c| c.name == "agent")).then_some(())
    })
    .await;
    wait_converged(&client, &ns, "cache", 1).await;
}

#[tokio::test]
async fn pods_with_auth_and_tls_converge_without_rewrites() {
    let client = admin().await;
    let ns = namespace(&client, "tls-idle").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let c = rcgen::generate_simple_self_signed(vec!["cache".to_string()]).unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &tls_secret(&c.cert.pem(), &c.signing_key.serialize_pem()),
        )
        .await
        .unwrap();
    let mut mc = memcached("cache", 2);
    mc.spec.auth = Some(memcached_operator::api::AuthSpec {
        enabled: true,
        ..Default::default()
    });
    mc.spec.tls = Some(TlsSpec {
        enabled: true,
        secret_name: Some("cert".into()),
        plaintext_port: Some(11400),
        ..TlsSpec::default()
    });
    mc.spec.monitoring = Some(memcached_operator::api::MonitoringSpec {
        enabled: true,
        image: None,
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;

    // A pod replaced: the changes of the members queue reconciles, which find every field
    // of theirs as applied (a field the API server stores differently would be rewritten).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let victim = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .remove(0);
    pods.delete(&kube::ResourceExt::name_any(&victim), &Default::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let rewrites: Vec<_> = crate::harness::events_with_reason(&client, &ns, "cache", "Updated")
        .await
        .into_iter()
        .map(|e| e.note)
        .collect();
    assert!(rewrites.is_empty(), "{rewrites:?}");
}
