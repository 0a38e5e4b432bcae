//! Updating the members. A member whose new template differs only in images is updated in
//! place: its images are patched,
//! the kubelet restarts the changed containers in the same pod (same name, address and
//! memory-backed `emptyDir`), and memcached, saved by its `preStop`, comes back with its items.
//! A larger memory is a restart by the agent, new CPU and memory a resize first (resize.rs).
//! Any other change replaces the member through the Eviction API (its disruption budget holds),
//! and the operator creates it anew under its name, empty (own.rs).
//!
//! One member at a time, or `rollout.maxUnavailable`: the next waits until every member is Ready
//! for `minReadySeconds`. A patched member counts as out until its containers have restarted: the
//! pod keeps its Ready condition while the kubelet runs the `preStop`.
//!
//! The patch, and why memcached waits for the agent beside it: in_place.rs.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{EvictParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::debug;

use super::context::Context;
use super::events::Change;
use crate::api::Memcached;
use crate::error::{Error, Result};
use crate::resources;
use crate::resources::REVISION_LABEL;
use crate::status::UpdateKind as Kind;

mod in_place;
pub mod own;
pub mod replacing;
mod settings;
pub(super) use own::history;
pub(super) use settings::without_any_settings;
mod resize;
use in_place::{InPlace, Made, Move, Record, next_move, restart_patch, restart_pending};

/// Member `ordinal` of `mc` as the operator creates it from `template` of `revision`
/// (resources::members::member), with the record of its template that an update compares.
pub fn member(mc: &Memcached, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let record = Record::of(&serde_json::to_value(template).expect("a pod template serialises"));
    let mut pod = resources::members::member(mc, template, revision, ordinal);
    pod.annotations_mut()
        .insert(TEMPLATE_ANNOTATION.to_string(), record.annotation());
    pod
}

/// On a member patched in place: the revision it is moving to, and each restarted container's
/// restart count before the patch. The revision label follows once it is back and available, so
/// the member counts updated only then.
pub const IN_PLACE_ANNOTATION: &str = "cache.example.com/update-in-place";
/// On a member: what an update compares of the template it was made from (in_place.rs, `Record`).
pub const TEMPLATE_ANNOTATION: &str = "cache.example.com/template";
/// How often an update in progress is looked at when no pod event comes sooner.
const RECHECK: Duration = Duration::from_secs(5);

/// An update in progress: its kind, and when to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Updating {
    pub kind: Kind,
    pub recheck: Duration,
}

/// What to do next for one Memcached's members.
#[derive(Debug, PartialEq)]
enum Step<'a> {
    /// Every member runs the current template.
    Done,
    /// As many members are out as the update may take; look again after this.
    Wait(Duration),
    /// Update this member (the highest outdated one, or an outdated one already out).
    Update(&'a Pod),
    /// This member, restarted in place, is back and available: label it with the revision.
    Finish(&'a Pod),
}

impl Step<'_> {
    /// For the log: the step and the member it is about.
    fn name(&self) -> String {
        match self {
            Step::Done => "done".to_string(),
            Step::Wait(recheck) => format!("wait {recheck:?}"),
            Step::Update(pod) => format!("update {}", pod.name_any()),
            Step::Finish(pod) => format!("finish {}", pod.name_any()),
        }
    }
}

/// What an update reads of the members' count.
#[derive(Clone, Copy, Debug)]
pub struct Keeper<'a> {
    /// The revision every member should have, and its template.
    pub update_revision: &'a str,
    pub template: &'a PodTemplateSpec,
    /// Members it wants.
    pub wanted: i32,
    /// Whether every member it has is of `update_revision`.
    pub all_updated: bool,
    /// Its name, for errors.
    pub name: &'a str,
    /// How long a member's update waits yet: the proxies load the layout that holds requests
    /// for a member restarting first.
    pub wait: Option<Duration>,
}

