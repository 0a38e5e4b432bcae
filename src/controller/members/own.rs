//! The members as the operator keeps them: the missing ones are created under their names,
//! each with the record of its template that the update compares (members.rs), and those beyond
//! the size deleted. No workload controller stands between: one would write its
//! status and a revision for every new Memcached, where the control plane's time goes
//! (docs/performance.md); here the pod watch counts the members.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use tracing::debug;

use super::{Keeper, apply_error, min_ready, read_error};
use crate::api::Memcached;
use crate::controller::context::Context;
use crate::controller::events::Change;
use crate::controller::events::Events;
use crate::error::{Refusal, Result, namespace_terminating};
use crate::resources::Images;
use crate::resources::{self, MANAGER_NAME, members};
use crate::status::Members;
use crate::watch::pod_index::Member;
use crate::watch::pod_index::PodIndex;

/// One Memcached's members as the pod watch shows them, and the template they should run.
#[derive(Debug)]
pub struct Seen {
    pub template: PodTemplateSpec,
    /// The template's revision.
    pub revision: String,
    pub members: Vec<Member>,
    /// Members being deleted: each holds its name until it is gone.
    pub terminating: Vec<String>,
    /// Counted for the Memcached's status.
    pub counts: Members,
    /// How soon the next Ready member has been Ready for `minReadySeconds`: no event tells
    /// when.
    pub available_in: Option<Duration>,
}

impl Seen {
    /// Whether the member of ordinal `n` is there and Ready.
    pub fn is_ready(&self, mc: &Memcached, n: i32) -> bool {
        self.members
            .iter()
            .any(|m| m.ready_since.is_some() && members::ordinal(mc, &m.name) == Some(n))
    }

    /// The zone of the member of ordinal `n`, as its pod is labelled.
    pub fn zone(&self, mc: &Memcached, n: i32) -> Option<String> {
        let member = self
            .members
            .iter()
            .find(|m| members::ordinal(mc, &m.name) == Some(n));
        member.and_then(|m| m.zone.clone())
    }

    /// Whether every member is of the current template (none is being updated).
    pub fn all_updated(&self) -> bool {
        self.counts.updated >= self.counts.replicas
    }

    pub fn keeper<'a>(&'a self, mc: &'a Memcached) -> Keeper<'a> {
        Keeper {
            update_revision: &self.revision,
            template: &self.template,
            wanted: mc.spec.size,
            all_updated: self.all_updated(),
            name: mc.metadata.name.as_deref().unwrap_or_default(),
            wait: None,
        }
    }
}

