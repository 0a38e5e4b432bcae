//! `operator-sdk run bundle`, `run bundle-upgrade`, `scorecard` and `cleanup`, unmodified, on the
//! local control plane with its real node, the way an operator developer tests a bundle
//! (`make test-run-bundle`: `SUITE=olm REAL_NODE=1 NODES=0 hack/e2e.sh run_bundle`, root):
//!   - images: the operator, memcached and the exporter (hack/images.sh); opm, OLM's util image,
//!     scorecard-test and busybox (hack/olm/images.sh); the bundle images of the previous release
//!     and of bundle/'s from their bundle.Dockerfile and the catalog image from
//!     catalog.Dockerfile, built with buildah; all pushed to a registry on 127.0.0.1
//!     (hack/olm/registry.sh, HTTPS with its own CA), which the real node's containerd pulls from
//!     and also uses as its mirror of Docker Hub (the scorecard config's short image name) and of
//!     the registry of the decompression image that `run bundle-upgrade` hard-codes (it has no
//!     flag for it);
//!   - the cluster (hack/e2e.sh): a real node and no kwok nodes, the real node's taint removed
//!     here (operator-sdk's and OLM's pods carry no toleration); OLM's CRDs and its olm and
//!     catalog operators as processes (tests/olm/olm.rs), the catalog operator's --opmImage and
//!     --util-image the images above (the bundle unpack Job runs on the real node).
//!
//! Phases, in namespace `memcached-run-bundle`:
//!   1. run bundle of the previous release (its bundle rebuilt from the release's rendered
//!      catalog entry, images named in the local registry): CSV Succeeded, the operator a pod on
//!      the real node from its image as pulled from the registry, the sample Memcached Available
//!      with real memcached pods that answer, a StatefulSet `OnDelete` (the operator updates the
//!      members itself) of Ready members with memcached's memory file and the agent from the
//!      release's own image; a key is stored in each;
//!   2. run bundle-upgrade to bundle/'s release (bundle.sh with the images in the local
//!      registry, as a release is made): it Succeeds and replaces the previous one, and its
//!      operator, whose pod template differs in the agent's image only (the operator's own) as
//!      the operator compares templates (`-m` through an env var or literal counts as equal),
//!      adopts the members as they run, then updates each in place (no StatefulSet left, the
//!      pods the Memcached's, of its revisions): the same Memcached UID and pods (names,
//!      uids, addresses), Ready, the agent restarted once on the new
//!      image, memcached not restarted (its restart count unchanged, memcached's image
//!      unchanged); a `Restarted` event each, about `minReadySeconds` or more apart, none
//!      `Evicted`; 10,000 keys written over the members before it, every one read back after
//!      it, and the key stored under the previous release found in every member; each member
//!      probed every 100 ms from the host (each one's time without an answer printed): never
//!      more than one not answering, none without an answer for 1 s or more (a restart of
//!      memcached takes longer); Available, at most one member out and never a pod over `size` in
//!      every sample, `Progressing` `RestartingInPlace` in some, `ReplacingMembers` in none; how
//!      each restarted container stopped (exit code, seconds after its patch) printed;
//!   3. run bundle-upgrade to a patch release pinned by digest (only the references of
//!      memcached's image and the agent's change): the operator restarts each member in place,
//!      memcached too, one at a time: 10,000 keys written over the members before it, at least
//!      99 % read back after it; the same pods (uids, addresses), memcached and the agent
//!      restarted once more, the agent first (exit 0, running again before memcached stopped:
//!      memcached's preStop asks it to save), a `Restarted` event each, about `minReadySeconds`
//!      or more apart, none `Evicted`; probed and sampled as in 2;
//!   4. scorecard of bundle/ as committed (its config unmodified): the tests as pods;
//!   5. the catalog image as a CatalogSource (OLM's registry pod, probed with
//!      grpc_health_probe): READY, and a Subscription to it resolves to bundle/'s release;
//!   6. cleanup: the CSV, Subscription, CatalogSource, registry pod, OperatorGroup, CRD and with
//!      it every Memcached and its pods gone.
//!
//! Each release runs its own operator image: the previous release's built from its commit
//! (previous_release.rs: PREVIOUS_RELEASE_COMMIT in hack/olm/versions.env, built by its own hack/images.sh), bundle/'s
//! and the patch release's from this tree (hack/images.sh).
//!
//! A failed check fails the test at once, naming what was expected. Figures are printed as
//! `FIGURE` lines and kept in `$E2E_CLUSTER_DIR/logs/run-bundle-figures.txt`; operator-sdk's
//! output in `logs/run-bundle-operator-sdk.log`, the samples in
//! `logs/run-bundle-availability*.log`. TIMEOUT: seconds per wait (default 240).

mod bundles;
mod scene;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

use crate::availability::{Sampler, Samples};
use crate::harness;
use crate::members::{self, KeptBy, Update};
use crate::olm::{self, CatalogOptions, Olm, field, str_field};
use crate::scripts::{run, tool};
use memcached_operator_testkit::probe::{Probed, Prober};
use scene::{Keys, Scene, secs, short, wait_until};

const PACKAGE: &str = "memcached-operator";
const OLM_NS: &str = "olm";
const NS: &str = "memcached-run-bundle";
const NS_CATALOG: &str = "memcached-catalog-image";
const MEMCACHED_PODS: &str =
    "app.kubernetes.io/part-of=memcached-operator,app.kubernetes.io/component=cache";
const OPERATOR_POD: &str = "control-plane=controller-manager";
const CRD: &str = "memcacheds.cache.example.com";
/// The real node's taint (hack/real-node.sh).
const REAL_NODE_TAINT: &str = "memcached-operator.dev/real-node";
/// Log and file prefix.
const PREFIX: &str = "run-bundle";

