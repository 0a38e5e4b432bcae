//! The autoscaler's step of a reconcile: read every member's `stats`, decide (autoscaling/
//! decide.rs), and set `spec.size` through the scale subresource. While autoscaling is on the
//! size is the autoscaler's: one set by hand is put back, with a Warning.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::context::Context;

pub mod remembered;
use crate::api::{AutoscalingStatus, LastScale, Memcached};
use crate::autoscaling::{Reading, Reason, decide, stats};
use crate::error::{Error, Result};
use crate::resources::{MANAGER_NAME, agent, warm_restart};
use crate::watch::hpa_index::HpaIndex;
use crate::watch::pod_index::PodIndex;
use remembered::Kept;

/// How often the members are read while autoscaling is on.
pub const POLL: Duration = Duration::from_secs(10);
/// Reconciles closer together than this (pod events) reuse the last decision: rates over a
/// moment say little, and each reading costs every member a connection.
const MIN_INTERVAL: SignedDuration = SignedDuration::from_secs(5);

/// While autoscaling is on, `spec.size` is the autoscaler's: one set by hand is put back, with a
/// Warning, before anything is sized from it. True when it was: the write's watch event brings
/// the next reconcile.
pub async fn put_back(ctx: &Context, mc: &Memcached) -> Result<bool> {
    let Some(spec) = mc.spec.autoscaling_on() else {
        return Ok(false);
    };
    if conflict(ctx.cached.hpas.as_deref(), mc).is_some() {
        return Ok(false);
    }
    let kept = match ctx.remembered.autoscaler.kept(mc) {
        Kept::Latest(size) => Some(size),
        Kept::Stale => None,
        // The size the autoscaler last reported (this process's, or a previous leader's): a
        // spec change since that did not keep it was made by hand.
        Kept::Unknown => mc
            .status
            .as_ref()
            .and_then(|s| s.autoscaling.as_ref())
            .and_then(|a| a.size),
    };
    // Bounds changed since: the kept size within the new ones.
    let Some(kept) = kept
        .map(|k| k.clamp(spec.min_size, spec.max_size.max(spec.min_size)))
        .filter(|k| *k != mc.spec.size)
    else {
        return Ok(false);
    };
    set_size(&ctx.client, mc, kept).await?;
    ctx.remembered.autoscaler.wrote(mc, kept);
    let note = format!(
        "spec.size was set to {} while autoscaling is on: put back to {kept}; change spec.autoscaling's minSize and maxSize, or turn it off, to size by hand",
        mc.spec.size
    );
    ctx.events
        .autoscaled(mc, EventType::Warning, "ManualScaleReverted", note);
    Ok(true)
}

/// The autoscaler's step: its status, or None while autoscaling is off.
pub async fn autoscale(ctx: &Context, mc: &Memcached) -> Result<Option<AutoscalingStatus>> {
    let Some(spec) = mc.spec.autoscaling_on() else {
        ctx.remembered.autoscaler.forget(&ObjectRef::from_obj(mc));
        return Ok(None);
    };
    let previous = mc.status.as_ref().and_then(|s| s.autoscaling.clone());
    if let Some(hpa) = conflict(ctx.cached.hpas.as_deref(), mc) {
        return Ok(Some(stand_aside(ctx, mc, &hpa, previous)));
    }
    let now = Timestamp::now();
    // A Memcached read before the last scale reached the cache would be sized from the old size.
    let stale = matches!(ctx.remembered.autoscaler.kept(mc), Kept::Stale);
    let mut remembered = ctx.remembered.autoscaler.take(mc);
    let recent = remembered
        .history
        .last_at()
        .is_some_and(|at| now.duration_since(at) < MIN_INTERVAL);
    if let Some(previous) = previous.as_ref()
        && (recent || stale)
    {
        ctx.remembered.autoscaler.keep(mc, remembered);
        return Ok(Some(previous.clone()));
    }
    let mut size = mc.spec.size;
    let Some(source) = Source::of(mc) else {
        ctx.remembered.autoscaler.keep(mc, remembered);
        return Ok(Some(AutoscalingStatus {
            size: Some(size),
            reason: Reason::SignalsUnavailable.as_str().to_string(),
            message: format!(
                "with authentication or TLS the operator reads stats through the agent that keeps the cache through restarts, which runs only with maxMemoryMiB of {} or more: raise it, or turn autoscaling off",
                warm_restart::MIN_MEMORY_MIB
            ),
            ..previous.unwrap_or_default()
        }));
    };
    let reading = read_members(&ctx.cached.pods, mc, size, &source).await;
    let last_scale = previous
        .as_ref()
        .and_then(|p| p.last_scale.as_ref())
        .map(|l| l.time.0);
    let (decision, history) = decide(spec, size, last_scale, reading, remembered.history);
    remembered.history = history;
    let mut last_scale = previous.and_then(|p| p.last_scale);
    if let Some(to) = decision.scale_to {
        set_size(&ctx.client, mc, to).await?;
        // The write makes the next generation: a Memcached read before it is stale.
        remembered.generation = mc.metadata.generation.map(|g| g + 1);
        ctx.events.autoscaled(
            mc,
            EventType::Normal,
            "Autoscaled",
            decision.message.clone(),
        );
        let ns = mc.namespace().unwrap_or_default();
        let scaled = &ctx.metrics.autoscaling;
        scaled.scaled(&ns, &mc.name_any(), size, to, decision.reason);
        last_scale = Some(LastScale {
            time: Time(now),
            from: size,
            to,
            reason: decision.reason.as_str().to_string(),
        });
        size = to;
    }
    remembered.size = Some(size);
    ctx.remembered.autoscaler.keep(mc, remembered);
    Ok(Some(AutoscalingStatus {
        size: Some(size),
        reason: decision.reason.as_str().to_string(),
        message: decision.message,
        signals: Some(decision.signals),
        next_scale_time: decision.next_scale.map(Time),
        last_scale,
        recommendations: decision.recommendations,
    }))
}

