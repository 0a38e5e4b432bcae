//! `spec.auth` on the API server: the Secret the operator generates, and Secrets it cannot use.
//! (memcached refusing and accepting clients is shown on the real node.)

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::{AuthSpec, Memcached};
use memcached_operator::resources::auth::{PASSWORD_KEY, USERNAME_KEY, secret_data};

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, condition, create, events_with_reason, member_pods,
    memcached, namespace, wait_converged, wait_degraded, wait_degraded_saying, wait_for, wait_gone,
    wait_not_degraded,
};

/// Each member's memcached flags and the Secret it mounts: whether it asks for a password file,
/// and from which Secret.
async fn auth_of(client: &Client, ns: &str, name: &str) -> Vec<(bool, Option<String>)> {
    member_pods(client, ns, name)
        .await
        .into_iter()
        .map(|p| {
            let pod = p.spec.unwrap();
            let flags = pod.containers[0].args.clone().unwrap_or_default();
            let secret = pod
                .volumes
                .iter()
                .flatten()
                .find_map(|v| v.secret.as_ref()?.secret_name.clone());
            (flags.iter().any(|f| f == "-Y"), secret)
        })
        .collect()
}

fn secret(name: &str, data: BTreeMap<String, ByteString>) -> Secret {
    let mut s = Secret {
        data: Some(data),
        ..Secret::default()
    };
    s.metadata.name = Some(name.into());
    s
}

fn with_auth(mut mc: Memcached, secret_name: Option<&str>) -> Memcached {
    mc.spec.auth = Some(AuthSpec {
        enabled: true,
        secret_name: secret_name.map(String::from),
        ..AuthSpec::default()
    });
    mc
}

#[tokio::test]
async fn auth_without_a_secret_gets_a_generated_one_owned_and_never_rewritten() {
    let client = admin().await;
    let ns = namespace(&client, "auth-generated").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &with_auth(memcached("cache", 2), None)).await;
    wait_converged(&client, &ns, "cache", 2).await;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let generated = secrets.get("cache-auth").await.expect("cache-auth created");
    let owner = &generated.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Memcached", "cache", Some(true))
    );
    let data = generated.data.clone().unwrap();
    assert_eq!(data[USERNAME_KEY].0, b"memcached");
    let password = data[PASSWORD_KEY].0.clone();
    assert!(
        password.len() >= 32 && password.iter().all(u8::is_ascii_alphanumeric),
        "a long random password: {}",
        String::from_utf8_lossy(&password)
    );
    assert_eq!(
        auth_of(&client, &ns, "cache").await,
        [
            (true, Some("cache-auth".into())),
            (true, Some("cache-auth".into()))
        ],
        "memcached reads a password file, from the generated Secret"
    );

    // A password the user sets there is theirs: the operator does not put its own back.
    let mine = serde_json::json!({"stringData": {PASSWORD_KEY: "chosen-by-me"}});
    secrets
        .patch("cache-auth", &PatchParams::default(), &Patch::Merge(&mine))
        .await
        .unwrap();
    crate::harness::set_size(&client, &ns, "cache", 3).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let kept = secrets.get("cache-auth").await.unwrap().data.unwrap();
    assert_eq!(kept[PASSWORD_KEY].0, b"chosen-by-me");

    // Deleted with its Memcached, by the garbage collector.
    Api::<Memcached>::namespaced(client.clone(), &ns)
        .delete("cache", &DeleteParams::foreground())
        .await
        .unwrap();
    wait_gone("the generated Secret", CONVERGE, &secrets, "cache-auth").await;
}

#[tokio::test]
async fn a_secret_that_is_missing_or_unusable_degrades_and_leaves_the_pods_alone() {
    let client = admin().await;
    let ns = namespace(&client, "auth-bad-secret").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    create(&client, &ns, &memcached("cache", 2)).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let uids = |pods: Vec<k8s_openapi::api::core::v1::Pod>| -> Vec<Option<String>> {
        pods.iter().map(|p| p.uid()).collect()
    };
    let before = uids(member_pods(&client, &ns, "cache").await);

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let turn_on = serde_json::json!({"spec": {"auth": {"enabled": true, "secretName": "creds"}}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&turn_on))
        .await
        .unwrap();
    let missing = wait_degraded(&mcs, "cache", "InvalidSecret", CONVERGE).await;
    assert!(
        missing.contains("Secret creds") && missing.contains("not found"),
        "{missing}"
    );

    // Each kind of bad content, named by its key; an object not ours is refused too.
    let mut no_password = secret_data("app", "x");
    no_password.remove(PASSWORD_KEY);
    secrets
        .create(&PostParams::default(), &secret("creds", no_password))
        .await
        .unwrap();
    let message = wait_degraded_saying(
        &mcs,
        "cache",
        "InvalidSecret",
        "no key \"password\"",
        CONVERGE,
    )
    .await;
    assert!(message.contains("Secret creds"), "{message}");
    let spaced = serde_json::json!({"data": secret_data("app", "two words")});
    secrets
        .patch("creds", &PatchParams::default(), &Patch::Merge(&spaced))
        .await
        .unwrap();
    let message = wait_degraded_saying(
        &mcs,
        "cache",
        "InvalidSecret",
        "key \"password\" holds ' '",
        CONVERGE,
    )
    .await;
    assert!(message.contains("Secret creds"), "{message}");

    // Nothing was applied meanwhile: the pods run as before, without authentication.
    assert_eq!(uids(member_pods(&client, &ns, "cache").await), before);
    assert_eq!(
        auth_of(&client, &ns, "cache").await,
        [(false, None), (false, None)]
    );
    let mc = mcs.get("cache").await.unwrap();
    assert_eq!(
        condition(&mc, "Available").map(|(s, _)| s).as_deref(),
        Some("True"),
        "the running pods keep serving"
    );
    let warnings: Vec<_> = events_with_reason(&client, &ns, "cache", "InvalidSecret").await;
    assert_eq!(
        warnings.len(),
        3,
        "one Warning per cause (missing, no key, a space), not per recheck: {:?}",
        warnings.iter().map(|e| &e.note).collect::<Vec<_>>()
    );

    // Fixed: it converges on its own (Secrets are rechecked, not watched).
    let fixed = serde_json::json!({"data": secret_data("app", "s3cret")});
    secrets
        .patch("creds", &PatchParams::default(), &Patch::Merge(&fixed))
        .await
        .unwrap();
    wait_not_degraded(&mcs, "cache", CONVERGE).await;
    wait_for("every member with the password file", CONVERGE, || async {
        let auth = auth_of(&client, &ns, "cache").await;
        (auth == [(true, Some("creds".into())), (true, Some("creds".into()))]).then_some(())
    })
    .await;
    wait_converged(&client, &ns, "cache", 2).await;
}

#[tokio::test]
async fn a_foreign_secret_of_the_generated_name_is_left_alone() {
    let client = admin().await;
    let ns = namespace(&client, "auth-foreign").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &secret("cache-auth", secret_data("someone", "else")),
        )
        .await
        .unwrap();
    create(&client, &ns, &with_auth(memcached("cache", 1), None)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let message = wait_degraded(&mcs, "cache", "ResourceExists", CONVERGE).await;
    assert!(
        message.contains("Secret") && message.contains("cache-auth"),
        "{message}"
    );
    let untouched = secrets.get("cache-auth").await.unwrap();
    assert!(untouched.owner_references().is_empty());
    assert_eq!(untouched.data.unwrap()[USERNAME_KEY].0, b"someone");
}
