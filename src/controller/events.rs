//! Events on a Memcached: what a write changed (Created, Updated, Restarted, ...), why
//! nothing could be applied (a Warning with the Degraded reason), and why its pods are not Ready
//! (a Warning with the cause, e.g. ImagePullFailed).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::IgnoredAny;
use tracing::{info, warn};

use crate::api::Memcached;
use crate::status::{Blocked, Reason, Trouble};
use operator_runtime::lock;

/// What applying an owned object changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Created,
    Updated,
    /// No longer wanted (a disruption budget below two pods).
    Deleted,
    /// A member's images patched in place (members.rs).
    Restarted,
    /// A member's containers resized in place, nothing restarted (members.rs).
    Resized,
    /// A member evicted for a pod spec it cannot take in place (members.rs).
    Evicted,
    /// The workload of a release up to 0.6.0 deleted, its members left running for the
    /// operator to keep (legacy.rs).
    Released,
    /// A member of such a workload now kept by the operator itself.
    Adopted,
}

impl Change {
    pub fn reason(&self) -> &'static str {
        match self {
            Change::Created => "Created",
            Change::Updated => "Updated",
            Change::Deleted => "Deleted",
            Change::Restarted => "Restarted",
            Change::Resized => "Resized",
            Change::Evicted => "Evicted",
            Change::Released => "Released",
            Change::Adopted => "Adopted",
        }
    }

    pub fn note(&self, kind: &str, name: &str) -> String {
        match self {
            Change::Created => format!("Created {kind} {name}"),
            Change::Updated => format!("Updated {kind} {name} to match the Memcached spec"),
            Change::Deleted => format!("Deleted {kind} {name}: no longer wanted by the spec"),
            Change::Restarted => format!(
                "Restarting {kind} {name} in place for new images: memcached keeps its cache"
            ),
            Change::Resized => format!(
                "Resized {kind} {name} in place for new requests or limits: memcached keeps running"
            ),
            Change::Evicted => format!(
                "Evicted {kind} {name} for a pod spec it cannot take in place: it comes back empty"
            ),
            Change::Released => format!(
                "Deleted {kind} {name}, leaving its members running: the operator keeps them itself"
            ),
            Change::Adopted => format!("Adopted {kind} {name}: nothing restarted, its cache kept"),
        }
    }
}

/// The pod troubles warned about for one Memcached at one generation of its spec.
#[derive(Debug, Default)]
struct Warned {
    generation: Option<i64>,
    reasons: Vec<Reason>,
}

