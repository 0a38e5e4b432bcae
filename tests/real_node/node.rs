//! The real node as a pod sees it: containerd behind the kubelet, the CNI bridge's addresses,
//! cluster DNS and the API server from inside a pod's network namespace, Services through
//! kube-proxy, logs through the kubelet; and kwok's nodes beside it for pods that do not ask for
//! the real one (was hack/smoke-real-node.sh; what teardown leaves behind is checked by
//! `hack/cluster.sh down` itself).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator_testkit::dns::lookup_a;
use memcached_operator_testkit::memcached::Connection;

use crate::harness::{CONVERGE, admin, apply, namespace, node_is_ready, pod_is_ready, wait_for};
use crate::{Process, RealNode, pod_ip, real_namespace};

const MAX_MEMORY_MIB: u64 = 48;

/// A Deployment of `replicas` pods of `image` running memcached, confined as the operator's are.
fn memcached_deployment(name: &str, image: &str, replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 11211, "runAsGroup": 11211,
                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "memcached", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["memcached"], "args": ["-m", MAX_MEMORY_MIB.to_string(), "-p", "11211"],
                        "ports": [{"name": "memcached", "containerPort": 11211}],
                        "readinessProbe": {"tcpSocket": {"port": "memcached"}, "periodSeconds": 2},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    }))
    .unwrap()
}

fn service(name: &str, headless: bool) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": if headless { name.to_string() } else { format!("{name}-vip") }},
        "spec": {
            "clusterIP": if headless { Some("None") } else { None },
            "selector": {"app": name},
            "ports": [{"name": "memcached", "port": 11211, "targetPort": "memcached"}],
        },
    }))
    .unwrap()
}

/// The Ready pods of Deployment `name`, once there are `count`.
async fn ready_pods(client: &Client, ns: &str, name: &str, count: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("{count} Ready pods of {ns}/{name}"),
        CONVERGE,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={name}")))
                .await
                .ok()?;
            let ready: Vec<Pod> = list.items.into_iter().filter(pod_is_ready).collect();
            (ready.len() == count).then_some(ready)
        },
    )
    .await
}

fn in_range(ip: Ipv4Addr, cidr: &str) -> bool {
    let (net, bits) = cidr.split_once('/').expect("a CIDR");
    let mask = u32::MAX
        .checked_shl(32 - bits.parse::<u32>().unwrap())
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(net.parse::<Ipv4Addr>().unwrap()) & mask
}

/// Runs `work` on a thread of its own that has joined the network namespace of process `pid`, so
/// every socket it opens is the pod's.
fn in_network_of<T, F>(pid: u32, work: impl FnOnce() -> F + Send + 'static) -> T
where
    F: Future<Output = T>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("the pod's netns");
        // SAFETY: setns on a valid descriptor affects only this thread.
        let joined = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(joined, 0, "setns: {}", std::io::Error::last_os_error());
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work())
    })
    .join()
    .expect("the thread in the pod's network")
}