/// Moves the members one step towards the current template; None when there is nothing to do.
pub async fn update(ctx: &Context, mc: &Memcached, keeper: Keeper<'_>) -> Result<Option<Updating>> {
    let update_revision = keeper.update_revision;
    let ns = mc.namespace().unwrap_or_default();
    let replacing = ctx.remembered.replacing.of(&ns, &mc.name_any());
    if keeper.all_updated && replacing.is_empty() {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default().labels(&resources::selector_string(mc)))
        .await
        .map_err(|source| read_error("Pods of", keeper.name, source))?;
    let mut view = View {
        update_revision,
        wanted: keeper.wanted,
        at_once: resources::members_at_once(mc),
        min_ready: min_ready(mc),
        now: Timestamp::now(),
        replacing,
        wait: keeper.wait.unwrap_or_default(),
    };
    view.replacing =
        ctx.remembered
            .replacing
            .served(&ns, &mc.name_any(), &view.available(&listed.items));
    let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let step = view.next_step(&listed.items);
    debug!(memcached = keeper.name, %update_revision, step = step.name(), "updating the members");
    let pod = match step {
        Step::Done => return Ok(None),
        Step::Wait(recheck) => {
            let kind = waiting_kind(&view, &revisions, keeper.template, &listed.items).await?;
            return Ok(Some(Updating { kind, recheck }));
        }
        Step::Finish(pod) => {
            let patch = json!({"metadata": {"labels": {REVISION_LABEL: update_revision}}});
            patch_pod(&pods, pod, patch).await?;
            return Ok(Some(Updating {
                kind: Kind::InPlace,
                recheck: RECHECK,
            }));
        }
        Step::Update(pod) => pod,
    };
    let (made, new) = templates(&revisions, pod, keeper.template).await?;
    let kind = match next_move(pod, &made, &new, update_revision) {
        Move::AwaitAgent | Move::AwaitResize => Kind::InPlace,
        Move::Resize(resize) => {
            if resize_pod(&pods, pod, resize).await? {
                ctx.events.applied(mc, pod, &Change::Resized);
                Kind::InPlace
            } else {
                evict(ctx, mc, pod).await?;
                Kind::Replace
            }
        }
        Move::Patch(patch, record) => {
            // A member's second patch (memcached after its agent) is the same update: one event.
            let first = InPlace::of(pod).is_none_or(|i| i.revision != update_revision);
            if let Some(patched) = patch_pod(&pods, pod, patch).await?
                && first
                && !record.restarts.is_empty()
            {
                ctx.events.applied(mc, &patched, &Change::Restarted);
            }
            Kind::InPlace
        }
        Move::Evict => {
            evict(ctx, mc, pod).await?;
            Kind::Replace
        }
    };
    Ok(Some(Updating {
        kind,
        recheck: RECHECK,
    }))
}

/// The kind of the update still to do while it waits, for the status.
async fn waiting_kind(
    view: &View<'_>,
    revisions: &Api<ControllerRevision>,
    template: &PodTemplateSpec,
    pods: &[Pod],
) -> Result<Kind> {
    Ok(match view.outdated(pods).next() {
        Some(pod) => {
            let (made, new) = templates(revisions, pod, template).await?;
            match restart_patch(pod, &made, &new, view.update_revision) {
                Some(_) => Kind::InPlace,
                None => Kind::Replace,
            }
        }
        None if !view.replacing.is_empty() => Kind::Replace,
        None => Kind::InPlace,
    })
}

/// What the next step reads besides the pods.
struct View<'a> {
    update_revision: &'a str,
    /// Members the spec wants.
    wanted: i32,
    /// Members the update may take out at once.
    at_once: i32,
    min_ready: SignedDuration,
    now: Timestamp,
    /// Members evicted for the update whose replacement has not served yet.
    replacing: BTreeSet<String>,
    /// How long a member's update (which takes it out) waits yet (`Keeper::wait`).
    wait: Duration,
}

impl View<'_> {
    fn next_step<'p>(&self, pods: &'p [Pod]) -> Step<'p> {
        match self.next_move(pods) {
            Step::Update(_) if !self.wait.is_zero() => Step::Wait(self.wait),
            step => step,
        }
    }

    fn next_move<'p>(&self, pods: &'p [Pod]) -> Step<'p> {
        let (restarting, mut outdated): (Vec<&Pod>, Vec<&Pod>) = self
            .outdated(pods)
            .partition(|p| InPlace::of(p).is_some_and(|i| i.revision == self.update_revision));
        if let Some(back) = restarting
            .iter()
            .find(|p| self.available_in(p) == Some(SignedDuration::ZERO))
        {
            return match InPlace::of(back).is_some_and(|i| i.memcached_next) {
                true => Step::Update(back),
                false => Step::Finish(back),
            };
        }
        if outdated.is_empty() {
            // A replaced member counts updated as soon as it exists; the update is over once it
            // serves.
            return if restarting.is_empty() && self.replacing.is_empty() {
                Step::Done
            } else {
                Step::Wait(self.soonest_available(pods))
            };
        }
        // A member already out costs nothing more to update: those first, then from the highest
        // ordinal down, as Kubernetes' rolling updates of numbered pods go.
        outdated.sort_by_key(|p| (self.available_in(p).is_none(), ordinal(p)));
        let candidate = outdated[outdated.len() - 1];
        if self.available_in(candidate).is_none() {
            return Step::Update(candidate);
        }
        let available = pods
            .iter()
            .filter(|p| self.available_in(p) == Some(SignedDuration::ZERO))
            .count();
        let out = i64::from(self.wanted) - available as i64;
        if out < i64::from(self.at_once) {
            return Step::Update(candidate);
        }
        Step::Wait(self.soonest_available(pods))
    }

    /// When to look again: when a member that is Ready but not yet for minReadySeconds becomes
    /// available, or soon.
    fn soonest_available(&self, pods: &[Pod]) -> Duration {
        let soonest = pods
            .iter()
            .filter_map(|p| self.available_in(p))
            .filter(|d| d.is_positive())
            .min()
            .and_then(|d| Duration::try_from(d).ok());
        soonest.map_or(RECHECK, |d| d.min(RECHECK))
    }

    /// The names of the members available now.
    fn available<'p>(&self, pods: &'p [Pod]) -> Vec<&'p str> {
        pods.iter()
            .filter(|p| self.available_in(p) == Some(SignedDuration::ZERO))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect()
    }

    /// Members not of the update revision and not going away.
    fn outdated<'p>(&self, pods: &'p [Pod]) -> impl Iterator<Item = &'p Pod> {
        pods.iter().filter(|p| {
            p.metadata.deletion_timestamp.is_none() && revision_of(p) != Some(self.update_revision)
        })
    }

    /// How long until the pod counts as available (zero: it does); None while it is not Ready,
    /// is going away, has not yet restarted for an update in place or waits for a resize.
    fn available_in(&self, pod: &Pod) -> Option<SignedDuration> {
        if pod.metadata.deletion_timestamp.is_some()
            || restart_pending(pod)
            || resize::actuation(pod) == resize::Actuation::Pending
        {
            return None;
        }
        let ready = pod
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "True")?;
        let since = ready
            .last_transition_time
            .as_ref()
            .map_or(self.now, |t| t.0);
        let left = self.min_ready - self.now.duration_since(since);
        Some(left.max(SignedDuration::ZERO))
    }
}

