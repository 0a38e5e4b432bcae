//! The StatefulSets of releases up to 0.6.0, adopted. Those releases kept a Memcached's members
//! in a StatefulSet; since 0.7.0 the operator keeps new ones' pods itself, and a Memcached that still
//! has its StatefulSet has its members handed over as they run: nothing is restarted, no key is
//! lost. The only module that knows of StatefulSets.
//!
//! 1. `release`: for each revision of the StatefulSet, the operator's ControllerRevision of the
//!    same template, naming the StatefulSet's (`ADOPTED_FROM`); then the StatefulSet deleted
//!    with `propagationPolicy: Orphan`: the garbage collector takes its owner reference off the
//!    pods and revisions before it goes (the reconcile waits for that).
//! 2. `adopt`: the StatefulSet's revisions collected, and each member left without a controller
//!    given the Memcached as its controller and the revision of step 1 that names its own.
//!
//! The members then take the current template as any update does (members.rs): in place where
//! images differ, as after an operator upgrade. So that they can, the template step 1 records is
//! the operator's own with the images the members run wherever the StatefulSet's template holds
//! all of it (a StatefulSet of 0.6.0: the API server only adds defaults); otherwise (a template
//! of an older release) the StatefulSet's own, which the update then replaces member by member.
//!
//! Each step reads what the ones before left, so an operator stopped between any two writes
//! resumes where it stopped. A pod without a controller whose revision no adoption names is not
//! taken: it is someone else's, left alone and reported, as a StatefulSet in the way is.

use std::collections::BTreeMap;

use futures::future::try_join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::context::Context;
use super::events::Change;
use super::members::own;
use super::members::{apply_error, history, read_error, without_any_settings};
use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources::members::POD_INDEX_LABEL;
use crate::resources::{self, MANAGER_NAME, REVISION_LABEL, members};
use crate::validation::quantity_bytes;
use crate::watch::owned::OwnedObject;
use crate::watch::pod_index::{Controller, Member};

/// On the operator's ControllerRevision made at adoption: the StatefulSet revision whose
/// members run its template.
pub const ADOPTED_FROM: &str = "cache.example.com/adopted-from";

pub mod cache;

/// Where a Memcached's adoption stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Nothing of a StatefulSet is left: the operator keeps the members.
    None,
    /// A step was written, or the garbage collector's is awaited: its watch event brings the
    /// next reconcile, and the status stays as it was meanwhile.
    Underway,
    /// A pod without a controller that no adoption names: someone else's.
    Foreign(String),
}

/// The step the Memcached's adoption takes now, given its members as observed. Its StatefulSet
/// (one it controls) is read from the cache here, not by observe, so that nothing outside this
/// module needs to know the kind.
pub async fn step(ctx: &Context, mc: &Memcached, seen: &own::Seen) -> Result<Adoption> {
    let members = &seen.members;
    let sts = ctx
        .legacy
        .get_for(mc)
        .filter(|held| resources::is_controlled_by(&held.metadata, mc));
    match sts.as_deref() {
        Some(sts) if sts.metadata.deletion_timestamp.is_some() => Ok(Adoption::Underway),
        Some(sts) => release(ctx, mc, sts, &seen.template)
            .await
            .map(|()| Adoption::Underway),
        // Released: the garbage collector's update of the member is on its way.
        None if members.iter().any(|m| m.controller == Controller::Workload) => {
            Ok(Adoption::Underway)
        }
        None if members.iter().any(|m| m.controller == Controller::None) => {
            adopt(ctx, mc, members).await
        }
        None => Ok(Adoption::None),
    }
}

/// Step 1: a revision of the operator's for each of the StatefulSet's, then the StatefulSet
/// deleted, its members and revisions orphaned.
async fn release(
    ctx: &Context,
    mc: &Memcached,
    sts: &OwnedObject<StatefulSet>,
    desired: &PodTemplateSpec,
) -> Result<()> {
    let (revisions, listed) = revisions_of(&ctx.client, mc).await?;
    let params = PostParams {
        field_manager: Some(MANAGER_NAME.into()),
        ..PostParams::default()
    };
    let of_the_stateful_set = listed.iter().filter(|r| {
        r.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == sts.metadata.uid.as_ref())
    });
    for from in of_the_stateful_set {
        let from_name = from.name_any();
        let template = adopted_template(desired, stored_template(from));
        let revision = members::revision(mc, &template);
        let mut body = members::controller_revision(mc, &template, &revision);
        body.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ADOPTED_FROM.into(), from_name.clone());
        match revisions.create(&params, &body).await {
            Ok(_) => {}
            // Made by an adoption stopped before: it must name the same StatefulSet revision, or
            // the members would be adopted as of another template. The StatefulSet is kept then.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let there = revisions
                    .get(&revision)
                    .await
                    .map_err(|source| read_error("ControllerRevision", &revision, source))?;
                let adopted = there.annotations().get(ADOPTED_FROM);
                if adopted != Some(&from_name) {
                    let adopted = adopted.map_or("", String::as_str);
                    return Err(Error::Adoption(format!(
                        "ControllerRevision {revision} adopts the members of StatefulSet revision {adopted}, not {from_name}: the StatefulSet is kept"
                    )));
                }
            }
            Err(source) => return Err(apply_error("ControllerRevision", &revision, source)),
        }
    }
    let name = sts.metadata.name.clone().unwrap_or_default();
    let delete = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: sts.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let ns = mc.namespace().unwrap_or_default();
    let stateful_sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    match stateful_sets.delete(&name, &delete).await {
        Ok(_) => {
            ctx.events.applied(mc, sts, &Change::Released);
            Ok(())
        }
        // Gone already, or another of that name: the next reconcile reads which.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(source) => Err(apply_error("StatefulSet", &name, source)),
    }
}

