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
//!      with real memcached pods that answer, a StatefulSet that rolls its own pods
//!      (`RollingUpdate`); a key is stored in each;
//!   2. run bundle-upgrade to bundle/'s release (bundle.sh with the images in the local
//!      registry, as a release is made): it Succeeds and replaces the previous one, and its
//!      operator, whose pod template cannot be taken in place (memcached's memory file, the agent
//!      beside it), replaces each member under its name: the same Memcached UID and StatefulSet
//!      (uid), now `OnDelete`, `size` new pods `<name>-0 …` of the update revision, Ready, with the
//!      agent from the operator's image; evicted one at a time (`Evicted` events, about
//!      `minReadySeconds` or more apart); Available, at most one member out and never a pod over `size`
//!      in every sample; the new members start empty (the replacement costs the cache once) and
//!      store and return a key;
//!   3. run bundle-upgrade to a patch release pinned by digest (only the references of
//!      memcached's image and the agent's change): the operator restarts each member in place,
//!      one at a time: 10,000 keys written over the members before it, at least 99 % read back
//!      after it; the same pods (uids, addresses), memcached restarted once more, a `Restarted`
//!      event each; each member probed every 100 ms from the host, never more than one not
//!      answering; Available, at most one member out and never a pod over `size` in every sample;
//!   4. scorecard of bundle/ as committed (its config unmodified): the tests as pods;
//!   5. the catalog image as a CatalogSource (OLM's registry pod, probed with
//!      grpc_health_probe): READY, and a Subscription to it resolves to bundle/'s release;
//!   6. cleanup: the CSV, Subscription, CatalogSource, registry pod, OperatorGroup, CRD and with
//!      it every Memcached, its StatefulSet and pods gone.
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
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

use crate::harness;
use crate::members::{self, Update, members_missing};
use crate::olm::{self, CatalogOptions, Olm, field, str_field};
use crate::scripts::{run, tool};
use memcached_operator_testkit::probe::Prober;
use scene::{Scene, secs, short, wait_until};

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

/// What the upgrades must keep (the Memcached, its StatefulSet) and what they must change (each
/// member's pod: replaced, then restarted in place).
struct Before {
    memcached_uid: String,
    stateful_set_uid: String,
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
        || scene.operator_pod_runs(&images.operator_prev),
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
    let sts = scene
        .stateful_set()
        .await
        .unwrap_or_else(|| panic!("{prev_csv} runs the Memcached as a StatefulSet"));
    let strategy = sts
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.type_.clone());
    let pods = scene.memcached_pods().await;
    let missing = members_missing(
        &pods,
        &release.sample,
        release.sample_size,
        sts.uid().as_deref(),
    );
    let deployments = scene
        .deployments()
        .list(&ListParams::default().labels(MEMCACHED_PODS))
        .await
        .map(|l| l.items.len())
        .ok();
    assert!(
        strategy.as_deref() == Some("RollingUpdate")
            && missing.is_empty()
            && deployments == Some(0),
        "{prev_csv} runs the Memcached as a StatefulSet {} (updateStrategy {strategy:?}, not RollingUpdate) of members {}-N ({}), no Deployment ({deployments:?})",
        release.sample,
        release.sample,
        missing.join("; ")
    );
    Before {
        memcached_uid: scene.memcached_uid().await,
        stateful_set_uid: sts.uid().unwrap_or_default(),
        members: members::before(&pods),
    }
}

// ---------------------------------------------------------------- 2. run bundle-upgrade

