//! Report: the status, the conditions' metrics, the events, and what the worker does next.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::apply::Applied;
use super::forget;
use super::observe::Seen;
use crate::api::{Memcached, ProxyStatus, ZoneMembers};
use crate::controller::autoscale;
use crate::controller::context::Context;
use crate::controller::ensure::{StatusPatch, patch_status};
use crate::controller::members::own;
use crate::controller::outcome::{COPY_RECHECK, Outcome};
use crate::error::Result;
use crate::resources::{self, proxy};
use crate::status::{self, NotReady, Observed};
use crate::watch::pod_index::Member;
use std::time::Duration;

/// Past the moment a member is available: a Ready condition's time is whole seconds.
const AVAILABLE_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

/// Reports what was seen and applied. After members were written, nothing: their watch events
/// queue a status refresh, which sees what the writes started, and the queue serves it after
/// the spec changes that users wait for.
pub async fn report(
    ctx: &Context,
    mc: &Memcached,
    seen: Seen,
    applied: Applied,
) -> Result<Outcome> {
    let blocked = applied.blocked.clone();
    if applied.written.any && blocked.is_none() {
        ctx.events.unblocked(mc);
        return Ok(Outcome::Converged);
    }
    let proxy = proxy_status(mc, &seen, &applied);
    let draining_ready = proxy.as_ref().map_or(0, |p| {
        let ready = |m: &&Member| m.ready_since.is_some() && p.draining.contains(&m.name);
        seen.members.members.iter().filter(ready).count() as i32
    });
    let observed = Observed {
        members: Some(seen.members.counts),
        creation_refused: applied.written.refused.as_deref(),
        update: applied.updating.map(|u| u.kind),
        autoscaling: applied.autoscaling.clone(),
        pods: seen.pods,
        troubles: seen.troubles,
        blocked: blocked.clone(),
        rollout_queued: applied.rollout_queued,
        binding: applied.binding.clone(),
        unissued: applied.unissued.clone(),
        not_ready: not_ready(&seen.members.members),
        proxy,
        draining_ready,
    };
    let stuck = observed.not_ready.clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (mut new_status, trouble) = status::desired_status_and_trouble(mc, &observed, &now);
    if ctx.remembered.statuses.to_write(mc, &mut new_status, &now) {
        match patch_status(&ctx.client, mc, &new_status).await? {
            StatusPatch::Gone => {
                forget(ctx, &ObjectRef::from_obj(mc));
                return Ok(Outcome::Gone);
            }
            StatusPatch::Written(version) => {
                ctx.remembered
                    .statuses
                    .wrote(mc, &new_status, version.as_deref())
            }
        }
    }
    let (ns, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    ctx.metrics
        .set_conditions(&ns, &name, &new_status.conditions);
    ctx.metrics.autoscaling.set(
        &ns,
        &name,
        mc.spec.autoscaling_on(),
        new_status.autoscaling.as_ref(),
    );
    ctx.events.troubled(mc, trouble.as_ref());
    match blocked {
        Some(blocked) => {
            ctx.events.blocked(mc, &blocked);
            Ok(Outcome::Blocked(blocked))
        }
        None => {
            ctx.events.unblocked(mc);
            Ok(next(mc, &seen.members, &applied, stuck))
        }
    }
}

/// The member not Ready for the longest.
fn not_ready(members: &[Member]) -> Option<NotReady> {
    members
        .iter()
        .filter_map(|m| Some((m.not_ready_since?, m)))
        .min_by_key(|(since, _)| *since)
        .map(|(since, m)| NotReady {
            member: m.name.clone(),
            since,
        })
}

/// What the worker does after an unblocked reconcile.
fn next(
    mc: &Memcached,
    members: &own::Seen,
    applied: &Applied,
    stuck: Option<NotReady>,
) -> Outcome {
    match (applied.rollout_queued, applied.updating) {
        (Some(_), _) => Outcome::WaitingForRolloutSlot,
        (None, Some(updating)) => Outcome::UpdatingMembers(updating.recheck),
        _ if applied.written.refused.is_some() => Outcome::PodsMissing,
        // The watch tells when a pod is Ready, not when it has been for long enough.
        _ if let Some(soon) = members.available_in => {
            Outcome::MembersBecomingAvailable(soon + AVAILABLE_MARGIN)
        }
        // Nothing else comes when a member has been not Ready for the progress deadline, nor
        // when the proxy's handover ends.
        _ if let Some(stuck) = stuck => {
            let left = stuck.deadline_in(mc, k8s_openapi::jiff::Timestamp::now());
            match (left.is_zero(), handover_ends(mc, applied)) {
                (true, None) => Outcome::Converged,
                (true, Some(ends)) => Outcome::HandingOver(ends),
                (false, ends) => Outcome::AwaitingProgress(
                    (left + AVAILABLE_MARGIN).min(ends.unwrap_or(Duration::MAX)),
                ),
            }
        }
        // Unless a periodic look comes first.
        _ if let Some(ends) = handover_ends(mc, applied) => Outcome::HandingOver(ends),
        _ if autoscale::enabled(mc) => Outcome::Autoscaling,
        _ if resources::binding::copies_secrets(mc) => Outcome::CopyingSecrets,
        _ => Outcome::Converged,
    }
}

/// When the proxy's handover ends, if that comes before the next periodic look.
fn handover_ends(mc: &Memcached, applied: &Applied) -> Option<Duration> {
    let ends = applied.proxy.as_ref()?.ends_in? + AVAILABLE_MARGIN;
    let periodic = match () {
        _ if autoscale::enabled(mc) => autoscale::POLL,
        _ if resources::binding::copies_secrets(mc) => COPY_RECHECK,
        _ => Duration::MAX,
    };
    (ends < periodic).then_some(ends)
}

/// The proxy's status, while it is on: its Ready pods, and the layout as written (as last
/// reported, when nothing was applied).
fn proxy_status(mc: &Memcached, seen: &Seen, applied: &Applied) -> Option<ProxyStatus> {
    if !proxy::enabled(mc) {
        return None;
    }
    let last = mc.status.as_ref().and_then(|s| s.proxy.clone());
    let (members, handover, keep, holding_since, zones) = match (&applied.proxy, last) {
        (Some(plan), _) => (
            plan.members,
            plan.handover.clone(),
            plan.keep,
            plan.holding_since.clone(),
            by_zone(mc, &plan.layout.zones),
        ),
        (None, Some(last)) => {
            let keep = mc.spec.size + i32::try_from(last.draining.len()).unwrap_or(0);
            let zones = last.zones;
            (last.members, last.handover, keep, last.holding_since, zones)
        }
        (None, None) => (0, None, mc.spec.size, None, Vec::new()),
    };
    let ready_replicas = seen
        .proxy
        .deployment
        .as_deref()
        .and_then(|d| d.status.as_ref())
        .map_or(0, |s| s.ready_replicas);
    Some(ProxyStatus {
        address: proxy::address(mc),
        ready_replicas,
        members,
        handover,
        draining: (mc.spec.size.max(0)..keep)
            .map(|n| format!("{}-{n}", mc.name_any()))
            .collect(),
        holding_since,
        zones,
    })
}

/// The layout's members (named by ordinal, with `zones` theirs) grouped by zone, by name.
fn by_zone(mc: &Memcached, zones: &[String]) -> Vec<ZoneMembers> {
    let name = mc.name_any();
    let mut grouped: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (n, zone) in zones.iter().enumerate() {
        let member = format!("{name}-{n}");
        grouped.entry(zone.as_str()).or_default().push(member);
    }
    let zone = |(zone, members): (&str, _)| ZoneMembers {
        zone: zone.to_string(),
        members,
    };
    grouped.into_iter().map(zone).collect()
}