/// The members as they are, with no request.
pub fn observe(pods: &PodIndex, images: &Images, mc: &Memcached) -> Seen {
    let (ns, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    let members = pods.members_of(&ns, &name);
    let terminating = pods.terminating_of(&ns, &name);
    Seen::of(mc, images, members, terminating, Timestamp::now())
}

impl Seen {
    /// `members` and `terminating` as seen at `now`, against the template of `images`.
    pub fn of(
        mc: &Memcached,
        images: &resources::Images,
        members: Vec<Member>,
        terminating: Vec<String>,
        now: Timestamp,
    ) -> Seen {
        let template = resources::pod_template(mc, images);
        let revision = members::revision(mc, &template);
        Seen {
            counts: counted(mc, &members, &revision, now),
            available_in: available_in(mc, &members, now),
            terminating,
            template,
            revision,
            members,
        }
    }
}

/// What keeping the members asks now.
#[derive(Debug, PartialEq, Eq)]
pub struct Moves {
    /// Ordinals to create, of the current revision.
    pub create: Vec<i32>,
    /// Members beyond the size, to delete.
    pub delete: Vec<String>,
    /// Whether an update to the current revision starts: members there are, none of it.
    pub update_starts: bool,
}

/// The members missing and those beyond `keep` (the size, or more while the proxy's previous
/// layout still reads from them), and whether an update starts. Pure.
pub fn moves(mc: &Memcached, seen: &Seen, keep: i32) -> Moves {
    let names: Vec<&str> = seen.members.iter().map(|m| m.name.as_str()).collect();
    // Its delete event brings the reconcile that makes it again; a create now would be refused.
    let terminating: Vec<&str> = seen.terminating.iter().map(String::as_str).collect();
    let (create, delete) = members::plan(mc, mc.spec.size, &names, &terminating);
    let delete = delete
        .into_iter()
        .filter(|name| members::ordinal(mc, name).is_some_and(|n| n >= keep))
        .collect::<Vec<_>>();
    let kept = seen
        .members
        .iter()
        .any(|m| m.revision.as_deref() == Some(seen.revision.as_str()));
    Moves {
        create,
        delete: delete.into_iter().map(String::from).collect(),
        update_starts: !seen.members.is_empty() && !kept,
    }
}

/// What the members' writes came to.
#[derive(Debug, Default)]
pub struct Written {
    /// Pods were created or deleted: their watch events refresh the status.
    pub any: bool,
    /// An update nobody asked for waits for the rollout budget: the members keep their
    /// revision.
    pub waiting: bool,
    /// Why a member could not be created (a quota, an admission policy), in the API server's
    /// words: reported in the status, and tried again on the next reconcile.
    pub refused: Option<String>,
    /// A pod of a member's name that is someone else's: left alone, and reported.
    pub foreign: Option<String>,
}

/// Creates the members missing and deletes those beyond the size; where an update starts,
/// collects the ControllerRevisions of releases before 0.9.0 that no member needs any more.
pub async fn apply(ctx: &Context, mc: &Memcached, seen: &Seen, moves: &Moves) -> Result<Written> {
    let mut written = Written::default();
    let Moves {
        create,
        delete,
        update_starts,
    } = moves;
    let mut update_starts = *update_starts;
    // An update nobody asked for (an operator upgrade) waits for the rollout budget; once
    // started, it goes on.
    if update_starts && ctx.remembered.rollouts.must_wait(mc) {
        (update_starts, written.waiting) = (false, true);
        debug!("an update nobody asked for waits for the rollout budget");
    }
    if create.is_empty() && delete.is_empty() && !update_starts {
        return Ok(written);
    }
    let ns = mc.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let params = PostParams {
        field_manager: Some(MANAGER_NAME.into()),
        ..PostParams::default()
    };
    // Independent: none waits for another (a reconcile's latency is its longest chain).
    let revisions = async {
        match update_starts {
            true => collect_revisions(&ctx.client, mc, seen).await,
            false => Ok(()),
        }
    };
    let creates = join_all(create.iter().map(|ordinal| {
        let pod = super::member(mc, &seen.template, &seen.revision, *ordinal);
        let (pods, params) = (&pods, &params);
        async move {
            match pods.create(params, &pod).await {
                Ok(created) => {
                    ctx.events.applied(mc, &created, &Change::Created);
                    Ok(Made::Written)
                }
                Err(error) => made(error, pods, mc, &pod.name_any()).await,
            }
        }
    }));
    let deletes = join_all(
        delete
            .iter()
            .map(|name| delete_member(&ctx.events, mc, &pods, name)),
    );
    let (revisions, creates, deletes) = tokio::join!(revisions, creates, deletes);
    revisions?;
    for made in creates.into_iter().chain(deletes) {
        match made? {
            Made::Written => written.any = true,
            Made::There => {}
            Made::Refused(words) => {
                written.refused.get_or_insert(words);
            }
            Made::Foreign(name) => {
                written.foreign.get_or_insert(name);
            }
        }
    }
    Ok(written)
}

/// Deletes the ControllerRevisions no member names (in one request): releases before 0.9.0
/// kept each template in one, and a member they made still reads its template there until an
/// update has moved it on (members.rs).
async fn collect_revisions(client: &Client, mc: &Memcached, seen: &Seen) -> Result<()> {
    let ns = mc.namespace().unwrap_or_default();
    let revisions: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let keep: Vec<&str> = seen
        .members
        .iter()
        .filter_map(|m| m.revision.as_deref())
        .collect();
    revisions
        .delete_collection(&DeleteParams::default(), &history(mc, &keep))
        .await
        .map(|_| ())
        .map_err(|source| apply_error("ControllerRevisions of", &mc.name_any(), source))
}

/// Deletes member `name`, beyond the size.
async fn delete_member(
    events: &Events,
    mc: &Memcached,
    pods: &Api<Pod>,
    name: &str,
) -> Result<Made> {
    match pods.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            let pod = Pod {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: mc.namespace(),
                    ..ObjectMeta::default()
                },
                ..Pod::default()
            };
            events.applied(mc, &pod, &Change::Deleted);
            Ok(Made::Written)
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Made::There),
        Err(source) => Err(apply_error("Pod", name, source)),
    }
}

/// The Memcached's ControllerRevisions but those named in `keep`.
pub(in crate::controller) fn history(mc: &Memcached, keep: &[&str]) -> ListParams {
    let mut names: Vec<String> = keep.iter().map(|n| format!("metadata.name!={n}")).collect();
    names.sort();
    names.dedup();
    ListParams::default()
        .labels(&resources::selector_string(mc))
        .fields(&names.join(","))
}

