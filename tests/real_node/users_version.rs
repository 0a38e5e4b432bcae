//! The secure tier on the memcached version users get by default (1.6.45, Debian sid's package;
//! the other suites run bookworm's 1.6.18): TLS and authentication together, a password rotation
//! and a certificate renewal in the running process, the exporter through the agent.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::{AuthSpec, MonitoringSpec, TlsSpec};
use memcached_operator::resources::auth::secret_data;
use memcached_operator_testkit::memcached::Connection;
use memcached_operator_testkit::net::metric_value;

use crate::harness::{admin, create, member_pods, memcached, wait_converged, wait_for};
use crate::tls::{Ca, client_config, tls_secret};
use crate::{
    RealNode, assert_keys, create_credentials, exporter_metrics, memcached_pid,
    operator_with_agent, pod_ip, real_namespace, restart_counts, write_keys,
};

const USER: &str = "app";
/// The issue's bound for a changed Secret to be in force.
const IN_FORCE: Duration = Duration::from_secs(120);

#[tokio::test]
async fn on_memcached_1_6_45_tls_and_auth_rotate_in_the_running_process() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "sid").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create_credentials(&secrets, "creds", USER, "first-password").await;
    let host = format!("cache.{ns}.svc");
    let ca = Ca::new("memcached test CA");
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("cert", &ca.issue(std::slice::from_ref(&host)), &ca),
        )
        .await
        .unwrap();
    let mut mc = memcached("cache", 1);
    mc.spec.image = Some(node.var("MEMCACHED_SID_IMAGE").into());
    mc.spec.auth = Some(AuthSpec {
        enabled: true,
        secret_name: Some("creds".into()),
        rotation_grace_seconds: 0,
    });
    mc.spec.tls = Some(TlsSpec {
        enabled: true,
        secret_name: Some("cert".into()),
        ..TlsSpec::default()
    });
    mc.spec.monitoring = Some(MonitoringSpec {
        enabled: true,
        image: None,
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 1).await;
    let pod = member_pods(&client, &ns, "cache").await.remove(0);
    let addr = SocketAddr::new(pod_ip(&pod).into(), 11211);
    // A full handshake each time: a resumed session would show the certificate it began with.
    let mut config = (*client_config(&ca.pem, None)).clone();
    config.resumption = tokio_rustls::rustls::client::Resumption::disabled();
    let verified = std::sync::Arc::new(config);
    let connect = |password: &'static str| {
        let verified = verified.clone();
        let host = host.clone();
        async move {
            let mut conn = Connection::connect_tls(addr, &host, verified)
                .await
                .map_err(|e| format!("connecting: {e:#}"))?;
            conn.login(USER, password)
                .await
                .map_err(|e| format!("{e:#}"))?;
            Ok::<_, String>(conn)
        }
    };

    let mut conn = connect("first-password").await.unwrap();
    assert_eq!(conn.stat("", "version").await.unwrap(), "1.6.45");
    write_keys(&mut conn).await;
    let served = conn.server_certificate().unwrap();
    let pid = memcached_pid(&pod);
    let metrics = exporter_metrics(&pod).await;
    assert_eq!(
        metric_value(&metrics, "memcached_up"),
        Some(1.0),
        "{metrics}"
    );

    // Both Secrets change at once: the agent sends SIGHUP for the password and
    // `refresh_certs` for the certificate, and this memcached takes both in the same process.
    let changed = Instant::now();
    let renewed = tls_secret("cert", &ca.issue(std::slice::from_ref(&host)), &ca);
    secrets
        .patch(
            "cert",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"data": renewed.data})),
        )
        .await
        .unwrap();
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"data": secret_data(USER, "second-password")})),
        )
        .await
        .unwrap();
    let mut last = String::new();
    let mut conn = loop {
        assert!(
            changed.elapsed() < IN_FORCE,
            "the new password and the renewed certificate not in force within {IN_FORCE:?}: {last}"
        );
        match connect("second-password").await {
            Ok(conn) if conn.server_certificate().as_ref() != Some(&served) => break conn,
            Ok(_) => last = "the new password works; the old certificate is served".into(),
            Err(e) => last = format!("the new password: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("both in force after {:?}", changed.elapsed());
    wait_for("the old password refused", IN_FORCE, || async {
        let err = connect("first-password").await.err()?;
        assert!(err.contains("authentication failure"), "{err}");
        Some(())
    })
    .await;

    let after = member_pods(&client, &ns, "cache").await.remove(0);
    assert_eq!(after.name_any(), pod.name_any());
    assert!(restart_counts(&after).values().all(|&n| n == 0));
    assert_eq!(memcached_pid(&after), pid);
    assert_keys(&mut conn, &after).await;
    let metrics = exporter_metrics(&after).await;
    assert_eq!(
        metric_value(&metrics, "memcached_up"),
        Some(1.0),
        "{metrics}"
    );
}
