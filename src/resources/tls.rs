//! memcached's TLS (`spec.tls`): the flags, the Secrets memcached reads its certificate (and the
//! client CA) from, and the checks those Secrets must pass before pods mount them. memcached
//! reads the files at start and again on `refresh_certs`, which the agent sends when the
//! kubelet has refreshed a renewed Secret (see `agent.rs`).

use k8s_openapi::api::core::v1::{Secret, SecretVolumeSource, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::api::{IssuerRef, Memcached, TlsSpec};
use crate::certificate::{Certificate, CertificateSpec};

use super::{mount, owned_metadata};

pub const CERT_KEY: &str = "tls.crt";
pub const PRIVATE_KEY_KEY: &str = "tls.key";
pub const CA_KEY: &str = "ca.crt";
/// The plain-text port's name on the pod and the Service, when the user asks for one.
pub const PLAINTEXT_PORT_NAME: &str = "memcached-plain";
pub const TLS_DIR: &str = "/etc/memcached/tls";
pub const CLIENT_CA_DIR: &str = "/etc/memcached/client-ca";
const TLS_VOLUME: &str = "tls";
const CLIENT_CA_VOLUME: &str = "client-ca";
/// memcached's `ssl_verify_mode`: 2 requires a client certificate the CA signed.
const VERIFY_REQUIRE: u8 = 2;

pub fn enabled(mc: &Memcached) -> bool {
    spec(mc).is_some()
}

fn spec(mc: &Memcached) -> Option<&TlsSpec> {
    mc.spec.tls.as_ref().filter(|t| t.enabled)
}

/// The server certificate's Secret: the user's, or the one cert-manager issues.
pub fn secret_name(mc: &Memcached) -> Option<String> {
    match issuer(mc) {
        Some(_) => Some(issued_secret_name(mc)),
        None => spec(mc)?.secret_name.clone(),
    }
}

/// Whether cert-manager issues the certificate (`issuerRef`).
pub fn issued(mc: &Memcached) -> bool {
    issuer(mc).is_some()
}

/// The issuer cert-manager takes the certificate from, unless the user names a Secret.
fn issuer(mc: &Memcached) -> Option<&IssuerRef> {
    let tls = spec(mc)?;
    tls.issuer_ref
        .as_ref()
        .filter(|_| tls.secret_name.is_none())
}

fn issued_secret_name(mc: &Memcached) -> String {
    format!("{}-tls", mc.name_any())
}

/// The Certificate cert-manager keeps issued for `spec.tls.issuerRef`: the Service's names,
/// and, under it, every member's (`*.`), and the names `also` lists (the proxy's), in
/// `<name>-tls`.
pub fn certificate(mc: &Memcached, also: Vec<String>) -> Option<Certificate> {
    let issuer_ref = issuer(mc)?.clone();
    let service = format!(
        "{}.{}.svc",
        mc.name_any(),
        mc.namespace().unwrap_or_default()
    );
    let mut dns_names = vec![
        service.clone(),
        format!("{service}.cluster.local"),
        format!("*.{service}"),
        format!("*.{service}.cluster.local"),
    ];
    dns_names.extend(also);
    Some(Certificate {
        metadata: ObjectMeta {
            name: Some(mc.name_any()),
            ..owned_metadata(mc)
        },
        spec: CertificateSpec {
            secret_name: issued_secret_name(mc),
            dns_names,
            issuer_ref,
            usages: vec![
                "server auth".into(),
                "digital signature".into(),
                "key encipherment".into(),
            ],
        },
    })
}

/// The client CA's Secret (mutual TLS).
pub fn client_ca_secret_name(mc: &Memcached) -> Option<&str> {
    spec(mc)?.client_ca_secret_name.as_deref()
}

/// The plain-text port the user asked for beside TLS.
pub fn plaintext_port(mc: &Memcached) -> Option<i32> {
    spec(mc)?.plaintext_port
}

/// memcached's flags: TLS on every listener but the plain ones on `local_port` (the pod's
/// loopback, for the exporter and the agent) and on plaintextPort.
pub fn memcached_args(mc: &Memcached, local_port: i32) -> Vec<String> {
    if !enabled(mc) {
        return Vec::new();
    }
    let mut options =
        format!("ssl_chain_cert={TLS_DIR}/{CERT_KEY},ssl_key={TLS_DIR}/{PRIVATE_KEY_KEY}");
    if client_ca_secret_name(mc).is_some() {
        // With client verification OpenSSL refuses a resumed session (`internal_error`) unless
        // a session id context is set, which memcached sets only with its session cache.
        options += &format!(
            ",ssl_ca_cert={CLIENT_CA_DIR}/{CA_KEY},ssl_verify_mode={VERIFY_REQUIRE},ssl_session_cache"
        );
    }
    // IPv4 listeners: a listener without a port takes -p's.
    let mut listeners = format!("0.0.0.0,notls:127.0.0.1:{local_port}");
    if let Some(plain) = plaintext_port(mc) {
        listeners += &format!(",notls:0.0.0.0:{plain}");
    }
    vec![
        "-Z".to_string(),
        "-o".to_string(),
        options,
        "-l".to_string(),
        listeners,
    ]
}

/// The Secrets memcached reads: (volume, where it is mounted, the Secret).
fn mounted(mc: &Memcached) -> Vec<(&'static str, &'static str, String)> {
    [
        (TLS_VOLUME, TLS_DIR, secret_name(mc)),
        (
            CLIENT_CA_VOLUME,
            CLIENT_CA_DIR,
            client_ca_secret_name(mc).map(String::from),
        ),
    ]
    .into_iter()
    .filter_map(|(volume, dir, secret)| Some((volume, dir, secret?)))
    .collect()
}

/// The Secrets' volumes.
pub fn volumes(mc: &Memcached) -> Vec<Volume> {
    mounted(mc)
        .into_iter()
        .map(|(volume, _, secret)| Volume {
            name: volume.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        })
        .collect()
}

/// Where memcached (and the agent, which watches them) find the files.
pub fn mounts(mc: &Memcached) -> Vec<VolumeMount> {
    mounted(mc)
        .into_iter()
        .map(|(volume, dir, _)| mount(volume, dir, true))
        .collect()
}

/// The directories the agent watches for a renewal.
pub fn watched_dirs(mc: &Memcached) -> Vec<&'static str> {
    mounted(mc).into_iter().map(|(_, dir, _)| dir).collect()
}

