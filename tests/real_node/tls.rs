//! spec.tls for real: memcached serves TLS only, a client that verifies it by the Service's name
//! gets in, a renewed certificate is served by the same process with every key, and with a
//! client CA a client without a certificate is refused.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::{BindingSpec, Memcached, MonitoringSpec, TlsSpec};
use memcached_operator::resources::tls::{CA_KEY, CERT_KEY, PRIVATE_KEY_KEY};
use memcached_operator_testkit::dns::lookup_a;
use memcached_operator_testkit::memcached::Connection;
use memcached_operator_testkit::net::metric_value;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::harness::{CONVERGE, admin, create, member_pods, memcached, wait_converged, wait_for};
use crate::{
    RealNode, assert_keys, exporter_metrics, memcached_pid, operator_with_agent, pod_ip,
    pymemcache, real_namespace, restart_counts, write_keys,
};

/// The issue's bound for a renewal to be served.
const RENEWAL: Duration = Duration::from_secs(120);

/// A certificate authority of the test's own.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub(crate) pem: String,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf for `names`: (certificate PEM, key PEM).
    pub(crate) fn issue(&self, names: &[String]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.to_vec()).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Creates the `kubernetes.io/tls` Secret `name` with a leaf `ca` issued for `names`.
pub(crate) async fn create_tls_secret(
    secrets: &Api<Secret>,
    name: &str,
    names: &[String],
    ca: &Ca,
) {
    secrets
        .create(
            &PostParams::default(),
            &tls_secret(name, &ca.issue(names), ca),
        )
        .await
        .unwrap();
}

pub(crate) fn tls_secret(name: &str, (cert, key): &(String, String), ca: &Ca) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (CERT_KEY.into(), ByteString(cert.as_bytes().to_vec())),
            (PRIVATE_KEY_KEY.into(), ByteString(key.as_bytes().to_vec())),
            (CA_KEY.into(), ByteString(ca.pem.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    };
    s.metadata.name = Some(name.into());
    s
}

/// Waits (at most the issue's 2 minutes) until each pod serves another certificate than the one
/// it served before (`served`, in the order of `pods`).
pub(crate) async fn wait_renewal_served(
    pods: &[Pod],
    host: &str,
    verified: &Arc<ClientConfig>,
    served: &[Vec<u8>],
) {
    for (pod, before) in pods.iter().zip(served) {
        let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
        wait_for(
            &format!("the renewed certificate served by {}", pod.name_any()),
            RENEWAL,
            || async {
                let conn = Connection::connect_tls(addr, host, verified.clone())
                    .await
                    .ok()?;
                (&conn.server_certificate()? != before).then_some(())
            },
        )
        .await;
    }
}

/// A client trusting the CA certificate `ca_pem`, with `client` as its certificate if given.
pub(crate) fn client_config(ca_pem: &str, client: Option<&(String, String)>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    })
}

/// Whether a round trip works over TLS to `ip` as `config` connects, logged in as `login`.
async fn round_trip(
    ip: Ipv4Addr,
    host: &str,
    config: Arc<ClientConfig>,
    login: Option<&(String, String)>,
) -> Result<(), String> {
    let addr = SocketAddr::new(ip.into(), 11211);
    let mut conn = Connection::connect_tls(addr, host, config)
        .await
        .map_err(|e| format!("{e:#}"))?;
    if let Some((user, password)) = login {
        conn.login(user, password)
            .await
            .map_err(|e| format!("{e:#}"))?;
    }
    conn.set("probe", b"1")
        .await
        .map_err(|e| format!("{e:#}"))?;
    match conn.get("probe").await.map_err(|e| format!("{e:#}"))? {
        Some(v) if v == "1" => Ok(()),
        other => Err(format!("get probe: {other:?}")),
    }
}

