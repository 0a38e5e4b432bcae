//! spec.auth for real: memcached refuses clients without the password, the agent beside it
//! rotates the password in the running process, and the exporter still reads its stats.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::{AuthSpec, MonitoringSpec};
use memcached_operator::resources::auth::secret_data;
use memcached_operator_testkit::memcached::Connection;
use memcached_operator_testkit::net::metric_value;
use serde_json::json;

use crate::harness::{admin, create, member_pods, memcached, wait_converged, wait_for};
use crate::{
    Process, RealNode, assert_keys, create_credentials, exporter_metrics, memcached_pid,
    operator_with_agent, pod_ip, pymemcache, real_namespace, restart_counts, write_keys,
};

const USER: &str = "app";
/// How long a changed Secret may take to be in force: the bound (the kubelet refreshes
/// a mounted Secret within about a minute; the agent looks every 5 s).
const ROTATION: Duration = Duration::from_secs(120);
const GRACE_SECONDS: i32 = 20;

async fn connect(pod: &Pod) -> Connection {
    Connection::connect(SocketAddr::new(pod_ip(pod).into(), 11211))
        .await
        .unwrap()
}

/// Whether `password` logs in to the memcached of `pod`.
async fn logs_in(pod: &Pod, password: &str) -> bool {
    connect(pod).await.login(USER, password).await.is_ok()
}

#[tokio::test]
async fn auth_refuses_strangers_and_a_rotation_keeps_the_process_and_every_key() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "auth").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create_credentials(&secrets, "creds", USER, "first-password").await;
    let mut mc = memcached("cache", 2);
    mc.spec.auth = Some(AuthSpec {
        enabled: true,
        secret_name: Some("creds".into()),
        rotation_grace_seconds: GRACE_SECONDS,
    });
    mc.spec.monitoring = Some(MonitoringSpec {
        enabled: true,
        image: None,
    });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let pods = member_pods(&client, &ns, "cache").await;
    assert_eq!(pods.len(), 2);

    let mut uptimes = Vec::new();
    for pod in &pods {
        // Strangers are refused; the password opens it.
        let err = connect(pod).await.get("k").await.unwrap_err().to_string();
        assert!(err.contains("CLIENT_ERROR unauthenticated"), "{err}");
        let err = connect(pod)
            .await
            .login(USER, "wrong")
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("CLIENT_ERROR authentication failure"), "{err}");
        let mut conn = connect(pod).await;
        conn.login(USER, "first-password").await.unwrap();
        write_keys(&mut conn).await;
        let uptime: u64 = conn.stat("", "uptime").await.unwrap().parse().unwrap();
        uptimes.push(uptime);

        // The agent: memcached's user, no capabilities, confined as memcached is.
        let uid = pod.metadata.uid.as_deref().unwrap();
        let agents = Process::in_pod(uid, "memcached-opera"); // comm keeps 15 characters
        let [agent] = &agents[..] else {
            panic!("one agent in {}, found {}", pod.name_any(), agents.len())
        };
        assert_eq!(agent.status("Uid"), "11211 11211 11211 11211");
        assert_eq!(agent.status("CapEff"), "0000000000000000");
        assert_eq!(agent.status("NoNewPrivs"), "1");
        assert_eq!(agent.status("Seccomp"), "2");
        assert!(agent.root_is_read_only());

        // The exporter reads stats through the agent, which logs in for it.
        let metrics = exporter_metrics(pod).await;
        assert_eq!(
            metric_value(&metrics, "memcached_up"),
            Some(1.0),
            "{metrics}"
        );
        assert!(
            metric_value(&metrics, "memcached_current_items").is_some_and(|n| n >= 100.0),
            "the exporter sees the items"
        );
    }
    let processes: Vec<u32> = pods.iter().map(memcached_pid).collect();

    // A real client library logs in as any application would (an ordinary set on each new
    // connection) and spreads its keys over the pods by hashing.
    let servers: Vec<String> = pods
        .iter()
        .map(|p| format!("{}:11211", pod_ip(p)))
        .collect();
    let app = pymemcache(json!({
        "servers": servers, "login": [USER, "first-password"], "keys": 200,
    }))
    .await;
    assert_eq!(
        (&app["stored"], &app["found"]),
        (&json!(200), &json!(200)),
        "{app}"
    );
    let per_server = app["per_server"].as_object().unwrap();
    assert!(
        servers
            .iter()
            .all(|s| per_server.get(s).is_some_and(|n| n.as_u64() > Some(0))),
        "every pod holds some of the keys: {app}"
    );
    // Without the login its first set is taken for one, and refused.
    let app = pymemcache(json!({"servers": servers, "keys": 1})).await;
    assert!(
        app["error"]
            .as_str()
            .is_some_and(|e| e.contains("bad authentication token format")),
        "{app}"
    );

    // Rotate: the new password works within the bound, the old one until its grace ends.
    let rotated = Instant::now();
    let new = serde_json::json!({"data": secret_data(USER, "second-password")});
    secrets
        .patch("creds", &PatchParams::default(), &Patch::Merge(&new))
        .await
        .unwrap();
    // Each pod's grace starts when its own agent sees the change, and the kubelets refresh the
    // Secret at different times: watch all pods at once so the old password is tried right
    // after the new one first works on each.
    let mut waiting: Vec<&Pod> = pods.iter().collect();
    while !waiting.is_empty() {
        assert!(
            rotated.elapsed() < ROTATION,
            "the new password not in force within {ROTATION:?} on {:?}",
            waiting.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        let mut still = Vec::new();
        for pod in waiting {
            if !logs_in(pod, "second-password").await {
                still.push(pod);
                continue;
            }
            assert!(
                logs_in(pod, "first-password").await,
                "{}: the old password still works during the grace period",
                pod.name_any()
            );
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "new password in force on every pod after {:?}",
        rotated.elapsed()
    );
    for pod in &pods {
        wait_for(
            &format!("the old password refused on {}", pod.name_any()),
            Duration::from_secs(GRACE_SECONDS as u64 + 30),
            || async { (!logs_in(pod, "first-password").await).then_some(()) },
        )
        .await;
    }

    // The same processes, never restarted, with every key.
    let after = member_pods(&client, &ns, "cache").await;
    assert_eq!(
        after.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    for (i, pod) in after.iter().enumerate() {
        assert!(
            restart_counts(pod).values().all(|&n| n == 0),
            "{}: {:?}",
            pod.name_any(),
            restart_counts(pod)
        );
        assert_eq!(memcached_pid(pod), processes[i]);
        let mut conn = connect(pod).await;
        conn.login(USER, "second-password").await.unwrap();
        let uptime: u64 = conn.stat("", "uptime").await.unwrap().parse().unwrap();
        assert!(
            uptime >= uptimes[i] + rotated.elapsed().as_secs().saturating_sub(2),
            "memcached's uptime kept counting: {} then {uptime}",
            uptimes[i]
        );
        assert_keys(&mut conn, pod).await;
        let metrics = exporter_metrics(pod).await;
        assert_eq!(
            metric_value(&metrics, "memcached_up"),
            Some(1.0),
            "the exporter logs in with the new password"
        );
    }
}
