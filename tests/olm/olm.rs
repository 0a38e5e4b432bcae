//! OLM itself on the local control plane: its CRDs, the prometheus-operator's ServiceMonitor and
//! PrometheusRule CRDs the bundle needs, OLM's `olm` and `catalog` operators as processes, `opm
//! serve` of a file-based catalog, and OLM's kinds as dynamic objects. Every process is killed
//! when its handle is dropped, so a failing (panicking) test leaves none behind.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client, ResourceExt};
use memcached_operator_testkit::net::{free_port, http_get};
pub use memcached_operator_testkit::process::Process;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::harness;

/// OLM's operators bind these (olm: health on :8080; catalog: health over TLS on :8443); the
/// ports are fixed upstream.
pub const OLM_PORTS: [u16; 2] = [8080, 8443];

/// Panics unless OLM's fixed ports are free on every address.
pub fn assert_ports_free() {
    for port in OLM_PORTS {
        assert!(
            TcpListener::bind(("0.0.0.0", port)).is_ok(),
            "port {port} is in use (OLM's operators bind it; stop whatever holds it)"
        );
    }
}

/// OLM's kinds (and the prometheus-operator's, which the bundle holds) for dynamic objects.
pub fn resource(kind: &str) -> ApiResource {
    let (group, version, plural) = match kind {
        "CatalogSource" => ("operators.coreos.com", "v1alpha1", "catalogsources"),
        "Subscription" => ("operators.coreos.com", "v1alpha1", "subscriptions"),
        "InstallPlan" => ("operators.coreos.com", "v1alpha1", "installplans"),
        "ClusterServiceVersion" => ("operators.coreos.com", "v1alpha1", "clusterserviceversions"),
        "OperatorGroup" => ("operators.coreos.com", "v1", "operatorgroups"),
        "ServiceMonitor" => ("monitoring.coreos.com", "v1", "servicemonitors"),
        "PrometheusRule" => ("monitoring.coreos.com", "v1", "prometheusrules"),
        _ => panic!("unknown kind {kind}"),
    };
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// `obj`'s field at `path` (under its data, as kubectl's jsonpath below metadata).
pub fn field<'a>(obj: &'a DynamicObject, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(&obj.data, |v, k| v.get(*k))
}

pub fn str_field(obj: &DynamicObject, path: &[&str]) -> String {
    field(obj, path)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Polls `check` every second until it is true; false after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The CustomResourceDefinitions of every YAML document in `files`.
pub fn crds_in(files: &[PathBuf]) -> Vec<CustomResourceDefinition> {
    let mut crds = vec![];
    for file in files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for value in docs {
            if value.get("kind").and_then(|k| k.as_str()) == Some("CustomResourceDefinition") {
                crds.push(serde_json::from_value(value).unwrap_or_else(|e| {
                    panic!("a CustomResourceDefinition in {}: {e}", file.display())
                }));
            }
        }
    }
    crds
}

/// Server-side applies `crds` and waits (at most `timeout`) until each is Established.
pub async fn apply_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> bool {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        harness::apply(&api, crd).await;
    }
    wait_until(timeout, || async {
        for crd in crds {
            let Ok(crd) = api.get(&crd.name_any()).await else {
                return false;
            };
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if !established {
                return false;
            }
        }
        true
    })
    .await
}

/// The prometheus-operator's ServiceMonitor and PrometheusRule CRD files
/// (`hack/monitoring-crds.sh` prints their directory, copied from its Go module).
pub fn monitoring_crd_files() -> Vec<PathBuf> {
    let root = memcached_operator_testkit::repo_root();
    let out = std::process::Command::new(root.join("hack/monitoring-crds.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("hack/monitoring-crds.sh runs");
    assert!(out.status.success(), "hack/monitoring-crds.sh failed");
    let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRDs in {}", dir.display());
    files
}

/// A self-signed CA and a `localhost` certificate it signed, for the catalog operator's health
/// endpoint over TLS (it then serves on :8443, away from olm's :8080).
pub struct TlsPair {
    pub cert: PathBuf,
    pub key: PathBuf,
    ca_der: Vec<u8>,
}

impl TlsPair {
    pub fn write(dir: &Path) -> TlsPair {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "olm test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let pair = TlsPair {
            cert: dir.join("olm-tls.crt"),
            key: dir.join("olm-tls.key"),
            ca_der: ca.der().to_vec(),
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }

    /// The status code of GET `path` over TLS on 127.0.0.1:`port` (the server's certificate
    /// verified against this CA as `localhost`), or None if nothing answered.
    pub async fn https_get(&self, port: u16, path: &str) -> Option<u16> {
        use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::ServerName};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(self.ca_der.clone())).ok()?;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").ok()?, tcp)
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        tls.write_all(request.as_bytes()).await.ok()?;
        let mut response = vec![];
        // A server may close without close_notify: keep what was read.
        let _ = tls.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response)
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }
}

/// How the catalog operator runs beyond the quickstart's flags.
#[derive(Default)]
pub struct CatalogOptions {
    /// More flags, e.g. `--opmImage` and `--util-image` (the images of the bundle unpack Job).
    pub args: Vec<String>,
    /// The cluster's DNS server (the kube-dns Service's IP). In a cluster the catalog operator
    /// dials a catalog image's pod by its Service's name (NAME.NS.svc:50051); out of cluster it
    /// then resolves names with this server, through a resolv.conf of its own bind-mounted in a
    /// mount namespace (root).
    pub cluster_dns: Option<String>,
}

