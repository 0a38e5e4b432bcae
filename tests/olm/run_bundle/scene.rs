//! What every phase uses: the release facts, the cluster as the admin, operator-sdk, the
//! registry and its images, the figures; and what the phases ask of the cluster.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator_testkit::memcached::Connection;
use serde_json::Value;

use super::{MEMCACHED_PODS, NS, OPERATOR_POD, PACKAGE, PREFIX};
use crate::availability::{Sampler, Watched};
use crate::harness;
use crate::members::{self, KeptBy, Update};
use crate::olm::{resource, str_field};
use crate::scripts::{Registry, env_lines, hack, olm_versions, run, stdout_of, tool};

// ---------------------------------------------------------------- the release facts

/// What bundle/'s CSV, catalog/ and the sample say.
pub struct Release {
    pub csv_name: String,
    pub version: String,
    pub prev_csv: String,
    pub prev_version: String,
    pub sample: String,
    pub sample_size: usize,
}

impl Release {
    pub fn read(root: &Path) -> Release {
        let yaml = |path: &str| -> Value {
            let path = root.join(path);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let csv = yaml(&format!(
            "bundle/manifests/{PACKAGE}.clusterserviceversion.yaml"
        ));
        let sample = yaml("config/samples/cache_v1alpha1_memcached.yaml");
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let csv_name = s(&csv["metadata"]["name"]);
        let prev_csv = crate::scripts::upgraded_from(PACKAGE, &csv);
        assert!(
            root.join(format!("catalog/{PACKAGE}/{prev_csv}.yaml"))
                .is_file(),
            "{csv_name} upgrades from no release kept in catalog/{PACKAGE}"
        );
        Release {
            version: s(&csv["spec"]["version"]),
            prev_version: prev_csv
                .strip_prefix(&format!("{PACKAGE}.v"))
                .unwrap()
                .to_string(),
            csv_name,
            prev_csv,
            sample: s(&sample["metadata"]["name"]),
            sample_size: sample["spec"]["size"].as_u64().expect("the sample's size") as usize,
        }
    }

    /// The next patch version: 0.2.0 -> 0.2.1.
    pub fn patch_version(&self) -> String {
        let (minor, patch) = self.version.rsplit_once('.').unwrap();
        format!("{minor}.{}", patch.parse::<u32>().unwrap() + 1)
    }
}

/// An image reference without its registry host: `memcached-operator:0.1.0`.
pub fn short(reference: &str) -> &str {
    reference.rsplit_once('/').map_or(reference, |(_, s)| s)
}

/// An image reference's tag.
pub fn tag(reference: &str) -> &str {
    reference.rsplit_once(':').unwrap().1
}

/// `operator-sdk run bundle-upgrade` has no flag for its registry pod's decompression image:
/// the `DefaultInitImage` of operator-sdk's source (its Go module at `version`).
pub fn sdk_decompression_image(version: &str) -> String {
    let cache = std::env::var_os("MEMCACHED_OPERATOR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/memcached-operator")
        })
        .join("bin");
    let go = std::env::var("GO").unwrap_or_else(|_| "go".into());
    let module = stdout_of(
        std::process::Command::new(go)
            .args(["mod", "download", "-json"])
            .arg(format!(
                "github.com/operator-framework/operator-sdk@{version}"
            ))
            .env("GOFLAGS", "")
            .current_dir(cache),
    );
    let module: Value = serde_json::from_str(&module).unwrap();
    let source = Path::new(module["Dir"].as_str().expect("go mod download -json: Dir"))
        .join("internal/olm/fbcutil/util.go");
    let text =
        std::fs::read_to_string(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("DefaultInitImage = \"")
                .and_then(|rest| rest.strip_suffix('"'))
        })
        .unwrap_or_else(|| {
            panic!(
                "operator-sdk's DefaultInitImage not found in {}",
                source.display()
            )
        })
        .to_string()
}

// ---------------------------------------------------------------- figures and operator-sdk

/// Figures, printed and kept in a file.
pub struct Figures(pub PathBuf);

