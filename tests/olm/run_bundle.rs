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
//!      with real memcached pods that answer; a key is stored in each;
//!   2. run bundle-upgrade to bundle/'s release (bundle.sh with the images in the local
//!      registry, as a release is made): it Succeeds and replaces the previous one, and the
//!      Memcached moves from the previous release's Deployment to a StatefulSet: the same
//!      Memcached UID, a StatefulSet of its name that it controls, `size` Ready pods
//!      `<name>-0 …` of it, the Deployment and its pods gone; Available and `size` pods serving in
//!      every sample (the Deployment's pods serve until the members are all available); the new
//!      members start empty (the move costs the cache once) and store and return a key;
//!   3. run bundle-upgrade to a patch release pinned by digest (so the memcached pod template
//!      changes): the StatefulSet replaces every member under its own name, one at a time:
//!      Available in every sample, at most one member out (`size` - 1 serving) and never a pod
//!      over `size`;
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
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use serde_json::{Value, json};

use crate::availability::Samples;
use crate::harness;
use crate::olm::{self, CatalogOptions, Olm, field, str_field};
use crate::scripts::{run, tool};
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

/// What the upgrade must keep (the Memcached) and what it must replace (the previous release's
/// Deployment and its pods).
struct Before {
    memcached_uid: String,
    pod_uids: BTreeMap<String, String>,
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
    assert!(
        scene.deployment().await.is_some() && scene.stateful_set().await.is_none(),
        "{prev_csv} runs the Memcached as a Deployment {}, no StatefulSet",
        release.sample
    );
    Before {
        memcached_uid: scene.memcached_uid().await,
        pod_uids: scene.pod_uids().await,
    }
}

// ---------------------------------------------------------------- 2. run bundle-upgrade

/// The pods the upgrade left: name -> uid of the StatefulSet's members.
type After = BTreeMap<String, String>;

