//! 0.6.0's members adopted. Releases up to 0.6.0 kept a Memcached's members in a StatefulSet;
//! since 0.8.0 the operator keeps every Memcached's pods itself, and one that still has its
//! StatefulSet moves over once its members all run the StatefulSet's current template, which is
//! the operator's: nothing is restarted, no key is lost.
//!
//! 1. `release`: the ControllerRevision of the current template is made, naming the StatefulSet
//!    revision the members have (`ADOPTED_FROM`), and the StatefulSet is deleted with
//!    `propagationPolicy: Orphan`: the garbage collector takes its owner reference off the pods
//!    and its revisions before it goes (the reconcile waits for that: `releasing`).
//! 2. `adopt`: the StatefulSet's revisions are collected, and each member left without a
//!    controller is given the Memcached as its controller and the revision of step 1 (their
//!    templates are the same, so nothing is rolled).
//!
//! Each step reads what the ones before left, so an operator stopped between any two writes
//! resumes where it stopped. A pod without a controller whose revision no adoption names is not
//! taken: it is someone else's, left alone and reported, as a StatefulSet in the way is.

use std::collections::BTreeMap;

use futures::future::try_join_all;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::{apply_error, read_error};
use crate::api::Memcached;
use crate::config::Members;
use crate::controller::context::Context;
use crate::controller::events::Change;
use crate::controller::owned::OwnedObject;
use crate::controller::pod_index::{Controller, Member};
use crate::error::{Error, Result};
use crate::resources::members::POD_INDEX_LABEL;
use crate::resources::{self, MANAGER_NAME, REVISION_LABEL, members};

/// On the operator's ControllerRevision made at adoption: the StatefulSet revision whose
/// members run its template.
pub const ADOPTED_FROM: &str = "cache.example.com/adopted-from";

/// Whether the Memcached's StatefulSet is being deleted where the operator keeps the members:
/// they are being released to the Memcached, and its delete event brings the reconcile that
/// adopts them.
pub fn releasing(ctx: &Context, mc: &Memcached, sts: Option<&OwnedObject<StatefulSet>>) -> bool {
    ctx.members == Members::Pods
        && sts.is_some_and(|sts| {
            sts.metadata.deletion_timestamp.is_some()
                && resources::is_controlled_by(&sts.metadata, mc)
        })
}

/// Whether every member runs the StatefulSet's current revision, as many as the spec asks:
/// then the StatefulSet's template is the operator's, and can be handed over unchanged.
fn ready_to_release(
    mc: &Memcached,
    sts: &OwnedObject<StatefulSet>,
    members: &[Member],
) -> Option<String> {
    let status = sts.status.as_ref()?;
    let revision = status.update_revision.clone()?;
    // Not `currentRevision`: under `OnDelete` its controller never moves it on.
    let settled = status.observed_generation >= sts.metadata.generation
        && sts.replicas == Some(mc.spec.size)
        && status.replicas == mc.spec.size
        && status.updated_replicas == Some(mc.spec.size);
    let all_current = members.len() == mc.spec.size as usize
        && members
            .iter()
            .all(|m| m.revision.as_deref() == Some(revision.as_str()));
    (settled && all_current).then_some(revision)
}

/// Step 1, where the operator keeps the members and the Memcached's StatefulSet (`sts`, applied
/// unchanged and with no update or rollout waiting) has every member at its current revision:
/// the revision of the template they run, then the StatefulSet deleted, its members orphaned.
/// Whether it was.
pub async fn release(
    ctx: &Context,
    mc: &Memcached,
    sts: Option<&OwnedObject<StatefulSet>>,
) -> Result<bool> {
    let ns = mc.namespace().unwrap_or_default();
    let Some(sts) = sts.filter(|_| ctx.members == Members::Pods) else {
        return Ok(false);
    };
    let members = ctx.pods.members_of(&ns, &mc.name_any());
    let Some(from) = ready_to_release(mc, sts, &members) else {
        return Ok(false);
    };
    let from = from.as_str();
    let desired = resources::stateful_set(mc, &ctx.images);
    let revision = members::revision(mc, &desired);
    let mut body = members::controller_revision(mc, &desired, &revision);
    body.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ADOPTED_FROM.into(), from.into());
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let params = PostParams {
        field_manager: Some(MANAGER_NAME.into()),
        ..PostParams::default()
    };
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
            if adopted.map(String::as_str) != Some(from) {
                return Err(Error::Adoption {
                    revision,
                    adopted: adopted.cloned().unwrap_or_default(),
                    stateful_set_revision: from.into(),
                });
            }
        }
        Err(source) => return Err(apply_error("ControllerRevision", &revision, source)),
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
    let stateful_sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    match stateful_sets.delete(&name, &delete).await {
        Ok(_) => {
            ctx.events.applied(mc, sts, &Change::Released);
            Ok(true)
        }
        // Gone already, or another of that name: the next reconcile reads which.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(true),
        Err(source) => Err(apply_error("StatefulSet", &name, source)),
    }
}