fn value<'a>(secret: &'a Secret, key: &str) -> Result<&'a [u8], String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.as_slice())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("Secret {} has no key {key:?}", secret.name_any()))
}

/// The PEM certificates under `key`; at least one.
fn certificates(secret: &Secret, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let name = secret.name_any();
    let certs: Vec<_> = CertificateDer::pem_slice_iter(value(secret, key)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("Secret {name}: key {key:?} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("Secret {name}: key {key:?} holds no certificate"));
    }
    Ok(certs)
}

/// Why memcached could not serve with this Secret's certificate, naming the Secret and the key;
/// None when it can: a chain and a private key in PEM that belong together.
pub fn certificate_problem(secret: &Secret) -> Option<String> {
    let name = secret.name_any();
    let check = || -> Result<(), String> {
        let chain = certificates(secret, CERT_KEY)?;
        let key = PrivateKeyDer::from_pem_slice(value(secret, PRIVATE_KEY_KEY)?).map_err(|e| {
            format!("Secret {name}: key {PRIVATE_KEY_KEY:?} holds no private key in PEM: {e}")
        })?;
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
            format!(
                "Secret {name}: {PRIVATE_KEY_KEY:?} does not belong to the certificate in \
                 {CERT_KEY:?} ({e})"
            )
        })?;
        Ok(())
    };
    check().err()
}