impl Figures {
    pub fn print(&self, text: impl AsRef<str>) {
        let line = format!("FIGURE  {}", text.as_ref());
        println!("{line}");
        if let Ok(mut f) = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.0)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

pub fn secs(since: Instant) -> String {
    format!("{:.1}", since.elapsed().as_secs_f64())
}

/// Polls `check` until it holds; panics after `timeout` naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    harness::wait_for(what, timeout, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

// ---------------------------------------------------------------- keys in the members

/// Keys written over the members (Scene::write_keys): each member's pod, its address and the
/// indices of the keys it was given.
pub struct Keys {
    prefix: String,
    members: Vec<(String, SocketAddr, Vec<usize>)>,
}

impl Keys {
    pub fn len(&self) -> usize {
        self.members.iter().map(|m| m.2.len()).sum()
    }

    /// Reads every key back from the member it was written to, at the same address (a member
    /// restarted in place keeps its pod's address), on a new connection: pod -> (found, written).
    /// A member that does not answer has none found; a value other than the one written is not
    /// found either.
    pub async fn read_back(&self) -> BTreeMap<String, (usize, usize)> {
        let mut found = BTreeMap::new();
        for (pod, addr, written) in &self.members {
            let mut hits = 0;
            if let Ok(mut conn) = Connection::connect(*addr).await {
                for i in written {
                    match conn.get(&format!("{}-{i}", self.prefix)).await {
                        Ok(Some(value)) if value == format!("v{i}") => hits += 1,
                        Ok(_) => {}
                        Err(e) => {
                            eprintln!("{pod} ({addr}): {e:#}");
                            break;
                        }
                    }
                }
            }
            found.insert(pod.clone(), (hits, written.len()));
        }
        found
    }
}

// ---------------------------------------------------------------- the scene

/// The registry's references of every image the test runs.
pub struct Images {
    pub operator_prev: String,
    pub operator: String,
    pub memcached: String,
    pub exporter: String,
    pub opm: String,
    pub olm_util: String,
    pub busybox: String,
    pub bundle_prev: String,
    pub bundle: String,
    pub catalog: String,
    /// `run bundle-upgrade`'s hard-coded decompression image (served as busybox).
    pub decompression: String,
    /// Archives of `hack/images.sh --print-env`, for the patch release's push.
    pub operator_archive: String,
}

/// What every phase uses: the cluster as the admin, the tools, the registry and its images.
pub struct Scene {
    pub client: Client,
    pub root: PathBuf,
    pub cluster_dir: PathBuf,
    pub work: PathBuf,
    pub logs: PathBuf,
    pub node: String,
    pub timeout: Duration,
    pub sdk: PathBuf,
    pub release: Release,
    pub registry: Registry,
    pub images: Images,
    pub figures: Figures,
}

impl Scene {
    pub fn ca(&self) -> &Path {
        self.registry.ca.as_deref().unwrap()
    }

    /// `hack/SCRIPT` with what operator-sdk and opm need to trust the registry.
    pub fn hack(&self, script: &str) -> std::process::Command {
        let mut command = hack(script);
        command
            .env("SSL_CERT_FILE", self.ca())
            .env("OPERATOR_SDK", &self.sdk);
        command
    }

