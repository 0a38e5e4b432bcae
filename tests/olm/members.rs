//! What a Memcached whose members the operator has updated has (since 0.4.0 its StatefulSet is
//! `OnDelete` and the operator updates each member, in place or by replacing it), as both upgrade
//! tests check it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use memcached_operator::api::Memcached;

use crate::harness;

/// The events regarding Memcached `name` for `reason` (`Evicted`, `Restarted`): the pods they
/// relate to, by time.
pub async fn member_events(
    client: &kube::Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<(String, k8s_openapi::jiff::Timestamp)> {
    let mut events: Vec<_> = harness::events_for(client, ns, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
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

/// The StatefulSet controller's label naming the revision a pod was made from.
const REVISION: &str = "controller-revision-hash";

/// An object's controller (its owner reference with `controller: true`): its uid.
pub fn controller_uid<K: kube::Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}

/// What `pods` lack of being exactly the members `<name>-0 … <name>-<size-1>` of the StatefulSet
/// whose uid is `sts_uid` (None: there is none, so no pod is its).
pub fn members_missing(
    pods: &[Pod],
    name: &str,
    size: usize,
    sts_uid: Option<&str>,
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
        if sts_uid.is_none() || controller_uid(pod).as_deref() != sts_uid {
            missing.push(format!("pod {} not the StatefulSet's", pod.name_any()));
        }
    }
    missing
}

/// A container's restart count in a pod's status (0 when it has none yet).
pub fn restarts(pod: &Pod, container: &str) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.iter().find(|c| c.name == container))
        .map_or(0, |c| c.restart_count)
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

/// A member before an update: its pod's uid and memcached's restart count.
#[derive(Clone, Debug, PartialEq)]
pub struct Before {
    pub uid: String,
    pub restarts: i32,
}

/// name -> what an update must change or keep of each pod.
pub fn before(pods: &[Pod]) -> BTreeMap<String, Before> {
    pods.iter()
        .map(|p| {
            let before = Before {
                uid: p.uid().unwrap_or_default(),
                restarts: restarts(p, "memcached"),
            };
            (p.name_any(), before)
        })
        .collect()
}

/// How the members came to the StatefulSet's current template.
pub enum Update<'a> {
    /// Made from it (a Memcached created under the new release).
    Created,
    /// Each of these replaced under its name: a new pod (uid).
    Replaced(&'a BTreeMap<String, Before>),
    /// Each of these restarted in place: the same pod (uid), memcached restarted once more
    /// (run_bundle, which only the real-node feature builds).
    #[cfg_attr(not(feature = "real-node"), allow(dead_code))]
    InPlace(&'a BTreeMap<String, Before>),
}

/// What the Memcached `mc` lacks of having every member updated to its StatefulSet's current
/// template, as the operator since 0.4.0 does it: a StatefulSet of its name that it controls
/// (`stateful_set_uid`: the very one it had before), `size` replicas, `updateStrategy: OnDelete`,
/// every replica updated; its pods (`pods`: all those of the Memcached, terminating included)
/// exactly the members `<name>-0 …`, each the StatefulSet's, not terminating, Ready, of the
/// update revision, with the agent beside memcached running `agent_image`, memcached with its
/// memory file (`-e`), and changed as `update` says; `status.servers` their stable addresses;
/// Available. Empty: all done.
pub fn update_missing(
    mc: &Memcached,
    sts: Option<&StatefulSet>,
    pods: &[Pod],
    stateful_set_uid: Option<&str>,
    update: &Update,
    agent_image: &str,
) -> Vec<String> {
    let (name, ns) = (mc.name_any(), mc.namespace().unwrap_or_default());
    let size = usize::try_from(mc.spec.size).unwrap_or_default();
    let mut missing = vec![];
    let Some(sts) = sts else {
        return vec![format!("no StatefulSet {name}")];
    };
    if controller_uid(sts) != mc.uid() {
        missing.push(format!(
            "StatefulSet {name} not controlled by the Memcached"
        ));
    }
    if let Some(before) = stateful_set_uid
        && sts.uid().as_deref() != Some(before)
    {
        missing.push(format!(
            "StatefulSet {name} uid {:?}, not the one before ({before})",
            sts.uid()
        ));
    }
    let spec = sts.spec.clone().unwrap_or_default();
    if spec.replicas != Some(mc.spec.size) {
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
    if status.observed_generation < sts.metadata.generation
        || status.updated_replicas != Some(mc.spec.size)
    {
        missing.push(format!(
            "StatefulSet {name}: {:?} of {size} replicas updated (generation {:?} observed {:?})",
            status.updated_replicas, sts.metadata.generation, status.observed_generation
        ));
    }
    let revision = status.update_revision.unwrap_or_default();
    missing.extend(members_missing(pods, &name, size, sts.uid().as_deref()));
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
        let (uid, count) = (pod.uid().unwrap_or_default(), restarts(pod, "memcached"));
        match update {
            Update::Created => {}
            Update::Replaced(before) => match before.get(&pod_name) {
                None => missing.push(format!("pod {pod_name} was not a member before")),
                Some(b) if b.uid == uid => {
                    missing.push(format!("pod {pod_name} not replaced (uid {uid})"))
                }
                Some(_) => {}
            },
            Update::InPlace(before) => match before.get(&pod_name) {
                None => missing.push(format!("pod {pod_name} was not a member before")),
                Some(b) if b.uid != uid => missing.push(format!(
                    "pod {pod_name} replaced (uid {uid}, not {}), not restarted in place",
                    b.uid
                )),
                Some(b) if count != b.restarts + 1 => missing.push(format!(
                    "pod {pod_name}: memcached restarted {count} times, not {} + 1",
                    b.restarts
                )),
                Some(_) => {}
            },
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
