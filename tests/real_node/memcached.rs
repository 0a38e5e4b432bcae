//! memcached as the operator deploys it, running for real.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator_testkit::dns::lookup_a;
use memcached_operator_testkit::memcached::Connection;

use crate::harness::{
    CONVERGE, Operator, admin, create, member_pods, memcached, pod_is_ready, set_size,
    wait_converged, wait_for,
};
use crate::{Process, RealNode, pod_ip, real_namespace};

/// The operator as a process (its own ServiceAccount), deploying the local memcached image in `ns`.
pub async fn operator_for(client: &Client, node: &RealNode, ns: &str) -> Operator {
    // Every pod runs the agent (warm restart's save): the node's image of the operator.
    crate::operator_with_agent(client, node, ns).await
}

fn service_name(ns: &str, name: &str) -> String {
    format!("{name}.{ns}.svc.cluster.local")
}

/// Waits until the headless Service's name resolves to exactly `want`.
async fn wait_dns(node: &RealNode, name: &str, want: &BTreeSet<Ipv4Addr>) {
    wait_for(
        &format!("{name} to resolve to {want:?}"),
        CONVERGE,
        || async {
            let got: BTreeSet<_> = lookup_a(node.dns(), name).await.ok()?.into_iter().collect();
            (&got == want).then_some(())
        },
    )
    .await;
}

async fn ips_of(client: &Client, ns: &str, name: &str) -> BTreeSet<Ipv4Addr> {
    member_pods(client, ns, name)
        .await
        .iter()
        .map(pod_ip)
        .collect()
}

#[tokio::test]
async fn a_memcached_is_real_confined_processes_found_through_dns() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "real").await;
    let _op = operator_for(&client, &node, &ns).await;
    let mut mc = memcached("cache", 3);
    mc.spec.max_memory_mib = 48;
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;

    let pods = member_pods(&client, &ns, "cache").await;
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.node_name.as_deref(),
            Some(node.name()),
            "{}",
            pod.name_any()
        );
        let status = pod.status.as_ref().unwrap();
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(container.ready, "the kubelet's probes passed");
        assert!(
            container
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some(),
            "a running container"
        );

        let processes = Process::in_pod(pod.metadata.uid.as_deref().unwrap(), "memcached");
        let [process] = &processes[..] else {
            panic!(
                "one memcached process in {}, found {}",
                pod.name_any(),
                processes.len()
            )
        };
        assert_eq!(
            process.status("Uid"),
            "11211 11211 11211 11211",
            "pid {}",
            process.pid
        );
        assert_eq!(
            process.status("CapEff"),
            "0000000000000000",
            "no capabilities"
        );
        assert_eq!(process.status("NoNewPrivs"), "1");
        assert_eq!(
            process.status("Seccomp"),
            "2",
            "seccomp filter (RuntimeDefault)"
        );
        assert!(process.root_is_read_only(), "read-only root file system");
    }

    // Every pod, by the headless Service's name through CoreDNS.
    let ips: BTreeSet<Ipv4Addr> = pods.iter().map(pod_ip).collect();
    wait_dns(&node, &service_name(&ns, "cache"), &ips).await;
    for ip in &ips {
        let mut conn = Connection::connect(SocketAddr::new((*ip).into(), 11211))
            .await
            .unwrap();
        let key = format!("key-{ip}");
        conn.set(&key, ip.to_string().as_bytes()).await.unwrap();
        assert_eq!(conn.get(&key).await.unwrap(), Some(ip.to_string()));
        assert_eq!(
            conn.stat("", "limit_maxbytes").await.unwrap(),
            (48u64 << 20).to_string(),
            "maxMemoryMiB is memcached's -m"
        );
    }
}