#[tokio::test]
async fn tls_serves_verified_clients_renews_in_place_and_requires_client_certificates() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "tls").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    // The names a client reaches the Memcached by: its Service's.
    let host = format!("cache.{ns}.svc");
    let names = vec![host.clone(), format!("{host}.cluster.local")];
    let ca = Ca::new("memcached test CA");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create_tls_secret(&secrets, "cache-tls", &names, &ca).await;
    let mut mc = memcached("cache", 2);
    mc.spec.tls = Some(TlsSpec {
        enabled: true,
        secret_name: Some("cache-tls".into()),
        ..TlsSpec::default()
    });
    mc.spec.monitoring = Some(MonitoringSpec {
        enabled: true,
        image: None,
    });
    mc.spec.binding = Some(BindingSpec { enabled: true });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let pods = member_pods(&client, &ns, "cache").await;
    // What an application learns from its binding: where to connect, and whom to trust.
    let bound = wait_for("the binding Secret", CONVERGE, || async {
        secrets.get_opt("cache-binding").await.ok()??.data
    })
    .await;
    let entry = |key: &str| String::from_utf8(bound[key].0.clone()).unwrap();
    assert_eq!((entry("host"), entry("tls")), (host.clone(), "true".into()));
    assert_eq!(entry("ca.crt"), ca.pem);

    // By the Service's name, through the cluster's DNS, verified against the CA.
    let ips: BTreeSet<Ipv4Addr> = pods.iter().map(pod_ip).collect();
    // CoreDNS follows the EndpointSlices through its own watch: a pod just Ready may be a moment
    // late in its answer.
    wait_for(
        "the Service's name to resolve to every member",
        CONVERGE,
        || async {
            let resolved: BTreeSet<Ipv4Addr> =
                lookup_a(node.dns(), &format!("{host}.cluster.local"))
                    .await
                    .ok()?
                    .into_iter()
                    .collect();
            (resolved == ips).then_some(())
        },
    )
    .await;
    // A real client library connects by that name and verifies the certificate; one trusting
    // another CA refuses the server.
    let one = pod_ip(&pods[0]).to_string();
    let by_name = |ca: &str| {
        json!({
            "servers": [format!("{}:{}", entry("host"), entry("port"))], "addresses": {&host: &one},
            "ca": ca, "keys": 20,
        })
    };
    let app = pymemcache(by_name(&entry("ca.crt"))).await;
    assert_eq!(
        (&app["stored"], &app["found"]),
        (&json!(20), &json!(20)),
        "{app}"
    );
    let app = pymemcache(by_name(&Ca::new("another CA").pem)).await;
    assert!(
        app["error"]
            .as_str()
            .is_some_and(|e| e.contains("CERTIFICATE_VERIFY_FAILED")),
        "{app}"
    );
    let verified = client_config(&ca.pem, None);
    let mut served = Vec::new();
    let mut uptimes = Vec::new();
    for pod in &pods {
        let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
        let mut conn = Connection::connect_tls(addr, &host, verified.clone())
            .await
            .unwrap();
        write_keys(&mut conn).await;
        served.push(conn.server_certificate().unwrap());
        uptimes.push(
            conn.stat("", "uptime")
                .await
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
        // Plain text is refused on memcached's port; a client checking another name too.
        let plain = async {
            let mut c = Connection::connect(addr).await?;
            c.get("key-1").await
        };
        assert!(plain.await.is_err(), "plain text on the TLS port");
        assert!(
            Connection::connect_tls(addr, "elsewhere.example", verified.clone())
                .await
                .is_err(),
            "the certificate is checked against the name"
        );
        let metrics = exporter_metrics(pod).await;
        assert_eq!(
            metric_value(&metrics, "memcached_up"),
            Some(1.0),
            "{metrics}"
        );
    }
    let pids: Vec<u32> = pods.iter().map(memcached_pid).collect();

    // Renewal: a new certificate (same names, same CA) is served by the same processes.
    let renewed = Instant::now();
    let fresh = tls_secret("cache-tls", &ca.issue(&names), &ca);
    secrets
        .patch(
            "cache-tls",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"data": fresh.data})),
        )
        .await
        .unwrap();
    wait_renewal_served(&pods, &host, &verified, &served).await;
    println!("renewed certificate served after {:?}", renewed.elapsed());
    let after = member_pods(&client, &ns, "cache").await;
    for (i, pod) in after.iter().enumerate() {
        assert_eq!(pod.name_any(), pods[i].name_any());
        let restarts = restart_counts(pod);
        assert!(restarts.values().all(|&n| n == 0), "{restarts:?}");
        assert_eq!(memcached_pid(pod), pids[i]);
        let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
        let mut conn = Connection::connect_tls(addr, &host, verified.clone())
            .await
            .unwrap();
        let uptime: u64 = conn.stat("", "uptime").await.unwrap().parse().unwrap();
        assert!(uptime >= uptimes[i], "uptime kept counting");
        assert_keys(&mut conn, pod).await;
    }

    // Mutual TLS, and authentication on top: clients need a certificate the client CA signed,
    // then the password. The exporter reads through the agent, which logs in over loopback.
    let client_ca = Ca::new("memcached clients");
    let mut ca_secret = Secret {
        data: Some(BTreeMap::from([(
            CA_KEY.into(),
            ByteString(client_ca.pem.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    ca_secret.metadata.name = Some("client-ca".into());
    secrets
        .create(&PostParams::default(), &ca_secret)
        .await
        .unwrap();
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {
            "tls": {"clientCASecretName": "client-ca"},
            "auth": {"enabled": true},
        }})),
    )
    .await
    .unwrap();
    let with_cert = client_config(&ca.pem, Some(&client_ca.issue(&["app".to_string()])));
    let stranger = client_config(&ca.pem, Some(&ca.issue(&["app".to_string()])));
    let login = wait_for("the generated credentials", CONVERGE, || async {
        let data = secrets.get_opt("cache-auth").await.ok()??.data?;
        let value = |k: &str| String::from_utf8(data.get(k)?.0.clone()).ok();
        Some((value("username")?, value("password")?))
    })
    .await;
    let login = Some(&login);
    wait_for(
        "every pod requires a client certificate",
        CONVERGE,
        || async {
            let pods = member_pods(&client, &ns, "cache").await;
            if pods.len() != 2 {
                return None;
            }
            for pod in &pods {
                let ip = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
                round_trip(ip, &host, with_cert.clone(), login).await.ok()?;
                round_trip(ip, &host, verified.clone(), login).await.err()?;
            }
            Some(())
        },
    )
    .await;
    wait_converged(&client, &ns, "cache", 2).await;
    for pod in member_pods(&client, &ns, "cache").await {
        let ip = pod_ip(&pod);
        let err = round_trip(ip, &host, verified.clone(), login)
            .await
            .unwrap_err();
        println!("without a client certificate: {err}");
        assert!(
            round_trip(ip, &host, stranger.clone(), login)
                .await
                .is_err(),
            "a certificate another CA signed is refused"
        );
        // A certificate is not a password: memcached still asks for the login.
        let mut conn =
            Connection::connect_tls(SocketAddr::new(ip.into(), 11211), &host, with_cert.clone())
                .await
                .unwrap();
        let err = conn.get("key-1").await.unwrap_err().to_string();
        assert!(err.contains("CLIENT_ERROR unauthenticated"), "{err}");
        round_trip(ip, &host, with_cert.clone(), login)
            .await
            .unwrap();
        let metrics = exporter_metrics(&pod).await;
        assert_eq!(metric_value(&metrics, "memcached_up"), Some(1.0));
    }
}
