//! The local control plane itself does what every other test relies on (was hack/smoke-cluster.sh):
//! kwok nodes Ready, ServiceAccount tokens authenticate, Deployments get running pods on those
//! nodes, and the garbage collector removes what a deleted Deployment owned.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::harness::{admin, cluster, namespace, node_is_ready, pod_is_ready, wait_for};

/// The HTTP status the API server answers `path` with for a client of `kubeconfig`.
async fn status_for(kubeconfig: &std::path::Path, path: &str) -> u16 {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("GET {path}: {other}"),
    }
}

#[tokio::test]
async fn the_local_cluster_runs_pods_authenticates_tokens_and_collects_garbage() {
    let client = admin().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let kwok = ListParams::default().labels("type=kwok");
    let count = wait_for("every kwok node Ready", Duration::from_secs(30), || async {
        let list = nodes.list(&kwok).await.ok()?.items;
        (!list.is_empty() && list.iter().all(node_is_ready)).then_some(list.len())
    })
    .await;
    assert!(count >= 1);
    assert!(
        Api::<Namespace>::all(client.clone())
            .get_opt("default")
            .await
            .unwrap()
            .is_some()
    );

    let ns = namespace(&client, "smoke").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the namespace's default ServiceAccount",
        Duration::from_secs(30),
        || async { accounts.get_opt("default").await.ok()? },
    )
    .await;
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("smoke".into());
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let dir = tempdir();
    let token_config = dir.join("smoke.kubeconfig");
    cluster()
        .service_account_kubeconfig(&ns, "smoke", &token_config, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(
        status_for(&token_config, &format!("/api/v1/namespaces/{ns}/pods")).await,
        403,
        "a ServiceAccount's token authenticates, and RBAC denies it what it was not granted"
    );
    let bogus = dir.join("bogus.kubeconfig");
    let text = std::fs::read_to_string(&token_config).unwrap();
    let token = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("user: {token: \""))
        .and_then(|t| t.strip_suffix("\"}"))
        .expect("the kubeconfig has a token");
    std::fs::write(&bogus, text.replace(token, "not-a-token")).unwrap();
    assert_eq!(
        status_for(&bogus, "/api").await,
        401,
        "a bogus token is refused"
    );

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "smoke"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "smoke"}},
            "template": {
                "metadata": {"labels": {"app": "smoke"}},
                "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let smoke = ListParams::default().labels("app=smoke");
    let placed = wait_for(
        "3 pods Running and Ready on kwok nodes",
        Duration::from_secs(60),
        || async {
            let list = pods.list(&smoke).await.ok()?.items;
            let running: Vec<String> = list
                .iter()
                .filter(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        && pod_is_ready(p)
                })
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            (running.len() == 3).then_some(running)
        },
    )
    .await;
    assert!(
        placed.iter().all(|n| n.starts_with("kwok-node-")),
        "{placed:?}"
    );

    deployments
        .delete("smoke", &DeleteParams::default())
        .await
        .unwrap();
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the ReplicaSet and pods garbage-collected",
        Duration::from_secs(60),
        || async {
            let sets = replica_sets.list(&smoke).await.ok()?.items;
            let left = pods.list(&smoke).await.ok()?.items;
            (sets.is_empty() && left.is_empty()).then_some(())
        },
    )
    .await;
    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
}

/// A directory of the test's own under the cluster's.
fn tempdir() -> std::path::PathBuf {
    let dir = cluster()
        .dir
        .join(format!("smoke-{:06x}", rand::random::<u32>() & 0xff_ffff));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