/// The ControllerRevisions of `mc`'s pods (its own and its StatefulSet's), and their API.
async fn revisions_of(
    client: &Client,
    mc: &Memcached,
) -> Result<(Api<ControllerRevision>, Vec<ControllerRevision>)> {
    let ns = mc.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let listed = revisions
        .list(&ListParams::default().labels(&resources::selector_string(mc)))
        .await
        .map_err(|source| read_error("ControllerRevisions of", &mc.name_any(), source))?;
    Ok((revisions, listed.items))
}

/// The pod template a StatefulSet revision records (its data is a patch replacing the
/// StatefulSet's).
fn stored_template(revision: &ControllerRevision) -> Value {
    let mut template = revision
        .data
        .as_ref()
        .and_then(|d| d.0.pointer("/spec/template"))
        .cloned()
        .unwrap_or_default();
    if let Some(t) = template.as_object_mut() {
        t.remove("$patch");
    }
    template
}

/// The template adopted members are recorded with: the operator's own (`desired`) with the
/// images of the StatefulSet's (`stored`), if `stored` holds all of that but the form of
/// memcached's settings; else `stored`.
fn adopted_template(desired: &PodTemplateSpec, stored: Value) -> PodTemplateSpec {
    let mut running = serde_json::to_value(desired).expect("a pod template serialises");
    for list in ["containers", "initContainers"] {
        let Some(containers) = running["spec"][list].as_array_mut() else {
            continue;
        };
        for container in containers {
            let image = stored["spec"][list].as_array().and_then(|theirs| {
                theirs
                    .iter()
                    .find(|c| c["name"] == container["name"])
                    .map(|c| c["image"].clone())
            });
            if let Some(image) = image {
                container["image"] = image;
            }
        }
    }
    // memcached's settings may take another form in the operator's template (since 0.9.0, `-t`
    // and `-c` from annotations): the same members all the same (members/settings.rs).
    let (theirs, ours) = (
        without_any_settings(&stored),
        without_any_settings(&running),
    );
    let chosen = if holds(&theirs, &ours) {
        running
    } else {
        stored
    };
    serde_json::from_value(chosen).unwrap_or_default()
}

/// Whether `stored` (as the API server keeps an object: defaults added, quantities in their
/// canonical form) holds everything `wanted` sets.
fn holds(stored: &Value, wanted: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    match (stored, wanted) {
        (_, Value::Null) => true,
        (Value::Object(s), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| s.get(k).map_or(empty(v), |there| holds(there, v))),
        (Value::Array(s), Value::Array(w)) => {
            s.len() == w.len() && s.iter().zip(w).all(|(there, v)| holds(there, v))
        }
        (Value::String(s), Value::String(w)) if s != w => {
            let amount = |q: &str| quantity_bytes(&Quantity(q.to_string()));
            amount(s).is_some() && amount(s) == amount(w)
        }
        (s, w) => s == w,
    }
}

