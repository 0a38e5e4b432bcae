//! The chaos suite (`make test-chaos`): faults of the control plane and of the operator while a
//! few hundred Memcacheds converge or change size. Each scenario asserts no panic, every
//! Memcached converged within a stated bound after the fault, and no lost or duplicated objects;
//! it prints its recovery time.

#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use harness::{Operator, OperatorOptions, admin, apply, memcached, namespace, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::{LABEL_INSTANCE, REVISION_LABEL};
use memcached_operator_testkit::operator::Supervised;

/// Memcacheds per scenario (CHAOS_CRS), spread over this many namespaces.
fn crs() -> usize {
    std::env::var("CHAOS_CRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}
const NAMESPACES: usize = 4;
/// How long every Memcached may take to converge once a fault has ended.
const RECOVERY: Duration = Duration::from_secs(240);

/// A control-plane component of the cluster (its pid from `DIR/pids`), sent a signal.
fn signal_component(component: &str, signal: &str) {
    let pidfile = harness::cluster().dir.join(format!("pids/{component}.pid"));
    let pid = std::fs::read_to_string(&pidfile).expect("component pid file");
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.trim())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {component}");
}

/// Waits until a read reaches storage again (the API server up, and etcd behind it).
async fn serving_reads(client: &Client) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    wait_for("the API server to serve reads again", RECOVERY, || async {
        namespaces.list(&ListParams::default().limit(1)).await.ok()
    })
    .await;
}

/// The same Memcacheds in several namespaces, with the size each should have.
struct Fleet {
    client: Client,
    sizes: BTreeMap<(String, String), i32>,
}