// ---------------------------------------------------------------- the bundles and the catalog

/// The bundles of the release being prepared (as a release is made) and of the previous one (as
/// its catalog entry holds it), and the catalog image, built and pushed: the rebuilt previous
/// bundle validates, and the catalog image and the image of the committed bundle.Dockerfile
/// render as their sources do.
fn the_bundle_and_catalog_images_render_as_their_sources(scene: &Scene, t0: Instant) {
    let root = &scene.root;
    let host = &scene.registry.host;
    let (version, prev_version) = (&scene.release.version, &scene.release.prev_version);
    let (work, images, release) = (&scene.work, &scene.images, &scene.release);
    let related = format!(
        "MEMCACHED={} MEMCACHED_EXPORTER={}",
        images.memcached, images.exporter
    );

    // The release being prepared, as a release is made (hack/olm/README.md, "Releasing"):
    // bundle.sh with the images named in a registry.
    run(scene
        .hack("olm/bundle.sh")
        .arg(work.join(format!("v{version}")))
        .env("IMG", &images.operator)
        .env("RELATED_IMAGES", &related));

    // The previous release: the bundle its catalog entry was rendered from.
    let prev_dir = work.join(format!("v{prev_version}"));
    let local = BTreeMap::from([
        ("", images.operator_prev.clone()),
        // Since 0.2.0 the operator's image is also the agent's (RELATED_IMAGE_AGENT).
        ("agent", images.operator_prev.clone()),
        ("memcached", images.memcached.clone()),
        ("memcached-exporter", images.exporter.clone()),
    ]);
    bundles::rebuild_from_catalog(
        &root.join("catalog").join(PACKAGE),
        &release.prev_csv,
        &local,
        &prev_dir,
    );
    let validated = std::process::Command::new(&scene.sdk)
        .args(["bundle", "validate"])
        .arg(prev_dir.join("bundle"))
        .output()
        .unwrap();
    assert!(
        validated.status.success(),
        "the rebuilt {} bundle validates:\n{}",
        release.prev_csv,
        String::from_utf8_lossy(&validated.stderr)
    );

    scene.push_bundle_image(&prev_dir, &images.bundle_prev);
    scene.push_bundle_image(&work.join(format!("v{version}")), &images.bundle);
    scene.push_catalog_image(&images.catalog);

    // The catalog image serves exactly catalog/.
    let opm = tool("OPM", "opm");
    let render = |what: &str| bundles::opm_render(&opm, what, scene.ca());
    let from_dir = render(root.join("catalog").to_str().unwrap());
    let from_image = render(&images.catalog);
    assert!(
        from_dir == from_image,
        "opm render of the catalog image (from catalog.Dockerfile) equals opm render catalog/: {}",
        bundles::first_difference(&from_dir, &from_image)
    );
    // The committed bundle.Dockerfile and bundle/, as `make bundle-build` would build them: the
    // image renders as bundle/ does (it also lists itself as a related image).
    let committed = format!("{host}/{PACKAGE}-bundle-committed:v{version}");
    scene.push_bundle_image(root, &committed);
    let without_image = |mut objects: Vec<Value>| {
        for o in &mut objects {
            if let Some(o) = o.as_object_mut() {
                o.remove("image");
                if let Some(Value::Array(related)) = o.get_mut("relatedImages") {
                    related.retain(|r| r["image"].as_str() != Some(committed.as_str()));
                }
            }
        }
        objects
    };
    let from_dir = without_image(render(root.join("bundle").to_str().unwrap()));
    let from_image = without_image(render(&committed));
    assert!(
        from_dir == from_image,
        "opm render of the image of the committed bundle.Dockerfile equals opm render bundle/: {}",
        bundles::first_difference(&from_dir, &from_image)
    );
    scene.figures.print(format!(
        "images built {}s after the start: bundles {}, {}, catalog {}",
        t0.elapsed().as_secs(),
        short(&images.bundle_prev),
        short(&images.bundle),
        short(&images.catalog)
    ));
}

// ---------------------------------------------------------------- the cluster

/// The real node takes operator-sdk's and OLM's pods (no toleration, no other node) and pulls
/// from the registry; OLM runs, its catalog operator's images from the registry.
async fn olm_runs_with_its_pods_on_the_real_node(scene: &Scene) -> Olm {
    let nodes = Api::<Node>::all(scene.client.clone());
    let names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(
        names,
        std::slice::from_ref(&scene.node),
        "the real node is the only node (NODES=0), so operator-sdk's and OLM's pods run there"
    );
    let node = nodes.get(&scene.node).await.unwrap();
    let taints: Vec<_> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != REAL_NODE_TAINT)
        .collect();
    nodes
        .patch(
            &scene.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .expect("the real node's taint removed");

    // The registry, and its mirror of Docker Hub and of the decompression image's registry.
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"source "$0" && real_node_registry_hosts "$@""#)
        .arg(scene.root.join("hack/real-node.sh"))
        .arg(&scene.cluster_dir)
        .arg(&scene.registry.host)
        .arg(scene.ca())
        .arg("docker.io")
        .arg(scene.images.decompression.split_once('/').unwrap().0)
        .status()
        .unwrap();
    assert!(status.success(), "real_node_registry_hosts: {status}");

    olm::assert_ports_free();
    let olm_dir = tool("OLM_DIR", "olm");
    let olm_crds = olm::crds_in(&[olm_dir.join("crds.yaml")]);
    assert!(
        olm::apply_crds(&scene.client, &olm_crds, scene.timeout).await,
        "OLM CRDs established"
    );
    scene.namespace(OLM_NS).await;
    // The bundle since 0.2.0 holds a ServiceMonitor and a PrometheusRule: OLM fails an
    // InstallPlan whose objects' kinds the cluster does not serve, so the cluster gets the
    // prometheus-operator's CRDs first, as a user's would (docs/monitoring.md).
    let monitoring_crds = olm::crds_in(&olm::monitoring_crd_files());
    assert!(
        olm::apply_crds(&scene.client, &monitoring_crds, scene.timeout).await,
        "ServiceMonitor and PrometheusRule CRDs established"
    );
    let env = harness::cluster().env().unwrap();
    let olm = Olm::start(
        &olm_dir,
        &harness::cluster().kubeconfig(),
        OLM_NS,
        &scene.cluster_dir,
        PREFIX,
        CatalogOptions {
            args: vec![
                "--util-image".into(),
                scene.images.olm_util.clone(),
                "--opmImage".into(),
                scene.images.opm.clone(),
            ],
            cluster_dns: Some(env["REAL_NODE_DNS_IP"].clone()),
        },
    );
    assert!(
        olm.olm_healthy(Duration::from_secs(60)).await,
        "olm operator healthy (:8080/healthz)"
    );
    assert!(
        olm.catalog_healthy(Duration::from_secs(60)).await,
        "catalog operator healthy (:8443/healthz)"
    );
    scene.namespace(NS).await;
    olm
}