/// Why this Secret cannot serve as the client CA, naming it and the key.
pub fn client_ca_problem(secret: &Secret) -> Option<String> {
    certificates(secret, CA_KEY).err()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::fixtures::memcached;

    fn secret(entries: &[(&str, String)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("cert".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Secret::default()
        }
    }

    fn certified(name: &str) -> rcgen::CertifiedKey<rcgen::KeyPair> {
        rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap()
    }

    #[test]
    fn a_matching_certificate_and_key_pass() {
        let c = certified("cache.ns.svc");
        let ok = secret(&[
            (CERT_KEY, c.cert.pem()),
            (PRIVATE_KEY_KEY, c.signing_key.serialize_pem()),
        ]);
        assert_eq!(certificate_problem(&ok), None);
        assert_eq!(client_ca_problem(&secret(&[(CA_KEY, c.cert.pem())])), None);
    }

    #[test]
    fn problems_name_the_secret_and_the_key() {
        let (a, b) = (certified("a"), certified("b"));
        let cases = [
            (
                secret(&[(CERT_KEY, a.cert.pem())]),
                "Secret cert has no key \"tls.key\"",
            ),
            (
                secret(&[
                    (CERT_KEY, "not a certificate".into()),
                    (PRIVATE_KEY_KEY, a.signing_key.serialize_pem()),
                ]),
                "key \"tls.crt\" holds no certificate",
            ),
            (
                secret(&[(CERT_KEY, a.cert.pem()), (PRIVATE_KEY_KEY, "junk".into())]),
                "key \"tls.key\" holds no private key",
            ),
            (
                secret(&[
                    (CERT_KEY, a.cert.pem()),
                    (PRIVATE_KEY_KEY, b.signing_key.serialize_pem()),
                ]),
                "\"tls.key\" does not belong to the certificate in \"tls.crt\"",
            ),
        ];
        for (secret, want) in cases {
            let problem = certificate_problem(&secret).expect("a problem");
            assert!(problem.contains(want), "{problem:?} lacks {want:?}");
        }
        let problem = client_ca_problem(&secret(&[("other", "x".into())])).unwrap();
        assert!(
            problem.contains("Secret cert has no key \"ca.crt\""),
            "{problem}"
        );
    }

    #[test]
    fn tls_flags_keep_a_plain_listener_on_loopback_only_unless_asked() {
        let mut mc = memcached("cache", 1);
        assert!(memcached_args(&mc, 11298).is_empty());
        mc.spec.tls = Some(TlsSpec {
            enabled: true,
            secret_name: Some("cert".into()),
            ..TlsSpec::default()
        });
        let args = memcached_args(&mc, 11298);
        assert_eq!(args[0], "-Z");
        assert_eq!(
            args[2],
            "ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key"
        );
        assert_eq!(args[4], "0.0.0.0,notls:127.0.0.1:11298");

        let tls = mc.spec.tls.as_mut().unwrap();
        tls.client_ca_secret_name = Some("ca".into());
        tls.plaintext_port = Some(11400);
        let args = memcached_args(&mc, 11298);
        assert!(args[2].ends_with(
            ",ssl_ca_cert=/etc/memcached/client-ca/ca.crt,ssl_verify_mode=2,ssl_session_cache"
        ));
        assert_eq!(args[4], "0.0.0.0,notls:127.0.0.1:11298,notls:0.0.0.0:11400");
        assert_eq!(watched_dirs(&mc), [TLS_DIR, CLIENT_CA_DIR]);
        assert_eq!(volumes(&mc).len(), 2);
    }

    #[test]
    fn an_issuer_gets_a_certificate_for_the_services_names_mounted_from_its_secret() {
        let mc = crate::fixtures::memcached_with_spec(serde_json::json!({
            "tls": {"enabled": true, "issuerRef": {"name": "ca", "kind": "ClusterIssuer"}},
        }));
        let issued = certificate(&mc, vec![]).expect("one for the issuer");
        assert_eq!(issued.metadata.name.as_deref(), Some("cache"));
        assert_eq!(issued.spec.secret_name, "cache-tls");
        assert_eq!(
            issued.spec.dns_names,
            [
                "cache.default.svc",
                "cache.default.svc.cluster.local",
                "*.cache.default.svc",
                "*.cache.default.svc.cluster.local",
            ]
        );
        // With the proxy, its agent serves the same certificate by the proxy's name.
        let mut proxied = mc.clone();
        proxied.spec.proxy = serde_json::from_value(serde_json::json!({"enabled": true})).unwrap();
        let names = crate::resources::proxy::certificate_names(&proxied);
        assert_eq!(
            certificate(&proxied, names).unwrap().spec.dns_names[4..],
            [
                "cache-proxy.default.svc",
                "cache-proxy.default.svc.cluster.local"
            ]
        );
        let issuer = &issued.spec.issuer_ref;
        assert_eq!(
            (
                issuer.name.as_str(),
                issuer.kind.as_str(),
                issuer.group.as_str()
            ),
            ("ca", "ClusterIssuer", "cert-manager.io")
        );
        assert_eq!(
            volumes(&mc)[0]
                .secret
                .as_ref()
                .unwrap()
                .secret_name
                .as_deref(),
            Some("cache-tls")
        );
        // A Secret of the user's: no Certificate.
        let own = crate::fixtures::memcached_with_spec(serde_json::json!({
            "tls": {"enabled": true, "secretName": "mine"},
        }));
        assert!(certificate(&own, vec![]).is_none());
    }
}