/// OLM's `olm` and `catalog` operators, run out of cluster as the admin with the flags of the
/// quickstart's Deployments. Killed when dropped.
pub struct Olm {
    pub olm: Process,
    pub catalog: Process,
    pub tls: TlsPair,
}

impl Olm {
    /// Starts both in namespace `namespace` (which must exist) from `olm_dir` (build-tools.sh
    /// --path olm), logs in `log_dir` as `{prefix}-olm.log` and `{prefix}-catalog.log`.
    pub fn start(
        olm_dir: &Path,
        kubeconfig: &Path,
        namespace: &str,
        dir: &Path,
        prefix: &str,
        catalog_options: CatalogOptions,
    ) -> Olm {
        let kubeconfig = kubeconfig.to_str().unwrap();
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let tls = TlsPair::write(dir);
        let olm = Process::start(
            "olm",
            &olm_dir.join("olm"),
            &[
                "--namespace",
                namespace,
                "--writeStatusName",
                "",
                "--writePackageServerStatusName",
                "",
            ],
            &[
                ("KUBECONFIG", kubeconfig),
                ("OPERATOR_NAMESPACE", namespace),
                ("OPERATOR_NAME", "olm-operator"),
            ],
            logs.join(format!("{prefix}-olm.log")),
        );
        let catalog_bin = olm_dir.join("catalog");
        let mut args: Vec<String> = [
            "--namespace",
            namespace,
            "--writeStatusName",
            "",
            "--tls-cert",
            tls.cert.to_str().unwrap(),
            "--tls-key",
            tls.key.to_str().unwrap(),
        ]
        .map(String::from)
        .into();
        args.extend(catalog_options.args);
        let mut program = catalog_bin.clone();
        if let Some(dns) = &catalog_options.cluster_dns {
            let resolv_conf = dir.join("olm-resolv.conf");
            std::fs::write(
                &resolv_conf,
                format!(
                    "nameserver {dns}\nsearch {namespace}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
                ),
            )
            .unwrap();
            program = PathBuf::from("unshare");
            let wrap = [
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#,
                resolv_conf.to_str().unwrap(),
                catalog_bin.to_str().unwrap(),
            ];
            args.splice(0..0, wrap.map(String::from));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let catalog = Process::start(
            "catalog",
            &program,
            &args,
            &[("KUBECONFIG", kubeconfig)],
            logs.join(format!("{prefix}-catalog.log")),
        );
        Olm { olm, catalog, tls }
    }

    /// olm answers 200 on http://127.0.0.1:8080/healthz within `timeout`.
    pub async fn olm_healthy(&self, timeout: Duration) -> bool {
        wait_until(timeout, || async {
            http_get(OLM_PORTS[0], "/healthz").await.map(|(s, _)| s) == Some(200)
        })
        .await
    }

    /// catalog answers 200 on https://127.0.0.1:8443/healthz within `timeout`.
    pub async fn catalog_healthy(&self, timeout: Duration) -> bool {
        let tls = &self.tls;
        wait_until(timeout, || async {
            tls.https_get(OLM_PORTS[1], "/healthz").await == Some(200)
        })
        .await
    }
}

/// `opm serve` of a file-based catalog on 127.0.0.1, as catalog.Dockerfile runs it (the cache
/// built first with --cache-only). Killed when dropped.
pub struct Opm {
    pub process: Process,
    pub port: u16,
}

impl Opm {
    /// Builds the cache of `catalog` into `dir/opm-cache-{name}` (true if that succeeded), then
    /// serves it on `port`; log in `dir/logs/{prefix}-opm-{name}.log`.
    pub async fn serve(
        opm: &Path,
        catalog: &Path,
        port: u16,
        dir: &Path,
        prefix: &str,
        name: &str,
    ) -> (bool, Opm) {
        let cache = dir.join(format!("opm-cache-{name}"));
        let _ = std::fs::remove_dir_all(&cache);
        let pprof = format!("127.0.0.1:{}", free_port());
        let termination_log = dir.join("logs").join("opm-termination.log");
        let log = dir.join("logs").join(format!("{prefix}-opm-{name}.log"));
        let common = [
            catalog.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "--pprof-addr",
            &pprof,
            "--termination-log",
            termination_log.to_str().unwrap(),
        ];
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let cached = Command::new(opm)
            .arg("serve")
            .args(common)
            .arg("--cache-only")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .status()
            .await
            .is_ok_and(|s| s.success());
        let port_arg = port.to_string();
        let mut args = vec!["serve"];
        args.extend(common);
        args.extend(["--port", &port_arg]);
        let process = Process::start(&format!("opm-{name}"), opm, &args, &[], log);
        (cached, Opm { process, port })
    }

    /// Accepts TCP connections on its port within `timeout`.
    pub async fn listening(&self, timeout: Duration) -> bool {
        let port = self.port;
        wait_until(timeout, || async {
            tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            .is_ok_and(|r| r.is_ok())
        })
        .await
    }
}