// ---------------------------------------------------------------- 1. run bundle

/// What the upgrades must keep (the Memcached, each member's pod) and each
/// container's restart count, which an update in place moves by one for the containers whose
/// image changes only.
struct Before {
    memcached_uid: String,
    members: BTreeMap<String, members::Before>,
}

async fn run_bundle_installs_the_previous_release_and_its_memcached_serves(
    scene: &Scene,
) -> Before {
    let (release, images, node) = (&scene.release, &scene.images, &scene.node);
    let prev_csv = &release.prev_csv;
    let t = Instant::now();
    scene
        .sdk(
            &format!(
                "operator-sdk run bundle {} (--index-image: the opm image)",
                short(&images.bundle_prev)
            ),
            &[
                "run",
                "bundle",
                &images.bundle_prev,
                "--index-image",
                &images.opm,
                "--decompression-image",
                &images.busybox,
                "-n",
                NS,
                "--timeout",
                "5m",
            ],
        )
        .await;
    scene.figures.print(format!(
        "run bundle {prev_csv}: command to CSV Succeeded {} s",
        secs(t)
    ));
    let phase = scene.csv_phase(prev_csv).await;
    assert_eq!(phase, "Succeeded", "CSV {prev_csv} phase Succeeded");
    let groups = scene
        .api("OperatorGroup", NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let targets: Vec<String> = groups
        .items
        .first()
        .and_then(|g| field(g, &["spec", "targetNamespaces"]))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    scene.figures.print(format!(
        "install mode: OperatorGroup targetNamespaces [{}] (empty: AllNamespaces)",
        targets.join(" ")
    ));
    let jobs = Api::<Job>::namespaced(scene.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let succeeded = jobs.items.iter().find_map(|j| j.status.as_ref()?.succeeded);
    assert_eq!(
        succeeded,
        Some(1),
        "OLM's bundle unpack Job ran on the real node and succeeded"
    );
    let registry_pod_image = match scene
        .get("CatalogSource", NS, &format!("{PACKAGE}-catalog"))
        .await
        .and_then(|c| {
            c.annotations()
                .get("operators.operatorframework.io/registry-pod-name")
                .cloned()
        }) {
        Some(pod) => scene
            .pods()
            .get(&pod)
            .await
            .ok()
            .and_then(|p| p.spec?.containers.into_iter().next()?.image),
        None => None,
    };
    assert_eq!(
        registry_pod_image.as_deref(),
        Some(images.opm.as_str()),
        "run bundle's registry pod runs the opm image"
    );
    wait_until(
        &format!(
            "the operator pod Running and Ready on {node} from {}, pulled from the registry",
            short(&images.operator_prev)
        ),
        scene.timeout,
        || scene.operator_pods_run(&images.operator_prev, 1),
    )
    .await;

    let t = Instant::now();
    let sample_file = scene
        .root
        .join("config/samples/cache_v1alpha1_memcached.yaml");
    let sample: Memcached =
        serde_saphyr::from_str(&std::fs::read_to_string(sample_file).unwrap()).unwrap();
    harness::apply(&scene.memcacheds(), &sample).await;
    wait_until(
        &format!("Memcached {} Available", release.sample),
        scene.timeout,
        || scene.memcached_available(),
    )
    .await;
    scene.figures.print(format!(
        "sample Memcached (size {}) created to Available: {} s",
        release.sample_size,
        secs(t)
    ));
    wait_until(
        &format!("{} memcached pods Ready on {node}", release.sample_size),
        scene.timeout,
        || scene.memcached_pods_ready(release.sample_size),
    )
    .await;
    if let Err(e) = scene.set_in_every_pod(PREFIX, &release.prev_version).await {
        panic!("every memcached pod stores a key (set over TCP from the host): {e}");
    }
    // Its StatefulSet is OnDelete (the operator updates the members itself since 0.4.0), each
    // member with memcached's memory file and the agent from the release's own image.
    let mut missing = vec![];
    let done = tokio::time::timeout(scene.timeout, async {
        loop {
            missing = match (
                scene.memcacheds().get(&release.sample).await,
                scene.stateful_set().await,
            ) {
                (Ok(mc), Some(sts)) => members::update_missing(
                    &mc,
                    (Some(&sts), &[]),
                    &scene.memcached_pods().await,
                    &KeptBy::StatefulSet(None),
                    &Update::Created,
                    &images.operator_prev,
                ),
                (mc, sts) => vec![format!(
                    "Memcached found: {}, StatefulSet found: {}",
                    mc.is_ok(),
                    sts.is_some()
                )],
            };
            let deployments = scene
                .deployments()
                .list(&ListParams::default().labels(MEMCACHED_PODS))
                .await
                .map(|l| l.items.len());
            if deployments.as_ref().ok() != Some(&0) {
                missing.push(format!("memcached Deployments: {deployments:?}"));
            }
            if missing.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "{prev_csv} runs the Memcached {} as a StatefulSet (OnDelete) of Ready members {}-N of its update revision, memcached with its memory file (-e), the agent from {}, no Deployment; still: {}",
        release.sample,
        release.sample,
        short(&images.operator_prev),
        missing.join("; ")
    );
    let pods = scene.memcached_pods().await;
    Before {
        memcached_uid: scene.memcached_uid().await,
        members: members::before(&pods),
    }
}

// ---------------------------------------------------------------- updates in place, watched

/// Keys written before each update in place, spread over the members.
const KEYS: usize = 10_000;

/// An update in place as a user of the cache sees it: `KEYS` keys written over the members before
/// it (each at its pod's address, which the update keeps), each member probed from the host
/// every 100 ms, the Memcached sampled every second; and the member events before it, so that
/// only its own are counted.
struct Watch {
    keys: Keys,
    prober: Prober,
    sampler: Sampler,
    restarted_before: usize,
    evicted_before: usize,
}

/// What a watch saw of an update, once it was done.
struct Watched {
    samples: Samples,
    probed: Probed,
    /// Keys found after it (of `written`).
    hits: usize,
    written: usize,
    /// "<pod> <found>/<written>" each.
    per_member: String,
    /// Its `Restarted` and `Evicted` events: the pods they name, by time.
    restarted: Vec<(String, Timestamp)>,
    evicted: Vec<(String, Timestamp)>,
}

impl Watch {
    /// Writes the keys (`<prefix>-<i>`) and reads them back (all of them, or it panics), then
    /// starts the prober and the sampler (`logs/run-bundle-<samples>.log`).
    async fn start(scene: &Scene, prefix: &str, samples: &str) -> Watch {
        let t = Instant::now();
        let keys = scene
            .write_keys(prefix, KEYS)
            .await
            .unwrap_or_else(|e| panic!("{KEYS} keys stored over the members: {e}"));
        let found = keys.read_back().await;
        assert!(
            found.values().all(|(hits, written)| hits == written),
            "every key reads back before the update: {found:?}"
        );
        scene.figures.print(format!(
            "{} keys written over {} members (and read back) in {} s",
            keys.len(),
            found.len(),
            secs(t)
        ));
        let addresses = scene
            .memcached_addresses()
            .await
            .unwrap_or_else(|e| panic!("the members' addresses: {e}"));
        Watch {
            keys,
            prober: Prober::start(addresses),
            sampler: scene.sampler(samples),
            restarted_before: scene.member_events("Restarted").await.len(),
            evicted_before: scene.member_events("Evicted").await.len(),
        }
    }

    /// A few more samples (nothing left to update), then stops the sampler and the prober, reads
    /// the keys back from the addresses they were written to, and prints what it saw of `what`:
    /// the keys found, each member's time without an answer, each container's restarts since
    /// `before`, the member events, the samples.
    async fn stop(
        self,
        scene: &Scene,
        what: &str,
        before: &BTreeMap<String, members::Before>,
    ) -> Watched {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let samples = self.sampler.stop();
        let probed = self.prober.stop().await;
        let t = Instant::now();
        let found = self.keys.read_back().await;
        let read_in = secs(t);
        let hits: usize = found.values().map(|(hits, _)| hits).sum();
        let per_member = found
            .iter()
            .map(|(pod, (hits, written))| format!("{pod} {hits}/{written}"))
            .collect::<Vec<_>>()
            .join(", ");
        let written = self.keys.len();
        scene.figures.print(format!(
            "{what}: {hits} of {written} keys found after it ({:.2} %; {per_member}; read back in {read_in} s)",
            100.0 * hits as f64 / written as f64,
        ));
        scene.figures.print(format!(
            "{what}: members probed every 100 ms ({} rounds): fewest answering at once {} of {}; time without an answer: {}",
            probed.rounds,
            probed.fewest,
            before.len(),
            probed.windows()
        ));
        let pods = scene.memcached_pods().await;
        scene.figures.print(format!(
            "{what}: restart counts {}",
            members::restart_counts(before, &pods)
        ));
        let since = |events: Vec<(String, Timestamp)>, n: usize| -> Vec<(String, Timestamp)> {
            events.into_iter().skip(n).collect()
        };
        let restarted = since(
            scene.member_events("Restarted").await,
            self.restarted_before,
        );
        let evicted = since(scene.member_events("Evicted").await, self.evicted_before);
        scene.figures.print(format!(
            "{what}: containers restarted, how they stopped: {}",
            stops(&pods, before, &restarted)
        ));
        scene.figures.print(format!(
            "{what}: {}; with a condition RestartingInPlace: {}, ReplacingMembers: {}, Updating: {}",
            samples.summary("during it"),
            samples.with_reason("RestartingInPlace"),
            samples.with_reason("ReplacingMembers"),
            samples.with_reason("Updating")
        ));
        Watched {
            samples,
            probed,
            hits,
            written,
            per_member,
            restarted,
            evicted,
        }
    }
}

/// For a figure: how each container restarted since `before` last stopped (its exit code and
/// reason, and how long after its member's patch, the `Restarted` event in `restarted`).
fn stops(
    pods: &[Pod],
    before: &BTreeMap<String, members::Before>,
    restarted: &[(String, Timestamp)],
) -> String {
    let mut stops = vec![];
    for pod in pods {
        let name = pod.name_any();
        let patched = restarted
            .iter()
            .rev()
            .find(|(p, _)| *p == name)
            .map(|e| e.1);
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        for status in statuses.into_iter().flatten() {
            let was = before.get(&name).and_then(|b| b.restarts.get(&status.name));
            if was.is_some_and(|was| status.restart_count <= *was) {
                continue;
            }
            let Some(stopped) = status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
            else {
                stops.push(format!("{name} {} (no last state)", status.name));
                continue;
            };
            let after = match (patched, stopped.finished_at.as_ref()) {
                (Some(patched), Some(finished)) => format!(
                    ", {:.1} s after its patch",
                    finished.0.duration_since(patched).as_secs_f64()
                ),
                _ => String::new(),
            };
            stops.push(format!(
                "{name} {} exit {} ({}){after}",
                status.name,
                stopped.exit_code,
                stopped.reason.as_deref().unwrap_or("no reason")
            ));
        }
    }
    stops.join("; ")
}

/// Whether in every pod the agent, last stopped with exit 0, runs since before memcached last
/// stopped: a member whose agent and memcached both change is patched agent first, and the agent
/// stopped alone leaves without waiting out the grace period. Err lists the members where not.
fn agents_first(pods: &[Pod]) -> Result<(), String> {
    let mut wrong = vec![];
    for pod in pods {
        let of = |name| members::container_status(pod, name);
        let (Some(agent), Some(memcached)) = (of("agent"), of("memcached")) else {
            wrong.push(format!("{}: no agent or memcached status", pod.name_any()));
            continue;
        };
        let agent_exit = agent
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        let agent_since = agent
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .map(|t| t.0);
        let memcached_stopped = memcached
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0);
        let first = matches!((agent_since, memcached_stopped), (Some(a), Some(m)) if a <= m);
        // The kubelet reports no last state when it no longer has the stopped container (seen
        // once in a clean run, 2026-11-28, for one member of three): the order still tells.
        let exit_ok = agent_exit.is_none_or(|code| code == 0);
        if !exit_ok || !first {
            wrong.push(format!(
                "{}: agent exit {agent_exit:?}, running since {agent_since:?}; memcached stopped at {memcached_stopped:?}",
                pod.name_any()
            ));
        }
    }
    match wrong.is_empty() {
        true => Ok(()),
        false => Err(wrong.join("; ")),
    }
}

impl Watched {
    /// What holds of every update in place here: each of `members` restarted in place once
    /// (`Restarted` events), about minReadySeconds or more apart, none evicted; at most one member
    /// not answering at any probe; the Memcached Available in every sample, at most one member
    /// out of service and never a pod over its size; Progressing saying `RestartingInPlace`, never
    /// `ReplacingMembers`.
    fn assert_in_place_one_at_a_time(
        &self,
        what: &str,
        members: &BTreeMap<String, members::Before>,
        min_ready: i32,
    ) {
        let size = members.len();
        match members::one_at_a_time(&self.restarted, members, min_ready) {
            Ok(_) if self.evicted.is_empty() => {}
            Ok(list) | Err(list) => panic!(
                "{what}: each of the {size} members restarted in place once, about minReadySeconds ({min_ready} s) or more apart ({list}), none evicted ({:?})",
                self.evicted
            ),
        }
        assert!(
            self.probed.fewest + 1 >= size,
            "{what}: at most one member not answering at any probe: fewest answering {} of {size} ({})",
            self.probed.fewest,
            self.probed.windows()
        );
        for sample in self.samples.unavailable() {
            eprintln!("availability: {}", sample.line);
        }
        assert!(
            self.samples.within_budget(1),
            "{what}: Memcached Available in every sample, at most 1 member out of service and never a pod over {size} ({})",
            self.samples.summary("during it")
        );
        assert!(
            self.samples.with_reason("RestartingInPlace") > 0
                && self.samples.with_reason("ReplacingMembers") == 0,
            "{what}: Progressing says RestartingInPlace during the update ({} samples), never ReplacingMembers ({})",
            self.samples.with_reason("RestartingInPlace"),
            self.samples.with_reason("ReplacingMembers")
        );
    }
}

/// Waits (the scene's timeout) until every member of the sample is updated as `update` says,
/// the agent from `agent_image` and memcached from `memcached_image`; panics naming `what` and
/// what is still missing.
async fn wait_updated(
    scene: &Scene,
    what: &str,
    update: &Update<'_>,
    agent_image: &str,
    memcached_image: &str,
) {
    let mut missing = vec![];
    let done = tokio::time::timeout(scene.timeout, async {
        loop {
            missing = scene.update_missing(update, agent_image).await;
            let images: Vec<Option<String>> = scene
                .memcached_pods()
                .await
                .iter()
                .map(|p| members::image(p, "memcached"))
                .collect();
            if images.iter().any(|i| i.as_deref() != Some(memcached_image)) {
                missing.push(format!("memcached images {images:?}"));
            }
            if missing.is_empty() && scene.memcached_image().await == memcached_image {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "within {:?} of its operator's start, {what}; still: {}",
        scene.timeout,
        missing.join("; ")
    );
}

// ---------------------------------------------------------------- 2. run bundle-upgrade

/// bundle/'s release: its pod template differs from the previous release's in the agent's image
/// only (the operator's own) as the operator compares templates (`-m` through an env var or
/// literal counts as equal), so its operator updates each member in place, one at a time: it
/// patches the agent's image, the kubelet restarts the agent alone, memcached runs on with its
/// cache. The same Memcached, StatefulSet and pods (uids, addresses), every key written before
/// the upgrade read back after it, at most one member out, Available throughout. What the
/// members are after it.
async fn run_bundle_upgrade_restarts_each_members_agent_in_place_keeping_the_keys(
    scene: &Scene,
    before: &Before,
) -> BTreeMap<String, members::Before> {
    let (release, images, node) = (&scene.release, &scene.images, &scene.node);
    let (csv, prev_csv) = (&release.csv_name, &release.prev_csv);
    let size = release.sample_size;
    let what = format!("the upgrade {prev_csv} -> {csv}");
    let watch = Watch::start(scene, "upgrade", "availability").await;
    let t = Instant::now();
    scene
        .sdk(
            &format!("operator-sdk run bundle-upgrade {}", short(&images.bundle)),
            &[
                "run",
                "bundle-upgrade",
                &images.bundle,
                "-n",
                NS,
                "--timeout",
                "5m",
            ],
        )
        .await;
    scene.figures.print(format!(
        "run bundle-upgrade {prev_csv} -> {csv}: command to CSV Succeeded {} s",
        secs(t)
    ));
    assert_eq!(
        scene.csv_phase(csv).await,
        "Succeeded",
        "CSV {csv} phase Succeeded"
    );
    let replaces = scene
        .get("ClusterServiceVersion", NS, csv)
        .await
        .map(|c| str_field(&c, &["spec", "replaces"]));
    assert_eq!(
        replaces.as_deref(),
        Some(prev_csv.as_str()),
        "CSV {csv} replaces {prev_csv}"
    );
    wait_until(&format!("CSV {prev_csv} removed"), scene.timeout, || {
        scene.csv_gone(prev_csv)
    })
    .await;
    wait_until(
        &format!(
            "the operator's two pods Running and Ready on {node} from {}",
            short(&images.operator)
        ),
        scene.timeout,
        || scene.operator_pods_run(&images.operator, 2),
    )
    .await;
    let t_operator = Instant::now();
    let update = Update::InPlace {
        before: &before.members,
        restarted: &["agent"],
    };
    wait_updated(
        scene,
        &format!(
            "Memcached {}'s {size} members adopted from its StatefulSet (gone), then updated in place on {node}: the same pods, Ready, the Memcached's, the agent restarted once on {}, memcached not restarted, still on {}",
            release.sample,
            short(&images.operator),
            short(&images.memcached)
        ),
        &update,
        &images.operator,
        &images.memcached,
    )
    .await;
    scene.figures.print(format!(
        "run bundle-upgrade started -> every member updated in place: {} s ({} s after {csv}'s operator was Ready)",
        secs(t),
        secs(t_operator)
    ));
    let watched = watch.stop(scene, &what, &before.members).await;
    let min_ready = scene.min_ready_seconds().await;
    scene.figures.print(format!(
        "{what}: members restarted in place: {}",
        members::one_at_a_time(&watched.restarted, &before.members, min_ready)
            .unwrap_or_else(|list| list)
    ));

    assert_eq!(
        scene.memcached_uid().await,
        before.memcached_uid,
        "the same Memcached (UID {}): no CR lost",
        before.memcached_uid
    );
    assert_eq!(
        watched.hits, watched.written,
        "{what}: every one of the {} keys written before it read back after it, memcached having run on: {} ({})",
        watched.written, watched.hits, watched.per_member
    );
    watched.assert_in_place_one_at_a_time(&what, &before.members, min_ready);
    // memcached ran on, so every member kept answering: none without an answer for as long as a
    // restart of memcached takes (1.4-1.6 s in phase 3), at most a probe or two lost to a busy
    // host.
    let silent: Vec<String> = watched
        .probed
        .down
        .iter()
        .filter(|(_, windows)| windows.iter().sum::<Duration>() >= Duration::from_secs(1))
        .map(|(member, _)| member.clone())
        .collect();
    assert!(
        silent.is_empty(),
        "{what}: every member answering throughout, none without an answer for 1 s or more (memcached is not restarted): {} ({})",
        silent.join(" "),
        watched.probed.windows()
    );
    // The key stored under the previous release is still there, and the members serve.
    if let Err(e) = scene
        .get_from_every_pod(PREFIX, &release.prev_version)
        .await
    {
        panic!(
            "the key stored under {prev_csv} read back from every member after the upgrade: {e}"
        );
    }
    if let Err(e) = scene.set_in_every_pod(PREFIX, &release.version).await {
        panic!("every member stores a key (set over TCP from the host): {e}");
    }
    if let Err(e) = scene.get_from_every_pod(PREFIX, &release.version).await {
        panic!("every member reads its key back: {e}");
    }
    members::before(&scene.memcached_pods().await)
}

// ---------------------------------------------------------------- 3. a release that changes only images

/// A patch release made as releases are (hack/olm/README.md, "Releasing": images pinned by
/// digest): the references of memcached's image and the agent's (the operator's) change from tag
/// to digest and nothing else, so the operator restarts each member in place, one at a time, both
/// memcached and the agent, the agent first: the same pods (uids, names, addresses), memcached restarted once
/// more, the keys kept (saved by the agent on preStop into the memory-backed file memcached
/// restores); at most one member not answering at any moment, the Memcached Available
/// throughout.
async fn a_release_by_digest_restarts_each_member_in_place_keeping_the_keys(
    scene: &Scene,
    before: &Before,
    after: &BTreeMap<String, members::Before>,
) {
    let (release, images, node) = (&scene.release, &scene.images, &scene.node);
    let patch_version = release.patch_version();
    let patch_csv = format!("{PACKAGE}.v{patch_version}");
    let what = format!("the update in place to {patch_csv}");
    let host = &scene.registry.host;
    let operator_patch = format!("{host}/memcached-operator:{patch_version}");
    scene
        .registry
        .push(&images.operator_archive, &operator_patch);
    let patch_dir = scene.work.join(format!("v{patch_version}"));
    run(scene
        .hack("olm/bundle.sh")
        .arg(&patch_dir)
        .env("VERSION", &patch_version)
        .env("REPLACES", &release.version)
        .env("SKIP_RANGE_MIN", "")
        .env("IMG", &operator_patch)
        .env(
            "RELATED_IMAGES",
            format!(
                "MEMCACHED={} MEMCACHED_EXPORTER={}",
                images.memcached, images.exporter
            ),
        )
        .env("USE_IMAGE_DIGESTS", "true"));
    let memcached_pinned = scene.registry.pinned(&images.memcached);
    let operator_pinned = scene.registry.pinned(&operator_patch);
    let bundle_patch = format!("{host}/{PACKAGE}-bundle:v{patch_version}");
    scene.push_bundle_image(&patch_dir, &bundle_patch);

    let watch = Watch::start(scene, "warm", "availability-in-place").await;
    let t = Instant::now();
    scene
        .sdk(
            &format!(
                "operator-sdk run bundle-upgrade {} (images by digest)",
                short(&bundle_patch)
            ),
            &[
                "run",
                "bundle-upgrade",
                &bundle_patch,
                "-n",
                NS,
                "--timeout",
                "5m",
            ],
        )
        .await;
    scene.figures.print(format!(
        "run bundle-upgrade {} -> {patch_csv}: command to CSV Succeeded {} s",
        release.csv_name,
        secs(t)
    ));
    wait_until(
        &format!(
            "the operator's two pods Running and Ready on {node} from the patch release's image (by digest)"
        ),
        scene.timeout,
        || scene.operator_pods_run(&operator_pinned, 2),
    )
    .await;
    let t_operator = Instant::now();
    let update = Update::InPlace {
        before: after,
        restarted: &["memcached", "agent"],
    };
    wait_updated(
        scene,
        &format!(
            "every member of Memcached {} restarted in place on {}, the agent from {}: the same pods, memcached and the agent restarted once more, Ready",
            release.sample,
            short(&memcached_pinned),
            short(&operator_pinned)
        ),
        &update,
        &operator_pinned,
        &memcached_pinned,
    )
    .await;
    scene.figures.print(format!(
        "patch release (images by digest): bundle-upgrade started -> every member restarted in place: {} s ({} s after its operator was Ready)",
        secs(t),
        secs(t_operator)
    ));
    let watched = watch.stop(scene, &what, after).await;
    let min_ready = scene.min_ready_seconds().await;
    scene.figures.print(format!(
        "{what}: members restarted in place: {}",
        members::one_at_a_time(&watched.restarted, after, min_ready).unwrap_or_else(|list| list)
    ));

    assert_eq!(
        scene.memcached_uid().await,
        before.memcached_uid,
        "the same Memcached (UID {}) after the update",
        before.memcached_uid
    );
    assert!(
        watched.hits * 100 >= watched.written * 99,
        "{what}: at least 99 % of the {} keys written before it read back after it, memcached restarted from its saved file: {} ({})",
        watched.written,
        watched.hits,
        watched.per_member
    );
    watched.assert_in_place_one_at_a_time(&what, after, min_ready);
    if let Err(e) = agents_first(&scene.memcached_pods().await) {
        panic!(
            "{what}: each member's agent restarted by itself (exit 0) and was running again before memcached stopped, so that memcached's preStop found it to save: {e}"
        );
    }
    if let Err(e) = scene.set_in_every_pod(PREFIX, &patch_version).await {
        panic!("every memcached pod answers (a key set and read back): {e}");
    }
    if let Err(e) = scene.get_from_every_pod(PREFIX, &patch_version).await {
        panic!("every memcached pod reads its key back: {e}");
    }
}

// ---------------------------------------------------------------- 4. scorecard

async fn the_scorecard_passes_every_test_of_the_committed_config(scene: &Scene) {
    let t = Instant::now();
    let json_file = scene.work.join("scorecard.json");
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(scene.logs.join(format!("{PREFIX}-operator-sdk.log")))
        .unwrap();
    let status = tokio::process::Command::new(&scene.sdk)
        .arg("scorecard")
        .arg(scene.root.join("bundle"))
        .args(["-n", NS, "-o", "json", "-w", "180s"])
        .args(["--untar-image", &scene.images.busybox])
        .args(["--storage-image", &scene.images.busybox])
        .current_dir(&scene.work)
        .env("KUBECONFIG", harness::cluster().kubeconfig())
        .env("SSL_CERT_FILE", scene.ca())
        .stdout(std::fs::File::create(&json_file).unwrap())
        .stderr(log)
        .status()
        .await
        .unwrap();
    assert!(
        status.success(),
        "operator-sdk scorecard bundle/ (tests as pods of the scorecard-test image): {status}"
    );
    let output: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap_or_default();
    let results: Vec<(String, String)> = output["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["status"]["results"].as_array().into_iter().flatten())
        .map(|r| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let states: Vec<String> = results.iter().map(|(n, s)| format!("{n}={s}")).collect();
    scene
        .figures
        .print(format!("scorecard: {} in {} s", states.join(" "), secs(t)));
    let config: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(scene.root.join("bundle/tests/scorecard/config.yaml")).unwrap(),
    )
    .unwrap();
    let mut want: Vec<String> = config["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["tests"].as_array().into_iter().flatten())
        .filter_map(|t| t["entrypoint"][1].as_str().map(String::from))
        .collect();
    want.sort();
    let mut passed: Vec<String> = results
        .iter()
        .filter(|(_, state)| state == "pass")
        .map(|(name, _)| name.clone())
        .collect();
    passed.sort();
    assert!(
        !want.is_empty() && passed == want,
        "scorecard: every test of the config passed ({}); passed: {}",
        want.join(" "),
        passed.join(" ")
    );
}

// ---------------------------------------------------------------- 5. the catalog image

async fn a_subscription_to_the_catalog_image_resolves_to_the_release(scene: &Scene) {
    let (csv, node) = (&scene.release.csv_name, &scene.node);
    let catalog_source = format!("{PACKAGE}-catalog-image");
    scene.namespace(NS_CATALOG).await;
    for object in [
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "CatalogSource",
            "metadata": {"name": catalog_source, "namespace": OLM_NS},
            "spec": {
                "sourceType": "grpc",
                "image": scene.images.catalog,
                "displayName": "memcached-operator (catalog image)",
                "grpcPodConfig": {"securityContextConfig": "restricted"},
            },
        }),
        json!({
            "apiVersion": "operators.coreos.com/v1",
            "kind": "OperatorGroup",
            "metadata": {"name": PACKAGE, "namespace": NS_CATALOG},
            "spec": {"targetNamespaces": [NS_CATALOG]},
        }),
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "Subscription",
            "metadata": {"name": PACKAGE, "namespace": NS_CATALOG},
            "spec": {
                "name": PACKAGE,
                "source": catalog_source,
                "sourceNamespace": OLM_NS,
                "installPlanApproval": "Manual",
            },
        }),
    ] {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        let kind = object.types.as_ref().unwrap().kind.clone();
        harness::apply(&scene.api(&kind, &object.namespace().unwrap()), &object).await;
    }
    wait_until(
        &format!(
            "the CatalogSource of the catalog image READY (its pod on {node}, probed by grpc_health_probe)"
        ),
        scene.timeout,
        || async {
            scene
                .get("CatalogSource", OLM_NS, &catalog_source)
                .await
                .is_some_and(|c| {
                    str_field(&c, &["status", "connectionState", "lastObservedState"]) == "READY"
                })
        },
    )
    .await;
    wait_until(
        &format!("a Subscription to the catalog image's default channel to resolve to {csv}"),
        scene.timeout,
        || async {
            let Some(sub) = scene.get("Subscription", NS_CATALOG, PACKAGE).await else {
                return false;
            };
            let plan = str_field(&sub, &["status", "installPlanRef", "name"]);
            if plan.is_empty() {
                return false;
            }
            scene
                .get("InstallPlan", NS_CATALOG, &plan)
                .await
                .is_some_and(|ip| {
                    field(&ip, &["spec", "clusterServiceVersionNames"])
                        .and_then(Value::as_array)
                        .is_some_and(|names| names.iter().any(|n| n.as_str() == Some(csv)))
                })
        },
    )
    .await;
    let _ = Api::<Namespace>::all(scene.client.clone())
        .delete(NS_CATALOG, &DeleteParams::default())
        .await;
    scene
        .api("CatalogSource", OLM_NS)
        .delete(&catalog_source, &DeleteParams::default())
        .await
        .expect("the catalog image's CatalogSource deleted");
}

// ---------------------------------------------------------------- 6. cleanup

async fn cleanup_leaves_nothing_of_the_operator(scene: &Scene) {
    let t = Instant::now();
    scene
        .sdk(
            &format!("operator-sdk cleanup {PACKAGE}"),
            &["cleanup", PACKAGE, "-n", NS, "--timeout", "3m"],
        )
        .await;
    scene.figures.print(format!("cleanup: {} s", secs(t)));
    let mut left = vec![];
    for kind in [
        "ClusterServiceVersion",
        "Subscription",
        "CatalogSource",
        "OperatorGroup",
        "InstallPlan",
    ] {
        for name in scene.names(kind, NS).await {
            left.push(format!("{kind} {name}"));
        }
    }
    assert!(
        left.is_empty(),
        "no CSV, Subscription, CatalogSource, OperatorGroup or InstallPlan left: {left:?}"
    );
    wait_until(
        &format!("no Deployment, StatefulSet or pod left in {NS} (operator, registry, memcached)"),
        scene.timeout,
        || async {
            let params = ListParams::default();
            scene
                .deployments()
                .list(&params)
                .await
                .is_ok_and(|l| l.items.is_empty())
                && scene
                    .stateful_sets()
                    .list(&params)
                    .await
                    .is_ok_and(|l| l.items.is_empty())
                && scene
                    .pods()
                    .list(&params)
                    .await
                    .is_ok_and(|l| l.items.is_empty())
        },
    )
    .await;
    let crds = Api::<CustomResourceDefinition>::all(scene.client.clone());
    wait_until(
        &format!("CRD {CRD} deleted (and with it every Memcached)"),
        scene.timeout,
        || async { matches!(crds.get_opt(CRD).await, Ok(None)) },
    )
    .await;
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_sdk_runs_upgrades_scores_and_cleans_up_the_bundle_on_the_real_node() {
    let t0 = Instant::now();
    let client = harness::cluster().admin().await.expect("admin client");
    let scene = Scene::set_up(client);
    the_bundle_and_catalog_images_render_as_their_sources(&scene, t0);
    let t_images = t0.elapsed();
    let _olm = olm_runs_with_its_pods_on_the_real_node(&scene).await;
    let before = run_bundle_installs_the_previous_release_and_its_memcached_serves(&scene).await;
    let after =
        run_bundle_upgrade_restarts_each_members_agent_in_place_keeping_the_keys(&scene, &before)
            .await;
    a_release_by_digest_restarts_each_member_in_place_keeping_the_keys(&scene, &before, &after)
        .await;
    the_scorecard_passes_every_test_of_the_committed_config(&scene).await;
    a_subscription_to_the_catalog_image_resolves_to_the_release(&scene).await;
    cleanup_leaves_nothing_of_the_operator(&scene).await;
    scene.figures.print(format!(
        "the whole test: {} s (images built after {} s)",
        t0.elapsed().as_secs(),
        t_images.as_secs()
    ));
}
