//! Leader election through a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.
//!
//! - Expiry is judged by this process's own monotonic clock: a foreign lease counts as expired
//!   when its record has not changed for its lease duration, however far the holder's wall clock
//!   is from ours. Clock skew between nodes cannot make two leaders.
//! - Every write is a replace carrying the resourceVersion we read, so of two candidates racing
//!   for a free lease exactly one wins; the other gets 409 Conflict.
//! - The leader renews every retry period and gives up (stops reconciling, exits non-zero) when
//!   it has not renewed for the renew deadline, before its lease can expire for others.
//! - On graceful shutdown the leader clears the holder, so a follower takes over at once.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{PostParams, WatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What to do with the lease in one round.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease object exists: create it, holding it.
    Create,
    /// Free (released) or expired: take it.
    Acquire,
    /// Ours: renew it.
    Renew,
    /// Someone else holds it and it has not expired.
    Follow { holder: String },
}

/// Pure decision for one round. `unchanged_for` is how long, by our clock, the record has looked
/// exactly as it does now.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = lease else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == me {
        return Decision::Renew;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    if unchanged_for > duration {
        Decision::Acquire
    } else {
        Decision::Follow {
            holder: holder.to_string(),
        }
    }
}

/// The lease spec to write for a decision to hold the lease.
pub fn held_spec(
    current: Option<&LeaseSpec>,
    me: &str,
    now: MicroTime,
    lease_duration: Duration,
) -> LeaseSpec {
    let ours = current.is_some_and(|c| c.holder_identity.as_deref() == Some(me));
    let transitions = current.and_then(|c| c.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(lease_duration.as_secs().max(1) as i32),
        acquire_time: if ours {
            current.and_then(|c| c.acquire_time.clone())
        } else {
            Some(now.clone())
        },
        renew_time: Some(now),
        lease_transitions: Some(if ours || current.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

/// The lease spec that releases it: no holder, as client-go writes on release.
pub fn released_spec(current: &LeaseSpec, now: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: None,
        renew_time: Some(now),
        lease_transitions: current.lease_transitions,
        ..LeaseSpec::default()
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeadershipLost {
    #[error("could not renew the lease within the renew deadline ({0:?})")]
    RenewDeadline(Duration),
    #[error("the lease was taken over by {0}")]
    TakenOver(String),
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The record as last read, and since when (our clock) it has looked like that.
    observed: Option<(LeaseSpec, Instant)>,
    last_renewed: Option<Instant>,
    changed: std::sync::Arc<Notify>,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        let changed = std::sync::Arc::new(Notify::new());
        tokio::spawn(watch_lease(
            api.clone(),
            config.name.clone(),
            changed.clone(),
        ));
        Self {
            api,
            config,
            observed: None,
            last_renewed: None,
            changed,
        }
    }

    /// The Lease's name (the `name` label of `leader_election_master_status`).
    pub fn lease_name(&self) -> &str {
        &self.config.name
    }

    /// Waits until this process holds the lease (true), or until `shutdown` (false).
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        let mut announced = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Decision::Create | Decision::Acquire | Decision::Renew) => {
                    info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                    return true;
                }
                Ok(Decision::Follow { holder }) => {
                    if announced.as_ref() != Some(&holder) {
                        info!(lease = %self.config.name, %holder, "waiting for the current leader");
                        announced = Some(holder);
                    }
                }
                Err(e) => debug!(error = %e, "lease not acquired this round"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.config.retry_period) => {}
                // A released lease is taken at once rather than at the next poll.
                _ = self.changed.notified() => {}
            }
        }
    }

    /// Renews the lease every retry period until `shutdown`; returns an error as soon as the
    /// renew deadline passes without a successful renewal.
    pub async fn hold(&mut self, shutdown: &CancellationToken) -> Result<(), LeadershipLost> {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let renewed =
                tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()).await;
            match renewed {
                Ok(Ok(Decision::Renew | Decision::Acquire | Decision::Create)) => {}
                Ok(Ok(Decision::Follow { holder })) => {
                    return Err(LeadershipLost::TakenOver(holder));
                }
                Ok(Err(e)) => warn!(error = %e, "lease renewal failed"),
                Err(_) => warn!("lease renewal timed out"),
            }
            let since = self
                .last_renewed
                .map(|t| t.elapsed())
                .unwrap_or(Duration::MAX);
            if since >= self.config.renew_deadline {
                return Err(LeadershipLost::RenewDeadline(self.config.renew_deadline));
            }
        }
    }

    /// Clears the holder, if it is us, so a follower can take over without waiting for expiry.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_ref() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        lease.spec = Some(released_spec(spec, now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.config.name, "released leadership"),
            Err(e) => {
                warn!(error = %e, "could not release the lease; followers wait for it to expire")
            }
        }
    }

    /// One round: read the lease, decide, and write if we are to hold it.
    async fn try_acquire_or_renew(&mut self) -> Result<Decision, kube::Error> {
        let current = self.api.get_opt(&self.config.name).await?;
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let unchanged_for = self.observe(spec.as_ref());
        let decision = decide(spec.as_ref(), &self.config.identity, unchanged_for);
        let desired = held_spec(
            spec.as_ref(),
            &self.config.identity,
            now(),
            self.config.lease_duration,
        );
        match (&decision, current) {
            (Decision::Follow { .. }, _) => return Ok(decision),
            (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(desired.clone()),
                };
                self.api.create(&PostParams::default(), &lease).await?;
            }
            (_, Some(mut lease)) => {
                // Carries the resourceVersion we read: a concurrent writer makes this fail.
                lease.spec = Some(desired.clone());
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await?;
            }
        }
        self.last_renewed = Some(Instant::now());
        self.observed = Some((desired, Instant::now()));
        Ok(decision)
    }

    fn observe(&mut self, spec: Option<&LeaseSpec>) -> Duration {
        match (&self.observed, spec) {
            (Some((seen, since)), Some(spec)) if seen == spec => since.elapsed(),
            (_, Some(spec)) => {
                self.observed = Some((spec.clone(), Instant::now()));
                Duration::ZERO
            }
            (_, None) => {
                self.observed = None;
                Duration::ZERO
            }
        }
    }
}