    /// Runs `operator-sdk ARGS` in the work directory as the admin; its output appended to
    /// `logs/run-bundle-operator-sdk.log`. Panics naming `what` unless it succeeds.
    pub async fn sdk(&self, what: &str, args: &[&str]) {
        let log = self.logs.join(format!("{PREFIX}-operator-sdk.log"));
        let mut file = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writeln!(file, "$ operator-sdk {}", args.join(" ")).unwrap();
        let out = tokio::process::Command::new(&self.sdk)
            .args(args)
            .current_dir(&self.work)
            .env("KUBECONFIG", harness::cluster().kubeconfig())
            .env("SSL_CERT_FILE", self.ca())
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", self.sdk.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        file.write_all(text.as_bytes()).unwrap();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        assert!(
            out.status.success(),
            "{what}: operator-sdk {} {}:\n{}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }

    /// Builds the image of `dir`/bundle.Dockerfile (`hack/olm/images.sh bundle`, `dir` its
    /// context) and pushes it as `reference`.
    pub fn push_bundle_image(&self, dir: &Path, reference: &str) {
        let archive = self.archive(reference);
        run(self
            .hack("olm/images.sh")
            .arg("bundle")
            .arg(dir)
            .arg(&archive)
            .arg(tag(reference)));
        self.registry.push(&archive, reference);
    }

    /// Builds the image of catalog.Dockerfile (`hack/olm/images.sh catalog`) and pushes it as
    /// `reference`.
    pub fn push_catalog_image(&self, reference: &str) {
        let archive = self.archive(reference);
        run(self
            .hack("olm/images.sh")
            .arg("catalog")
            .arg(&archive)
            .arg(tag(reference)));
        self.registry.push(&archive, reference);
    }

    /// Where the image `reference` is built to.
    fn archive(&self, reference: &str) -> PathBuf {
        self.work
            .join(format!("{}.tar", short(reference).replace(':', "-")))
    }

    pub fn api(&self, kind: &str, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &resource(kind))
    }

    pub async fn get(&self, kind: &str, ns: &str, name: &str) -> Option<DynamicObject> {
        self.api(kind, ns).get(name).await.ok()
    }

    pub async fn names(&self, kind: &str, ns: &str) -> Vec<String> {
        self.api(kind, ns)
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().map(|o| o.name_any()).collect())
            .unwrap_or_else(|e| vec![format!("(list failed: {e})")])
    }

    pub async fn csv_phase(&self, csv: &str) -> String {
        match self.get("ClusterServiceVersion", NS, csv).await {
            Some(c) => str_field(&c, &["status", "phase"]),
            None => String::new(),
        }
    }

    pub async fn csv_gone(&self, csv: &str) -> bool {
        matches!(
            self.api("ClusterServiceVersion", NS).get_opt(csv).await,
            Ok(None)
        )
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn memcacheds(&self) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn namespace(&self, name: &str) {
        harness::namespace_named(&self.client, name).await;
    }

    /// The operator's one pod: Running and Ready on the real node, from `image` (by tag or
    /// digest) as pulled from the registry (its imageID the registry's digest).
    /// The operator's Deployment runs `replicas` pods on the node, Running and Ready from
    /// `image`, and no other (the previous release ran one, this one runs two).
    pub async fn operator_pods_run(&self, image: &str, replicas: usize) -> bool {
        let repo = match image.split_once('@') {
            Some((repo, _)) => repo,
            None => image.rsplit_once(':').unwrap().0,
        };
        let Ok(pods) = self
            .pods()
            .list(&ListParams::default().labels(OPERATOR_POD))
            .await
        else {
            return false;
        };
        pods.items.len() == replicas
            && pods.items.iter().all(|pod| {
                let (Some(spec), Some(status)) = (&pod.spec, &pod.status) else {
                    return false;
                };
                let manager = status
                    .container_statuses
                    .iter()
                    .flatten()
                    .find(|c| c.name == "manager");
                spec.node_name.as_deref() == Some(self.node.as_str())
                    && status.phase.as_deref() == Some("Running")
                    && pod.metadata.deletion_timestamp.is_none()
                    && spec.containers[0].image.as_deref() == Some(image)
                    && manager.is_some_and(|c| {
                        c.ready && c.image_id.starts_with(&format!("{repo}@sha256:"))
                    })
            })
    }

    pub async fn memcached_available(&self) -> bool {
        self.memcacheds()
            .get(&self.release.sample)
            .await
            .is_ok_and(|mc| harness::condition(&mc, "Available").is_some_and(|c| c.0 == "True"))
    }

    pub async fn memcached_uid(&self) -> String {
        self.memcacheds()
            .get(&self.release.sample)
            .await
            .ok()
            .and_then(|mc| mc.uid())
            .unwrap_or_default()
    }

    /// Every memcached pod, those terminating included.
    pub async fn memcached_pods(&self) -> Vec<Pod> {
        self.pods()
            .list(&ListParams::default().labels(MEMCACHED_PODS))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// `n` memcached pods not terminating, all Ready on the real node.
    pub async fn memcached_pods_ready(&self, n: usize) -> bool {
        let pods = self.memcached_pods().await;
        let live: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        live.len() == n
            && live.iter().all(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
                    && harness::pod_is_ready(p)
            })
    }

    pub fn stateful_sets(&self) -> Api<StatefulSet> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The sample's StatefulSet (today's workload), if there is one.
    pub async fn stateful_set(&self) -> Option<StatefulSet> {
        self.stateful_sets().get(&self.release.sample).await.ok()
    }