/// The members an update evicted (`Evicted` events), one at a time: each of `members` once, the
/// next once the one before has been replaced and Ready for `min_ready` seconds, so at least
/// that long after it (less a second: a Ready time is kept to the second). For a figure: each
/// with its time after the first.
fn evicted_one_at_a_time(
    evicted: &[(String, Timestamp)],
    members: &BTreeMap<String, members::Before>,
    min_ready: i32,
) -> Result<String, String> {
    let first = evicted.first().map(|(_, t)| *t);
    let list = evicted
        .iter()
        .map(|(pod, t)| {
            let after = first.map_or(0.0, |f| t.duration_since(f).as_secs_f64());
            format!("{pod} +{after:.1} s")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut names: Vec<&String> = evicted.iter().map(|(pod, _)| pod).collect();
    names.sort();
    let apart = evicted
        .windows(2)
        .all(|w| w[1].1.duration_since(w[0].1).as_secs_f64() >= f64::from(min_ready - 1));
    if names.into_iter().eq(members.keys()) && apart {
        Ok(list)
    } else {
        Err(list)
    }
}

/// bundle/'s release: its operator sets the StatefulSet `OnDelete` and a pod template memcached
/// cannot take in place (its memory file, the agent beside it, a volume), so it replaces each
/// member under its name, one at a time (evicts it; the StatefulSet makes it anew): the same
/// StatefulSet, new pods, at most one member out, Available throughout; the cache is lost once.
/// What the members are after it.
async fn run_bundle_upgrade_replaces_each_member_one_at_a_time(
    scene: &Scene,
    before: &Before,
) -> BTreeMap<String, members::Before> {
    let (release, images, node) = (&scene.release, &scene.images, &scene.node);
    let (csv, prev_csv) = (&release.csv_name, &release.prev_csv);
    let size = release.sample_size;
    let sampler = scene.sampler("availability");
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
            "the operator pod Running and Ready on {node} from {}",
            short(&images.operator)
        ),
        scene.timeout,
        || scene.operator_pod_runs(&images.operator),
    )
    .await;
    let t_operator = Instant::now();
    let update = Update::Replaced(&before.members);
    let mut missing = vec![];
    let done = tokio::time::timeout(scene.timeout, async {
        loop {
            missing = scene
                .update_missing(&before.stateful_set_uid, &update, &images.operator)
                .await;
            if missing.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "within {:?} of its operator's start, Memcached {} on the same StatefulSet (OnDelete), its {size} members replaced under their names, Ready on {node}, the agent from {}; still: {}",
        scene.timeout,
        release.sample,
        short(&images.operator),
        missing.join("; ")
    );
    scene.figures.print(format!(
        "run bundle-upgrade started -> every member replaced: {} s ({} s after {csv}'s operator was Ready)",
        secs(t),
        secs(t_operator)
    ));
    tokio::time::sleep(Duration::from_secs(5)).await; // a few more samples, nothing left to do
    let samples = sampler.stop();

    let uid = scene.memcached_uid().await;
    assert_eq!(
        uid, before.memcached_uid,
        "the same Memcached (UID {}): no CR lost",
        before.memcached_uid
    );
    let min_ready = scene.min_ready_seconds().await;
    let evicted = scene.member_events("Evicted").await;
    let restarted = scene.member_events("Restarted").await;
    match evicted_one_at_a_time(&evicted, &before.members, min_ready) {
        Ok(list) => scene.figures.print(format!("members evicted: {list}")),
        Err(list) => panic!(
            "each of the {size} members evicted once, about minReadySeconds ({min_ready} s) or more apart: {list}"
        ),
    }
    assert!(
        restarted.is_empty(),
        "no member restarted in place (the template changes beyond images): {restarted:?}"
    );
    let after = members::before(&scene.memcached_pods().await);
    let line = |m: &BTreeMap<String, members::Before>| {
        m.iter()
            .map(|(n, b)| format!("{n}={}", b.uid))
            .collect::<Vec<_>>()
            .join(" ")
    };
    scene.figures.print(format!(
        "memcached pods before/after the upgrade: {} / {}",
        line(&before.members),
        line(&after)
    ));
    for sample in samples.unavailable() {
        eprintln!("availability: {}", sample.line);
    }
    assert!(
        samples.within_budget(1),
        "Memcached Available in every sample, at most 1 member out of service and never a pod over {size} ({})",
        samples.summary("during the upgrade")
    );
    assert!(
        samples.with_reason("ReplacingMembers") > 0
            && samples.with_reason("RestartingInPlace") == 0,
        "Progressing says ReplacingMembers during the update ({} samples), never RestartingInPlace ({})",
        samples.with_reason("ReplacingMembers"),
        samples.with_reason("RestartingInPlace")
    );
    scene.figures.print(format!(
        "{}; with a condition ReplacingMembers: {}, Updating: {}; Memcacheds lost: 0",
        samples.summary("during the upgrade"),
        samples.with_reason("ReplacingMembers"),
        samples.with_reason("Updating")
    ));
    // The members start empty (the replacement costs the cache once), and serve.
    let kept = scene
        .get_from_every_pod(PREFIX, &release.prev_version)
        .await
        .is_ok();
    scene.figures.print(format!(
        "the key stored under {prev_csv} found in every replaced member: {kept}"
    ));
    if let Err(e) = scene.set_in_every_pod(PREFIX, &release.version).await {
        panic!("every member stores a key (set over TCP from the host): {e}");
    }
    if let Err(e) = scene.get_from_every_pod(PREFIX, &release.version).await {
        panic!("every member reads its key back: {e}");
    }
    after
}

// ---------------------------------------------------------------- 3. a release that changes only images

/// Keys written before the update in place, spread over the members.
const KEYS: usize = 10_000;

/// A patch release made as releases are (hack/olm/README.md, "Releasing": images pinned by
/// digest): the references of memcached's image and the agent's (the operator's) change from tag
/// to digest and nothing else, so the operator restarts each member in place, one at a time: the
/// same pods (uids, names, addresses), memcached restarted once more, the keys kept (saved by
/// the agent on preStop into the memory-backed file memcached restores); at most one member not
/// answering at any moment, the Memcached Available throughout.
async fn a_release_by_digest_restarts_each_member_in_place_keeping_the_keys(
    scene: &Scene,
    before: &Before,
    after: &BTreeMap<String, members::Before>,
) {
    let (release, images, node) = (&scene.release, &scene.images, &scene.node);
    let size = release.sample_size;
    let patch_version = release.patch_version();
    let patch_csv = format!("{PACKAGE}.v{patch_version}");
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

    // The cache the update must keep, and each member's address, which it keeps too.
    let t = Instant::now();
    let keys = scene
        .write_keys("warm", KEYS)
        .await
        .unwrap_or_else(|e| panic!("{KEYS} keys stored over the members: {e}"));
    let found = keys.read_back().await;
    assert!(
        found.values().all(|(hits, written)| hits == written),
        "every key reads back before the upgrade: {found:?}"
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
    let prober = Prober::start(addresses.clone());
    let sampler = scene.sampler("availability-in-place");
    let evicted_before = scene.member_events("Evicted").await.len();

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
            "the operator pod Running and Ready on {node} from the patch release's image (by digest)"
        ),
        scene.timeout,
        || scene.operator_pod_runs(&operator_pinned),
    )
    .await;
    let t_operator = Instant::now();
    let update = Update::InPlace(after);
    let mut missing = vec![];
    let done = tokio::time::timeout(scene.timeout, async {
        loop {
            missing = scene
                .update_missing(&before.stateful_set_uid, &update, &operator_pinned)
                .await;
            let images: Vec<Option<String>> = scene
                .memcached_pods()
                .await
                .iter()
                .map(|p| members::image(p, "memcached"))
                .collect();
            if images
                .iter()
                .any(|i| i.as_deref() != Some(&memcached_pinned))
            {
                missing.push(format!("memcached images {images:?}"));
            }
            if missing.is_empty() && scene.memcached_image().await == memcached_pinned {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "within {:?} of its operator's start, every member of Memcached {} restarted in place on {} and the agent from {}: the same pods, memcached restarted once more, Ready; still: {}",
        scene.timeout,
        release.sample,
        short(&memcached_pinned),
        short(&operator_pinned),
        missing.join("; ")
    );
    let took = secs(t);
    let took_operator = secs(t_operator);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples = sampler.stop();
    let probed = prober.stop().await;
    let t = Instant::now();
    let found = keys.read_back().await;
    let read_in = secs(t);

    let hits: usize = found.values().map(|(hits, _)| hits).sum();
    let per_member: Vec<String> = found
        .iter()
        .map(|(pod, (hits, written))| format!("{pod} {hits}/{written}"))
        .collect();
    scene.figures.print(format!(
        "update in place: {hits} of {} keys found after it ({:.2} %; {}; read back in {read_in} s)",
        keys.len(),
        100.0 * hits as f64 / keys.len() as f64,
        per_member.join(", ")
    ));
    scene.figures.print(format!(
        "patch release (images by digest): bundle-upgrade started -> every member restarted in place: {took} s ({took_operator} s after its operator was Ready)"
    ));
    scene.figures.print(format!(
        "members probed every 100 ms ({} rounds): fewest answering at once {} of {size}; time without an answer: {}",
        probed.rounds,
        probed.fewest,
        probed.windows()
    ));
    let restarts: Vec<String> = scene
        .memcached_pods()
        .await
        .iter()
        .map(|p| {
            format!(
                "{} memcached {} -> {}, agent {}",
                p.name_any(),
                after.get(&p.name_any()).map_or(-1, |b| b.restarts),
                members::restarts(p, "memcached"),
                members::restarts(p, "agent")
            )
        })
        .collect();
    scene
        .figures
        .print(format!("restart counts: {}", restarts.join("; ")));
    let restarted = scene.member_events("Restarted").await;
    let list = restarted
        .iter()
        .map(|(pod, _)| pod.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    scene.figures.print(format!(
        "{}; with a condition RestartingInPlace: {}, Updating: {}",
        samples.summary("during the update in place"),
        samples.with_reason("RestartingInPlace"),
        samples.with_reason("Updating")
    ));

    assert_eq!(
        scene.memcached_uid().await,
        before.memcached_uid,
        "the same Memcached (UID {}) after the update",
        before.memcached_uid
    );
    assert!(
        hits * 100 >= keys.len() * 99,
        "at least 99 % of the {} keys written before the update in place read back after it: {hits} ({})",
        keys.len(),
        per_member.join(", ")
    );
    let mut names: Vec<&str> = restarted.iter().map(|(pod, _)| pod.as_str()).collect();
    names.sort();
    assert!(
        names.into_iter().eq(after.keys().map(String::as_str))
            && scene.member_events("Evicted").await.len() == evicted_before,
        "each member restarted in place once (Restarted events: {list}), none evicted"
    );
    assert!(
        probed.fewest + 1 >= size,
        "at most one member not answering at any probe: fewest answering {} of {size} ({})",
        probed.fewest,
        probed.windows()
    );
    for sample in samples.unavailable() {
        eprintln!("availability: {}", sample.line);
    }
    assert!(
        samples.within_budget(1),
        "Memcached Available in every sample, at most 1 member out of service and never a pod over {size} ({})",
        samples.summary("during the update in place")
    );
    assert!(
        samples.with_reason("RestartingInPlace") > 0
            && samples.with_reason("ReplacingMembers") == 0,
        "Progressing says RestartingInPlace during the update ({} samples), never ReplacingMembers ({})",
        samples.with_reason("RestartingInPlace"),
        samples.with_reason("ReplacingMembers")
    );
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
    let after = run_bundle_upgrade_replaces_each_member_one_at_a_time(&scene, &before).await;
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
