//! Test ground for the end-to-end suite: the local control plane started by `hack/e2e.sh`, the
//! operator run as a real subprocess authenticated as its own ServiceAccount, and waiting helpers.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::process::{Child, Command};

pub const OPERATOR_NAMESPACE: &str = "memcached-operator-system";
const FIELD_MANAGER: &str = "e2e";

/// The cluster directory written by `hack/cluster.sh up`.
pub fn cluster_dir() -> PathBuf {
    let dir = std::env::var("E2E_CLUSTER_DIR").expect(
        "E2E_CLUSTER_DIR is not set: run the end-to-end suite with `make test-e2e`, which starts the local control plane",
    );
    PathBuf::from(dir)
}

pub fn admin_kubeconfig() -> PathBuf {
    cluster_dir().join("kubeconfig")
}

/// A client with the cluster admin's credentials (the test's own, not the operator's).
pub async fn admin() -> Client {
    let kubeconfig = Kubeconfig::read_from(admin_kubeconfig()).expect("admin kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("admin config");
    let client = Client::try_from(config).expect("admin client");
    install_crd(&client).await;
    client
}

/// Applies the committed CRD (what `make install` applies) and waits until it is served.
async fn install_crd(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/crd/bases/cache.example.com_memcacheds.yaml");
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    apply(&crds, &crd).await;
    wait_for("CRD Established", Duration::from_secs(30), || async {
        let crd = crds.get(&crd.name_any()).await.ok()?;
        let conditions = crd.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

/// Server-side applies `obj` as the test.
pub async fn apply<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {}: {e}", obj.name_any()))
}

/// A fresh namespace named after the test.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    apply(&Api::<Namespace>::all(client.clone()), &ns).await;
    name
}

/// Polls `check` every 200 ms until it returns Some, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs kubectl against the local control plane as the admin; returns (success, stdout+stderr).
pub async fn kubectl(args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", admin_kubeconfig())
        .output()
        .await
        .expect("kubectl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The permissions the operator is given, taken from config/rbac so the shipped RBAC is what
/// the tests exercise.
pub enum Rbac {
    /// ClusterRole manager-role bound cluster-wide (AllNamespaces install).
    Cluster,
    /// The same rules as a Role in each listed namespace (OwnNamespace/SingleNamespace/MultiNamespace).
    Namespaces(Vec<String>),
}

pub struct OperatorOptions {
    pub rbac: Rbac,
    pub watch_namespace: Option<String>,
    pub leader_elect: bool,
    /// Lease name shared by the processes that compete for it.
    pub lease: String,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Default for OperatorOptions {
    fn default() -> Self {
        Self {
            rbac: Rbac::Cluster,
            watch_namespace: None,
            leader_elect: false,
            lease: "unused".into(),
            extra_args: vec![],
            env: vec![],
        }
    }
}

fn manager_rules() -> Vec<PolicyRule> {
    rules_of("role.yaml")
}

fn rules_of(file: &str) -> Vec<PolicyRule> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config/rbac")
            .join(file),
    )
    .unwrap();
    let role: ClusterRole = serde_yaml::from_str(&text).unwrap();
    role.rules.unwrap()
}

/// A ClusterRole with `rules`, bound to the ServiceAccount `sa` in `sa_ns`.
pub async fn bind_cluster_role(
    client: &Client,
    name: &str,
    rules: Vec<PolicyRule>,
    sa: &str,
    sa_ns: &str,
) {
    let role = ClusterRole {
        metadata: meta(name, None),
        rules: Some(rules),
        ..Default::default()
    };
    apply(&Api::<ClusterRole>::all(client.clone()), &role).await;
    let binding = ClusterRoleBinding {
        metadata: meta(name, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(sa_ns.into()),
            ..Default::default()
        }]),
    };
    apply(&Api::<ClusterRoleBinding>::all(client.clone()), &binding).await;
}

/// The rules of a shipped ClusterRole in config/rbac, e.g. "metrics_reader_role.yaml".
pub fn shipped_rules(file: &str) -> Vec<PolicyRule> {
    rules_of(file)
}

fn leader_election_rules() -> Vec<PolicyRule> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rbac/leader_election_role.yaml"),
    )
    .unwrap();
    let role: Role = serde_yaml::from_str(&text).unwrap();
    role.rules.unwrap()
}

fn binding_subject(sa: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(OPERATOR_NAMESPACE.into()),
        ..Default::default()
    }]
}

fn meta(name: &str, namespace: Option<&str>) -> kube::api::ObjectMeta {
    kube::api::ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        ..Default::default()
    }
}