impl Fleet {
    async fn create(client: &Client, prefix: &str, n: usize) -> Fleet {
        let mut namespaces = Vec::new();
        for _ in 0..NAMESPACES {
            namespaces.push(namespace(client, prefix).await);
        }
        let mut sizes = BTreeMap::new();
        for i in 0..n {
            let ns = &namespaces[i % NAMESPACES];
            let name = format!("mc-{i}");
            Api::<Memcached>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &memcached(&name, 1))
                .await
                .expect("create Memcached");
            sizes.insert((ns.clone(), name), 1);
        }
        Fleet {
            client: client.clone(),
            sizes,
        }
    }

    fn namespaces(&self) -> Vec<String> {
        let mut namespaces: Vec<String> = self.sizes.keys().map(|(ns, _)| ns.clone()).collect();
        namespaces.dedup();
        namespaces
    }

    /// Changes the size of every `every`-th Memcached to `size`.
    async fn resize(&mut self, every: usize, size: i32) {
        let keys: Vec<_> = self.sizes.keys().step_by(every).cloned().collect();
        for (ns, name) in keys {
            let patch = serde_json::json!({"spec": {"size": size}});
            let result = Api::<Memcached>::namespaced(self.client.clone(), &ns)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            // During a fault the write may fail; then the old size stays the wanted one.
            if result.is_ok() {
                self.sizes.insert((ns, name), size);
            }
        }
    }

    /// The Memcacheds not yet Available at their wanted size, each with what it reports.
    async fn unconverged(&self) -> Option<Vec<String>> {
        let mut left = Vec::new();
        for ns in self.namespaces() {
            let mcs = Api::<Memcached>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .ok()?;
            for mc in mcs {
                let want = self.sizes.get(&(ns.clone(), mc.name_any()));
                let done = want.is_some_and(|want| {
                    mc.spec.size == *want
                        && mc.status.as_ref().is_some_and(|s| {
                            s.ready_replicas == *want
                                && s.observed_generation == mc.metadata.generation
                                && s.conditions
                                    .iter()
                                    .any(|c| c.type_ == "Available" && c.status == "True")
                        })
                });
                if !done {
                    left.push(format!(
                        "{ns}/{} (want {want:?}, spec {}, generation {:?}, status {:?})",
                        mc.name_any(),
                        mc.spec.size,
                        mc.metadata.generation,
                        mc.status.as_ref().map(|s| (
                            s.ready_replicas,
                            s.observed_generation,
                            s.conditions
                                .iter()
                                .map(|c| format!("{}={}:{}", c.type_, c.status, c.reason))
                                .collect::<Vec<_>>()
                        ))
                    ));
                }
            }
        }
        Some(left)
    }

    /// Waits until every Memcached converged; the time it took.
    async fn converged_within(&self, bound: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let left = self.unconverged().await;
            if left.as_ref().is_some_and(Vec::is_empty) {
                return start.elapsed();
            }
            if start.elapsed() > bound {
                let left = left.unwrap_or_default();
                let mut examples = Vec::new();
                for line in left.iter().take(5) {
                    examples.push(format!("{line}\n    {}", self.cluster_side(line).await));
                }
                panic!(
                    "{} Memcacheds not converged after {bound:?}, e.g.:\n{}",
                    left.len(),
                    examples.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// What the cluster says of the Memcached named at the start of `line` ("ns/name ..."): its
    /// status as last written and its pods, to tell a stale status from a cluster that is behind.
    async fn cluster_side(&self, line: &str) -> String {
        let Some((ns, rest)) = line.split_once('/') else {
            return String::new();
        };
        let name = rest.split(' ').next().unwrap_or_default();
        let reported = Api::<Memcached>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|mc| mc.status)
            .map(|s| (s.replicas, s.ready_replicas, s.available_replicas));
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(self.client.clone(), ns)
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|p| {
                        let status = p.status.unwrap_or_default();
                        let ready = status
                            .conditions
                            .unwrap_or_default()
                            .into_iter()
                            .find(|c| c.type_ == "Ready")
                            .map(|c| c.status)
                            .unwrap_or_default();
                        format!(
                            "{}:{}:ready={ready}:{}",
                            p.metadata.name.unwrap_or_default(),
                            status.phase.unwrap_or_default(),
                            p.spec.and_then(|s| s.node_name).unwrap_or_default()
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        format!("reported (replicas, ready, available) {reported:?}; pods {pods:?}")
    }

    /// One Service per Memcached and exactly its members, `<name>-0…<name>-(size-1)`, each
    /// the Memcached's, of one revision; no StatefulSet: nothing lost, duplicated or left over.
    async fn assert_objects_match(&self) {
        for ns in self.namespaces() {
            let mcs = Api::<Memcached>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap();
            let stateful_sets = Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap();
            let services = Api::<Service>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap();
            let pods = Api::<Pod>::namespaced(self.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .unwrap();
            let wanted = self.sizes.keys().filter(|(n, _)| *n == ns).count();
            assert_eq!(mcs.items.len(), wanted, "Memcacheds in {ns}");
            assert_eq!(stateful_sets.items.len(), 0, "StatefulSets in {ns}");
            assert_eq!(services.items.len(), wanted, "Services in {ns}");
            for mc in mcs {
                let name = mc.name_any();
                let want = self.sizes[&(ns.clone(), name.clone())];
                let members: Vec<&Pod> = pods
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| p.labels().get(LABEL_INSTANCE) == Some(&name))
                    .collect();
                let mut names: Vec<String> = members.iter().map(|p| p.name_any()).collect();
                names.sort();
                let mut ordinals: Vec<String> = (0..want).map(|i| format!("{name}-{i}")).collect();
                ordinals.sort();
                assert_eq!(names, ordinals, "{ns}/{name}'s members");
                for pod in &members {
                    let owner = pod
                        .owner_references()
                        .iter()
                        .find(|o| o.controller == Some(true));
                    assert_eq!(
                        owner.map(|o| o.uid.as_str()),
                        mc.uid().as_deref(),
                        "{ns}/{} is its Memcached's",
                        pod.name_any()
                    );
                }
                let revisions: std::collections::BTreeSet<_> = members
                    .iter()
                    .filter_map(|p| p.labels().get(REVISION_LABEL))
                    .collect();
                assert!(
                    revisions.len() <= 1,
                    "{ns}/{name}: one revision: {revisions:?}"
                );
            }
        }
    }

    /// Deletes the namespaces, so later scenarios do not carry this one's load.
    async fn delete(self) {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        for ns in self.namespaces() {
            let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
        }
    }
}

fn assert_no_panic(log: &str) {
    assert!(
        !log.contains("panicked at"),
        "the operator panicked:\n{}",
        log.lines()
            .skip_while(|l| !l.contains("panicked at"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A leader-electing operator under a restart loop, watching every namespace.
async fn leader(client: &Client, lease: &str, extra_args: Vec<String>) -> Supervised {
    Operator::supervised(
        client,
        OperatorOptions {
            leader_elect: true,
            lease: lease.into(),
            extra_args,
            ..Default::default()
        },
    )
    .await
}

#[tokio::test]
async fn api_server_hung_for_a_minute() {
    let hang = Duration::from_secs(
        std::env::var("CHAOS_HANG_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let client = admin().await;
    let op = leader(&client, "chaos-hang", vec![]).await;
    let fleet = Fleet::create(&client, "hang", crs()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal_component("kube-apiserver", "STOP");
    tokio::time::sleep(hang).await;
    signal_component("kube-apiserver", "CONT");
    let recovered = fleet.converged_within(RECOVERY).await;
    fleet.assert_objects_match().await;
    println!(
        "kube-apiserver hung {hang:?} during convergence of {} Memcacheds: all Available {recovered:.1?} after it resumed; operator restarts: {}",
        fleet.sizes.len(),
        op.restarts()
    );
    assert_no_panic(&op.log_text());
    op.stop().await;
    fleet.delete().await;
}

/// Kills a control-plane component while sizes change; the cluster restarts it.
async fn killed_and_restarted(component: &str, prefix: &str) {
    let client = admin().await;
    let op = leader(&client, &format!("chaos-{prefix}"), vec![]).await;
    let mut fleet = Fleet::create(&client, prefix, crs()).await;
    fleet.converged_within(RECOVERY).await;
    fleet.resize(3, 2).await;
    signal_component(component, "KILL");
    let killed = Instant::now();
    serving_reads(&client).await;
    let back = killed.elapsed();
    fleet.resize(5, 3).await;
    let recovered = fleet.converged_within(RECOVERY).await;
    fleet.assert_objects_match().await;
    println!(
        "{component} killed with {} Memcacheds changing size: API back after {back:.1?}, all converged {recovered:.1?} later; operator restarts: {}",
        fleet.sizes.len(),
        op.restarts()
    );
    assert_no_panic(&op.log_text());
    op.stop().await;
    fleet.delete().await;
}

#[tokio::test]
async fn api_server_killed_and_restarted() {
    killed_and_restarted("kube-apiserver", "apikill").await;
}

#[tokio::test]
async fn etcd_killed_and_restarted() {
    killed_and_restarted("etcd", "etcdkill").await;
}

/// etcd's current revision, and a compaction up to it, through its JSON gateway.
fn compact_etcd() -> i64 {
    let endpoint = harness::cluster()
        .env()
        .unwrap()
        .remove("ETCD_ENDPOINT")
        .expect("ETCD_ENDPOINT in the cluster's env");
    let post = |path: &str, body: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sf",
                "-X",
                "POST",
                &format!("{endpoint}{path}"),
                "-d",
                body,
            ])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "POST {path}: {out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // "AA==" is the key "\0": any key will do to read the header's revision.
    let range = post("/v3/kv/range", r#"{"key": "AA=="}"#);
    let revision: i64 = range["header"]["revision"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    post(
        "/v3/kv/compaction",
        &format!(r#"{{"revision": "{revision}", "physical": true}}"#),
    );
    revision
}

#[tokio::test]
async fn a_watch_that_expires_misses_no_change() {
    let client = admin().await;
    let op = leader(&client, "chaos-410", vec![]).await;
    let mut fleet = Fleet::create(&client, "expire", crs()).await;
    fleet.converged_within(RECOVERY).await;

    // Frozen, the operator's watches fall behind; the changes it misses are compacted away, and
    // the API server restarts with a watch cache that starts after them: resuming its watches
    // from where they were is answered 410 Gone.
    op.signal("STOP");
    fleet.resize(4, 3).await;
    let revision = compact_etcd();
    signal_component("kube-apiserver", "KILL");
    serving_reads(&client).await;
    op.signal("CONT");
    let resumed = Instant::now();
    let recovered = fleet.converged_within(RECOVERY).await;
    fleet.assert_objects_match().await;
    println!(
        "watch expiry (etcd compacted at revision {revision}, API server restarted): {} size changes made while the operator was frozen applied {recovered:.1?} after it resumed ({:.1?})",
        fleet.sizes.len().div_ceil(4),
        resumed.elapsed()
    );
    assert_no_panic(&op.log_text());
    op.stop().await;
    fleet.delete().await;
}

#[tokio::test]
async fn a_stored_memcached_that_does_not_parse_stops_nothing() {
    let client = admin().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ns = namespace(&client, "unparseable").await;

    // A schema loosened for a moment (spec.maxMemoryMiB may be a string) lets a bad object be
    // stored. (Not spec.size: the scale subresource insists on an integer there.)
    let committed = crds.get("memcacheds.cache.example.com").await.unwrap();
    let loosen = serde_json::json!([{
        "op": "replace",
        "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/maxMemoryMiB",
        "value": {"x-kubernetes-int-or-string": true}
    }]);
    crds.patch(
        "memcacheds.cache.example.com",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(loosen).unwrap()),
    )
    .await
    .unwrap();
    let raw: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<Memcached>(&()),
    );
    let bad: kube::core::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "bad"}, "spec": {"size": 1, "maxMemoryMiB": "lots"}
    }))
    .unwrap();
    wait_for("the loosened schema", Duration::from_secs(30), || async {
        match raw.create(&PostParams::default(), &bad).await {
            Ok(created) => Some(created),
            Err(e) => {
                eprintln!("not yet stored: {e}");
                None
            }
        }
    })
    .await;
    let mut restored = committed.clone();
    restored.metadata.managed_fields = None;
    restored.metadata.resource_version = None;
    restored.status = None;
    apply(&crds, &restored).await;

    let op = leader(&client, "chaos-parse", vec![]).await;
    let mut fleet = Fleet::create(&client, "parse", crs() / 4).await;
    fleet.converged_within(RECOVERY).await;
    fleet.resize(2, 2).await;
    fleet.converged_within(RECOVERY).await;
    fleet.assert_objects_match().await;
    let invalid = op.metric("memcached_operator_invalid_objects").await;
    assert_eq!(invalid, 1.0, "memcached_operator_invalid_objects");
    let event = wait_for(
        "an InvalidObject event",
        Duration::from_secs(30),
        || async {
            Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("InvalidObject"))
        },
    )
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("spec.maxMemoryMiB"),
        "the event names the field: {note}"
    );
    assert_eq!(event.regarding.and_then(|r| r.name).as_deref(), Some("bad"));
    println!(
        "a Memcached that does not parse: counted, reported ({note}), and {} others converged",
        fleet.sizes.len()
    );
    assert_no_panic(&op.log_text());
    op.stop().await;
    let _ = raw.delete("bad", &DeleteParams::default()).await;
    fleet.delete().await;
}

/// One observation of the Lease.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    holder: String,
    transitions: i32,
}

#[tokio::test]
async fn leader_churn_keeps_one_leader_and_the_last_size() {
    let churn = Duration::from_secs(
        std::env::var("CHAOS_CHURN_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(90),
    );
    let client = admin().await;
    let lease_name = "chaos-churn";
    let leases: Api<Lease> = Api::namespaced(client.clone(), harness::OPERATOR_NAMESPACE);
    // Short lease so that a minute holds many takeovers; the renew deadline stays below it.
    let args = || {
        vec![
            "--leader-election-lease-duration=4s".to_string(),
            "--leader-election-renew-deadline=3s".to_string(),
            "--leader-election-retry-period=1s".to_string(),
        ]
    };
    let lease_duration = Duration::from_secs(4);
    let history = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Seen>::new()));
    let watch = tokio::spawn({
        let (leases, history) = (leases.clone(), history.clone());
        async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={lease_name}"));
            let mut stream =
                std::pin::pin!(watcher(leases, config).default_backoff().applied_objects());
            while let Some(Ok(lease)) = futures::StreamExt::next(&mut stream).await {
                let spec = lease.spec.unwrap_or_default();
                history.lock().unwrap().push(Seen {
                    at: Instant::now(),
                    holder: spec.holder_identity.unwrap_or_default(),
                    transitions: spec.lease_transitions.unwrap_or(0),
                });
            }
        }
    });
    let a = leader(&client, lease_name, args()).await;
    let b = leader(&client, lease_name, args()).await;
    let mut fleet = Fleet::create(&client, "churn", crs()).await;

    let start = Instant::now();
    let (mut kills, mut round) = (0, 0);
    while start.elapsed() < churn {
        let holder = leases
            .get_opt(lease_name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity);
        for op in [&a, &b] {
            if holder.as_deref() == Some(op.identity.as_str()) && op.signal("KILL") {
                kills += 1;
            }
        }
        round += 1;
        fleet.resize(7, 1 + (round % 3)).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let recovered = fleet.converged_within(RECOVERY).await;
    fleet.assert_objects_match().await;
    watch.abort();

    // Safety: a new holder only once the previous one's lease could have expired (SIGKILL means
    // no release), judged by when we saw the previous holder's last renewal.
    let history = history.lock().unwrap().clone();
    let mut changes = 0;
    for pair in history.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if before.holder == after.holder || after.holder.is_empty() || before.holder.is_empty() {
            continue;
        }
        changes += 1;
        let last_renewal = history
            .iter()
            .filter(|s| s.holder == before.holder && s.at <= before.at)
            .map(|s| s.at)
            .max()
            .unwrap();
        // The watch sees a renewal up to a retry period late: allow that much.
        assert!(
            after.at.duration_since(last_renewal) + Duration::from_secs(1) >= lease_duration,
            "{} took over {:?} after {}'s last renewal: two holders at once",
            after.holder,
            after.at.duration_since(last_renewal),
            before.holder
        );
    }
    let first = history.iter().find(|s| !s.holder.is_empty()).unwrap();
    let last = history.last().unwrap();
    assert!(
        changes >= 3,
        "too few takeovers to mean anything: {changes}"
    );
    assert_eq!(
        last.transitions - first.transitions,
        changes,
        "leaseTransitions counts every holder change"
    );
    println!(
        "leader churn for {churn:?}: {kills} leaders SIGKILLed, {changes} takeovers (leaseTransitions {}), never two holders; {} Memcacheds at their last size {recovered:.1?} after the churn",
        last.transitions,
        fleet.sizes.len()
    );
    assert_no_panic(&a.log_text());
    assert_no_panic(&b.log_text());
    a.stop().await;
    b.stop().await;
    fleet.delete().await;
}