/// Another autoscaler (`hpa`) sizes `mc`: the operator decides nothing, and says so once. The
/// HPA's size is the one to keep once it goes: nothing of ours is remembered.
fn stand_aside(
    ctx: &Context,
    mc: &Memcached,
    hpa: &str,
    previous: Option<AutoscalingStatus>,
) -> AutoscalingStatus {
    ctx.remembered.autoscaler.forget(&ObjectRef::from_obj(mc));
    let message = format!(
        "HorizontalPodAutoscaler {hpa} also scales this Memcached: the operator decides nothing while it does; delete it, or turn spec.autoscaling off"
    );
    let reason = Reason::AutoscalerConflict.as_str();
    if previous.as_ref().is_none_or(|p| p.reason != reason) {
        ctx.events
            .autoscaled(mc, EventType::Warning, reason, message.clone());
    }
    AutoscalingStatus {
        size: None,
        reason: reason.to_string(),
        message,
        signals: None,
        next_scale_time: None,
        recommendations: Vec::new(),
        last_scale: previous.and_then(|p| p.last_scale),
    }
}

/// Where a member's `stats` are read.
enum Source {
    /// memcached's own port: no login, no TLS.
    Port(u16),
    /// The agent's endpoint (`GET /stats`), which logs in over the pod's loopback.
    Agent { port: u16, token: String },
}

impl Source {
    /// None where memcached wants a login or speaks only TLS and no agent serves its stats.
    fn of(mc: &Memcached) -> Option<Source> {
        let (port, plain) = agent::stats_port(mc)?;
        let port = u16::try_from(port).ok()?;
        Some(if plain {
            Source::Port(port)
        } else {
            Source::Agent {
                port,
                token: warm_restart::token(mc),
            }
        })
    }

    async fn read(&self, ip: std::net::IpAddr) -> std::io::Result<crate::autoscaling::MemberStats> {
        match self {
            Source::Port(port) => stats::read(SocketAddr::new(ip, *port)).await,
            Source::Agent { port, token } => {
                let addr = SocketAddr::new(ip, *port);
                stats::read_through_agent(addr, warm_restart::TOKEN_HEADER, token).await
            }
        }
    }
}

/// Every member's `stats` at once, by ordinal; one without an address or an answer is None.
async fn read_members(pods: &PodIndex, mc: &Memcached, size: i32, source: &Source) -> Reading {
    let (ns, name) = (mc.namespace().unwrap_or_default(), mc.name_any());
    let addresses = pods.addresses_of(&ns, &name);
    let at = Timestamp::now();
    let reads = (0..size).map(|i| {
        let member = format!("{name}-{i}");
        let ip = addresses.get(&member).copied();
        async move {
            let ip = ip?;
            source
                .read(ip)
                .await
                .inspect_err(|error| debug!(%member, %ip, %error, "no stats"))
                .ok()
        }
    });
    Reading {
        at,
        members: futures::future::join_all(reads).await,
    }
}

/// `spec.size` through the scale subresource: the autoscaler may change the size and nothing else.
async fn set_size(client: &Client, mc: &Memcached, size: i32) -> Result<()> {
    let api: Api<Memcached> = Api::namespaced(client.clone(), &mc.namespace().unwrap_or_default());
    let patch = serde_json::json!({"spec": {"replicas": size}});
    api.patch_scale(
        &mc.name_any(),
        &PatchParams {
            field_manager: Some(MANAGER_NAME.to_string()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .map_err(|source| Error::Scale {
        name: mc.name_any(),
        source,
    })
}

/// The HorizontalPodAutoscaler that also scales `mc`, if any.
fn conflict(hpas: Option<&HpaIndex>, mc: &Memcached) -> Option<String> {
    let hpas = hpas.as_ref()?;
    hpas.targeting(&mc.namespace().unwrap_or_default(), &mc.name_any())
}

/// Whether autoscaling is on for `mc`.
pub fn enabled(mc: &Memcached) -> bool {
    mc.spec.autoscaling_on().is_some()
}