/// What a member's create (or delete) came to.
enum Made {
    /// Created (or deleted): its watch event brings a status refresh.
    Written,
    /// Nothing to do: there already (or gone already).
    There,
    /// Refused for good, in the API server's words.
    Refused(String),
    /// Someone else's pod has the member's name.
    Foreign(String),
}

/// A member's create that failed. A pod there already is done if it is ours (made by a
/// reconcile whose watch event has not come yet, or being deleted where the pod watch has not
/// said so yet), someone else's if not. A refusal (a quota, an admission
/// policy) is reported rather than failing the reconcile, so that the Memcached's other objects
/// are kept and its status says why members are missing; a namespace being deleted is no
/// refusal to report: the reconcile ends quietly on it.
async fn made(error: kube::Error, pods: &Api<Pod>, mc: &Memcached, name: &str) -> Result<Made> {
    match error {
        kube::Error::Api(e) if e.code == 409 => {
            let there = pods
                .get_opt(name)
                .await
                .map_err(|source| read_error("Pod", name, source))?;
            Ok(match there {
                Some(pod) if !resources::is_controlled_by(&pod.metadata, mc) => {
                    Made::Foreign(name.to_string())
                }
                _ => Made::There,
            })
        }
        ref refused @ kube::Error::Api(ref e)
            if Refusal::of(e.code).is_some() && !namespace_terminating(refused) =>
        {
            Ok(Made::Refused(e.message.clone()))
        }
        source => Err(apply_error("Pod", name, source)),
    }
}

/// How long until the first of the Ready members not yet available is.
fn available_in(mc: &Memcached, seen: &[Member], now: Timestamp) -> Option<Duration> {
    let min_ready = min_ready(mc);
    seen.iter()
        .filter_map(|m| m.ready_since)
        .map(|since| min_ready - now.duration_since(since))
        .filter(|left| left.is_positive())
        .min()
        .and_then(|left| Duration::try_from(left).ok())
}

/// The members counted: there, Ready, Ready for `minReadySeconds`, of the current revision.
fn counted(mc: &Memcached, seen: &[Member], revision: &str, now: Timestamp) -> Members {
    let min_ready = min_ready(mc);
    let count = |f: &dyn Fn(&Member) -> bool| seen.iter().filter(|m| f(m)).count() as i32;
    Members {
        replicas: seen.len() as i32,
        ready: count(&|m| m.ready_since.is_some()),
        available: count(&|m| {
            m.ready_since
                .is_some_and(|since| now.duration_since(since) >= min_ready)
        }),
        updated: count(&|m| m.revision.as_deref() == Some(revision)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::memcached;
    use crate::watch::pod_index::Controller;
    use k8s_openapi::jiff::SignedDuration;

    fn member(name: &str, ready_for: Option<i64>, revision: &str, now: Timestamp) -> Member {
        Member {
            name: name.into(),
            ready_since: ready_for.map(|s| now - SignedDuration::from_secs(s)),
            not_ready_since: None,
            revision: Some(revision.into()),
            controller: Controller::Memcached,
            zone: None,
        }
    }

    #[test]
    fn the_history_is_the_memcacheds_revisions_but_those_kept() {
        let mc = memcached("cache", 3);
        let params = history(&mc, &["cache-b", "cache-a", "cache-b"]);
        assert_eq!(
            params.label_selector.as_deref(),
            Some("app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached")
        );
        assert_eq!(
            params.field_selector.as_deref(),
            Some("metadata.name!=cache-a,metadata.name!=cache-b")
        );
    }

    #[test]
    fn members_are_counted_there_ready_available_and_updated() {
        let mut mc = memcached("cache", 3);
        mc.spec.rollout = Some(crate::api::RolloutSpec {
            min_ready_seconds: 10,
            ..Default::default()
        });
        let now = Timestamp::now();
        let seen = [
            member("cache-0", Some(60), "new", now),
            member("cache-1", Some(5), "old", now),
            member("cache-2", None, "new", now),
        ];
        let counts = counted(&mc, &seen, "new", now);
        assert_eq!(
            counts,
            Members {
                replicas: 3,
                ready: 2,
                available: 1,
                updated: 2
            },
            "available: ready for minReadySeconds"
        );
        assert_eq!(
            available_in(&mc, &seen, now),
            Some(Duration::from_secs(5)),
            "cache-1, Ready for 5 of 10 s, is available in 5 s"
        );
        assert_eq!(available_in(&mc, &seen[..1], now), None, "all available");
    }
}