/// A Role with `rules` in `ns`, bound to the ServiceAccount `sa`.
async fn bind_role(client: &Client, ns: &str, name: &str, rules: Vec<PolicyRule>, sa: &str) {
    let role = Role {
        metadata: meta(name, Some(ns)),
        rules: Some(rules),
    };
    apply(&Api::<Role>::namespaced(client.clone(), ns), &role).await;
    let binding = RoleBinding {
        metadata: meta(name, Some(ns)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(binding_subject(sa)),
    };
    apply(
        &Api::<RoleBinding>::namespaced(client.clone(), ns),
        &binding,
    )
    .await;
}

/// Creates a ServiceAccount with exactly the shipped permissions and returns a kubeconfig that
/// authenticates as it with a TokenRequest token.
async fn service_account_kubeconfig(client: &Client, rbac: &Rbac) -> PathBuf {
    let sa = format!(
        "controller-manager-{:06x}",
        rand::random::<u32>() & 0xff_ffff
    );
    apply(
        &Api::<Namespace>::all(client.clone()),
        &Namespace {
            metadata: meta(OPERATOR_NAMESPACE, None),
            ..Default::default()
        },
    )
    .await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    apply(
        &sas,
        &ServiceAccount {
            metadata: meta(&sa, Some(OPERATOR_NAMESPACE)),
            ..Default::default()
        },
    )
    .await;

    let role_name = format!("{sa}-manager");
    match rbac {
        Rbac::Cluster => {
            bind_cluster_role(client, &role_name, manager_rules(), &sa, OPERATOR_NAMESPACE).await
        }
        Rbac::Namespaces(namespaces) => {
            for ns in namespaces {
                bind_role(client, ns, &role_name, manager_rules(), &sa).await;
            }
        }
    }
    bind_role(
        client,
        OPERATOR_NAMESPACE,
        &format!("{sa}-leader-election"),
        leader_election_rules(),
        &sa,
    )
    .await;
    // As config/default: the operator may review who scrapes /metrics (--metrics-secure).
    let metrics_auth = format!("{sa}-metrics-auth");
    bind_cluster_role(
        client,
        &metrics_auth,
        rules_of("metrics_auth_role.yaml"),
        &sa,
        OPERATOR_NAMESPACE,
    )
    .await;

    let request = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 7200}
    });
    let response: serde_json::Value = sas
        .create_subresource("token", &sa, &PostParams::default(), &request)
        .await
        .expect("TokenRequest");
    let token = response["status"]["token"]
        .as_str()
        .expect("token in TokenRequest status");

    let admin = Kubeconfig::read_from(admin_kubeconfig()).unwrap();
    let cluster = admin.clusters[0].cluster.clone().unwrap();
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "local", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
            "certificate-authority": cluster.certificate_authority,
        }}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": sa}}],
    });
    let dir = cluster_dir().join("operators");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

/// The operator binary running as a subprocess. Killed when dropped.
pub struct Operator {
    child: Option<Child>,
    pub metrics_port: u16,
    pub health_port: u16,
    pub log: PathBuf,
    pub identity: String,
    kubeconfig: PathBuf,
}

impl Operator {
    pub async fn start(client: &Client, options: OperatorOptions) -> Operator {
        let kubeconfig = service_account_kubeconfig(client, &options.rbac).await;
        Self::start_with(&kubeconfig, &options).await
    }

    /// Starts another process with the same ServiceAccount as `other` (a second replica).
    pub async fn replica(other: &Operator, options: &OperatorOptions) -> Operator {
        Self::start_with(&other.kubeconfig, options).await
    }

    async fn start_with(kubeconfig: &Path, options: &OperatorOptions) -> Operator {
        let (metrics_port, health_port) = (free_port(), free_port());
        let identity = format!("operator-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let log = kubeconfig.with_file_name(format!("{identity}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memcached-operator"));
        cmd.arg(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{health_port}"
            ))
            .arg(format!("--identity={identity}"))
            .args(&options.extra_args)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,memcached_operator=debug")
            .envs(options.env.iter().cloned())
            .env_remove("WATCH_NAMESPACE")
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .kill_on_drop(true);
        if let Some(ns) = &options.watch_namespace {
            cmd.env("WATCH_NAMESPACE", ns);
        }
        if options.leader_elect {
            cmd.arg("--leader-elect")
                .arg(format!("--leader-election-namespace={OPERATOR_NAMESPACE}"))
                .arg(format!("--leader-election-id={}", options.lease));
        }
        let child = cmd.spawn().expect("operator starts");
        let op = Operator {
            child: Some(child),
            metrics_port,
            health_port,
            log,
            identity,
            kubeconfig: kubeconfig.into(),
        };
        wait_for("operator /healthz", Duration::from_secs(20), || async {
            op.get_health("/healthz").await.filter(|s| *s == 200)
        })
        .await;
        op
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().and_then(|c| c.id()).expect("running") as i32
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit and returns its exit code.
    pub async fn wait(&mut self) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("operator exits")
            .unwrap();
        status.code()
    }

    async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((status, body))
    }

    pub async fn get_health(&self, path: &str) -> Option<u16> {
        Self::http_get(self.health_port, path).await.map(|(s, _)| s)
    }

    pub async fn metrics(&self) -> String {
        let (status, body) = Self::http_get(self.metrics_port, "/metrics")
            .await
            .expect("/metrics answers");
        assert_eq!(status, 200);
        body
    }

    /// The value of one metric series, by its exact name and labels as rendered.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    pub async fn is_leader(&self, lease: &str) -> bool {
        self.metric(&format!(
            "leader_election_master_status{{name=\"{lease}\"}}"
        ))
        .await
            == 1.0
    }

    pub async fn reconciles(&self) -> f64 {
        self.metric(
            r#"controller_runtime_reconcile_total{controller="memcached",result="success"}"#,
        )
        .await
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