/// Round trips to every address the Service resolves to, until stopped: how many rounds found
/// no memcached answering, and the fewest Ready members there were meanwhile.
struct Prober {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU32>,
    unanswered: Arc<AtomicU32>,
    /// Addresses DNS gave out that did not answer: a pod stopped while clients could still
    /// find it.
    refused: Arc<AtomicU32>,
    min_ready: Arc<AtomicI32>,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    fn start(client: &Client, node: &RealNode, ns: &str, name: &str) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let (rounds, unanswered) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let refused = Arc::new(AtomicU32::new(0));
        let min_ready = Arc::new(AtomicI32::new(i32::MAX));
        let (client, ns) = (client.clone(), ns.to_string());
        let (dns, service, name) = (node.dns(), service_name(&ns, name), name.to_string());
        let task = tokio::spawn({
            let (stop, rounds, unanswered, refused, min_ready) = (
                stop.clone(),
                rounds.clone(),
                unanswered.clone(),
                refused.clone(),
                min_ready.clone(),
            );
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let mut answered = false;
                    for ip in lookup_a(dns, &service).await.unwrap_or_default() {
                        if let Ok(mut conn) =
                            Connection::connect(SocketAddr::new(ip.into(), 11211)).await
                            && conn.set("probe", b"1").await.is_ok()
                        {
                            answered = true;
                        } else {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    rounds.fetch_add(1, Ordering::SeqCst);
                    if !answered {
                        unanswered.fetch_add(1, Ordering::SeqCst);
                    }
                    let members = member_pods(&client, &ns, &name).await;
                    let ready = members.iter().filter(|p| pod_is_ready(p)).count();
                    min_ready.fetch_min(ready as i32, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Prober {
            stop,
            rounds,
            unanswered,
            refused,
            min_ready,
            task,
        }
    }

    async fn stop(self) -> (u32, u32, u32, i32) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        (
            self.rounds.load(Ordering::SeqCst),
            self.unanswered.load(Ordering::SeqCst),
            self.refused.load(Ordering::SeqCst),
            self.min_ready.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test]
async fn scaling_and_an_image_change_keep_memcached_answering() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "rollout").await;
    let _op = operator_for(&client, &node, &ns).await;
    create(&client, &ns, &memcached("cache", 3)).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let service = service_name(&ns, "cache");

    for size in [5, 2] {
        set_size(&client, &ns, "cache", size).await;
        wait_converged(&client, &ns, "cache", size).await;
        let ips = ips_of(&client, &ns, "cache").await;
        assert_eq!(ips.len(), size as usize);
        wait_dns(&node, &service, &ips).await;
        for ip in &ips {
            let mut conn = Connection::connect(SocketAddr::new((*ip).into(), 11211))
                .await
                .unwrap_or_else(|e| panic!("memcached at {ip} after scaling to {size}: {e}"));
            conn.set("k", b"v").await.unwrap();
        }
    }

    // The same image under a second name: a change of spec.image restarts every member in its
    // pod, one at a time.
    let rolled = format!("{}-rolled", node.memcached_image());
    node.ctr(&["images", "tag", "--force", node.memcached_image(), &rolled]);
    let restarts = |p: &k8s_openapi::api::core::v1::Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|s| s.iter().find(|c| c.name == "memcached"))
            .map_or(0, |c| c.restart_count)
    };
    let before: BTreeMap<String, i32> = member_pods(&client, &ns, "cache")
        .await
        .iter()
        .map(|p| (p.uid().unwrap(), restarts(p)))
        .collect();
    let prober = Prober::start(&client, &node, &ns, "cache");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let patch = serde_json::json!({"spec": {"image": rolled}});
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(
        "every member restarted on the new image",
        CONVERGE,
        || async {
            let pods = member_pods(&client, &ns, "cache").await;
            let rolled_all = pods.len() == 2
                && pods.iter().all(|p| {
                    p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(rolled.as_str())
                        && before
                            .get(&p.uid().unwrap())
                            .is_some_and(|was| restarts(p) > *was)
                });
            rolled_all.then_some(())
        },
    )
    .await;
    // The same pods, under their own names.
    assert_eq!(
        wait_converged(&client, &ns, "cache", 2).await,
        ["cache-0", "cache-1"]
    );
    let (rounds, unanswered, refused, min_ready) = prober.stop().await;
    println!(
        "image rollout: {rounds} probe rounds, {unanswered} unanswered, {refused} addresses from DNS refused, at least {min_ready} ready pods"
    );
    assert!(rounds >= 5, "the prober ran: {rounds} rounds");
    assert_eq!(unanswered, 0, "a round in which no memcached answered");
    // A member restarting in place keeps its address, which refuses for the second or so that
    // memcached takes to save and restore (`refused`, printed above, is not asserted).
    // One member out at a time.
    assert!(
        min_ready >= 1,
        "fewest ready pods during the rollout: {min_ready} of 2"
    );
}