fn revision_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(REVISION_LABEL).map(String::as_str)
}

/// The member's ordinal, from its name `<memcached>-<ordinal>`.
fn ordinal(pod: &Pod) -> i64 {
    pod.metadata
        .name
        .as_deref()
        .and_then(|n| n.rsplit_once('-'))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(-1)
}

/// The pod template a revision records (`data.spec.template`).
async fn recorded_template(revisions: &Api<ControllerRevision>, name: &str) -> Result<Value> {
    let revision = revisions
        .get(name)
        .await
        .map_err(|source| read_error("ControllerRevision", name, source))?;
    let mut template = revision
        .data
        .map(|d| d.0)
        .and_then(|mut d| d.pointer_mut("/spec/template").map(Value::take))
        .unwrap_or_default();
    if let Some(t) = template.as_object_mut() {
        t.remove("$patch");
    }
    Ok(template)
}

/// The template `pod` was made from, and the current `template` as JSON. A member made by a
/// release before 0.9.0, or adopted from a StatefulSet, has no record of its template: that is
/// in the ControllerRevision of its revision.
async fn templates(
    revisions: &Api<ControllerRevision>,
    pod: &Pod,
    template: &PodTemplateSpec,
) -> Result<(Made, Value)> {
    let new = serde_json::to_value(template).expect("a pod template serialises");
    let made = match Made::of_pod(pod, &new) {
        Some(made) => made,
        None => {
            let revision = revision_of(pod).unwrap_or_default();
            Made::from_template(recorded_template(revisions, revision).await?)
        }
    };
    Ok((made, new))
}

/// Evicts a member for a pod spec it cannot take in place, through the client that gives back
/// a 429 at once.
async fn evict(ctx: &Context, mc: &Memcached, pod: &Pod) -> Result<()> {
    let name = pod.name_any();
    let ns = mc.namespace().unwrap_or_default();
    let evictions: Api<Pod> = Api::namespaced(ctx.evictions.clone(), &ns);
    match evictions.evict(&name, &EvictParams::default()).await {
        Ok(_) => {
            ctx.remembered.replacing.evicted(&ns, &mc.name_any(), &name);
            ctx.events.applied(mc, pod, &Change::Evicted);
            Ok(())
        }
        // The disruption budget allows none now: a member is out for another cause.
        Err(kube::Error::Api(e)) if e.code == 429 || e.code == 404 => Ok(()),
        Err(source) => Err(apply_error("Pod", &name, source)),
    }
}

/// Resizes a member's containers in place; false if the API server refuses the resize (it
/// would change the pod's QoS class, say): only a new pod takes that.
async fn resize_pod(pods: &Api<Pod>, pod: &Pod, resize: Value) -> Result<bool> {
    let name = pod.name_any();
    let params = PatchParams::default();
    match pods
        .patch_subresource("resize", &name, &params, &Patch::Strategic(resize))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 422 => {
            tracing::info!(pod = %name, reason = %e.message, "resize refused: the member is replaced");
            Ok(false)
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(source) => Err(apply_error("Pod", &name, source)),
    }
}

/// Patches `pod`; None if it is gone meanwhile.
async fn patch_pod(pods: &Api<Pod>, pod: &Pod, patch: Value) -> Result<Option<Pod>> {
    let name = pod.name_any();
    match pods
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(patched) => Ok(Some(patched)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(source) => Err(apply_error("Pod", &name, source)),
    }
}

/// How long a member must have been Ready to count as available (`minReadySeconds`).
fn min_ready(mc: &Memcached) -> SignedDuration {
    let rollout = mc.spec.rollout.clone().unwrap_or_default();
    SignedDuration::from_secs(i64::from(rollout.min_ready_seconds))
}

pub(super) fn read_error(kind: &str, name: &str, source: kube::Error) -> Error {
    Error::Read {
        kind: kind.into(),
        name: name.into(),
        source,
    }
}

pub(super) fn apply_error(kind: &str, name: &str, source: kube::Error) -> Error {
    Error::Apply {
        kind: kind.into(),
        name: name.into(),
        source,
    }
}

#[cfg(test)]
mod tests;
