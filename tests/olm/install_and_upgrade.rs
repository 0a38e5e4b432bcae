//! Install and upgrade through real OLM on the embedded local control plane (`make test-olm`,
//! which runs `SUITE=olm hack/e2e.sh install_and_upgrade`): the operator installed, then upgraded
//! along the catalog's upgrade graph, the way OperatorHub users receive a release, but without
//! images or a container runtime:
//!   - `hack/cluster.sh up` (by hack/e2e.sh): etcd, kube-apiserver, controller-manager,
//!     scheduler, kwok (fake nodes);
//!   - OLM's CRDs (the module's deploy/chart/crds) and OLM's own `olm` and `catalog` operators as
//!     processes against it, built from the OLM module (`OLM_DIR`, `hack/olm/build-tools.sh
//!     --path olm`);
//!   - `opm serve` (`OPM`) on 127.0.0.1 of a file-based catalog (its bundles carry their objects
//!     inline, so no bundle image and no unpack Job are needed), a grpc CatalogSource
//!     (spec.address).
//!
//! Phase 1, the previous release: the catalog as it was when PREVIOUS_RELEASE was released (a
//! release bundle/'s CSV `replaces`, or skips to through its `olm.skipRange`) is served. Two OwnNamespace installs of it: NS by an Automatic
//! Subscription, NS_MANUAL by a Manual one (its InstallPlan approved by the test). Asserts the
//! InstallPlan, the CSV phase and the objects OLM creates; runs the previous release's own
//! operator binary (`PREV_OPERATOR_BIN`, else built from its commit by its own hack/images.sh:
//! previous_release.rs) as each CSV's Deployment would (below) and creates Memcacheds, which it
//! runs as StatefulSets (`updateStrategy: OnDelete`, the operator updating the members itself)
//! of members with memcached's memory file and the agent from its own image (its CSV's
//! `RELATED_IMAGE_AGENT`), plus one in NS_OTHER that no OperatorGroup targets.
//! Phase 2, the upgrade: catalog/ (all releases) is served in its place on the same address. NS
//! upgrades by itself; NS_MANUAL gets an InstallPlan that waits for approval until the test
//! approves it; each namespace's operator process is then today's binary (`OPERATOR_BIN`).
//! Asserts: the new CSV Succeeds and replaces the old one (which is removed); the new operator
//! adopts the members of each Memcached's StatefulSet as they run (the StatefulSet deleted, its
//! pods the Memcached's, its ControllerRevisions the Memcached's own), then updates them; the
//! pod template changes in the agent's image only as the operator compares templates
//! (the operator's own, the new CSV's `RELATED_IMAGE_AGENT`), so each member is updated in place:
//! the same pod (name and uid), its
//! agent restarted once on the new image, memcached not restarted (its restart count unchanged),
//! one at a time, about `minReadySeconds` or more apart (its `Restarted` events), none evicted;
//! every Memcached stays Available throughout (polled every second; its Progressing reason says
//! `RestartingInPlace`, never `ReplacingMembers`) with at most one member out of service and
//! never a pod over its size; no Memcached is lost (same UIDs); it ends with `size` Ready pods
//! `<name>-0 … <name>-N-1` of the update revision, `status.servers` lists
//! `<name>-N.<name>.<ns>.svc:<port>`, and nothing in the namespace is orphaned. Then least
//! privilege: the new CSV's `permissions` (StatefulSets; pods patched, resized and evicted; pods
//! created and deleted and ControllerRevisions created and collected, new in it; Deployments only
//! list, watch and delete; the scale of Memcacheds patched and HorizontalPodAutoscalers listed
//! and watched, for autoscaling) apply in NS only (`kubectl auth can-i` as the operator's
//! ServiceAccount), and the operator reconciles a new Memcached in NS, keeping its members
//! itself: no StatefulSet, its pods the Memcached's, of its one ControllerRevision.
//! Phase 3: a fresh Subscription to the default channel installs the new release directly.
//! Phase 4: without the ServiceMonitor and PrometheusRule CRDs, OLM fails the InstallPlan of the
//! bundle, which holds one of each.
//!
//! kwok runs no containers (its pods are Ready at once), so the operator binary of each release
//! (`PREV_OPERATOR_BIN`, `OPERATOR_BIN`, default the debug build) runs as a process instead of
//! the pod, as the ServiceAccount OLM created, with the environment the pod gets
//! (WATCH_NAMESPACE from the pod's olm.targetNamespaces annotation, the Deployment's
//! RELATED_IMAGE_* values); when OLM rolls the Deployment to the new CSV, the process is replaced
//! by the new release's, like the pod. kwok restarts a container whose image is patched, counting
//! the restart and making the pod Ready anew (hack/templates/kwok-in-place-restart.yaml), as a
//! kubelet does, and would make an evicted member anew at once (its StatefulSet recreates it).
//!
//! Checks print `PASS`/`FAIL` lines and are reported together at the end ("N passed, N failed");
//! a check the rest depends on ends the test at once. Figures (upgrade and update durations, pods)
//! are printed as `FIGURE` lines and kept in `$E2E_CLUSTER_DIR/logs/olm-upgrade.txt`. Every process
//! started here is killed when the test ends, panicking or not. TIMEOUT: seconds per wait
//! (default 180). OLM's operators listen on :8080 (olm, health) and :8443 (catalog, health over
//! TLS): their ports are fixed upstream, so the test refuses to start when either is taken.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator_testkit::net::free_port;
use memcached_operator_testkit::{Launch, OperatorProcess};
use serde_json::{Value, json};

use crate::availability::{Sampler, Watched};
use crate::harness;
use crate::members::{self, KeptBy, Update, controller_uid};
use crate::olm::{self, CatalogOptions, Olm, Opm, field, resource, str_field, wait_until};
use crate::scripts::{path_env, tool};

const PACKAGE: &str = "memcached-operator";
const OLM_NS: &str = "olm";
const NS: &str = "memcached-olm-test";
const NS_MANUAL: &str = "memcached-olm-manual";
const NS_OTHER: &str = "memcached-olm-other";
const NS_FRESH: &str = "memcached-olm-fresh";
const NS_NO_CRDS: &str = "memcached-olm-no-monitoring";
const CATSRC: &str = "memcached-catalog";
/// The memcached pods (not the operator's): labels of src/resources.rs.
const MEMCACHED_PODS: &str =
    "app.kubernetes.io/part-of=memcached-operator,app.kubernetes.io/component=cache";
/// The second Memcached of each installed namespace, and the one created after the upgrade.
const SECOND: &str = "memcached-second";
const AFTER_UPGRADE: &str = "memcached-after-upgrade";
/// Log and file prefix.
const PREFIX: &str = "olm";

// ---------------------------------------------------------------- checks and figures

/// Checks counted as passed or failed, printed as they happen, reported together at the end.
struct Checks {
    passed: usize,
    failed: Vec<String>,
    figures: PathBuf,
    start: Instant,
}

impl Checks {
    fn check(&mut self, desc: impl Into<String>, ok: bool) -> bool {
        let desc = desc.into();
        if ok {
            self.passed += 1;
            println!("PASS  {desc}");
        } else {
            println!("FAIL  {desc}");
            self.failed.push(desc);
        }
        ok
    }

    /// A check the rest depends on: on failure, diagnostics and the end of the test.
    async fn require(&mut self, desc: impl Into<String>, ok: bool, env: &Env) {
        let desc = desc.into();
        if !self.check(desc.clone(), ok) {
            env.diagnostics().await;
            panic!(
                "{desc} failed: the checks after it would only time out\n{}",
                self.summary()
            );
        }
    }

    fn figure(&self, text: impl AsRef<str>) {
        let line = format!("FIGURE  {}", text.as_ref());
        println!("{line}");
        if let Ok(mut f) = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.figures)
        {
            let _ = writeln!(f, "{line}");
        }
    }

    fn summary(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.passed, self.failed.len());
        for f in &self.failed {
            s += &format!("\n  FAIL  {f}");
        }
        s
    }
}

