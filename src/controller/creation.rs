//! Why a StatefulSet cannot create its pods (a quota, an admission policy). A Deployment's
//! ReplicaSet says so in a condition; a StatefulSet's controller only records `FailedCreate`
//! events, so they are read, and only while its own status shows pods missing.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::owned::OwnedObject;
use crate::error::{Error, Result};

/// An older refusal is taken for a cause since removed (the quota was raised).
const RECENT: SignedDuration = SignedDuration::from_mins(10);

/// Whether the StatefulSet controller, having seen the current spec, still runs fewer pods than
/// it wants, and the pod watch has not seen them either: in parallel pod management every sync
/// creates all missing pods at once, so after a sync this means a creation failed (or a pod is
/// gone and not yet replaced). The pod watch tells a failure from a status written before the
/// controller saw its own creations, as it does under a burst of new StatefulSets, where
/// reading events for each cost the API server more than the rest of their reconciles.
/// `pods`: the sorted names of the Memcached's pods.
pub fn pods_missing(sts: &OwnedObject<StatefulSet>, pods: &[String]) -> bool {
    let wanted = sts.replicas.unwrap_or(0);
    let reported_missing = sts.status.as_ref().is_some_and(|status| {
        status.observed_generation >= sts.metadata.generation && status.replicas < wanted
    });
    let name = sts.name_any();
    reported_missing
        && (0..wanted).any(|ordinal| pods.binary_search(&format!("{name}-{ordinal}")).is_err())
}

/// The words of the StatefulSet's latest recent `FailedCreate` event; read only while its pods
/// are missing (`pods_missing`).
pub async fn refused(ctx: &Context, sts: &OwnedObject<StatefulSet>) -> Result<Option<String>> {
    let name = sts.name_any();
    let events: Api<Event> =
        Api::namespaced(ctx.client.clone(), &sts.namespace().unwrap_or_default());
    let fields =
        format!("involvedObject.kind=StatefulSet,involvedObject.name={name},reason=FailedCreate");
    let list = events
        .list(&ListParams::default().fields(&fields))
        .await
        .map_err(|source| Error::Read {
            kind: "Events of StatefulSet".into(),
            name: name.clone(),
            source,
        })?;
    Ok(latest(list.items, Timestamp::now()))
}

/// The message of the most recent event, if it is recent.
fn latest(events: Vec<Event>, now: Timestamp) -> Option<String> {
    events
        .into_iter()
        .filter_map(|e| Some((last_seen(&e)?, e.message?)))
        .filter(|(at, _)| now.duration_since(*at) < RECENT)
        .max_by_key(|(at, _)| *at)
        .map(|(_, message)| message)
}

fn last_seen(e: &Event) -> Option<Timestamp> {
    let series = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref());
    series
        .map(|t| t.0)
        .or(e.event_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.as_ref().map(|t| t.0))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn event(message: &str, at: Timestamp) -> Event {
        Event {
            message: Some(message.into()),
            last_timestamp: Some(Time(at)),
            ..Event::default()
        }
    }

    #[test]
    fn the_latest_recent_refusal_is_reported_and_an_old_one_is_not() {
        let now = Timestamp::now();
        let ago = |mins| now - SignedDuration::from_mins(mins);
        let events = vec![
            event("exceeded quota: pods=1", ago(3)),
            event("exceeded quota: pods=2", ago(1)),
            event("denied by policy", ago(30)),
        ];
        assert_eq!(
            latest(events, now).as_deref(),
            Some("exceeded quota: pods=2")
        );
        assert_eq!(latest(vec![event("denied by policy", ago(30))], now), None);
    }
}
