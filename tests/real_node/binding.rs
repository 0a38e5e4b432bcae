//! spec.binding for real: an application pod that mounts the binding Secret as the Service
//! Binding specification lays it out reaches every member by its stable name, and the Service,
//! with what it reads there, before and after the members change.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::{AuthSpec, BindingSpec};
use serde_json::json;

use crate::harness::{
    CONVERGE, admin, create, member_pods, memcached, set_size, wait_converged, wait_for,
};
use crate::{RealNode, busybox_pod, operator_with_agent, real_namespace};

/// The application: reads `$SERVICE_BINDING_ROOT/cache/*`, logs in, and sets and gets a key on
/// each of `servers` and on `host:port`, printing a line for each that answers.
const APP: &str = r#"
set -e
bb=/bin/busybox
b="$SERVICE_BINDING_ROOT/cache"
[ "$($bb cat "$b/type")" = memcached ]
creds="$($bb cat "$b/username") $($bb cat "$b/password")"
answers() {
    printf 'set login 0 0 %s\r\n%s\r\nset app 0 0 2\r\nok\r\nget app\r\nquit\r\n' "${#creds}" "$creds" \
        | $bb timeout 10 $bb nc -w 5 "$1" "$2" | $bb grep -q 'VALUE app'
}
for server in $($bb cat "$b/servers" | $bb tr , ' '); do
    answers "${server%:*}" "${server##*:}"
    echo "member $server answers"
done
answers "$($bb cat "$b/host")" "$($bb cat "$b/port")"
echo "host answers"
"#;

/// Runs the application with the binding mounted; what it printed.
async fn application(client: &Client, node: &RealNode, ns: &str) -> String {
    let mounted = json!({
        "volumes": [{"name": "binding", "secret": {"secretName": "cache-binding"}}],
        "container": {
            "env": [{"name": "SERVICE_BINDING_ROOT", "value": "/bindings"}],
            "volumeMounts": [{"name": "binding", "mountPath": "/bindings/cache", "readOnly": true}],
        },
    });
    let (succeeded, log) = busybox_pod(client, node, ns, APP, mounted).await;
    assert!(succeeded, "the application failed:\n{log}");
    log
}

/// Waits until the binding lists the running pods by their stable names under the Service, in
/// the order of their names; those addresses.
async fn wait_servers_are_the_pods(client: &Client, ns: &str) -> Vec<String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    wait_for("the binding to list the pods", CONVERGE, || async {
        let data = secrets.get_opt("cache-binding").await.ok()??.data?;
        let servers = String::from_utf8(data.get("servers")?.0.clone()).ok()?;
        let pods: Vec<String> = member_pods(client, ns, "cache")
            .await
            .iter()
            .map(|p| format!("{}.cache.{ns}.svc:11211", p.name_any()))
            .collect();
        (servers == pods.join(",")).then_some(pods)
    })
    .await
}

#[tokio::test]
async fn an_application_pod_connects_with_its_binding_as_mounted() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "binding").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let mut mc = memcached("cache", 3);
    mc.spec.auth = Some(AuthSpec {
        enabled: true,
        ..AuthSpec::default()
    });
    mc.spec.binding = Some(BindingSpec { enabled: true });
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;

    for size in [3, 2] {
        if size != 3 {
            set_size(&client, &ns, "cache", size).await;
            wait_converged(&client, &ns, "cache", size).await;
        }
        let members = wait_servers_are_the_pods(&client, &ns).await;
        assert_eq!(members.len(), size as usize);
        let log = application(&client, &node, &ns).await;
        for member in &members {
            assert!(log.contains(&format!("member {member} answers")), "{log}");
        }
        assert!(log.contains("host answers"), "{log}");
    }
}
