//! Test ground for the end-to-end suite: the local control plane started by `hack/e2e.sh`, the
//! operator run as a real subprocess authenticated as its own ServiceAccount, and waiting helpers.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use memcached_operator::api::{Memcached, MemcachedSpec};
use memcached_operator_testkit::operator::ENDPOINT_ARGS;
use memcached_operator_testkit::operator::Supervised;
use memcached_operator_testkit::{Launch, LocalCluster, OperatorProcess};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use memcached_operator::config::OPERATOR_NAMESPACE;
const FIELD_MANAGER: &str = "e2e";

/// The cluster `hack/e2e.sh` started (E2E_CLUSTER_DIR).
pub fn cluster() -> LocalCluster {
    let dir = std::env::var("E2E_CLUSTER_DIR").expect(
        "E2E_CLUSTER_DIR is not set: run the end-to-end suite with `make test-e2e`, which starts the local control plane",
    );
    LocalCluster::at(dir)
}

/// A client with the cluster admin's credentials (the test's own, not the operator's).
pub async fn admin() -> Client {
    let client = cluster().admin().await.expect("admin client");
    install_crd(&client).await;
    client
}

/// Applies the committed CRD (what `make install` applies) and waits until it is served.
async fn install_crd(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/crd/bases/cache.example.com_memcacheds.yaml");
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
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
    namespace_named(client, &name).await;
    name
}