async fn run_bundle_upgrade_moves_the_memcached_to_its_stateful_set(
    scene: &Scene,
    before: &Before,
) -> After {
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
    // The move: the StatefulSet beside the Deployment, the Deployment deleted once the members
    // are all available.
    let mut missing = vec![];
    let moved = tokio::time::timeout(scene.timeout, async {
        loop {
            missing = scene.migration_missing().await;
            if missing.is_empty() && scene.memcached_available().await {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        moved.is_ok(),
        "within {:?} of its operator's start, Memcached {} on a StatefulSet of its name that it controls, {size} pods {}-N of it Ready on {node}, its Deployment gone, Available; still: {}",
        scene.timeout,
        release.sample,
        release.sample,
        missing.join("; ")
    );
    scene.figures.print(format!(
        "run bundle-upgrade started -> the Memcached on its StatefulSet, its Deployment gone: {} s",
        secs(t)
    ));
    tokio::time::sleep(Duration::from_secs(5)).await; // a few more samples, the new operator in charge
    let samples = sampler.stop();

    let uid = scene.memcached_uid().await;
    assert_eq!(
        uid, before.memcached_uid,
        "the same Memcached (UID {}): no CR lost",
        before.memcached_uid
    );
    let pod_uids = scene.pod_uids().await;
    assert!(
        pod_uids
            .values()
            .all(|u| !before.pod_uids.values().any(|b| b == u)),
        "none of the Deployment's pods left: {pod_uids:?}"
    );
    let line = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(n, u)| format!("{n}={u}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    scene.figures.print(format!(
        "memcached pods before/after the upgrade: {} / {}",
        line(&before.pod_uids),
        line(&pod_uids)
    ));
    assert!(
        samples.always_serving(size),
        "Memcached Available and {size} pods serving in every sample during the upgrade ({})",
        samples.summary("during the upgrade")
    );
    scene.figures.print(format!(
        "{}, with a condition Migrating: {}, most pods: {}; Memcacheds lost: 0",
        samples.summary("during the upgrade"),
        samples.with_reason("Migrating"),
        samples.most_pods()
    ));
    // The members start empty (the move costs the cache once), and serve.
    let kept = scene
        .get_from_every_pod(PREFIX, &release.prev_version)
        .await
        .is_ok();
    scene.figures.print(format!(
        "the key stored under {prev_csv} found in every new member: {kept}"
    ));
    if let Err(e) = scene.set_in_every_pod(PREFIX, &release.version).await {
        panic!("every member stores a key (set over TCP from the host): {e}");
    }
    if let Err(e) = scene.get_from_every_pod(PREFIX, &release.version).await {
        panic!("every member reads its key back: {e}");
    }
    pod_uids
}

// ---------------------------------------------------------------- 3. a release that changes the pod template

/// A patch release made as releases are (hack/olm/README.md, "Releasing": images pinned by
/// digest): the memcached image's reference changes from tag to digest, so every memcached pod
/// template changes; the StatefulSet replaces each member under its own name, one at a time
/// (maxUnavailable 1, minReadySeconds; a member cannot surge): the Memcached stays Available
/// with at most one member out, and never has a pod over its size.
async fn a_release_by_digest_rolls_every_pod_one_at_a_time(
    scene: &Scene,
    before: &Before,
    after: &After,
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
    let bundle_patch = format!("{host}/{PACKAGE}-bundle:v{patch_version}");
    scene.push_bundle_image(&patch_dir, &bundle_patch);

    let sampler = scene.sampler("availability-roll");
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
    let operator_pinned = scene.registry.pinned(&operator_patch);
    wait_until(
        &format!(
            "the operator pod Running and Ready on {node} from the patch release's image (by digest)"
        ),
        scene.timeout,
        || scene.operator_pod_runs(&operator_pinned),
    )
    .await;
    // Every member runs the pinned image, each replaced under its own name.
    wait_until(
        &format!(
            "the memcached StatefulSet rolled to {}: its {size} members replaced, Ready, Available",
            short(&memcached_pinned)
        ),
        scene.timeout,
        || async {
            scene.memcached_pods_ready(size).await
                && scene.memcached_image().await == memcached_pinned
                && scene
                    .pod_uids()
                    .await
                    .iter()
                    .all(|(name, uid)| after.contains_key(name) && after.get(name) != Some(uid))
                && scene.memcached_available().await
        },
    )
    .await;
    scene.figures.print(format!(
        "patch release: bundle-upgrade started to every memcached pod replaced: {} s",
        secs(t)
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples: Samples = sampler.stop();
    assert_eq!(
        scene.memcached_uid().await,
        before.memcached_uid,
        "the same Memcached (UID {}) after the roll",
        before.memcached_uid
    );
    assert!(
        samples.always_serving(size.saturating_sub(1)),
        "Memcached Available and at least {} pods serving in every sample during the roll (one member out at a time) ({})",
        size.saturating_sub(1),
        samples.summary("during the roll")
    );
    assert!(
        samples.max_pods().is_some_and(|most| most <= size),
        "never a pod over size (a member is replaced under its own name): most pods {}",
        samples.most_pods()
    );
    scene.figures.print(format!(
        "{}, most pods: {}",
        samples.summary("during the roll"),
        samples.most_pods()
    ));
    if let Err(e) = scene.set_in_every_pod(PREFIX, &patch_version).await {
        panic!("every new memcached pod answers (a key set and read back): {e}");
    }
    if let Err(e) = scene.get_from_every_pod(PREFIX, &patch_version).await {
        panic!("every new memcached pod reads its key back: {e}");
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
    let after = run_bundle_upgrade_moves_the_memcached_to_its_stateful_set(&scene, &before).await;
    a_release_by_digest_rolls_every_pod_one_at_a_time(&scene, &before, &after).await;
    the_scorecard_passes_every_test_of_the_committed_config(&scene).await;
    a_subscription_to_the_catalog_image_resolves_to_the_release(&scene).await;
    cleanup_leaves_nothing_of_the_operator(&scene).await;
    scene.figures.print(format!(
        "the whole test: {} s (images built after {} s)",
        t0.elapsed().as_secs(),
        t_images.as_secs()
    ));
}
