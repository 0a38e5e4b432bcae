//! The reconcile's decisions, from what it saw: no API server, no clock.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::*;
use crate::controller::reconcile::desired::desired;
use crate::controller::reconcile::observe::SeenProxy;
use crate::controller::secrets::Mounts;
use crate::fixtures::{memcached, memcached_with_spec};
use crate::resources;
use crate::resources::Images;
use crate::watch::pod_index::{Controller, Member};

/// What a reconcile of `mc` sees where nothing of it exists yet but `members` (of the current
/// revision, Ready for long) and the Secrets `there` has.
fn seeing(mc: &Memcached, members: &[&str], there: impl Fn(&str) -> Option<Secret>) -> Seen {
    let now = Timestamp::now();
    let template = resources::pod_template(mc, &Images::default());
    let revision = resources::members::revision(mc, &template);
    let members = members
        .iter()
        .map(|name| Member {
            name: name.to_string(),
            ready_since: Some(now - SignedDuration::from_hours(1)),
            not_ready_since: None,
            revision: Some(revision.clone()),
            controller: Controller::Memcached,
            zone: None,
        })
        .collect();
    Seen {
        service: None,
        budget: None,
        policy: None,
        monitor: None,
        certificate: None,
        proxy: SeenProxy::default(),
        keeps_policies: true,
        keeps_certificates: true,
        secrets: Mounts::as_if(mc, there),
        members: own::Seen::of(mc, &Images::default(), members, vec![], now),
        pods: vec![],
        troubles: vec![],
        now,
    }
}

fn nothing(_: &str) -> Option<Secret> {
    None
}

fn plan_of(mc: &Memcached, seen: &Seen) -> Plan {
    plan(mc, seen, desired(mc, None, &Images::default()))
}

fn message(blocked: &Option<Blocked>) -> String {
    blocked
        .as_ref()
        .map(|b| b.message().to_string())
        .unwrap_or_default()
}

#[test]
fn a_new_memcached_makes_every_member_and_nothing_blocks_it() {
    let mc = memcached("cache", 3);
    let plan = plan_of(&mc, &seeing(&mc, &[], nothing));
    assert_eq!(plan.blocked, None);
    assert_eq!(plan.moves.create, [0, 1, 2]);
    assert!(plan.moves.delete.is_empty() && !plan.moves.update_starts);
    assert!(plan.desired.budget.is_some(), "three members have a budget");
}

#[test]
fn a_smaller_size_deletes_the_highest_members_and_one_being_deleted_holds_its_name() {
    let mut mc = memcached("cache", 1);
    let plan = plan_of(
        &mc,
        &seeing(&mc, &["cache-0", "cache-1", "cache-2"], nothing),
    );
    assert_eq!(plan.moves.delete, ["cache-1", "cache-2"]);
    assert!(plan.desired.budget.is_none(), "no budget below two members");

    mc.spec.size = 2;
    let mut seen = seeing(&mc, &["cache-0"], nothing);
    seen.members.terminating = vec!["cache-1".into()];
    assert!(
        plan_of(&mc, &seen).moves.create.is_empty(),
        "cache-1 is made again once it is gone"
    );
}

#[test]
fn members_of_another_template_start_an_update_and_of_this_one_are_kept() {
    let mc = memcached("cache", 2);
    let mut seen = seeing(&mc, &["cache-0", "cache-1"], nothing);
    let moves = &plan_of(&mc, &seen).moves;
    assert!(!moves.update_starts && moves.create.is_empty());
    for member in &mut seen.members.members {
        member.revision = Some("cache-older".into());
    }
    let moves = &plan_of(&mc, &seen).moves;
    assert!(moves.update_starts);
}

#[test]
fn someone_elses_object_of_the_memcacheds_name_blocks_it_before_anything_else() {
    let mut mc = memcached("cache", 3);
    mc.spec.max_memory_mib = 0;
    let mut theirs = resources::service(&mc);
    theirs.metadata.owner_references = None;
    let mut seen = seeing(&mc, &[], nothing);
    seen.service = Some(Arc::new(crate::watch::owned::OwnedObject::of(&theirs)));
    let plan = plan_of(&mc, &seen);
    assert!(
        matches!(plan.blocked, Some(Blocked::ResourceExists { .. })),
        "{:?}",
        plan.blocked
    );
    assert!(message(&plan.blocked).starts_with("Service default/cache already exists"));
}

#[test]
fn a_spec_that_cannot_work_is_not_applied() {
    let mc = memcached_with_spec(json!({"maxMemoryMiB": 256,
        "resources": {"limits": {"memory": "128Mi"}}}));
    let plan = plan_of(&mc, &seeing(&mc, &["cache-0"], nothing));
    assert!(
        matches!(plan.blocked, Some(Blocked::InvalidSpec { .. })),
        "{:?}",
        plan.blocked
    );
    assert!(message(&plan.blocked).contains("spec.resources.limits.memory"));
}