    /// The sample's ControllerRevisions (its StatefulSet's, or the operator's own).
    pub async fn revisions(&self) -> Vec<ControllerRevision> {
        let selector = format!("app.kubernetes.io/instance={}", self.release.sample);
        Api::<ControllerRevision>::namespaced(self.client.clone(), NS)
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// The memcached image of the sample's members' template: its StatefulSet's, or where the
    /// operator keeps the members itself, the one its first member runs (since 0.9.0 no
    /// revision object keeps the template: each member records what an update compares).
    pub async fn memcached_image(&self) -> String {
        match self.stateful_set().await {
            Some(sts) => serde_json::to_value(sts.spec.map(|s| s.template))
                .unwrap_or_default()
                .pointer("/spec/containers/0/image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            None => self
                .memcached_pods()
                .await
                .first()
                .and_then(|p| members::image(p, "memcached"))
                .unwrap_or_default(),
        }
    }

    /// What the sample still lacks of having every member updated to its template as `update`
    /// says, kept by the operator itself since the upgrade (members::update_missing: no
    /// StatefulSet, ControllerRevisions of the Memcached's only, its pods exactly the members,
    /// the Memcached's, of the revision with the agent from `agent_image`, ...), all of them
    /// Ready on the real node. Empty: done.
    pub async fn update_missing(&self, update: &Update<'_>, agent_image: &str) -> Vec<String> {
        let (name, size) = (&self.release.sample, self.release.sample_size);
        let Ok(mc) = self.memcacheds().get(name).await else {
            return vec![format!("Memcached {name} not found")];
        };
        let sts = self.stateful_set().await;
        let pods = self.memcached_pods().await;
        let mut missing = members::update_missing(
            &mc,
            (sts.as_ref(), &self.revisions().await),
            &pods,
            &KeptBy::Operator,
            update,
            agent_image,
        );
        if !self.memcached_pods_ready(size).await {
            missing.push(format!("not {size} pods Ready on {}", self.node));
        }
        missing
    }

    /// The events regarding the sample: `reason` -> the pods they relate to, by time.
    pub async fn member_events(&self, reason: &str) -> Vec<(String, Timestamp)> {
        members::member_events(&self.client, NS, &self.release.sample, reason).await
    }

    /// The sample's `rollout.minReadySeconds` (5 unless set).
    pub async fn min_ready_seconds(&self) -> i32 {
        self.memcacheds()
            .get(&self.release.sample)
            .await
            .ok()
            .and_then(|mc| mc.spec.rollout)
            .map_or(5, |r| r.min_ready_seconds)
    }

    /// memcached's text protocol from the host to each memcached pod not terminating: stores
    /// `key` = `value` in every one.
    pub async fn set_in_every_pod(&self, key: &str, value: &str) -> Result<(), String> {
        for (pod, addr) in self.memcached_addresses().await? {
            let mut conn = Connection::connect(addr)
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
            conn.set(key, value.as_bytes())
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
        }
        Ok(())
    }

    /// Reads `key` back from every memcached pod not terminating: `value` in each.
    pub async fn get_from_every_pod(&self, key: &str, value: &str) -> Result<(), String> {
        for (pod, addr) in self.memcached_addresses().await? {
            let mut conn = Connection::connect(addr)
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
            let got = conn
                .get(key)
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
            if got.as_deref() != Some(value) {
                return Err(format!("{pod} ({addr}): get {key} answered {got:?}"));
            }
        }
        Ok(())
    }

    /// Stores `n` small keys `<prefix>-<i>` (value `v<i>`) over the memcached pods not
    /// terminating, key `i` in the `i % members`-th by name, each at its pod's address through
    /// memcached's text protocol: what was written where.
    pub async fn write_keys(&self, prefix: &str, n: usize) -> Result<Keys, String> {
        let addresses = self.memcached_addresses().await?;
        let mut keys = Keys {
            prefix: prefix.into(),
            members: vec![],
        };
        let mut connections = vec![];
        for (pod, addr) in &addresses {
            let conn = Connection::connect(*addr)
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
            connections.push(conn);
            keys.members.push((pod.clone(), *addr, vec![]));
        }
        let count = keys.members.len();
        for i in 0..n {
            let (pod, addr, written) = &mut keys.members[i % count];
            connections[i % count]
                .set(&format!("{prefix}-{i}"), format!("v{i}").as_bytes())
                .await
                .map_err(|e| format!("{pod} ({addr}): {e:#}"))?;
            written.push(i);
        }
        Ok(keys)
    }

    pub async fn memcached_addresses(&self) -> Result<Vec<(String, SocketAddr)>, String> {
        let pods = self.memcached_pods().await;
        let live: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.is_empty() {
            return Err("no memcached pod".into());
        }
        live.iter()
            .map(|p| {
                let ip = p
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.as_deref())
                    .and_then(|ip| ip.parse().ok())
                    .ok_or_else(|| format!("{} has no IP", p.name_any()))?;
                Ok((p.name_any(), SocketAddr::new(ip, 11211)))
            })
            .collect()
    }

    pub fn sampler(&self, name: &str) -> Sampler {
        let watched = Watched {
            namespace: NS.into(),
            names: vec![self.release.sample.clone()],
            pods: Some(MEMCACHED_PODS.into()),
        };
        Sampler::start(
            self.client.clone(),
            vec![watched],
            self.logs.join(format!("{PREFIX}-{name}.log")),
        )
    }

    /// On a failure: what OLM and the test namespace hold.
    /// Also the nodes' taints (a pod left Pending), the namespace's Warning events (a failed
    /// preStop hook, say) and the last lines of each member's previous containers (memcached's
    /// and the agent's, before their last restart: how a save went).
    pub fn diagnostics(&self) {
        eprintln!("diagnostics:");
        let mut all: Vec<Vec<String>> = [
            &["get", "catalogsource,subscription,installplan,csv", "-A"][..],
            &[
                "get",
                "nodes",
                "-o",
                "custom-columns=NAME:.metadata.name,TAINTS:.spec.taints",
            ][..],
            &[
                "get",
                "deployment,replicaset,statefulset,pods,jobs",
                "-n",
                NS,
                "-o",
                "wide",
            ][..],
            &[
                "get",
                "events",
                "-n",
                NS,
                "--field-selector=type=Warning",
                "--sort-by=.lastTimestamp",
            ][..],
        ]
        .iter()
        .map(|args| args.iter().map(|a| a.to_string()).collect())
        .collect();
        for i in 0..self.release.sample_size {
            for container in ["memcached", "agent"] {
                all.push(
                    [
                        "logs",
                        "-n",
                        NS,
                        &format!("{}-{i}", self.release.sample),
                        "-c",
                        container,
                        "--previous",
                        "--timestamps",
                        "--tail=25",
                    ]
                    .iter()
                    .map(|a| a.to_string())
                    .collect(),
                );
            }
        }
        for args in &all {
            let out = std::process::Command::new("kubectl")
                .args(["--request-timeout=20s"])
                .args(args)
                .env("KUBECONFIG", harness::cluster().kubeconfig())
                .output();
            if let Ok(out) = out {
                eprintln!(
                    "$ kubectl {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.diagnostics();
        }
    }
}

// ---------------------------------------------------------------- the set-up

impl Scene {
    /// The release facts, the tools, and the images of the operator, memcached, the exporter and
    /// OLM's tools pushed to a registry started here.
    pub fn set_up(client: Client) -> Scene {
        let root = memcached_operator_testkit::repo_root();
        let cluster_dir = harness::cluster().dir;
        let work = cluster_dir.join(PREFIX);
        let logs = cluster_dir.join("logs");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("work")).unwrap();
        std::fs::create_dir_all(&logs).unwrap();
        let figures = Figures(logs.join(format!("{PREFIX}-figures.txt")));
        let _ = std::fs::write(&figures.0, "");
        let timeout = Duration::from_secs(
            std::env::var("TIMEOUT")
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(240),
        );
        let release = Release::read(&root);
        let env = harness::cluster().env().expect("the cluster's env file");
        let node = env
            .get("REAL_NODE_NAME")
            .expect("the cluster has no real node: run with `make test-run-bundle`")
            .clone();

        // Tools and images (cached by the scripts).
        let sdk = tool("OPERATOR_SDK", "operator-sdk");
        run(hack("images.sh").arg("build"));
        run(hack("images.sh").arg("operator"));
        let host_images = env_lines(&stdout_of(hack("images.sh").arg("--print-env")));
        // The previous release's operator image, built from its own commit (its RBAC cannot run
        // today's operator).
        let prev_images: BTreeMap<String, String> = crate::previous_release::operator()
            .into_iter()
            .map(|(key, value)| (format!("PREV_{key}"), value))
            .collect();
        let olm_images = env_lines(&stdout_of(hack("olm/images.sh").arg("build")));
        let image = |key: &str| -> String {
            host_images
                .get(key)
                .or_else(|| olm_images.get(key))
                .or_else(|| prev_images.get(key))
                .unwrap_or_else(|| {
                    panic!(
                        "no {key} from hack/images.sh, hack/olm/images.sh or the previous release's"
                    )
                })
                .clone()
        };
        let decompression = sdk_decompression_image(&olm_versions()["OPERATOR_SDK_VERSION"]);

        // HTTPS: operator-sdk looks the index image up without its --use-http (plain HTTP refused).
        let registry = Registry::start(&work.join("registry"), true);
        let host = registry.host.clone();
        let (version, prev_version) = (release.version.clone(), release.prev_version.clone());
        let images = Images {
            operator_prev: format!("{host}/memcached-operator:{prev_version}"),
            operator: format!("{host}/memcached-operator:{version}"),
            memcached: format!("{host}/memcached:{}", tag(&image("MEMCACHED_IMAGE"))),
            exporter: format!(
                "{host}/memcached-exporter:{}",
                tag(&image("EXPORTER_IMAGE"))
            ),
            opm: format!("{host}/{}", image("OPM_IMAGE")),
            olm_util: format!("{host}/{}", image("OLM_UTIL_IMAGE")),
            busybox: format!("{host}/{}", image("BUSYBOX_IMAGE")),
            bundle_prev: format!("{host}/{PACKAGE}-bundle:v{prev_version}"),
            bundle: format!("{host}/{PACKAGE}-bundle:v{version}"),
            catalog: format!("{host}/{PACKAGE}-catalog:v{version}"),
            decompression: decompression.clone(),
            operator_archive: image("OPERATOR_ARCHIVE"),
        };
        // Each release's own operator image.
        for (archive, reference) in [
            ("PREV_OPERATOR_ARCHIVE", images.operator_prev.clone()),
            ("OPERATOR_ARCHIVE", images.operator.clone()),
            ("MEMCACHED_ARCHIVE", images.memcached.clone()),
            ("EXPORTER_ARCHIVE", images.exporter.clone()),
            ("OPM_ARCHIVE", images.opm.clone()),
            ("OLM_UTIL_ARCHIVE", images.olm_util.clone()),
            (
                "SCORECARD_TEST_ARCHIVE",
                format!("{host}/{}", image("SCORECARD_TEST_IMAGE")),
            ),
            ("BUSYBOX_ARCHIVE", images.busybox.clone()),
            // The registry pod of `run bundle-upgrade` needs sh, cat and gzip: busybox.
            (
                "BUSYBOX_ARCHIVE",
                format!("{host}/{}", decompression.split_once('/').unwrap().1),
            ),
        ] {
            registry.push(image(archive), &reference);
        }

        Scene {
            client,
            root,
            cluster_dir,
            work: work.join("work"),
            logs,
            node,
            timeout,
            sdk,
            release,
            registry,
            images,
            figures,
        }
    }
}