/// Publishes events as this controller instance.
///
/// Best-effort and in the background, as client-go's recorder: a worker does not wait a round
/// trip for an event, and failing to record one does not fail the reconcile. An event still in
/// flight when the process exits is lost.
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    /// The cause last warned about, per blocked Memcached. The status says the same once the
    /// cache has our status write, but a reconcile can start before it does.
    warned: Arc<Mutex<HashMap<ObjectRef<Memcached>, Blocked>>>,
    /// The pod troubles warned about per Memcached, and at which generation of its spec.
    troubled: Arc<Mutex<HashMap<ObjectRef<Memcached>, Warned>>>,
    /// Objects that do not parse, as (uid, resourceVersion), already reported.
    invalid: Arc<Mutex<HashSet<(String, String)>>>,
    /// The objects a reconcile created, per Memcached, announced together at its end.
    created: Arc<Mutex<HashMap<ObjectRef<Memcached>, Vec<ObjectReference>>>>,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            warned: Arc::default(),
            troubled: Arc::default(),
            invalid: Arc::default(),
            created: Arc::default(),
        }
    }

    /// A Normal event for an apply of `applied` that made `change`. What a reconcile creates is
    /// announced in one event at its end (`announce_created`): a new Memcached's Service and
    /// members are one change to its user, and each Event is a write the API server stores.
    pub fn applied<K: Resource<DynamicType = ()>>(
        &self,
        mc: &Memcached,
        applied: &K,
        change: &Change,
    ) {
        let (kind, name) = (K::kind(&()), applied.name_any());
        let note = change.note(&kind, &name);
        info!(%kind, %name, reason = change.reason(), "{note}");
        if *change == Change::Created {
            let created = applied.object_ref(&());
            lock(&self.created)
                .entry(ObjectRef::from_obj(mc))
                .or_default()
                .push(created);
            return;
        }
        self.publish(
            mc,
            Some(applied.object_ref(&())),
            EventType::Normal,
            change.reason(),
            "Apply",
            note,
        );
    }

    /// One Normal event for what `mc`'s reconcile created, if anything: "Created Pod cache-0,
    /// Service cache" (the object itself as the related one when it is alone).
    pub fn announce_created(&self, mc: &Memcached) {
        let Some(mut created) = lock(&self.created).remove(&ObjectRef::from_obj(mc)) else {
            return;
        };
        created.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
        let objects: Vec<String> = created
            .iter()
            .map(|o| {
                let (kind, name) = (o.kind.as_deref(), o.name.as_deref());
                format!("{} {}", kind.unwrap_or_default(), name.unwrap_or_default())
            })
            .collect();
        let related = match created.len() {
            1 => created.pop(),
            _ => None,
        };
        let note = format!("Created {}", objects.join(", "));
        self.publish(mc, related, EventType::Normal, "Created", "Apply", note);
    }

    /// A Warning that nothing is applied for `mc`, and why: once per cause, not on every recheck.
    pub fn blocked(&self, mc: &Memcached, blocked: &Blocked) {
        let previous = lock(&self.warned).insert(ObjectRef::from_obj(mc), blocked.clone());
        if previous.as_ref() == Some(blocked) || blocked.is_reported_in(mc.status.as_ref()) {
            return;
        }
        self.publish(
            mc,
            None,
            EventType::Warning,
            blocked.reason().as_str(),
            "Reconcile",
            blocked.message().to_string(),
        );
    }

    /// A Warning that `mc`'s pods are not Ready, and why: once per cause and version of the
    /// spec, not per pod, retry or restart (a pod OOM-killed again and again between Ready spells).
    /// A cause that comes back after the spec changed is warned about again.
    pub fn troubled(&self, mc: &Memcached, trouble: Option<&Trouble>) {
        let Some(trouble) = trouble else { return };
        let reported = mc.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.reason == trouble.reason.as_str())
        });
        let mut troubled = lock(&self.troubled);
        let warned = troubled.entry(ObjectRef::from_obj(mc)).or_default();
        if warned.generation != mc.metadata.generation {
            *warned = Warned {
                generation: mc.metadata.generation,
                reasons: Vec::new(),
            };
        }
        if warned.reasons.contains(&trouble.reason) {
            return;
        }
        warned.reasons.push(trouble.reason);
        drop(troubled);
        if reported {
            return;
        }
        self.publish(
            mc,
            None,
            EventType::Warning,
            trouble.reason.as_str(),
            "Reconcile",
            trouble.message(),
        );
    }

    /// A Warning on a stored Memcached that does not parse (written while the schema was looser):
    /// the controller skips it. Once per version of the object, not on every relist.
    pub fn invalid(&self, meta: &ObjectMeta, error: String) {
        let version = (
            meta.uid.clone().unwrap_or_default(),
            meta.resource_version.clone().unwrap_or_default(),
        );
        if !lock(&self.invalid).insert(version) {
            return;
        }
        let regarding = ObjectReference {
            api_version: Some(Memcached::api_version(&()).into_owned()),
            kind: Some(Memcached::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        };
        let note =
            format!("skipped: it does not match the Memcached schema ({error}); fix or delete it");
        self.send(
            regarding,
            None,
            EventType::Warning,
            "InvalidObject",
            "Parse",
            note,
        );
    }

    /// An event of the autoscaler: a Normal for its scale, a Warning for a size it put back.
    pub fn autoscaled(&self, mc: &Memcached, type_: EventType, reason: &str, note: String) {
        info!(reason, "{note}");
        self.publish(mc, None, type_, reason, "Autoscale", note);
    }

    /// A member the operator could not sweep before the proxy's layout changed (sweep.rs).
    pub fn sweep_failed(&self, mc: &Memcached, member: &str, error: &std::io::Error) {
        warn!(%member, %error, "could not sweep a member before the proxy's layout changes");
        let note = format!(
            "Could not sweep {member} before the proxy's layout changed ({error}): keys it holds \
             for other members may read back old after a later change"
        );
        self.publish(mc, None, EventType::Warning, "SweepFailed", "Sweep", note);
    }

    /// The Memcached `key` is gone: nothing of it is kept.
    pub fn forget(&self, key: &ObjectRef<Memcached>) {
        lock(&self.warned).remove(key);
        lock(&self.troubled).remove(key);
        lock(&self.created).remove(key);
    }

    /// `mc` is no longer blocked: a later cause is warned about again.
    pub fn unblocked(&self, mc: &Memcached) {
        lock(&self.warned).remove(&ObjectRef::from_obj(mc));
    }

    fn publish(
        &self,
        mc: &Memcached,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.send(mc.object_ref(&()), related, type_, reason, action, note);
    }

    fn send(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = new_event(
            &self.reporter,
            regarding,
            related,
            type_,
            reason,
            action,
            note,
        );
        let client = self.client.clone();
        tokio::spawn(async move {
            // Posted without kube's Recorder, and the created Event not decoded: nothing reads it.
            let api = Api::<K8sEvent>::namespaced(
                client.clone(),
                event.metadata.namespace.as_deref().unwrap_or("default"),
            );
            let sent = async {
                let body = serde_json::to_vec(&event).map_err(kube::Error::SerdeError)?;
                let request = kube::core::Request::new(api.resource_url())
                    .create(&PostParams::default(), body)
                    .map_err(kube::Error::BuildRequest)?;
                client.request::<IgnoredAny>(request).await
            };
            if let Err(error) = sent.await {
                warn!(%error, reason = event.reason.as_deref(), "could not record event");
            }
        });
    }
}

/// An events.k8s.io Event as kube's `Recorder` makes one, without its series: the Recorder folds
/// events with the same reason into one series whatever their note, so "Scaled from 3 to 5" then
/// "from 5 to 2" would show the first text twice. Only real changes are recorded, so there is no
/// flood to fold.
fn new_event(
    reporter: &Reporter,
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) -> K8sEvent {
    let now = Timestamp::now();
    K8sEvent {
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                regarding.name.as_deref().unwrap_or(&reporter.controller),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        action: Some(action.to_string()),
        reason: Some(reason.to_string()),
        note: Some(note),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding),
        related,
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(
            match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_string(),
        ),
        ..K8sEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_noted_with_the_kind_and_name() {
        assert_eq!(
            Change::Created.note("Service", "cache"),
            "Created Service cache"
        );
        assert_eq!(Change::Adopted.reason(), "Adopted");
    }
}