fn secs(since: Instant) -> String {
    format!("{:.1}", since.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------- the release facts

/// What bundle/'s CSV and catalog/ say about the release under test and the one it replaces.
struct Release {
    csv_name: String,
    prev_csv: String,
    deployment: String,
    sa: String,
    image: String,
    default_channel: String,
    /// The CSV's first alm-example.
    sample: Value,
}

impl Release {
    fn read(root: &Path) -> Release {
        let csv_file = root.join(format!(
            "bundle/manifests/{PACKAGE}.clusterserviceversion.yaml"
        ));
        let csv: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&csv_file).unwrap()).unwrap();
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let dep = &csv["spec"]["install"]["spec"]["deployments"][0];
        let examples: Value = serde_json::from_str(
            csv["metadata"]["annotations"]["alm-examples"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let package = yaml_docs(&root.join(format!("catalog/{PACKAGE}/package.yaml")));
        let default_channel = package
            .iter()
            .find(|d| d["schema"].as_str() == Some("olm.package"))
            .map(|d| s(&d["defaultChannel"]))
            .unwrap_or_default();
        Release {
            csv_name: s(&csv["metadata"]["name"]),
            prev_csv: crate::scripts::upgraded_from(PACKAGE, &csv),
            deployment: s(&dep["name"]),
            sa: s(&dep["spec"]["template"]["spec"]["serviceAccountName"]),
            image: s(&dep["spec"]["template"]["spec"]["containers"][0]["image"]),
            default_channel,
            sample: examples[0].clone(),
        }
    }
}

fn yaml_docs(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.into_iter().filter(|v| !v.is_null()).collect()
}

fn write_yaml_docs(path: &Path, docs: &[serde_json::Value]) {
    let mut text = String::new();
    for doc in docs {
        text += "---\n";
        text += &serde_saphyr::to_string(doc).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// The catalog as `release.prev_csv` was released: catalog/ without the bundles of later
/// releases (and their channel entries), the default channel one that still has entries (the
/// one holding that release). Its directory and that channel.
fn previous_catalog(root: &Path, dir: &Path, release: &Release) -> (PathBuf, String) {
    let version = |csv: &str| {
        crate::scripts::version(
            csv.strip_prefix(&format!("{PACKAGE}.v"))
                .unwrap_or_default(),
        )
    };
    let later = |csv: &str| version(csv) > version(&release.prev_csv);
    let catalog = root.join("catalog").join(PACKAGE);
    let prev = dir.join("catalog-prev");
    let _ = std::fs::remove_dir_all(&prev);
    std::fs::create_dir_all(prev.join(PACKAGE)).unwrap();
    for entry in std::fs::read_dir(&catalog).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.starts_with(&format!("{PACKAGE}.v"))
            && name.ends_with(".yaml")
            && !later(name.trim_end_matches(".yaml"))
        {
            std::fs::copy(&path, prev.join(PACKAGE).join(&name)).unwrap();
        }
    }
    let mut channels = vec![];
    for mut ch in yaml_docs(&catalog.join("channels.yaml")) {
        if let Some(entries) = ch
            .get_mut("entries")
            .and_then(serde_json::Value::as_array_mut)
        {
            entries.retain(|e| !later(e["name"].as_str().unwrap_or_default()));
            if entries.is_empty() {
                continue;
            }
        }
        channels.push(ch);
    }
    write_yaml_docs(&prev.join(PACKAGE).join("channels.yaml"), &channels);
    let prev_channel = channels
        .iter()
        .find(|ch| {
            ch["entries"].as_array().is_some_and(|es| {
                es.iter()
                    .any(|e| e["name"].as_str() == Some(&release.prev_csv))
            })
        })
        .and_then(|ch| ch["name"].as_str())
        .unwrap_or_else(|| {
            panic!(
                "{} is in no channel of catalog/{PACKAGE}/channels.yaml",
                release.prev_csv
            )
        })
        .to_string();
    let mut package = yaml_docs(&catalog.join("package.yaml"));
    for doc in &mut package {
        if doc["schema"].as_str() == Some("olm.package") {
            doc["defaultChannel"] = serde_json::Value::String(prev_channel.clone());
        }
    }
    write_yaml_docs(&prev.join(PACKAGE).join("package.yaml"), &package);
    (prev, prev_channel)
}

// ---------------------------------------------------------------- the cluster, as the admin

/// name -> `value` of each object `api` lists with `params`; empty when the list fails.
async fn by_name<K, V>(
    api: Api<K>,
    params: ListParams,
    value: impl Fn(&K) -> V,
) -> BTreeMap<String, V>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&params)
        .await
        .map(|l| l.items.iter().map(|o| (o.name_any(), value(o))).collect())
        .unwrap_or_default()
}

/// An object's uid, empty when it has none.
fn uid<K: kube::Resource>(obj: &K) -> String {
    obj.uid().unwrap_or_default()
}

struct Env {
    client: Client,
    dir: PathBuf,
    release: Release,
    timeout: Duration,
    /// The previous release's operator (built from its own commit) and today's.
    prev_operator_bin: PathBuf,
    operator_bin: PathBuf,
    operators: HashMap<String, OperatorProcess>,
}

impl Env {
    fn api(&self, kind: &str, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &resource(kind))
    }

    async fn get(&self, kind: &str, ns: &str, name: &str) -> Option<DynamicObject> {
        self.api(kind, ns).get(name).await.ok()
    }

    /// Server-side applies a JSON object of one of the kinds of `resource`.
    async fn apply(&self, obj: Value) {
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        let kind = obj.types.as_ref().unwrap().kind.clone();
        let ns = obj.namespace().unwrap();
        harness::apply(&self.api(&kind, &ns), &obj).await;
    }

    async fn namespace(&self, name: &str) {
        harness::namespace_named(&self.client, name).await;
    }

    /// A namespace with an OwnNamespace OperatorGroup.
    async fn operator_group(&self, ns: &str) {
        self.namespace(ns).await;
        self.apply(json!({
            "apiVersion": "operators.coreos.com/v1",
            "kind": "OperatorGroup",
            "metadata": {"name": PACKAGE, "namespace": ns},
            "spec": {"targetNamespaces": [ns]},
        }))
        .await;
    }

    async fn subscription(&self, ns: &str, channel: &str, approval: &str, starting: Option<&str>) {
        let mut spec = json!({
            "name": PACKAGE,
            "channel": channel,
            "source": CATSRC,
            "sourceNamespace": OLM_NS,
            "installPlanApproval": approval,
        });
        if let Some(csv) = starting {
            spec["startingCSV"] = json!(csv);
        }
        self.apply(json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "Subscription",
            "metadata": {"name": PACKAGE, "namespace": ns},
            "spec": spec,
        }))
        .await;
    }

    async fn catalog_ready(&self) -> bool {
        self.get("CatalogSource", OLM_NS, CATSRC)
            .await
            .is_some_and(|c| {
                str_field(&c, &["status", "connectionState", "lastObservedState"]) == "READY"
            })
    }

    /// The Subscription's current InstallPlan (empty when none).
    async fn installplan(&self, ns: &str) -> String {
        match self.get("Subscription", ns, PACKAGE).await {
            Some(s) => str_field(&s, &["status", "installPlanRef", "name"]),
            None => String::new(),
        }
    }

    /// Waits for the Subscription's InstallPlan, one other than `old`; its name.
    async fn wait_installplan(&self, ns: &str, old: &str) -> Option<String> {
        let ok = wait_until(self.timeout, || async move {
            let ip = self.installplan(ns).await;
            !ip.is_empty() && ip != old
        })
        .await;
        if ok {
            Some(self.installplan(ns).await)
        } else {
            None
        }
    }

    async fn ip_phase(&self, ns: &str, ip: &str) -> String {
        match self.get("InstallPlan", ns, ip).await {
            Some(ip) => str_field(&ip, &["status", "phase"]),
            None => String::new(),
        }
    }

    async fn wait_ip_phase(&self, ns: &str, ip: &str, phase: &str) -> bool {
        wait_until(self.timeout, || async move {
            self.ip_phase(ns, ip).await == phase
        })
        .await
    }

    async fn ip_installs(&self, ns: &str, ip: &str, csv: &str) -> bool {
        self.get("InstallPlan", ns, ip).await.is_some_and(|ip| {
            field(&ip, &["spec", "clusterServiceVersionNames"])
                .and_then(Value::as_array)
                .is_some_and(|names| names.iter().any(|n| n.as_str() == Some(csv)))
        })
    }

    async fn ip_waits_for_approval(&self, ns: &str, ip: &str) -> bool {
        wait_until(self.timeout, || async move {
            self.get("InstallPlan", ns, ip).await.is_some_and(|ip| {
                str_field(&ip, &["status", "phase"]) == "RequiresApproval"
                    && field(&ip, &["spec", "approved"]) == Some(&json!(false))
            })
        })
        .await
    }

    async fn approve(&self, ns: &str, ip: &str) -> bool {
        self.api("InstallPlan", ns)
            .patch(
                ip,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"approved": true}})),
            )
            .await
            .is_ok()
    }

    async fn csv_phase(&self, ns: &str, csv: &str) -> String {
        match self.get("ClusterServiceVersion", ns, csv).await {
            Some(c) => str_field(&c, &["status", "phase"]),
            None => String::new(),
        }
    }

    async fn csv_succeeded(&self, ns: &str, csv: &str) -> bool {
        self.csv_phase(ns, csv).await == "Succeeded"
    }

    async fn wait_csv_succeeded(&self, ns: &str, csv: &str) -> bool {
        wait_until(
            self.timeout,
            || async move { self.csv_succeeded(ns, csv).await },
        )
        .await
    }

    async fn csv_gone(&self, ns: &str, csv: &str) -> bool {
        matches!(
            self.api("ClusterServiceVersion", ns).get_opt(csv).await,
            Ok(None)
        )
    }

    async fn deployment(&self, ns: &str) -> Option<Deployment> {
        Api::<Deployment>::namespaced(self.client.clone(), ns)
            .get(&self.release.deployment)
            .await
            .ok()
    }

    /// The operator Deployment's container env: name -> its value, or its fieldRef's path.
    async fn operator_envs(&self, ns: &str) -> BTreeMap<String, (String, String)> {
        let Some(d) = self.deployment(ns).await else {
            return Default::default();
        };
        let env = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.env)
            .unwrap_or_default();
        env.into_iter()
            .map(|e| {
                let path = e
                    .value_from
                    .and_then(|v| v.field_ref)
                    .map(|f| f.field_path)
                    .unwrap_or_default();
                (e.name, (e.value.unwrap_or_default(), path))
            })
            .collect()
    }

    /// The operator Deployment's container env var `name`: its value, or its fieldRef's path.
    async fn operator_env(&self, ns: &str, name: &str) -> (String, String) {
        self.operator_envs(ns)
            .await
            .remove(name)
            .unwrap_or_default()
    }

    /// olm.targetNamespaces of the (first) operator pod in `ns`.
    async fn pod_target_namespaces(&self, ns: &str) -> String {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels("control-plane=controller-manager"))
            .await;
        pods.ok()
            .and_then(|l| l.items.into_iter().next())
            .and_then(|p| p.annotations().get("olm.targetNamespaces").cloned())
            .unwrap_or_default()
    }

    /// Some object of the kind of `api` that OLM labelled as owned by `csv` exists.
    async fn owned<K>(&self, api: Api<K>, csv: &str) -> bool
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.list(&ListParams::default().labels(&format!("olm.owner={csv}")))
            .await
            .is_ok_and(|l| !l.items.is_empty())
    }

    async fn owned_role_and_binding(&self, csv: &str, ns: &str) -> bool {
        self.owned(Api::<Role>::namespaced(self.client.clone(), ns), csv)
            .await
            && self
                .owned(Api::<RoleBinding>::namespaced(self.client.clone(), ns), csv)
                .await
    }

    async fn owned_clusterrole_and_binding(&self, csv: &str) -> bool {
        self.owned(Api::<ClusterRole>::all(self.client.clone()), csv)
            .await
            && self
                .owned(Api::<ClusterRoleBinding>::all(self.client.clone()), csv)
                .await
    }

    /// `kubectl auth can-i --as=<the operator's ServiceAccount in NS> ARGS` answers `answer`.
    async fn can_i(&self, answer: &str, args: &[&str]) -> bool {
        let who = format!("--as=system:serviceaccount:{NS}:{}", self.release.sa);
        let mut all = vec!["--request-timeout=20s", "auth", "can-i", who.as_str()];
        all.extend(args);
        let (_, out) = harness::kubectl(&all).await;
        out.lines().next().map(str::trim) == Some(answer)
    }

    async fn can(&self, args: &[&str]) -> bool {
        self.can_i("yes", args).await
    }

    async fn cannot(&self, args: &[&str]) -> bool {
        self.can_i("no", args).await
    }

    fn memcacheds(&self, ns: &str) -> Api<Memcached> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// A Memcached from the CSV's first alm-example, renamed and resized when asked.
    async fn create_sample(&self, ns: &str, name: Option<&str>, size: Option<i64>) {
        let mut sample = self.release.sample.clone();
        if let Some(name) = name {
            sample["metadata"]["name"] = json!(name);
        }
        if let Some(size) = size {
            sample["spec"]["size"] = json!(size);
        }
        let mc: Memcached = serde_json::from_value(sample).unwrap();
        harness::apply(&self.memcacheds(ns), &mc).await;
    }

    async fn wait_available(&self, ns: &str, names: &[&str]) -> bool {
        wait_until(self.timeout, || async move {
            for name in names {
                let Ok(mc) = self.memcacheds(ns).get(name).await else {
                    return false;
                };
                if harness::condition(&mc, "Available").map(|c| c.0).as_deref() != Some("True") {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// No Deployment or StatefulSet in NS_OTHER, nor a pod, Service or ControllerRevision of the
    /// operator's labels, and no condition on its sample: no operator reconciled it.
    async fn not_reconciled_elsewhere(&self) -> bool {
        let mut nothing = true;
        for (resource, labels) in [
            (ApiResource::erase::<Deployment>(&()), ""),
            (ApiResource::erase::<StatefulSet>(&()), ""),
            (ApiResource::erase::<Pod>(&()), MEMCACHED_PODS),
            (ApiResource::erase::<Service>(&()), MEMCACHED_PODS),
            (
                ApiResource::erase::<ControllerRevision>(&()),
                MEMCACHED_PODS,
            ),
        ] {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), NS_OTHER, &resource);
            let list = api.list(&ListParams::default().labels(labels)).await;
            nothing &= list.is_ok_and(|l| l.items.is_empty());
        }
        let sample = self.memcacheds(NS_OTHER).get(&self.sample_name()).await;
        nothing && sample.is_ok_and(|mc| mc.status.is_none_or(|s| s.conditions.is_empty()))
    }

    fn sample_name(&self) -> String {
        self.release.sample["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// name -> uid of every Memcached in `ns`.
    async fn memcached_uids(&self, ns: &str) -> BTreeMap<String, String> {
        by_name(self.memcacheds(ns), ListParams::default(), uid).await
    }

    /// name -> uid of the memcached pods in `ns`.
    async fn pod_uids(&self, ns: &str) -> BTreeMap<String, String> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns);
        by_name(pods, ListParams::default().labels(MEMCACHED_PODS), uid).await
    }

    /// name -> uid of the StatefulSets in `ns`.
    async fn stateful_set_uids(&self, ns: &str) -> BTreeMap<String, String> {
        let stateful_sets = Api::<StatefulSet>::namespaced(self.client.clone(), ns);
        by_name(stateful_sets, ListParams::default(), uid).await
    }

    /// The pods of Memcached `name` in `ns`, terminating or not.
    async fn pods_of(&self, ns: &str, name: &str) -> Vec<Pod> {
        let selector = format!("{MEMCACHED_PODS},app.kubernetes.io/instance={name}");
        self.listed(ns, &selector).await
    }

    /// The objects of kind `K` in `ns` that the label selector `labels` picks ("" for all);
    /// none where the list fails (the waits that read it try again).
    async fn listed<K>(&self, ns: &str, labels: &str) -> Vec<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(labels))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// What Memcached `name` in `ns` lacks of having every member updated as `update` says
    /// (members::update_missing), kept as `kept_by` says, the agent from the operator's
    /// RELATED_IMAGE_AGENT; and its pods' names.
    async fn updated(
        &self,
        ns: &str,
        name: &str,
        kept_by: &KeptBy<'_>,
        update: &Update<'_>,
    ) -> (Vec<String>, Vec<String>) {
        let Ok(mc) = self.memcacheds(ns).get(name).await else {
            return (vec![format!("Memcached {ns}/{name} not found")], vec![]);
        };
        let sts = Api::<StatefulSet>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .ok()
            .flatten();
        let revisions: Vec<ControllerRevision> = self
            .listed(ns, &format!("app.kubernetes.io/instance={name}"))
            .await;
        let pods = self.pods_of(ns, name).await;
        let (agent, _) = self.operator_env(ns, "RELATED_IMAGE_AGENT").await;
        let missing = members::update_missing(
            &mc,
            (sts.as_ref(), &revisions),
            &pods,
            kept_by,
            update,
            &agent,
        );
        let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        names.sort();
        (missing, names)
    }

    /// What Memcacheds `names` in `ns` lack of running as the operator makes them since 0.4.0
    /// (members::update_missing of members made from the current template: a StatefulSet,
    /// OnDelete, its Ready pods of its update revision, the agent from the operator's
    /// RELATED_IMAGE_AGENT, ...), each with its Service; and of no memcached Deployment in `ns`.
    async fn created_missing(&self, ns: &str, names: &[&str]) -> Vec<String> {
        let mut missing = vec![];
        for name in names {
            let kept_by = KeptBy::StatefulSet(None);
            let (not, _) = self.updated(ns, name, &kept_by, &Update::Created).await;
            missing.extend(not.into_iter().map(|m| format!("{name}: {m}")));
            let service = Api::<Service>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await;
            if !service.is_ok_and(|s| s.is_some()) {
                missing.push(format!("no Service {name}"));
            }
        }
        let deployments = Api::<Deployment>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(MEMCACHED_PODS))
            .await
            .map(|l| l.items.len());
        if deployments.as_ref().ok() != Some(&0) {
            missing.push(format!("memcached Deployments: {deployments:?}"));
        }
        missing
    }

    /// The members the operator updated in place of Memcached `name` in `ns` (its `Restarted`
    /// events, the pod each names), by time; and those it evicted (`Evicted`).
    async fn member_updates(
        &self,
        ns: &str,
        name: &str,
    ) -> (Vec<(String, Timestamp)>, Vec<(String, Timestamp)>) {
        let restarted = members::member_events(&self.client, ns, name, "Restarted").await;
        let evicted = members::member_events(&self.client, ns, name, "Evicted").await;
        (restarted, evicted)
    }

    /// What in `ns` has lost its controller: a memcached pod whose StatefulSet or Memcached is
    /// gone, a StatefulSet, ControllerRevision of the operator's or PodDisruptionBudget whose
    /// Memcached is gone (or that has none).
    async fn orphans(&self, ns: &str) -> Vec<String> {
        let memcacheds: Vec<String> = self.memcached_uids(ns).await.into_values().collect();
        let sts: Vec<StatefulSet> = self.listed(ns, "").await;
        // A member is kept by its StatefulSet (0.6.0's) or by its Memcached (the operator's own).
        let keepers: Vec<String> = memcacheds
            .iter()
            .cloned()
            .chain(sts.iter().map(uid))
            .collect();
        let revisions: Vec<ControllerRevision> = self.listed(ns, MEMCACHED_PODS).await;
        let pods: Vec<Pod> = self.listed(ns, MEMCACHED_PODS).await;
        let budgets: Vec<PodDisruptionBudget> = self.listed(ns, "").await;
        let orphaned = |owner: Option<String>, owners: &[String]| {
            owner.is_none_or(|uid| !owners.contains(&uid))
        };
        let mut orphans = vec![];
        for pod in &pods {
            if orphaned(controller_uid(pod), &keepers) {
                orphans.push(format!("pod {}", pod.name_any()));
            }
        }
        for r in &revisions {
            if orphaned(controller_uid(r), &keepers) {
                orphans.push(format!("ControllerRevision {}", r.name_any()));
            }
        }
        for s in &sts {
            if orphaned(controller_uid(s), &memcacheds) {
                orphans.push(format!("StatefulSet {}", s.name_any()));
            }
        }
        // The operator's own budget (the bundle's) is OLM's to keep.
        let operators = |b: &&PodDisruptionBudget| {
            b.labels().get("control-plane").map(String::as_str) == Some("controller-manager")
        };
        for b in budgets.iter().filter(|b| !operators(b)) {
            if orphaned(controller_uid(b), &memcacheds) {
                orphans.push(format!("PodDisruptionBudget {}", b.name_any()));
            }
        }
        orphans
    }

    /// 2 Memcacheds of 3 + 2 pods, all Running.
    async fn all_pods_ready(&self, ns: &str) -> bool {
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(
                &ListParams::default()
                    .labels(MEMCACHED_PODS)
                    .fields("status.phase=Running"),
            )
            .await
            .is_ok_and(|l| l.items.len() == 5)
    }

    /// The Deployment runs the new CSV's template, its two replicas (the previous release ran
    /// one) from it.
    async fn rolled(&self, ns: &str) -> bool {
        let Some(d) = self.deployment(ns).await else {
            return false;
        };
        let image = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let status = d.status.unwrap_or_default();
        image == self.release.image
            && status.updated_replicas == Some(2)
            && status.replicas == Some(2)
    }

    /// The CSV replaced the previous one in `ns`: its spec.replaces, the Subscription's
    /// installedCSV, and the previous CSV removed.
    async fn replaced(&self, ns: &str) -> bool {
        let r = &self.release;
        let Some(csv) = self.get("ClusterServiceVersion", ns, &r.csv_name).await else {
            return false;
        };
        let Some(sub) = self.get("Subscription", ns, PACKAGE).await else {
            return false;
        };
        // OLM names in spec.replaces the CSV it replaced, also where the bundle skips to it.
        str_field(&csv, &["spec", "replaces"]) == r.prev_csv
            && str_field(&sub, &["status", "installedCSV"]) == r.csv_name
            && self.csv_gone(ns, &r.prev_csv).await
    }

    /// (Re)starts the operator for `ns` as its current pod would run: stops the previous
    /// process first (the old pod goes away), a fresh token of the ServiceAccount, the pod's
    /// olm.targetNamespaces as WATCH_NAMESPACE, the Deployment's RELATED_IMAGE_* (memcached's,
    /// the exporter's, the agent's).
    /// Whether it became ready, and its WATCH_NAMESPACE.
    async fn run_operator(&mut self, ns: &str, tag: &str, bin: &Path) -> (bool, String) {
        if let Some(mut old) = self.operators.remove(ns) {
            let _ = std::process::Command::new("kill")
                .arg(old.pid().to_string())
                .status();
            old.wait().await;
        }
        let kubeconfig = self.dir.join(format!("operator-{ns}.kubeconfig"));
        harness::cluster()
            .service_account_kubeconfig(
                ns,
                &self.release.sa,
                &kubeconfig,
                Duration::from_secs(3600),
            )
            .await
            .expect("the operator's ServiceAccount kubeconfig");
        let watch_ns = self.pod_target_namespaces(ns).await;
        let related = self
            .operator_envs(ns)
            .await
            .into_iter()
            .filter(|(name, (value, _))| name.starts_with("RELATED_IMAGE_") && !value.is_empty())
            .map(|(name, (value, _))| (name, value));
        let mut launch = Launch {
            command: format!(
                "{} --leader-elect --log-format=json --metrics-secure \
                 --metrics-bind-address=127.0.0.1:{{metrics}} \
                 --health-probe-bind-address=127.0.0.1:{{health}}",
                bin.display()
            ),
            identity: format!("{PREFIX}-operator-{ns}-{tag}"),
            kubeconfig,
            log_dir: self.dir.join("logs"),
            env: vec![
                ("POD_NAMESPACE".into(), ns.into()),
                ("POD_NAME".into(), format!("olm-test-operator-{tag}")),
                ("WATCH_NAMESPACE".into(), watch_ns.clone()),
            ],
        };
        launch.env.extend(related);
        let op = OperatorProcess::spawn(launch).expect("the operator starts");
        let ready = match op.wait_health("/readyz", Duration::from_secs(60)).await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("{e}");
                false
            }
        };
        self.operators.insert(ns.into(), op);
        (ready, watch_ns)
    }

    /// On failures: what OLM and the test namespace hold.
    async fn diagnostics(&self) {
        eprintln!("diagnostics:");
        for args in [
            &["get", "catalogsource,subscription,installplan,csv", "-A"][..],
            &[
                "get",
                "deployment,replicaset,statefulset,pods,jobs",
                "-n",
                NS,
                "-o",
                "wide",
            ][..],
            &["get", "memcached", "-A"][..],
        ] {
            let (_, out) = harness::kubectl(args).await;
            eprintln!("$ kubectl {}\n{out}", args.join(" "));
        }
    }
}

