//! What a Memcached whose members the operator has updated has (since 0.4.0 its StatefulSet is
//! `OnDelete` and the operator updates each member itself: in place when only images change, by
//! replacing it otherwise; since 0.7.0 a new Memcached's members are the operator's own, with no
//! StatefulSet), as both upgrade tests check it. From each release to the next since 0.4.0, as
//! the operator compares templates (0.6.0's `-m` through an env var counts as equal to 0.5.0's
//! literal one), only the agent's image changes (the operator's own), so each member is updated
//! in place: the same pod, its agent restarted, memcached running on.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use memcached_operator::api::Memcached;
use memcached_operator::controller::TEMPLATE_ANNOTATION;

use crate::harness;

/// The events regarding Memcached `name` for `reason` (`Evicted`, `Restarted`): the pods they
/// relate to, by time.
pub async fn member_events(
    client: &kube::Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<(String, Timestamp)> {
    let mut events: Vec<_> = harness::events_with_reason(client, ns, name, reason)
        .await
        .into_iter()
        .filter_map(|e| {
            let pod = e.related.as_ref()?.name.clone()?;
            let time = e
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            Some((pod, time))
        })
        .collect();
    events.sort_by_key(|(_, t)| *t);
    events
}

/// Whether `events` (member_events of one Memcached: `Restarted` or `Evicted`) name each of
/// `members` once and are about `min_ready` seconds or more apart, as the operator updates one
/// member at a time: the next once the one before has been back and Ready for minReadySeconds
/// (less a second: a Ready time is kept to the second). For a figure, either way: each member
/// with its time after the first.
pub fn one_at_a_time(
    events: &[(String, Timestamp)],
    members: &BTreeMap<String, Before>,
    min_ready: i32,
) -> Result<String, String> {
    let first = events.first().map(|(_, t)| *t);
    let list = events
        .iter()
        .map(|(pod, t)| {
            let after = first.map_or(0.0, |f| t.duration_since(f).as_secs_f64());
            format!("{pod} +{after:.1} s")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut names: Vec<&String> = events.iter().map(|(pod, _)| pod).collect();
    names.sort();
    let apart = events
        .windows(2)
        .all(|w| w[1].1.duration_since(w[0].1).as_secs_f64() >= f64::from(min_ready - 1));
    if names.into_iter().eq(members.keys()) && apart {
        Ok(list)
    } else {
        Err(list)
    }
}

/// The label naming the revision a pod was made from (the StatefulSet controller's, which the
/// operator gives its own members too).
pub const REVISION: &str = "controller-revision-hash";

/// An object's controller (its owner reference with `controller: true`): its uid.
pub fn controller_uid<K: kube::Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// What `pods` lack of being exactly the members `<name>-0 … <name>-<size-1>` of `keeper`, the
/// object of that kind and uid (None: there is none, so no pod is its).
pub fn members_missing(
    pods: &[Pod],
    name: &str,
    size: usize,
    (keeper, uid): (&str, Option<&str>),
) -> Vec<String> {
    let mut missing = vec![];
    let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    names.sort();
    let mut want: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
    want.sort();
    if names != want {
        missing.push(format!(
            "pods [{}], not [{}]",
            names.join(" "),
            want.join(" ")
        ));
    }
    for pod in pods {
        if uid.is_none() || controller_uid(pod).as_deref() != uid {
            missing.push(format!("pod {} not the {keeper}'s", pod.name_any()));
        }
    }
    missing
}

/// A container's restart count in a pod's status (0 when it has none yet).
pub fn restarts(pod: &Pod, container: &str) -> i32 {
    container_status(pod, container).map_or(0, |c| c.restart_count)
}

/// A container's status in a pod.
pub fn container_status<'p>(pod: &'p Pod, container: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
}

/// A container's image in a pod's spec.
pub fn image(pod: &Pod, container: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .image
        .clone()
}

/// The names of a pod's containers (not its init containers), in its spec's order.
fn containers(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect()
}

/// A member before an update: its pod's uid and each container's restart count.
#[derive(Clone, Debug, PartialEq)]
pub struct Before {
    pub uid: String,
    /// container -> its restart count.
    pub restarts: BTreeMap<String, i32>,
}

/// name -> what an update must change or keep of each pod.
pub fn before(pods: &[Pod]) -> BTreeMap<String, Before> {
    pods.iter()
        .map(|p| {
            let before = Before {
                uid: p.uid().unwrap_or_default(),
                restarts: containers(p)
                    .into_iter()
                    .map(|c| {
                        let count = restarts(p, &c);
                        (c, count)
                    })
                    .collect(),
            };
            (p.name_any(), before)
        })
        .collect()
}

/// For a figure: each pod's containers' restart counts before (from `before`) and now
/// (`<pod> memcached 0 -> 0, agent 0 -> 1; ...`).
pub fn restart_counts(before: &BTreeMap<String, Before>, pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            let was = before.get(&p.name_any());
            let counts: Vec<String> = containers(p)
                .iter()
                .map(|c| {
                    let was = was
                        .and_then(|b| b.restarts.get(c))
                        .map_or("?".to_string(), i32::to_string);
                    format!("{c} {was} -> {}", restarts(p, c))
                })
                .collect();
            format!("{} {}", p.name_any(), counts.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How the members came to their current template.
pub enum Update<'a> {
    /// Made from it (a Memcached created under the new release, or the previous release's own
    /// members before the upgrade).
    Created,
    /// Each of `before` updated in place: the same pod (uid), with the same containers, each
    /// container of `restarted` restarted once more and every other one not restarted at all
    /// (an operator upgrade from 0.5.0: the agent, not memcached; a release by digest: both).
    InPlace {
        before: &'a BTreeMap<String, Before>,
        restarted: &'a [&'a str],
    },
}

/// What keeps a Memcached's members.
pub enum KeptBy<'a> {
    /// A StatefulSet of its name, as releases up to 0.6.0 made them (and their Memcacheds keep
    /// it): the very one of this uid, when given.
    StatefulSet(Option<&'a str>),
    /// The operator itself, as it keeps those of Memcacheds made since 0.7.0 and adopts those of
    /// StatefulSets of before since 0.8.0: no StatefulSet, ControllerRevisions of the
    /// Memcached's only (since 0.9.0 those of before, until an update collects them), each
    /// member recording its template.
    Operator,
}

/// What the Memcached `mc` lacks of having every member updated to its current template, kept
/// as `kept_by` says: a StatefulSet of its name that it controls, `size` replicas,
/// `updateStrategy: OnDelete`, every replica updated; or no StatefulSet, `revisions` (the
/// ControllerRevisions of its label) all the Memcached's, one of them running the agent from
/// `agent_image`, the members' revision, and a status that
/// counts `size` members available. Its pods (`pods`: all those of the Memcached, terminating
/// included) exactly the members `<name>-0 …`, each the keeper's, not terminating, Ready, of the
/// update revision, with the agent beside memcached running `agent_image`, memcached with its
/// memory file (`-e`), and changed as `update` says; `status.servers` their stable addresses;
/// Available. Empty: all done.
pub fn update_missing(
    mc: &Memcached,
    (sts, revisions): (Option<&StatefulSet>, &[ControllerRevision]),
    pods: &[Pod],
    kept_by: &KeptBy,
    update: &Update,
    agent_image: &str,
) -> Vec<String> {
    let (name, ns) = (mc.name_any(), mc.namespace().unwrap_or_default());
    let size = usize::try_from(mc.spec.size).unwrap_or_default();
    let mut missing = vec![];
    let (keeper, revision) = match kept_by {
        KeptBy::StatefulSet(uid_before) => {
            let Some(sts) = sts else {
                return vec![format!("no StatefulSet {name}")];
            };
            missing.extend(stateful_set_missing(mc, sts, *uid_before));
            let status = sts.status.clone().unwrap_or_default();
            (
                ("StatefulSet", sts.uid()),
                status.update_revision.unwrap_or_default(),
            )
        }
        KeptBy::Operator => {
            if sts.is_some() {
                missing.push(format!(
                    "a StatefulSet {name}, where the operator keeps the members"
                ));
            }
            // Since 0.9.0 no revision is made: each member records its template. Those of a
            // release before, or of an adoption, stay until the update after next starts.
            if revisions.iter().any(|r| controller_uid(r) != mc.uid()) {
                let names: Vec<String> = revisions.iter().map(|r| r.name_any()).collect();
                missing.push(format!(
                    "ControllerRevisions [{}], not all the Memcached's",
                    names.join(" ")
                ));
            }
            for pod in pods {
                if !pod.annotations().contains_key(TEMPLATE_ANNOTATION) {
                    missing.push(format!("pod {}: no record of its template", pod.name_any()));
                }
            }
            let status = mc.status.clone().unwrap_or_default();
            if status.observed_generation != mc.metadata.generation
                || status.replicas != mc.spec.size
                || status.available_replicas != mc.spec.size
            {
                missing.push(format!(
                    "status: {}/{size} members, {} available (generation {:?} observed {:?})",
                    status.replicas,
                    status.available_replicas,
                    mc.metadata.generation,
                    status.observed_generation
                ));
            }
            // The members' revision: one for all, which the loop below checks.
            let revision = pods.iter().find_map(|p| p.labels().get(REVISION).cloned());
            (("Memcached", mc.uid()), revision.unwrap_or_default())
        }
    };
    missing.extend(members_missing(
        pods,
        &name,
        size,
        (keeper.0, keeper.1.as_deref()),
    ));
    for pod in pods {
        let pod_name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_some() {
            missing.push(format!("pod {pod_name} terminating"));
        } else if !harness::pod_is_ready(pod) {
            missing.push(format!("pod {pod_name} not Ready"));
        }
        if pod.labels().get(REVISION) != Some(&revision) {
            missing.push(format!(
                "pod {pod_name} of revision {:?}, not {revision}",
                pod.labels().get(REVISION)
            ));
        }
        let agent = image(pod, "agent");
        if agent.as_deref() != Some(agent_image) {
            missing.push(format!(
                "pod {pod_name}: agent image {agent:?}, not {agent_image}"
            ));
        }
        let args = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        if !args.iter().any(|a| a == "-e") {
            missing.push(format!(
                "pod {pod_name}: memcached without its memory file (-e): {args:?}"
            ));
        }
        let Update::InPlace { before, restarted } = update else {
            continue;
        };
        let Some(b) = before.get(&pod_name) else {
            missing.push(format!("pod {pod_name} was not a member before"));
            continue;
        };
        let uid = pod.uid().unwrap_or_default();
        if b.uid != uid {
            missing.push(format!(
                "pod {pod_name} replaced (uid {uid}, not {}), not updated in place",
                b.uid
            ));
            continue;
        }
        let mut now = containers(pod);
        now.sort();
        if now.iter().ne(b.restarts.keys()) {
            missing.push(format!(
                "pod {pod_name}: containers [{}], not those before [{}]",
                now.join(" "),
                b.restarts.keys().cloned().collect::<Vec<_>>().join(" ")
            ));
        }
        for (container, was) in &b.restarts {
            let count = restarts(pod, container);
            let once_more = restarted.contains(&container.as_str());
            let want = if once_more { was + 1 } else { *was };
            if count != want {
                missing.push(format!(
                    "pod {pod_name}: {container} restarted {count} times, not {was}{}",
                    if once_more { " + 1" } else { " (never)" }
                ));
            }
        }
    }
    let servers = mc
        .status
        .as_ref()
        .map(|s| s.servers.clone())
        .unwrap_or_default();
    let port = mc.spec.container_port;
    let want: Vec<String> = (0..size)
        .map(|i| format!("{name}-{i}.{name}.{ns}.svc:{port}"))
        .collect();
    if servers != want {
        missing.push(format!(
            "status.servers [{}], not [{}]",
            servers.join(" "),
            want.join(" ")
        ));
    }
    let available = harness::condition(mc, "Available");
    if available.as_ref().map(|c| c.0.as_str()) != Some("True") {
        missing.push(format!("Available {available:?}"));
    }
    missing
}

/// What the StatefulSet `sts` lacks of keeping `mc`'s members as the operator since 0.4.0 makes
/// it: controlled by the Memcached (the very one of `uid_before` when given), `size` replicas,
/// `updateStrategy: OnDelete`, every replica updated.
fn stateful_set_missing(
    mc: &Memcached,
    sts: &StatefulSet,
    uid_before: Option<&str>,
) -> Vec<String> {
    let name = mc.name_any();
    let size = mc.spec.size;
    let mut missing = vec![];
    if controller_uid(sts) != mc.uid() {
        missing.push(format!(
            "StatefulSet {name} not controlled by the Memcached"
        ));
    }
    if let Some(before) = uid_before
        && sts.uid().as_deref() != Some(before)
    {
        missing.push(format!(
            "StatefulSet {name} uid {:?}, not the one before ({before})",
            sts.uid()
        ));
    }
    let spec = sts.spec.clone().unwrap_or_default();
    if spec.replicas != Some(size) {
        missing.push(format!(
            "StatefulSet {name} replicas {:?}, not {size}",
            spec.replicas
        ));
    }
    let strategy = spec.update_strategy.and_then(|s| s.type_);
    if strategy.as_deref() != Some("OnDelete") {
        missing.push(format!(
            "StatefulSet {name} updateStrategy {strategy:?}, not OnDelete"
        ));
    }
    let status = sts.status.clone().unwrap_or_default();
    if status.observed_generation < sts.metadata.generation || status.updated_replicas != Some(size)
    {
        missing.push(format!(
            "StatefulSet {name}: {:?} of {size} replicas updated (generation {:?} observed {:?})",
            status.updated_replicas, sts.metadata.generation, status.observed_generation
        ));
    }
    missing
}