/// Notifies on every change of the Lease, so a follower reacts to a release within milliseconds.
async fn watch_lease(api: Api<Lease>, name: String, changed: std::sync::Arc<Notify>) {
    loop {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        match api.watch(&params, "0").await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    if event.is_err() {
                        break;
                    }
                    changed.notify_one();
                }
            }
            Err(e) => debug!(error = %e, "lease watch failed; polling only"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap(),
            )),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn missing_lease_is_created() {
        assert_eq!(decide(None, "me", S(0)), Decision::Create);
    }

    #[test]
    fn free_lease_is_acquired_at_once() {
        assert_eq!(
            decide(Some(&lease(None, 15)), "me", S(0)),
            Decision::Acquire
        );
        assert_eq!(
            decide(Some(&lease(Some(""), 15)), "me", S(0)),
            Decision::Acquire
        );
    }

    #[test]
    fn own_lease_is_renewed() {
        assert_eq!(
            decide(Some(&lease(Some("me"), 15)), "me", S(100)),
            Decision::Renew
        );
    }

    #[test]
    fn unexpired_foreign_lease_is_respected() {
        let other = lease(Some("other"), 15);
        assert_eq!(
            decide(Some(&other), "me", S(0)),
            Decision::Follow {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(Some(&other), "me", S(15)),
            Decision::Follow {
                holder: "other".into()
            }
        );
    }

    #[test]
    fn expired_foreign_lease_is_taken_over() {
        assert_eq!(
            decide(Some(&lease(Some("other"), 15)), "me", S(16)),
            Decision::Acquire
        );
    }

    #[test]
    fn expiry_ignores_the_holders_wall_clock() {
        // The record's renewTime is far in the past by any clock, yet we only just saw it change:
        // a holder whose clock lags ours must still be respected for the full duration.
        let skewed = lease(Some("other"), 15);
        assert!(skewed.renew_time.as_ref().unwrap().0 < k8s_openapi::jiff::Timestamp::now());
        assert_eq!(
            decide(Some(&skewed), "me", S(1)),
            Decision::Follow {
                holder: "other".into()
            }
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let t = MicroTime(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let taken = held_spec(Some(&lease(Some("other"), 15)), "me", t.clone(), S(15));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(t.clone()));
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_duration_seconds, Some(15));

        let mut mine = lease(Some("me"), 15);
        mine.acquire_time = Some(MicroTime(
            k8s_openapi::jiff::Timestamp::from_second(500).unwrap(),
        ));
        let renewed = held_spec(Some(&mine), "me", t.clone(), S(15));
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, mine.acquire_time);
        assert_eq!(renewed.renew_time, Some(t.clone()));

        let released = released_spec(&renewed, t.clone());
        let after_release = held_spec(Some(&released), "next", t, S(15));
        assert_eq!(
            after_release.lease_transitions,
            Some(4),
            "taking a released lease is a transition too"
        );
    }

    #[test]
    fn release_clears_the_holder() {
        let released = released_spec(&lease(Some("me"), 15), now());
        assert_eq!(released.holder_identity, None);
        assert_eq!(decide(Some(&released), "next", S(0)), Decision::Acquire);
    }
}