/// Once OLM has rolled the operator's Deployment in `ns` to the new CSV, the process is the new
/// release's binary, as the pod would be; when it started.
async fn run_new_operator(env: &mut Env, checks: &mut Checks, ns: &str) -> Instant {
    let r = &env.release;
    let (csv_name, deployment, image, sa) = (
        r.csv_name.clone(),
        r.deployment.clone(),
        r.image.clone(),
        r.sa.clone(),
    );
    let e = &*env;
    let ok = wait_until(env.timeout, || async move { e.rolled(ns).await }).await;
    checks.check(
        format!("Deployment {deployment} in {ns} rolled to {image}"),
        ok,
    );
    let bin = env.operator_bin.clone();
    let (ok, watch_ns) = env.run_operator(ns, &csv_name, &bin).await;
    checks
        .require(
            format!("operator ({csv_name}) ready in {ns} as {sa} (WATCH_NAMESPACE={watch_ns})"),
            ok,
            env,
        )
        .await;
    Instant::now()
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_and_upgrade_through_olm() {
    let root = memcached_operator_testkit::repo_root();
    let cluster = harness::cluster();
    let dir = cluster.dir.clone();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let timeout = Duration::from_secs(
        std::env::var("TIMEOUT")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(180),
    );

    // ------------------------------------------------------------ setup
    olm::assert_ports_free();
    let release = Release::read(&root);
    let catalog = root.join("catalog").join(PACKAGE);
    assert!(
        catalog.join("package.yaml").is_file(),
        "catalog/{PACKAGE}/package.yaml not found: run make catalog"
    );
    assert!(
        catalog.join(format!("{}.yaml", release.prev_csv)).is_file(),
        "the release {} upgrades from, {}, is not in catalog/{PACKAGE}",
        release.csv_name,
        release.prev_csv
    );
    // The previous release runs its own operator, built from its commit (hack/olm/versions.env:
    // PREVIOUS_RELEASE, PREVIOUS_RELEASE_COMMIT): today's would need today's RBAC.
    let prev_version = release
        .prev_csv
        .strip_prefix(&format!("{PACKAGE}.v"))
        .unwrap_or_default()
        .to_string();
    let prev_bin = path_env("PREV_OPERATOR_BIN").unwrap_or_else(crate::previous_release::binary);
    // The binaries may be rebuilt meanwhile: run copies.
    let bin = path_env("OPERATOR_BIN")
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_memcached-operator")));
    for (what, bin) in [("PREV_OPERATOR_BIN", &prev_bin), ("OPERATOR_BIN", &bin)] {
        assert!(bin.is_file(), "{} not built (set {what})", bin.display());
    }
    let prev_operator_bin = dir.join(format!("memcached-operator-{prev_version}"));
    std::fs::copy(&prev_bin, &prev_operator_bin).unwrap();
    let operator_bin = dir.join("memcached-operator");
    std::fs::copy(&bin, &operator_bin).unwrap();
    let opm = tool("OPM", "opm");
    let olm_dir = tool("OLM_DIR", "olm");

    let client = cluster.admin().await.expect("admin client");
    let mut checks = Checks {
        passed: 0,
        failed: vec![],
        figures: dir.join("logs/olm-upgrade.txt"),
        start: Instant::now(),
    };
    let _ = std::fs::write(&checks.figures, "");
    let mut env = Env {
        client: client.clone(),
        dir: dir.clone(),
        release,
        timeout,
        prev_operator_bin,
        operator_bin,
        operators: HashMap::new(),
    };
    let (csv_name, prev_csv) = (env.release.csv_name.clone(), env.release.prev_csv.clone());
    let (deployment, sa) = (env.release.deployment.clone(), env.release.sa.clone());
    let sample = env.sample_name();

    // ------------------------------------------------------------ OLM
    let olm_crds = olm::crds_in(&[olm_dir.join("crds.yaml")]);
    let ok = olm::apply_crds(&client, &olm_crds, timeout).await;
    checks.require("OLM CRDs established", ok, &env).await;
    env.namespace(OLM_NS).await;
    // The bundle since 0.2.0 holds a ServiceMonitor and a PrometheusRule: OLM fails an
    // InstallPlan whose objects' kinds the cluster does not serve, so the cluster gets the
    // prometheus-operator's CRDs first, as a user's would (docs/monitoring.md).
    let monitoring_crds = olm::crds_in(&olm::monitoring_crd_files());
    let ok = olm::apply_crds(&client, &monitoring_crds, timeout).await;
    checks
        .require(
            "ServiceMonitor and PrometheusRule CRDs established",
            ok,
            &env,
        )
        .await;
    let olm = Olm::start(
        &olm_dir,
        &cluster.kubeconfig(),
        OLM_NS,
        &dir,
        PREFIX,
        CatalogOptions::default(),
    );
    let ok = olm.olm_healthy(Duration::from_secs(60)).await;
    checks
        .require("olm operator healthy (:8080/healthz)", ok, &env)
        .await;
    let ok = olm.catalog_healthy(Duration::from_secs(60)).await;
    checks
        .require("catalog operator healthy (:8443/healthz)", ok, &env)
        .await;

    // The catalog before this release.
    let (catalog_prev, prev_channel) = previous_catalog(&root, &dir, &env.release);
    let validated = tokio::process::Command::new(&opm)
        .arg("validate")
        .arg(&catalog_prev)
        .status()
        .await
        .is_ok_and(|s| s.success());
    checks.check(
        format!(
            "the catalog before {csv_name} ({prev_csv} in channel {prev_channel}) passes opm validate"
        ),
        validated,
    );

    let grpc_port = free_port();
    let (cached, opm_prev) =
        Opm::serve(&opm, &catalog_prev, grpc_port, &dir, PREFIX, "previous").await;
    checks.check(
        "opm serve --cache-only builds the cache of previous",
        cached,
    );
    let ok = opm_prev.listening(Duration::from_secs(60)).await;
    checks
        .require(
            format!("opm serve previous listening on 127.0.0.1:{grpc_port}"),
            ok,
            &env,
        )
        .await;

    // ------------------------------------------------------------ phase 1: the previous release
    println!(
        "creating CatalogSource, OperatorGroups and Subscriptions ({prev_csv}, channel {prev_channel})"
    );
    let t0 = Instant::now();
    env.apply(json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "CatalogSource",
        "metadata": {"name": CATSRC, "namespace": OLM_NS},
        "spec": {
            "sourceType": "grpc",
            "address": format!("127.0.0.1:{grpc_port}"),
            "displayName": "memcached-operator (local catalog/)",
            "publisher": "memcached-operator maintainers",
        },
    }))
    .await;
    env.operator_group(NS).await;
    env.subscription(NS, &prev_channel, "Automatic", None).await;
    env.operator_group(NS_MANUAL).await;
    env.subscription(NS_MANUAL, &prev_channel, "Manual", Some(&prev_csv))
        .await;
    env.namespace(NS_OTHER).await;

    let e = &env;
    let ok = wait_until(timeout, || async move { e.catalog_ready().await }).await;
    checks.check(format!("CatalogSource {CATSRC} connection READY"), ok);

    let ip = env.wait_installplan(NS, "").await;
    checks
        .require(
            format!("Subscription in {NS} resolved to an InstallPlan"),
            ip.is_some(),
            &env,
        )
        .await;
    let ip = ip.unwrap();
    let ok = env.wait_ip_phase(NS, &ip, "Complete").await;
    checks.check(format!("InstallPlan {ip} phase Complete"), ok);
    let ok = env.ip_installs(NS, &ip, &prev_csv).await;
    checks.check(format!("InstallPlan {ip} installs {prev_csv}"), ok);
    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default())
        .await
        .is_ok_and(|l| l.items.is_empty());
    checks.check(
        "no bundle unpack Job (bundle objects inline in the catalog)",
        jobs,
    );
    let ok = env.wait_csv_succeeded(NS, &prev_csv).await;
    checks
        .require(format!("CSV {prev_csv} in {NS} phase Succeeded"), ok, &env)
        .await;

    let ip_manual = env.wait_installplan(NS_MANUAL, "").await;
    checks
        .require(
            format!("Manual Subscription in {NS_MANUAL} resolved to an InstallPlan"),
            ip_manual.is_some(),
            &env,
        )
        .await;
    let ip_manual = ip_manual.unwrap();
    let ok = env.ip_waits_for_approval(NS_MANUAL, &ip_manual).await;
    checks.check(
        format!("InstallPlan {ip_manual} ({prev_csv}) waits for approval"),
        ok,
    );
    let ok = env.approve(NS_MANUAL, &ip_manual).await;
    checks.check(format!("InstallPlan {ip_manual} approved"), ok);
    let ok = env.wait_csv_succeeded(NS_MANUAL, &prev_csv).await;
    checks
        .require(
            format!("CSV {prev_csv} in {NS_MANUAL} phase Succeeded"),
            ok,
            &env,
        )
        .await;

    // ------------------------------------------------------------ what OLM created
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ok = wait_until(Duration::from_secs(10), || {
        let crds = &crds;
        async move {
            crds.get("memcacheds.cache.example.com")
                .await
                .is_ok_and(|c| {
                    c.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        }
    })
    .await;
    checks.check(
        "CRD memcacheds.cache.example.com created and Established",
        ok,
    );
    let ok = Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .get(&sa)
        .await
        .is_ok();
    checks.check(format!("ServiceAccount {sa}"), ok);
    let ok = env.owned_role_and_binding(&prev_csv, NS).await;
    checks.check(
        format!("Role and RoleBinding (permissions) owned by {prev_csv}"),
        ok,
    );
    let ok = env.owned_clusterrole_and_binding(&prev_csv).await;
    checks.check(
        format!("ClusterRole and ClusterRoleBinding (clusterPermissions) owned by {prev_csv}"),
        ok,
    );
    let ok = Api::<ClusterRole>::all(client.clone())
        .get("memcached-operator-memcached-viewer-role")
        .await
        .is_ok();
    checks.check(
        "ClusterRole memcached-operator-memcached-viewer-role (bundle object)",
        ok,
    );
    let ok = Api::<Service>::namespaced(client.clone(), NS)
        .get("memcached-operator-controller-manager-metrics-service")
        .await
        .is_ok();
    checks.check("metrics Service (bundle object)", ok);
    let ok = wait_until(timeout, || async move {
        e.deployment(NS).await.is_some_and(|d| {
            d.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        })
    })
    .await;
    checks
        .require(
            format!("Deployment {deployment} Available (kwok runs its pod)"),
            ok,
            &env,
        )
        .await;
    let ok = env.pod_target_namespaces(NS).await == NS;
    checks.check(
        format!("operator pod annotated olm.targetNamespaces={NS} (its WATCH_NAMESPACE)"),
        ok,
    );
    let (_, path) = env.operator_env(NS, "WATCH_NAMESPACE").await;
    checks.check(
        "WATCH_NAMESPACE comes from metadata.annotations['olm.targetNamespaces']",
        path == "metadata.annotations['olm.targetNamespaces']",
    );
    let (related, _) = env.operator_env(NS, "RELATED_IMAGE_MEMCACHED").await;
    checks.check(
        "RELATED_IMAGE_MEMCACHED set on the operator",
        !related.is_empty(),
    );
    println!(
        "install of {prev_csv} through OLM took {}s after the control plane was up",
        secs(t0)
    );

    // ------------------------------------------------------------ the operator, as its pod would run
    let prev_bin = env.prev_operator_bin.clone();
    for ns in [NS, NS_MANUAL] {
        let (ok, watch_ns) = env.run_operator(ns, &prev_csv, &prev_bin).await;
        checks
            .require(
                format!(
                    "operator ({prev_csv}, its own binary) ready in {ns} as {sa} (WATCH_NAMESPACE={watch_ns})"
                ),
                ok,
                &env,
            )
            .await;
    }

    // The CSV's first alm-example, and a second Memcached of 2 pods, in each installed
    // namespace; the alm-example also in NS_OTHER, which no OperatorGroup targets.
    for ns in [NS, NS_MANUAL] {
        env.create_sample(ns, None, None).await;
        env.create_sample(ns, Some(SECOND), Some(2)).await;
    }
    env.create_sample(NS_OTHER, None, None).await;
    for ns in [NS, NS_MANUAL] {
        let ok = env.wait_available(ns, &[&sample, SECOND]).await;
        checks.check(
            format!("Memcacheds {sample} and {SECOND} Available in {ns} ({prev_csv})"),
            ok,
        );
    }
    // The previous release runs them as StatefulSets whose members it updates itself
    // (OnDelete), each member with memcached's memory file and the agent from its own image.
    let (prev_agent, _) = env.operator_env(NS, "RELATED_IMAGE_AGENT").await;
    let prev_related: BTreeMap<String, String> = env
        .operator_envs(NS)
        .await
        .into_iter()
        .filter(|(name, _)| name.starts_with("RELATED_IMAGE_"))
        .map(|(name, (value, _))| (name, value))
        .collect();
    for ns in [NS, NS_MANUAL] {
        let (e, names) = (&env, [sample.as_str(), SECOND]);
        let ok = wait_until(timeout, || async move {
            e.created_missing(ns, &names).await.is_empty()
        })
        .await;
        let missing = env.created_missing(ns, &names).await;
        checks.check(
            format!(
                "{prev_csv} runs {sample} and {SECOND} in {ns} as StatefulSets (updateStrategy OnDelete) of Ready pods <name>-N of their update revision, memcached with its memory file (-e), the agent from {prev_agent}, with their Services, no Deployment{}",
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(" (not: {})", missing.join("; "))
                }
            ),
            ok,
        );
    }
    let ok = env.not_reconciled_elsewhere().await;
    checks.check(
        format!("Memcached in {NS_OTHER} (outside the OperatorGroups) left alone"),
        ok,
    );
    // The contrast for the least-privilege checks after the upgrade: the previous release
    // updates the members itself (it patches, resizes and evicts pods) and scales Memcacheds,
    // but cannot make or delete pods (its StatefulSets' controller does), and its rules hold in
    // its own namespace only.
    let ok = env.can(&["patch", "pods", "-n", NS]).await
        && env
            .can(&["create", "pods", "--subresource=eviction", "-n", NS])
            .await
        && env
            .can(&["patch", "pods", "--subresource=resize", "-n", NS])
            .await
        && env.can(&patch_scale(NS)).await
        && env.cannot(&["create", "pods", "-n", NS]).await
        && env.cannot(&["delete", "pods", "-n", NS]).await;
    checks.check(
        format!(
            "under {prev_csv} {sa} can patch, resize and evict pods and patch the scale of Memcacheds in {NS}, not create or delete pods"
        ),
        ok,
    );
    let ok = env
        .cannot(&["list", "statefulsets.apps", "-n", NS_OTHER])
        .await;
    checks.check(
        format!("under {prev_csv} {sa} cannot list StatefulSets in {NS_OTHER} (permissions)"),
        ok,
    );

    // The state the upgrade starts from: what must stay (the Memcacheds, their StatefulSets,
    // each member's pod) and each container's restart count (the agent's is to move by one,
    // memcached's not at all).
    let e = &env;
    let mut before = BTreeMap::new();
    for ns in [NS, NS_MANUAL] {
        let ok = wait_until(timeout, || async move { e.all_pods_ready(ns).await }).await;
        checks.check(format!("5 memcached pods Running in {ns}"), ok);
        let mut pods = BTreeMap::new();
        for name in [sample.as_str(), SECOND] {
            pods.insert(
                name.to_string(),
                members::before(&env.pods_of(ns, name).await),
            );
        }
        before.insert(
            ns,
            (
                env.memcached_uids(ns).await,
                env.stateful_set_uids(ns).await,
                pods,
            ),
        );
    }

    let watched = |ns: &str| Watched {
        namespace: ns.into(),
        names: vec![sample.clone(), SECOND.into()],
        pods: Some(MEMCACHED_PODS.into()),
    };
    let sampler = Sampler::start(
        client.clone(),
        vec![watched(NS), watched(NS_MANUAL)],
        dir.join("logs/olm-availability.log"),
    );

    // ------------------------------------------------------------ phase 2: the upgrade
    println!("serving catalog/ (all releases) in place of the previous catalog");
    opm_prev.process.stop().await;
    let (cached, opm_current) = Opm::serve(
        &opm,
        &root.join("catalog"),
        grpc_port,
        &dir,
        PREFIX,
        "current",
    )
    .await;
    checks.check("opm serve --cache-only builds the cache of current", cached);
    let ok = opm_current.listening(Duration::from_secs(60)).await;
    checks
        .require(
            format!("opm serve current listening on 127.0.0.1:{grpc_port}"),
            ok,
            &env,
        )
        .await;
    let t_publish = Instant::now();

    // Automatic: OLM upgrades as soon as it sees the new release.
    let ip_up = env.wait_installplan(NS, &ip).await;
    checks
        .require(
            format!("Subscription in {NS} resolved to a new InstallPlan"),
            ip_up.is_some(),
            &env,
        )
        .await;
    let ip_up = ip_up.unwrap();
    let ok = env.ip_installs(NS, &ip_up, &csv_name).await;
    checks.check(format!("InstallPlan {ip_up} installs {csv_name}"), ok);
    let ok = env.wait_csv_succeeded(NS, &csv_name).await;
    if checks.check(
        format!("CSV {csv_name} in {NS} phase Succeeded (Automatic)"),
        ok,
    ) {
        checks.figure(format!(
            "Automatic: catalog with {csv_name} served -> CSV Succeeded in {} s",
            secs(t_publish)
        ));
    }
    // OLM rolled the operator's Deployment: its pod, here the process, is the new release's.
    let mut started = BTreeMap::new();
    started.insert(NS, run_new_operator(&mut env, &mut checks, NS).await);

    // Manual: the upgrade's InstallPlan waits; nothing moves until it is approved.
    let ip_manual_up = env.wait_installplan(NS_MANUAL, &ip_manual).await;
    checks
        .require(
            format!("Manual Subscription in {NS_MANUAL} resolved to a new InstallPlan"),
            ip_manual_up.is_some(),
            &env,
        )
        .await;
    let ip_manual_up = ip_manual_up.unwrap();
    let ok = env.ip_waits_for_approval(NS_MANUAL, &ip_manual_up).await;
    checks.check(
        format!("InstallPlan {ip_manual_up} ({csv_name}) waits for approval"),
        ok,
    );
    let ok = env.ip_installs(NS_MANUAL, &ip_manual_up, &csv_name).await;
    checks.check(
        format!("InstallPlan {ip_manual_up} installs {csv_name}"),
        ok,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ok =
        env.csv_gone(NS_MANUAL, &csv_name).await && env.csv_succeeded(NS_MANUAL, &prev_csv).await;
    checks.check(
        format!("unapproved: {NS_MANUAL} still runs {prev_csv} 5 s later, no {csv_name}"),
        ok,
    );
    let t_approve = Instant::now();
    let ok = env.approve(NS_MANUAL, &ip_manual_up).await;
    checks.check(format!("InstallPlan {ip_manual_up} approved"), ok);
    let ok = env.wait_csv_succeeded(NS_MANUAL, &csv_name).await;
    if checks.check(
        format!("CSV {csv_name} in {NS_MANUAL} phase Succeeded (Manual)"),
        ok,
    ) {
        checks.figure(format!(
            "Manual: InstallPlan approved -> CSV Succeeded in {} s",
            secs(t_approve)
        ));
    }
    started.insert(
        NS_MANUAL,
        run_new_operator(&mut env, &mut checks, NS_MANUAL).await,
    );
    for ns in [NS, NS_MANUAL] {
        let e = &env;
        let ok = wait_until(timeout, || async move { e.replaced(ns).await }).await;
        checks.check(
            format!("{csv_name} replaced {prev_csv} in {ns} (installedCSV; the old CSV removed)"),
            ok,
        );
    }
    let e = &env;

    // The new operators have started: a new Memcached is made from the new template at once.
    env.create_sample(NS, Some(AFTER_UPGRADE), Some(1)).await;
    let ok = env.wait_available(NS, &[AFTER_UPGRADE]).await;
    checks.check(
        format!("operator ({csv_name}) reconciles a new Memcached in {NS}: Available"),
        ok,
    );

    // What the new release changes in the members: the agent's image (the operator's own) and
    // no other, so that each member is to be updated in place, its agent alone restarted.
    for ns in [NS, NS_MANUAL] {
        let related = env
            .operator_envs(ns)
            .await
            .into_iter()
            .filter(|(name, _)| name.starts_with("RELATED_IMAGE_"))
            .map(|(name, (value, _))| (name, value))
            .collect::<BTreeMap<_, _>>();
        let changed: Vec<String> = related
            .iter()
            .filter(|(name, value)| prev_related.get(*name) != Some(*value))
            .map(|(name, value)| {
                let was = prev_related.get(name).map_or("none", String::as_str);
                format!("{name} {was} -> {value}")
            })
            .collect();
        checks.check(
            format!(
                "{csv_name}'s operator in {ns} differs from {prev_csv}'s in the agent's image only ({})",
                changed.join(", ")
            ),
            changed.len() == 1
                && changed[0].starts_with("RELATED_IMAGE_AGENT ")
                && related.len() == prev_related.len(),
        );
    }

    // Each Memcached of the previous release has its StatefulSet (OnDelete), whose template
    // now differs in the agent's image only as the operator compares them (`-m` through an env
    // var or literal counts as equal), so the operator updates each member in place (it
    // patches the agent's image; kwok restarts that container and makes the pod Ready anew),
    // one at a time, about minReadySeconds apart: the same pods, memcached not restarted. Then
    // it adopts them: the StatefulSet deleted, its pods left running and made the Memcached's.
    let memcacheds = [
        (
            NS,
            vec![sample.clone(), SECOND.into(), AFTER_UPGRADE.into()],
        ),
        (NS_MANUAL, vec![sample.clone(), SECOND.into()]),
    ];
    for (ns, names) in &memcacheds {
        let (ns, names) = (*ns, names.as_slice());
        let (_, sts_before, pods_before) = &before[ns];
        let update = |name: &str| match pods_before.get(name) {
            Some(pods) => Update::InPlace {
                before: pods,
                restarted: &["agent"],
            },
            None => Update::Created,
        };
        // Those of before adopted, those made since the upgrade the operator's own.
        let kept_by = |_: &str| KeptBy::Operator;
        let ok = wait_until(timeout, || async move {
            for name in names {
                if !e
                    .updated(ns, name, &kept_by(name), &update(name))
                    .await
                    .0
                    .is_empty()
                {
                    return false;
                }
            }
            true
        })
        .await;
        if ok {
            checks.figure(format!(
                "{ns}: operator ({csv_name}) started -> every member of every Memcached updated in place: {} s",
                secs(started[ns])
            ));
        }
        for name in names {
            let kept = kept_by(name);
            let (missing, pods) = env.updated(ns, name, &kept, &update(name)).await;
            let of_before = sts_before.contains_key(name);
            checks.check(
                format!(
                    "{ns}/{name}: {}, pods {} {}, Ready, of its update revision, the agent beside memcached, status.servers by stable names{}",
                    if of_before {
                        format!("its StatefulSet {name} gone, its members adopted: ControllerRevisions of the Memcached's only")
                    } else {
                        "no StatefulSet, ControllerRevisions of the Memcached's only".to_string()
                    },
                    pods.join(" "),
                    if of_before {
                        "each the same pod (uid), its agent restarted once, memcached not restarted"
                    } else {
                        "each the Memcached's, made from it"
                    },
                    if missing.is_empty() {
                        String::new()
                    } else {
                        format!(" (not: {})", missing.join("; "))
                    }
                ),
                missing.is_empty(),
            );
        }
        // One member at a time: each patched once (a `Restarted` event), the next once the one
        // before has restarted and been Ready for minReadySeconds (kwok makes it Ready anew at
        // once); none evicted.
        for name in names {
            let min_ready = env
                .memcacheds(ns)
                .get(name)
                .await
                .ok()
                .and_then(|mc| mc.spec.rollout)
                .map_or(5, |r| r.min_ready_seconds);
            let (restarted, evicted) = env.member_updates(ns, name).await;
            match pods_before.get(name) {
                Some(pods) => {
                    let (ok, list) = match members::one_at_a_time(&restarted, pods, min_ready) {
                        Ok(list) => (true, list),
                        Err(list) => (false, list),
                    };
                    checks.check(
                        format!(
                            "{ns}/{name}: each of its {} members restarted in place once ({list}), about minReadySeconds ({min_ready} s) or more apart; none evicted ({})",
                            pods.len(),
                            evicted.len()
                        ),
                        ok && evicted.is_empty(),
                    );
                    checks.figure(format!(
                        "{ns}/{name}: restart counts {}",
                        members::restart_counts(pods, &env.pods_of(ns, name).await)
                    ));
                }
                None => {
                    checks.check(
                        format!(
                            "{ns}/{name} (made by {csv_name}): no member restarted ({}) or evicted ({})",
                            restarted.len(),
                            evicted.len()
                        ),
                        restarted.is_empty() && evicted.is_empty(),
                    );
                }
            }
        }
        let orphans = env.orphans(ns).await;
        checks.check(
            format!(
                "{ns}: nothing orphaned (every memcached pod its Memcached's or its StatefulSet's, every StatefulSet and PodDisruptionBudget its Memcached's){}",
                if orphans.is_empty() {
                    String::new()
                } else {
                    format!(": {}", orphans.join(", "))
                }
            ),
            orphans.is_empty(),
        );
    }
    // A few more samples with the new operators in charge and nothing left to update.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let samples = sampler.stop();
    for ns in [NS, NS_MANUAL] {
        let (mcs_before, _, pods_before) = &before[ns];
        let mut mcs_after = env.memcached_uids(ns).await;
        mcs_after.remove(AFTER_UPGRADE);
        checks.check(
            format!("no Memcached lost in {ns} (same names and UIDs)"),
            *mcs_before == mcs_after,
        );
        if *mcs_before != mcs_after {
            eprintln!("{ns} before: {mcs_before:?}\n{ns} after: {mcs_after:?}");
        }
        let mut pods_after = env.pod_uids(ns).await;
        pods_after.retain(|name, _| !name.starts_with(&format!("{AFTER_UPGRADE}-")));
        let uids_before: BTreeMap<String, String> = pods_before
            .values()
            .flatten()
            .map(|(name, b)| (name.clone(), b.uid.clone()))
            .collect();
        checks.check(
            format!(
                "the same {} memcached pods in {ns} after the upgrade (names and UIDs): none replaced",
                uids_before.len()
            ),
            !uids_before.is_empty() && uids_before == pods_after,
        );
        let line = |pods: &mut dyn Iterator<Item = (&String, &String)>| {
            pods.map(|(name, uid)| format!("{name}={}", &uid[..uid.len().min(8)]))
                .collect::<Vec<_>>()
                .join(" ")
        };
        checks.figure(format!(
            "{ns}: Memcacheds before/after: {}/{}; memcached pods before: {}; after: {}",
            mcs_before.len(),
            mcs_after.len(),
            line(&mut pods_before.values().flatten().map(|(n, b)| (n, &b.uid))),
            line(&mut pods_after.iter())
        ));
    }
    for sample in samples.unavailable() {
        eprintln!("availability: {}", sample.line);
    }
    checks.check(
        format!(
            "every Memcached Available throughout the upgrade ({} samples, 1 s apart)",
            samples.len()
        ),
        samples.always_available(),
    );
    checks.check(
        format!(
            "within the rollout budget throughout: at most 1 member of a Memcached out of service, never a pod over its size ({})",
            samples.summary("during the upgrades")
        ),
        samples.within_budget(1),
    );
    checks.check(
        format!(
            "Progressing says RestartingInPlace during the update ({} samples), never ReplacingMembers ({})",
            samples.with_reason("RestartingInPlace"),
            samples.with_reason("ReplacingMembers")
        ),
        samples.with_reason("RestartingInPlace") > 0 && samples.with_reason("ReplacingMembers") == 0,
    );
    checks.figure(format!(
        "{}; with a condition RestartingInPlace: {}, Updating: {}, RolloutQueued: {}",
        samples.summary("during the upgrades"),
        samples.with_reason("RestartingInPlace"),
        samples.with_reason("Updating"),
        samples.with_reason("RolloutQueued")
    ));

    // ------------------------------------------------------------ monitoring (the new bundle's objects)
    let ok = env
        .get(
            "ServiceMonitor",
            NS,
            "memcached-operator-controller-manager-metrics-monitor",
        )
        .await
        .is_some();
    checks.check(
        format!(
            "servicemonitor memcached-operator-controller-manager-metrics-monitor (bundle object) in {NS}"
        ),
        ok,
    );
    let ok = env
        .get("PrometheusRule", NS, "memcached-operator-alerts")
        .await
        .is_some();
    checks.check(
        format!("prometheusrule memcached-operator-alerts (bundle object) in {NS}"),
        ok,
    );
    let ok = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get("memcached-operator-grafana-dashboard")
        .await
        .is_ok();
    checks.check(
        format!("configmap memcached-operator-grafana-dashboard (bundle object) in {NS}"),
        ok,
    );
    let (exporter, _) = env
        .operator_env(NS, "RELATED_IMAGE_MEMCACHED_EXPORTER")
        .await;
    checks.check(
        format!("RELATED_IMAGE_MEMCACHED_EXPORTER set on the operator ({csv_name})"),
        !exporter.is_empty(),
    );
    let ok = env
        .can(&["create", "servicemonitors.monitoring.coreos.com", "-n", NS])
        .await;
    checks.check(
        format!("{sa} can create ServiceMonitors in {NS} (spec.monitoring)"),
        ok,
    );
    let ok = env
        .cannot(&[
            "list",
            "servicemonitors.monitoring.coreos.com",
            "-n",
            NS_OTHER,
        ])
        .await;
    checks.check(
        format!("{sa} cannot list ServiceMonitors in {NS_OTHER}"),
        ok,
    );

    // ------------------------------------------------------------ least privilege (the new CSV)
    let ok = env.can(&["list", "statefulsets.apps", "-n", NS]).await
        && env.can(&["delete", "statefulsets.apps", "-n", NS]).await;
    checks.check(
        format!("{sa} can list and delete StatefulSets in {NS} (the previous release's)"),
        ok,
    );
    let ok = env.cannot(&["create", "statefulsets.apps", "-n", NS]).await
        && env.cannot(&["patch", "statefulsets.apps", "-n", NS]).await
        && env
            .cannot(&["list", "deployments.apps", "-n", NS_OTHER])
            .await;
    checks.check(
        format!(
            "{sa} cannot create or patch StatefulSets in {NS}, nor list Deployments (spec.proxy's) outside its namespaces"
        ),
        ok,
    );
    let ok = env.can(&["patch", "deployments.apps", "-n", NS]).await
        && env.can(&["watch", "configmaps", "-n", NS]).await
        && env.can(&["delete", "services", "-n", NS]).await;
    checks.check(
        format!("{sa} keeps spec.proxy's Deployment, ConfigMap and Service in {NS}"),
        ok,
    );
    let ok = env.can(&["patch", "pods", "-n", NS]).await
        && env
            .can(&["create", "pods", "--subresource=eviction", "-n", NS])
            .await
        && env
            .can(&["patch", "pods", "--subresource=resize", "-n", NS])
            .await
        && env
            .can(&["get", "controllerrevisions.apps", "-n", NS])
            .await;
    checks.check(
        format!(
            "{sa} can patch, resize and evict pods and read ControllerRevisions in {NS} (it updates the members)"
        ),
        ok,
    );
    let ok = env.can(&["create", "pods", "-n", NS]).await
        && env.can(&["delete", "pods", "-n", NS]).await
        && env
            .can(&["create", "controllerrevisions.apps", "-n", NS])
            .await
        && env
            .can(&["deletecollection", "controllerrevisions.apps", "-n", NS])
            .await
        && env
            .cannot(&["patch", "controllerrevisions.apps", "-n", NS])
            .await;
    checks.check(
        format!(
            "{sa} can create and delete pods and create and collect ControllerRevisions in {NS} (new in {csv_name}: it keeps new Memcacheds' members), never change a revision"
        ),
        ok,
    );
    let ok = env.cannot(&["patch", "pods", "-n", NS_OTHER]).await
        && env.cannot(&["create", "pods", "-n", NS_OTHER]).await
        && env.cannot(&["delete", "pods", "-n", NS_OTHER]).await
        && env
            .cannot(&["create", "controllerrevisions.apps", "-n", NS_OTHER])
            .await
        && env
            .cannot(&["create", "pods", "--subresource=eviction", "-n", NS_OTHER])
            .await
        && env
            .cannot(&["patch", "pods", "--subresource=resize", "-n", NS_OTHER])
            .await;
    checks.check(
        format!(
            "{sa} cannot make, delete, patch, resize or evict pods nor make revisions in {NS_OTHER}"
        ),
        ok,
    );
    let ok = env.can(&patch_scale(NS)).await
        && env
            .can(&["list", "horizontalpodautoscalers.autoscaling", "-n", NS])
            .await
        && env
            .can(&["watch", "horizontalpodautoscalers.autoscaling", "-n", NS])
            .await;
    checks.check(
        format!(
            "{sa} can patch the scale of Memcacheds and list and watch HorizontalPodAutoscalers in {NS} (autoscaling)"
        ),
        ok,
    );
    let ok = env.cannot(&patch_scale(NS_OTHER)).await
        && env
            .cannot(&[
                "list",
                "horizontalpodautoscalers.autoscaling",
                "-n",
                NS_OTHER,
            ])
            .await
        && env
            .cannot(&["create", "horizontalpodautoscalers.autoscaling", "-n", NS])
            .await;
    checks.check(
        format!(
            "{sa} cannot patch the scale of Memcacheds or list HorizontalPodAutoscalers in {NS_OTHER}, nor create HorizontalPodAutoscalers in {NS}"
        ),
        ok,
    );
    let ok = env.cannot(&["list", "events", "-n", NS]).await;
    checks.check(
        format!("{sa} cannot list events in {NS} (it reads none)"),
        ok,
    );
    let ok = env
        .can(&[
            "patch",
            "memcacheds.cache.example.com",
            "--subresource=status",
            "-n",
            NS,
        ])
        .await;
    checks.check(format!("{sa} can patch Memcached status in {NS}"), ok);
    let ok = wait_until(Duration::from_secs(60), || async move {
        e.cannot(&["list", "statefulsets.apps", "-n", NS_OTHER])
            .await
    })
    .await;
    checks.check(
        format!(
            "{sa} cannot list StatefulSets in {NS_OTHER} (permissions, not clusterPermissions)"
        ),
        ok,
    );
    let ok = env
        .cannot(&["list", "memcacheds.cache.example.com", "--all-namespaces"])
        .await;
    checks.check(format!("{sa} cannot list Memcacheds in all namespaces"), ok);
    let ok = env.cannot(&["list", "pods", "-n", NS_OTHER]).await;
    checks.check(format!("{sa} cannot list Pods in {NS_OTHER}"), ok);
    let ok = env
        .can(&["create", "tokenreviews.authentication.k8s.io"])
        .await;
    checks.check(
        format!("{sa} can create TokenReviews (clusterPermissions: secure metrics)"),
        ok,
    );
    let ok = env
        .can(&["create", "subjectaccessreviews.authorization.k8s.io"])
        .await;
    checks.check(
        format!("{sa} can create SubjectAccessReviews (clusterPermissions: secure metrics)"),
        ok,
    );
    let ok = env.owned_role_and_binding(&csv_name, NS).await;
    checks.check(
        format!("Role and RoleBinding (permissions) owned by {csv_name}"),
        ok,
    );
    let prev = prev_csv.as_str();
    let ok = wait_until(Duration::from_secs(60), || async move {
        !e.owned(Api::<ClusterRole>::all(e.client.clone()), prev)
            .await
            && !e
                .owned(Api::<ClusterRoleBinding>::all(e.client.clone()), prev)
                .await
    })
    .await;
    checks.check(
        format!("no ClusterRole or ClusterRoleBinding of {prev_csv} left"),
        ok,
    );
    let ok = env.not_reconciled_elsewhere().await;
    checks.check(format!("Memcached in {NS_OTHER} still left alone"), ok);
    let forbidden: Vec<String> = std::fs::read_dir(dir.join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("{PREFIX}-operator-")) && n.ends_with(".log")
            })
        })
        .flat_map(|p| {
            std::fs::read_to_string(&p)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.to_lowercase().contains("forbidden"))
                .map(|l| format!("{}: {l}", p.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    for l in &forbidden {
        eprintln!("{l}");
    }
    checks.check(
        "operator logs have no RBAC 'forbidden' errors",
        forbidden.is_empty(),
    );

    // ------------------------------------------------------------ phase 3: a fresh install
    let channel = env.release.default_channel.clone();
    env.operator_group(NS_FRESH).await;
    env.subscription(NS_FRESH, &channel, "Automatic", None)
        .await;
    let t_fresh = Instant::now();
    let ok = env.wait_csv_succeeded(NS_FRESH, &csv_name).await;
    if checks.check(
        format!("fresh Subscription to channel {channel} installs {csv_name}: Succeeded"),
        ok,
    ) {
        checks.figure(format!(
            "fresh install of {csv_name} (channel {channel}): Subscription -> CSV Succeeded in {} s",
            secs(t_fresh)
        ));
    }

    // ------------------------------------------------------------ phase 4: without the monitoring CRDs
    // What the README tells users: the bundle's ServiceMonitor and PrometheusRule need their
    // CRDs, and OLM fails the InstallPlan without them.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &monitoring_crds {
        let _ = crds.delete(&crd.name_any(), &DeleteParams::default()).await;
    }
    let c = &client;
    let ok = wait_until(Duration::from_secs(60), || async move {
        c.list_api_groups()
            .await
            .is_ok_and(|g| g.groups.iter().all(|g| g.name != "monitoring.coreos.com"))
    })
    .await;
    checks.check("ServiceMonitor and PrometheusRule CRDs removed", ok);
    env.operator_group(NS_NO_CRDS).await;
    env.subscription(NS_NO_CRDS, &channel, "Automatic", None)
        .await;
    let ip_no_crds = env.wait_installplan(NS_NO_CRDS, "").await;
    checks
        .require(
            format!("Subscription in {NS_NO_CRDS} resolved to an InstallPlan"),
            ip_no_crds.is_some(),
            &env,
        )
        .await;
    let ip_no_crds = ip_no_crds.unwrap();
    let ok = env.wait_ip_phase(NS_NO_CRDS, &ip_no_crds, "Failed").await;
    checks.check(
        format!("without the monitoring CRDs, InstallPlan {ip_no_crds} fails"),
        ok,
    );
    if let Some(ip) = env.get("InstallPlan", NS_NO_CRDS, &ip_no_crds).await {
        let installed = field(&ip, &["status", "conditions"])
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Installed"))
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_string();
        checks.figure(format!(
            "InstallPlan without the monitoring CRDs: {} {installed}",
            str_field(&ip, &["status", "message"])
        ));
    }
    // The steps before the failing one stay (the CSV), short of what it needs: no operator runs.
    let phase = env.csv_phase(NS_NO_CRDS, &csv_name).await;
    let no_deployment = Api::<Deployment>::namespaced(client.clone(), NS_NO_CRDS)
        .list(&ListParams::default())
        .await
        .is_ok_and(|l| l.items.is_empty());
    checks.check(
        format!("no operator Deployment in {NS_NO_CRDS}, {csv_name} not Succeeded ({phase})"),
        phase != "Succeeded" && no_deployment,
    );

    // ------------------------------------------------------------ the end
    if !checks.failed.is_empty() {
        env.diagnostics().await;
        for p in [&olm.olm, &olm.catalog, &opm_current.process] {
            eprintln!(
                "----- tail of {} ({})\n{}",
                p.name,
                p.log.display(),
                p.log_tail(20)
            );
        }
    }
    println!(
        "{PREFIX} took {}s after the control plane was up",
        checks.start.elapsed().as_secs()
    );
    let summary = checks.summary();
    println!("{summary}");
    assert!(checks.failed.is_empty(), "{summary}");
}

/// `kubectl auth can-i` arguments: patch the scale of Memcacheds in `ns` (the autoscaler's write).
fn patch_scale(ns: &str) -> [&str; 5] {
    [
        "patch",
        "memcacheds.cache.example.com",
        "--subresource=scale",
        "-n",
        ns,
    ]
}