/// What step 2 came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Adopted {
    /// The members were adopted (their watch events bring the status refresh).
    Written,
    /// A pod without a controller that no adoption names: someone else's.
    Foreign(String),
}

/// Step 2: the StatefulSet's revisions collected, then the members without a controller made
/// the Memcached's, each with the revision that names the StatefulSet revision it has.
pub async fn adopt(ctx: &Context, mc: &Memcached, members: &[Member]) -> Result<Adopted> {
    let ns = mc.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let listed = revisions
        .list(&ListParams::default().labels(&resources::selector_string(mc)))
        .await
        .map_err(|source| read_error("ControllerRevisions of", &mc.name_any(), source))?;
    // StatefulSet revision -> the operator's revision of the same template.
    let adopting: BTreeMap<String, String> = listed
        .items
        .iter()
        .filter(|r| resources::is_controlled_by(&r.metadata, mc))
        .filter_map(|r| Some((r.annotations().get(ADOPTED_FROM)?.clone(), r.name_any())))
        .collect();
    let mut moves = Vec::new();
    for member in members.iter().filter(|m| m.controller == Controller::None) {
        match member.revision.as_ref().and_then(|r| adopting.get(r)) {
            Some(revision) => moves.push((member.name.as_str(), revision.as_str())),
            None => return Ok(Adopted::Foreign(member.name.clone())),
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
        .items
        .iter()
        .any(|r| !keep.contains(&r.name_any().as_str()))
    {
        revisions
            .delete_collection(&DeleteParams::default(), &super::own::history(mc, &keep))
            .await
            .map_err(|source| apply_error("ControllerRevisions of", &mc.name_any(), source))?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
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
    Ok(Adopted::Written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn member(name: &str, revision: &str) -> Member {
        Member {
            name: name.into(),
            ready_since: None,
            revision: Some(revision.into()),
            controller: Controller::StatefulSet,
        }
    }

    fn stateful_set(replicas: i32, updated: i32, current: &str) -> OwnedObject<StatefulSet> {
        let mc = memcached("cache", replicas);
        let mut sts = crate::fixtures::stateful_set_with_status(&mc, replicas, replicas);
        sts.metadata.generation = Some(2);
        sts.status = Some(StatefulSetStatus {
            observed_generation: Some(2),
            replicas,
            updated_replicas: Some(updated),
            current_revision: Some(current.into()),
            update_revision: Some("cache-new".into()),
            ..StatefulSetStatus::default()
        });
        sts
    }

    #[test]
    fn a_stateful_set_is_released_only_once_every_member_runs_its_current_template() {
        let mc = memcached("cache", 2);
        let members = [
            member("cache-0", "cache-new"),
            member("cache-1", "cache-new"),
        ];
        assert_eq!(
            ready_to_release(&mc, &stateful_set(2, 2, "cache-new"), &members).as_deref(),
            Some("cache-new")
        );
        assert_eq!(
            ready_to_release(&mc, &stateful_set(2, 2, "cache-old"), &members).as_deref(),
            Some("cache-new"),
            "under OnDelete the current revision stays the first"
        );
        assert_eq!(
            ready_to_release(&mc, &stateful_set(2, 1, "cache-old"), &members),
            None,
            "an update under way finishes first"
        );
        let behind = [
            member("cache-0", "cache-new"),
            member("cache-1", "cache-old"),
        ];
        assert_eq!(
            ready_to_release(&mc, &stateful_set(2, 2, "cache-new"), &behind),
            None,
            "the pod watch says a member is not updated yet"
        );
        assert_eq!(
            ready_to_release(&mc, &stateful_set(3, 3, "cache-new"), &members),
            None,
            "a size change reaches the StatefulSet first"
        );
        let mut unseen = stateful_set(2, 2, "cache-new");
        unseen.metadata.generation = Some(3);
        assert_eq!(
            ready_to_release(&mc, &unseen, &members),
            None,
            "its controller has not seen its spec"
        );
    }
}