/// The namespace `name`, applied (so it may exist already).
pub async fn namespace_named(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    apply(&Api::<Namespace>::all(client.clone()), &ns).await;
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

/// Polls until `api` has no object `name`, or panics after `timeout` naming `what`.
pub async fn wait_gone<K>(what: &str, timeout: Duration, api: &Api<K>, name: &str)
where
    K: Clone + DeserializeOwned + Debug,
{
    wait_for(what, timeout, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
}

/// Runs kubectl against the local control plane as the admin; returns (success, stdout+stderr).
pub async fn kubectl(args: &[&str]) -> (bool, String) {
    cluster().kubectl(args).await
}

/// The permissions the operator is given, taken from config/rbac so the shipped RBAC is what
/// the tests exercise.
pub enum Rbac {
    /// ClusterRole manager-role bound cluster-wide (AllNamespaces install).
    Cluster,
    /// The same rules as a Role in each listed namespace (OwnNamespace/SingleNamespace/MultiNamespace).
    Namespaces(Vec<String>),
    /// These rules, bound cluster-wide (e.g. the shipped ones less one).
    ClusterRules(Vec<PolicyRule>),
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

impl OperatorOptions {
    /// The defaults, watching only `ns`.
    pub fn watching(ns: &str) -> Self {
        OperatorOptions {
            watch_namespace: Some(ns.into()),
            ..Default::default()
        }
    }

    /// How the suite starts the operator binary as `identity` with these options.
    fn launch(&self, kubeconfig: &Path, identity: &str) -> Launch {
        let mut command = format!(
            "{} {ENDPOINT_ARGS}",
            env!("CARGO_BIN_EXE_memcached-operator")
        );
        for arg in &self.extra_args {
            command += &format!(" {arg}");
        }
        if self.leader_elect {
            command += &format!(
                " --leader-elect --leader-election-namespace={OPERATOR_NAMESPACE} --leader-election-id={}",
                self.lease
            );
        }
        let mut env = vec![("RUST_LOG".into(), "info,memcached_operator=debug".into())];
        env.extend(self.env.iter().cloned());
        if let Some(ns) = &self.watch_namespace {
            env.push(("WATCH_NAMESPACE".into(), ns.clone()));
        }
        Launch {
            command,
            identity: identity.into(),
            kubeconfig: kubeconfig.into(),
            log_dir: kubeconfig.parent().unwrap().into(),
            env,
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
    let role: ClusterRole = serde_saphyr::from_str(&text).unwrap();
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
    bind_existing_cluster_role(client, name, name, sa, sa_ns).await;
}

/// A ClusterRoleBinding `binding` of the existing ClusterRole `role` to ServiceAccount `sa` in `sa_ns`.
pub async fn bind_existing_cluster_role(
    client: &Client,
    binding: &str,
    role: &str,
    sa: &str,
    sa_ns: &str,
) {
    let binding = ClusterRoleBinding {
        metadata: meta(binding, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
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
    let role: Role = serde_saphyr::from_str(&text).unwrap();
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
    namespace_named(client, OPERATOR_NAMESPACE).await;
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
        Rbac::ClusterRules(rules) => {
            bind_cluster_role(client, &role_name, rules.clone(), &sa, OPERATOR_NAMESPACE).await
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

    let dir = cluster().dir.join("operators");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{sa}.kubeconfig"));
    cluster()
        .service_account_kubeconfig(
            OPERATOR_NAMESPACE,
            &sa,
            &path,
            Duration::from_secs(2 * 3600),
        )
        .await
        .expect("ServiceAccount kubeconfig");
    path
}

/// The operator binary running as a subprocess with the suite's options. Killed when dropped.
pub struct Operator(OperatorProcess);

impl std::ops::Deref for Operator {
    type Target = OperatorProcess;
    fn deref(&self) -> &OperatorProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Operator {
    fn deref_mut(&mut self) -> &mut OperatorProcess {
        &mut self.0
    }
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
        let identity = format!("operator-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let op =
            OperatorProcess::spawn(options.launch(kubeconfig, &identity)).expect("operator starts");
        op.wait_health("/healthz", Duration::from_secs(20))
            .await
            .expect("operator /healthz");
        Operator(op)
    }

    /// An operator that is restarted whenever it exits, as a kubelet restarts its container:
    /// 10 s later (the kubelet's first crash-loop back-off), or OPERATOR_RESTART_SECONDS.
    pub async fn supervised(client: &Client, options: OperatorOptions) -> Supervised {
        let kubeconfig = service_account_kubeconfig(client, &options.rbac).await;
        let identity = format!("operator-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let delay = std::env::var("OPERATOR_RESTART_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10);
        Supervised::start(
            Duration::from_secs(delay),
            options.launch(&kubeconfig, &identity),
        )
        .expect("operator starts")
    }

    /// /metrics, which must answer.
    pub async fn metrics_text(&self) -> String {
        self.0.metrics().await.expect("/metrics answers 200")
    }

    /// Asserts that no reconcile has failed, naming each failure's object and error if one did.
    pub async fn assert_no_failed_reconciles(&self) {
        let text = self.metrics_text().await;
        let failures: Vec<String> = self
            .0
            .log_text()
            .lines()
            .filter(|line| line.contains("reconcile failed"))
            .map(str::to_string)
            .collect();
        assert!(
            text.contains(r#"controller_runtime_reconcile_errors_total{controller="memcached"} 0"#),
            "reconciles failed:\n{}",
            failures.join("\n")
        );
    }
}

// ---------------------------------------------------------------- Memcacheds

pub const CONVERGE: Duration = Duration::from_secs(60);

pub fn memcached(name: &str, size: i32) -> Memcached {
    let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({ "size": size })).unwrap();
    Memcached::new(name, spec)
}

pub async fn create(client: &Client, ns: &str, mc: &Memcached) -> Memcached {
    Api::<Memcached>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), mc)
        .await
        .expect("create Memcached")
}

pub async fn set_size(client: &Client, ns: &str, name: &str, size: i32) {
    let patch = serde_json::json!({"spec": {"size": size}});
    Api::<Memcached>::namespaced(client.clone(), ns)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patch size");
}

pub fn condition(mc: &Memcached, type_: &str) -> Option<(String, String)> {
    mc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits until the Memcached reports `size` ready pods, Available=True, for the current
/// generation, and its status.nodes are exactly the Running pods. Returns the pod names.
pub async fn wait_converged(client: &Client, ns: &str, name: &str, size: i32) -> Vec<String> {
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("app.kubernetes.io/name=memcached,app.kubernetes.io/instance={name}");
    wait_for(
        &format!("{ns}/{name} converged at size {size}"),
        CONVERGE,
        || async {
            let mc = mcs.get(name).await.ok()?;
            let status = mc.status.as_ref()?;
            let available = condition(&mc, "Available")? == ("True".into(), "AllPodsReady".into());
            if !available
                || status.ready_replicas != size
                || status.observed_generation != mc.metadata.generation
            {
                return None;
            }
            let mut running: Vec<String> = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .map(|p| p.name_any())
                .collect();
            running.sort();
            (status.nodes == running && running.len() == size as usize).then_some(running)
        },
    )
    .await
}

/// The Memcached's member pods, by name: those of its instance label not being deleted.
pub async fn member_pods(client: &Client, ns: &str, name: &str) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/name=memcached,app.kubernetes.io/instance={name}");
    let mut pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    pods
}

/// Whether the node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the pod's Ready condition is True.
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The events regarding the object `name` in `ns`.
pub async fn events_for(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// The events regarding the object `name` in `ns` for `reason`.
pub async fn events_with_reason(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    let mut events = events_for(client, ns, name).await;
    events.retain(|e| e.reason.as_deref() == Some(reason));
    events
}

/// Waits until Memcached `name` reports Degraded=True for `reason`; its message.
pub async fn wait_degraded(
    mcs: &Api<Memcached>,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> String {
    wait_degraded_saying(mcs, name, reason, "", timeout).await
}

/// Waits until Memcached `name` reports Degraded=True for `reason` with a message that contains
/// `part` (a cause replaced by another of the same reason); its message.
pub async fn wait_degraded_saying(
    mcs: &Api<Memcached>,
    name: &str,
    reason: &str,
    part: &str,
    timeout: Duration,
) -> String {
    wait_for(
        &format!("Degraded=True {reason} {part}"),
        timeout,
        || async {
            let c = mcs
                .get(name)
                .await
                .ok()?
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Degraded")?;
            (c.status == "True" && c.reason == reason && c.message.contains(part))
                .then_some(c.message)
        },
    )
    .await
}

/// Waits until Memcached `name` reports Degraded=False.
pub async fn wait_not_degraded(mcs: &Api<Memcached>, name: &str, timeout: Duration) {
    wait_for("Degraded=False", timeout, || async {
        let mc = mcs.get(name).await.ok()?;
        (condition(&mc, "Degraded")?.0 == "False").then_some(())
    })
    .await
}