#[test]
fn what_this_process_cannot_keep_blocks_rather_than_running_without_it() {
    let mc = memcached_with_spec(json!({"networkPolicy": {"enabled": true}}));
    let mut seen = seeing(&mc, &[], nothing);
    seen.keeps_policies = false;
    assert_eq!(
        plan_of(&mc, &seen).blocked,
        Some(Blocked::Refused {
            refusal: Refusal::Forbidden,
            message: status::NETWORK_POLICIES_FORBIDDEN.into()
        })
    );
    let mc = memcached_with_spec(json!({"tls": {"enabled": true, "issuerRef": {"name": "ca"}}}));
    let mut seen = seeing(&mc, &[], nothing);
    seen.keeps_certificates = false;
    assert_eq!(
        plan_of(&mc, &seen).blocked,
        Some(Blocked::InvalidSpec {
            message: status::CERTIFICATES_UNAVAILABLE.into()
        })
    );
}

#[test]
fn secrets_the_pods_cannot_mount_block_and_a_missing_generated_one_is_made() {
    let named = memcached_with_spec(json!({"auth": {"enabled": true, "secretName": "creds"}}));
    let plan = plan_of(&named, &seeing(&named, &[], nothing));
    assert_eq!(
        plan.blocked,
        Some(Blocked::InvalidSecret {
            message: "Secret creds (spec.auth.secretName) not found".into()
        })
    );

    let generated = memcached_with_spec(json!({"auth": {"enabled": true}}));
    let plan = plan_of(&generated, &seeing(&generated, &[], nothing));
    assert_eq!(plan.blocked, None);
    assert_eq!(plan.generate.as_deref(), Some("cache-auth"));
    // As the API server keeps it: stringData moved into data.
    let mut ours = resources::auth::generated_secret(&generated, "s3cret");
    let written = ours.string_data.take().unwrap_or_default();
    ours.data = Some(
        written
            .into_iter()
            .map(|(k, v)| (k, k8s_openapi::ByteString(v.into_bytes())))
            .collect(),
    );
    let plan = plan_of(&generated, &seeing(&generated, &[], |_| Some(ours.clone())));
    assert_eq!((plan.blocked, plan.generate), (None, None), "there already");
}

#[test]
fn a_certificate_not_issued_yet_is_waited_for_not_blocked() {
    let mc = memcached_with_spec(json!({"tls": {"enabled": true, "issuerRef": {"name": "ca"}}}));
    let plan = plan_of(&mc, &seeing(&mc, &[], nothing));
    assert_eq!(plan.blocked, None);
    assert_eq!(plan.unissued.as_deref(), Some("cache-tls"));
    assert!(plan.desired.certificate.is_some());
}

#[test]
fn the_proxy_s_layout_keeps_a_member_leaving_until_its_handover_ends() {
    let mc = memcached_with_spec(json!({"size": 3, "proxy": {"enabled": true}}));
    let mut scaled_in = mc.clone();
    scaled_in.status.get_or_insert_default().proxy = Some(crate::api::ProxyStatus {
        members: 4,
        ..Default::default()
    });
    let members = ["cache-0", "cache-1", "cache-2", "cache-3"];
    let plan = plan_of(&scaled_in, &seeing(&scaled_in, &members, nothing));
    assert!(plan.moves.delete.is_empty(), "cache-3 drains");
    let layout = plan.desired.proxy.config_map.as_ref().unwrap();
    assert!(layout.data.as_ref().unwrap()["layout.json"].contains("\"previous\""));
    let mut off = scaled_in;
    off.spec.proxy = None;
    let plan = plan_of(&off, &seeing(&off, &members, nothing));
    assert_eq!(plan.moves.delete, ["cache-3"], "no proxy, no drain");
    assert!(plan.desired.proxy.config_map.is_none());
}

#[test]
fn the_proxy_blocks_on_an_image_without_it_and_on_someone_elses_object_of_its_name() {
    let old = memcached_with_spec(json!({"proxy": {"enabled": true, "image": "memcached:1.6.18"}}));
    let plan = plan_of(&old, &seeing(&old, &[], nothing));
    assert!(matches!(plan.blocked, Some(Blocked::InvalidSpec { .. })));
    assert!(message(&plan.blocked).starts_with("spec.proxy.image: memcached:1.6.18"));

    let mc = memcached_with_spec(json!({"proxy": {"enabled": true}}));
    let mut theirs = crate::resources::proxy::service(&mc).unwrap();
    theirs.metadata.owner_references = None;
    let mut seen = seeing(&mc, &[], nothing);
    seen.proxy.service = Some(Arc::new(crate::watch::owned::OwnedObject::of(&theirs)));
    let plan = plan_of(&mc, &seen);
    assert!(message(&plan.blocked).starts_with("Service default/cache-proxy already exists"));
    // Without the proxy, an object of that name is not ours to mind (a Memcached `cache-proxy`).
    let mut off = mc.clone();
    off.spec.proxy = None;
    assert_eq!(plan_of(&off, &seen).blocked, None);
}