/// The API server as a pod's own ServiceAccount reaches it: the ClusterIP of
/// `kubernetes.default.svc`, checked against the pod's CA, with the pod's token.
async fn pod_config(pid: u32) -> kube::Config {
    let sa = format!("/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount");
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(serde_json::json!({
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": "https://10.96.0.1:443",
            "tls-server-name": "kubernetes.default.svc",
            "certificate-authority": format!("{sa}/ca.crt"),
        }}],
        "users": [{"name": "pod", "user": {"tokenFile": format!("{sa}/token")}}],
        "contexts": [{"name": "pod", "context": {"cluster": "in-cluster", "user": "pod"}}],
        "current-context": "pod",
    }))
    .unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn pods_on_the_real_node_get_its_network_cluster_dns_services_and_the_api() {
    let client = admin().await;
    let node = RealNode::get();
    let nodes: Api<Node> = Api::all(client.clone());

    // The node: containerd behind the kubelet, Ready beside kwok's nodes.
    let real = nodes.get(node.name()).await.unwrap();
    assert!(node_is_ready(&real), "{} Ready", node.name());
    let runtime = real
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.container_runtime_version.clone())
        .unwrap_or_default();
    assert!(runtime.starts_with("containerd://"), "runtime {runtime}");
    let kwok = nodes
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .unwrap()
        .items;
    assert!(
        !kwok.is_empty() && kwok.iter().all(node_is_ready),
        "kwok's nodes Ready"
    );

    // Pods of a namespace sent to the real node; pods of another stay on kwok's nodes.
    let ns = real_namespace(&client, "node").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    apply(
        &deployments,
        &memcached_deployment("memcached", node.memcached_image(), 3),
    )
    .await;
    apply(&services, &service("memcached", true)).await;
    let vip = apply(&services, &service("memcached", false)).await;
    let elsewhere = namespace(&client, "kwok").await;
    apply(
        &Api::namespaced(client.clone(), &elsewhere),
        &memcached_deployment("fake", "memcached:1.6", 2),
    )
    .await;

    let pods = ready_pods(&client, &ns, "memcached", 3).await;
    let cidr = node.var("REAL_NODE_POD_CIDR");
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(node.name()));
        assert!(
            in_range(pod_ip(pod), cidr),
            "{}: {} from the bridge's range {cidr}",
            pod.name_any(),
            pod_ip(pod)
        );
    }
    let kwok_names: BTreeSet<String> = kwok.iter().map(|n| n.name_any()).collect();
    for pod in ready_pods(&client, &elsewhere, "fake", 2).await {
        let on = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(
            kwok_names.contains(&on),
            "{} on {on}",
            pod.metadata.name.unwrap()
        );
    }

    // memcached in each pod answers on its pod IP, with the flags it was given.
    let ips: BTreeSet<Ipv4Addr> = pods.iter().map(pod_ip).collect();
    for ip in &ips {
        let mut conn = Connection::connect(SocketAddr::new((*ip).into(), 11211))
            .await
            .unwrap();
        conn.set("smoke", ip.to_string().as_bytes()).await.unwrap();
        assert_eq!(conn.get("smoke").await.unwrap(), Some(ip.to_string()));
        assert_eq!(
            conn.stat("settings", "maxbytes").await.unwrap(),
            (MAX_MEMORY_MIB << 20).to_string()
        );
    }

    // The ClusterIP Service, through kube-proxy's rules.
    let cluster_ip: Ipv4Addr = vip.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    let answered = wait_for("the ClusterIP to answer", CONVERGE, || async {
        let mut conn = Connection::connect(SocketAddr::new(cluster_ip.into(), 11211))
            .await
            .ok()?;
        conn.get("smoke").await.ok()?
    })
    .await;
    assert!(
        ips.iter().any(|ip| ip.to_string() == answered),
        "{answered}"
    );

    // Inside a pod: its resolv.conf, cluster DNS, and the API server as its ServiceAccount.
    let pod = &pods[0];
    let process = Process::in_pod(pod.metadata.uid.as_deref().unwrap(), "memcached")
        .pop()
        .expect("the pod's memcached process");
    let resolv =
        std::fs::read_to_string(format!("/proc/{}/root/etc/resolv.conf", process.pid)).unwrap();
    assert!(
        resolv.contains(&format!("nameserver {}", node.dns().ip()))
            && resolv.contains(&format!("search {ns}.svc.cluster.local")),
        "{resolv}"
    );
    let dns = node.dns();
    let name = format!("memcached.{ns}.svc.cluster.local");
    // CoreDNS follows the EndpointSlices through its own watch: a pod just Ready may be a moment
    // late in its answer.
    let want = ips.clone();
    let resolved = in_network_of(process.pid, move || async move {
        wait_for(
            "cluster DNS from inside the pod to answer every member",
            Duration::from_secs(30),
            || async {
                let got: BTreeSet<_> = lookup_a(dns, &name).await.ok()?.into_iter().collect();
                (got == want).then_some(got)
            },
        )
        .await
    });
    assert_eq!(resolved, ips, "the headless Service from inside a pod");
    let config = pod_config(process.pid).await;
    let version = in_network_of(process.pid, move || async move {
        let client = Client::try_from(config).unwrap();
        client.apiserver_version().await
    })
    .expect("GET /version as the pod's ServiceAccount");
    assert!(version.git_version.starts_with("v1."), "{version:?}");

    // The kubelet serves the container's log to the API server.
    let logs = Api::<Pod>::namespaced(client.clone(), &ns)
        .logs(
            &pod.name_any(),
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await;
    assert!(logs.is_ok(), "kubectl logs: {logs:?}");
}