/// Step 2: the StatefulSet's revisions collected, then the members without a controller made
/// the Memcached's, each with the revision that names the StatefulSet revision it has.
async fn adopt(ctx: &Context, mc: &Memcached, members: &[Member]) -> Result<Adoption> {
    let (revisions, listed) = revisions_of(&ctx.client, mc).await?;
    // StatefulSet revision -> the operator's revision of the same template.
    let adopting: BTreeMap<String, String> = listed
        .iter()
        .filter(|r| resources::is_controlled_by(&r.metadata, mc))
        .filter_map(|r| Some((r.annotations().get(ADOPTED_FROM)?.clone(), r.name_any())))
        .collect();
    let mut moves = Vec::new();
    for member in members.iter().filter(|m| m.controller == Controller::None) {
        match member.revision.as_ref().and_then(|r| adopting.get(r)) {
            Some(revision) => moves.push((member.name.as_str(), revision.as_str())),
            None => return Ok(Adoption::Foreign(member.name.clone())),
        }
    }
    // The StatefulSet's revisions first (none of its members needs one now): an adoption
    // stopped after this still finds the revisions it adopts as.
    let mut keep: Vec<&str> = members
        .iter()
        .filter(|m| m.controller != Controller::None)
        .filter_map(|m| m.revision.as_deref())
        .chain(moves.iter().map(|(_, revision)| *revision))
        .collect();
    keep.sort_unstable();
    keep.dedup();
    if listed
        .iter()
        .any(|r| !keep.contains(&r.name_any().as_str()))
    {
        revisions
            .delete_collection(&DeleteParams::default(), &history(mc, &keep))
            .await
            .map_err(|source| apply_error("ControllerRevisions of", &mc.name_any(), source))?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &mc.namespace().unwrap_or_default());
    let owner = [resources::owner_reference(mc)];
    try_join_all(moves.iter().map(|(name, revision)| {
        let (pods, owner) = (&pods, &owner);
        async move {
            let ordinal = name.rsplit_once('-').map_or("", |(_, n)| n);
            let patch = json!({"metadata": {
                "ownerReferences": owner,
                "labels": {REVISION_LABEL: revision, POD_INDEX_LABEL: ordinal},
            }});
            match pods
                .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(adopted) => {
                    ctx.events.applied(mc, &adopted, &Change::Adopted);
                    Ok(())
                }
                // Gone meanwhile: made anew as a member.
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(source) => Err(apply_error("Pod", name, source)),
            }
        }
    }))
    .await?;
    Ok(Adoption::Underway)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use crate::resources::Images;

    /// `template` as the API server keeps it in a StatefulSet: with defaults added.
    fn as_stored(template: &PodTemplateSpec) -> Value {
        let mut stored = serde_json::to_value(template).unwrap();
        stored["spec"]["dnsPolicy"] = json!("ClusterFirst");
        stored["spec"]["containers"][0]["terminationMessagePath"] = json!("/dev/termination-log");
        stored["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
        stored
    }

    fn image(template: &PodTemplateSpec) -> Option<String> {
        template.spec.as_ref().unwrap().containers[0].image.clone()
    }

    #[test]
    fn members_of_the_operators_template_are_adopted_as_of_it_with_the_images_they_run() {
        let mc = memcached("cache", 3);
        let desired = resources::pod_template(&mc, &Images::new("memcached:new"));
        let older = resources::pod_template(&mc, &Images::new("memcached:old"));
        let adopted = adopted_template(&desired, as_stored(&older));
        assert_eq!(adopted, older, "the defaults left out, the images kept");
        assert_eq!(
            adopted_template(&desired, as_stored(&desired)),
            desired,
            "a StatefulSet of the current template: nothing to update"
        );
        assert_eq!(
            members::revision(&mc, &adopted_template(&desired, as_stored(&desired))),
            members::revision(&mc, &desired)
        );
    }

    #[test]
    fn members_of_0_6_are_adopted_as_of_the_operators_template_whatever_their_settings_form() {
        let mc = memcached("cache", 3);
        let desired = resources::pod_template(&mc, &Images::new("memcached:new"));
        let mut stored = as_stored(&resources::pod_template(&mc, &Images::new("memcached:old")));
        // 0.6.0's form: only the memory from an annotation, -t and -c memcached's defaults.
        let memcached = &mut stored["spec"]["containers"][0];
        let args = memcached["args"].as_array_mut().unwrap();
        for flag in ["-t", "-c"] {
            let at = args.iter().position(|a| a == flag).unwrap();
            args.drain(at..at + 2);
        }
        memcached["env"].as_array_mut().unwrap().truncate(1);
        let memory = resources::warm_restart::MEMORY_ANNOTATION;
        let annotations = stored["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.retain(|k, _| k == memory);
        for volume in stored["spec"]["volumes"].as_array_mut().unwrap() {
            if let Some(items) = volume["downwardAPI"]["items"].as_array_mut() {
                items.truncate(1);
            }
        }
        let adopted = adopted_template(&desired, stored);
        assert_eq!(image(&adopted).as_deref(), Some("memcached:old"));
        let args = |t: &PodTemplateSpec| t.spec.as_ref().unwrap().containers[0].args.clone();
        assert_eq!(
            args(&adopted),
            args(&desired),
            "recorded as the operator's own template: its update compares the settings by value"
        );
    }

    #[test]
    fn members_of_another_template_are_adopted_as_of_theirs() {
        let mc = memcached("cache", 3);
        let desired = resources::pod_template(&mc, &Images::new("memcached:new"));
        let mut stored = as_stored(&resources::pod_template(&mc, &Images::new("m:old")));
        stored["spec"]["containers"][0]["args"] = json!(["-m", "32"]);
        let adopted = adopted_template(&desired, stored.clone());
        assert_eq!(serde_json::to_value(&adopted).unwrap(), stored);
        assert_eq!(image(&adopted).as_deref(), Some("m:old"));
    }

    #[test]
    fn a_stored_template_holds_what_is_wanted_whatever_the_api_server_adds_or_rewrites() {
        assert!(holds(&json!({"a": 1, "b": 2}), &json!({"a": 1})));
        assert!(!holds(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(
            holds(&json!({"a": 1}), &json!({"a": 1, "b": {}})),
            "empty is absent"
        );
        assert!(!holds(&json!([1, 2]), &json!([1])), "a list is whole");
        assert!(
            holds(&json!({"cpu": "500m"}), &json!({"cpu": "0.5"})),
            "a quantity's form"
        );
        assert!(!holds(&json!({"cpu": "500m"}), &json!({"cpu": "1"})));
        assert!(!holds(&json!({"image": "a"}), &json!({"image": "b"})));
    }
}
