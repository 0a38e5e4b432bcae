//! The autoscaler's decision: the members' `stats` and what came before in, one decision out.
//! Pure, so that flapping, silent members and restarted counters are tested without a cache.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{AutoscalingSpec, Signals};

/// What one member's `stats` said; the counters since its process started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberStats {
    pub uptime: u64,
    pub evictions: u64,
    pub bytes: u64,
    pub limit_maxbytes: u64,
    pub curr_connections: u64,
    pub max_connections: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub store_too_large: u64,
}

/// One round of readings: by ordinal, None where the member did not answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub at: Timestamp,
    pub members: Vec<Option<MemberStats>>,
}

/// What the autoscaler remembers of a Memcached between rounds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    last: Option<Reading>,
    pressure_since: Option<Timestamp>,
    calm_since: Option<Timestamp>,
}

impl History {
    /// When the last reading was taken.
    pub fn last_at(&self) -> Option<Timestamp> {
        self.last.as_ref().map(|r| r.at)
    }
}

/// Why the autoscaler scales or holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A first reading: rates need two.
    Measuring,
    /// A member evicts live items.
    Evicting,
    /// Under pressure, for less than the scale-out window so far.
    PressureStabilizing,
    /// Under pressure at maxSize: only a larger maxSize or maxMemoryMiB helps.
    AtMaxSize,
    /// Every member calm, and the items would fit one member fewer.
    Calm,
    /// Calm, for less than the scale-in window so far.
    CalmStabilizing,
    /// Neither under pressure nor calm enough to remove a member.
    Steady,
    /// Some member did not answer: no scale-in on a partial view, and no scale-out until
    /// the last one's new member serves.
    MembersNotAnswering,
    /// spec.size was below minSize.
    BelowMinSize,
    /// spec.size was above maxSize.
    AboveMaxSize,
    /// The operator cannot read the members' `stats` (authentication, TLS only): no decision.
    SignalsUnavailable,
    /// A HorizontalPodAutoscaler scales the same Memcached: no decision while it does.
    AutoscalerConflict,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Measuring => "Measuring",
            Reason::Evicting => "Evicting",
            Reason::PressureStabilizing => "PressureStabilizing",
            Reason::AtMaxSize => "AtMaxSize",
            Reason::Calm => "Calm",
            Reason::CalmStabilizing => "CalmStabilizing",
            Reason::Steady => "Steady",
            Reason::MembersNotAnswering => "MembersNotAnswering",
            Reason::BelowMinSize => "BelowMinSize",
            Reason::AboveMaxSize => "AboveMaxSize",
            Reason::SignalsUnavailable => "SignalsUnavailable",
            Reason::AutoscalerConflict => "AutoscalerConflict",
        }
    }

    pub const ALL: [Reason; 12] = [
        Reason::Measuring,
        Reason::Evicting,
        Reason::PressureStabilizing,
        Reason::AtMaxSize,
        Reason::Calm,
        Reason::CalmStabilizing,
        Reason::Steady,
        Reason::MembersNotAnswering,
        Reason::BelowMinSize,
        Reason::AboveMaxSize,
        Reason::SignalsUnavailable,
        Reason::AutoscalerConflict,
    ];
}

/// The decision of one round.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The size to set, when it differs from the current one.
    pub scale_to: Option<i32>,
    /// While a window runs: when it ends, and the size changes if the pressure (or the calm)
    /// lasts until then.
    pub next_scale: Option<Timestamp>,
    pub reason: Reason,
    pub message: String,
    pub signals: Signals,
    pub recommendations: Vec<String>,
}

/// The share of connections at which a member's maxConnections is worth raising: more pods do
/// not help, as hashing clients connect to every member.
const CONNECTIONS_PERCENT: u64 = 80;

/// One round: `size` is spec.size, `last_scale` the time of the autoscaler's last scale.
pub fn decide(
    spec: &AutoscalingSpec,
    size: i32,
    last_scale: Option<Timestamp>,
    reading: Reading,
    history: History,
) -> (Decision, History) {
    let now = reading.at;
    let rates = Rates::between(history.last.as_ref(), &reading);
    let signals = rates.signals(&reading);
    let recommendations = recommendations(history.last.as_ref(), &reading);
    let answering = reading.members.iter().flatten().count();
    let all_answer = answering == usize::try_from(size).unwrap_or(0);
    let pressure = rates.pressure(spec);
    let calm = all_answer && rates.complete && rates.calm(spec, &reading);
    let pressure_since = pressure.then(|| history.pressure_since.unwrap_or(now));
    let calm_since = calm.then(|| history.calm_since.unwrap_or(now));
    // A scale starts both windows again: its effect has to show first.
    let held = |since: Option<Timestamp>| {
        since.map(|s| now.duration_since(last_scale.map_or(s, |l| l.max(s))))
    };
    let seconds = |s: i32| SignedDuration::from_secs(i64::from(s));
    let (scale_to, reason) = if size < spec.min_size {
        (Some(spec.min_size), Reason::BelowMinSize)
    } else if size > spec.max_size {
        (Some(spec.max_size), Reason::AboveMaxSize)
    } else if history.last.is_none() {
        (None, Reason::Measuring)
    } else if pressure {
        if size >= spec.max_size {
            (None, Reason::AtMaxSize)
        } else if !all_answer {
            (None, Reason::MembersNotAnswering)
        } else if held(pressure_since) >= Some(seconds(spec.scale_out_stabilization_seconds)) {
            (Some(size + 1), Reason::Evicting)
        } else {
            (None, Reason::PressureStabilizing)
        }
    } else if calm && size > spec.min_size {
        if held(calm_since) >= Some(seconds(spec.scale_in_stabilization_seconds)) {
            (Some(size - 1), Reason::Calm)
        } else {
            (None, Reason::CalmStabilizing)
        }
    } else if !all_answer {
        (None, Reason::MembersNotAnswering)
    } else {
        (None, Reason::Steady)
    };
    // When the window now running ends, if what fills it lasts.
    let ends = |since: Option<Timestamp>, window: i32| {
        let start = since.map(|s| last_scale.map_or(s, |l| l.max(s)))?;
        start.checked_add(seconds(window)).ok()
    };
    let next_scale = match reason {
        Reason::PressureStabilizing => ends(pressure_since, spec.scale_out_stabilization_seconds),
        Reason::CalmStabilizing => ends(calm_since, spec.scale_in_stabilization_seconds),
        _ => None,
    };
    let message = message(spec, size, scale_to, reason, &signals);
    let decision = Decision {
        scale_to,
        next_scale,
        reason,
        message,
        signals,
        recommendations,
    };
    let history = History {
        last: Some(reading),
        pressure_since,
        calm_since,
    };
    (decision, history)
}

/// Per-member rates between two readings, where both came from the same process.
struct Rates {
    /// Evictions per second by ordinal; None where unknown (no earlier reading, a restart).
    evictions: Vec<Option<f64>>,
    /// Every member's rate is known.
    complete: bool,
    hits: u64,
    gets: u64,
}

impl Rates {
    fn between(last: Option<&Reading>, now: &Reading) -> Rates {
        let seconds = last.map_or(0.0, |l| now.at.duration_since(l.at).as_secs_f64());
        let mut rates = Rates {
            evictions: Vec::with_capacity(now.members.len()),
            complete: true,
            hits: 0,
            gets: 0,
        };
        for (i, member) in now.members.iter().enumerate() {
            let before = last.and_then(|l| l.members.get(i)).and_then(Option::as_ref);
            let rate = match (before, member) {
                // A counter below its last value, or a younger process: memcached restarted.
                (Some(b), Some(m))
                    if seconds > 0.0
                        && m.uptime >= b.uptime
                        && m.evictions >= b.evictions
                        && m.get_hits >= b.get_hits
                        && m.get_misses >= b.get_misses =>
                {
                    rates.hits += m.get_hits - b.get_hits;
                    rates.gets += (m.get_hits - b.get_hits) + (m.get_misses - b.get_misses);
                    Some((m.evictions - b.evictions) as f64 / seconds)
                }
                _ => None,
            };
            rates.complete &= rate.is_some();
            rates.evictions.push(rate);
        }
        rates
    }

    /// Some member evicts at the threshold's rate. memcached evicts only once its memory is all
    /// handed out, so no memory figure is needed (and `bytes` would not say: it counts items,
    /// not the slab chunks they fill).
    fn pressure(&self, spec: &AutoscalingSpec) -> bool {
        self.evictions
            .iter()
            .flatten()
            .any(|rate| *rate >= f64::from(spec.evictions_per_second))
    }

    /// No evictions anywhere, and every item would fit one member fewer below memoryPercent.
    fn calm(&self, spec: &AutoscalingSpec, reading: &Reading) -> bool {
        let members: Vec<&MemberStats> = reading.members.iter().flatten().collect();
        let fewer = members.len().saturating_sub(1) as u64;
        let bytes: u64 = members.iter().map(|m| m.bytes).sum();
        let limit = members.iter().map(|m| m.limit_maxbytes).min().unwrap_or(0);
        fewer > 0
            && self.evictions.iter().all(|r| *r == Some(0.0))
            && percent(bytes, fewer * limit) < spec.memory_percent
    }

    fn signals(&self, reading: &Reading) -> Signals {
        let members = reading.members.iter().flatten();
        Signals {
            members_answering: members.clone().count() as i32,
            evictions_per_second: self.evictions.iter().flatten().sum::<f64>().round() as i64,
            memory_percent: members
                .map(|m| percent(m.bytes, m.limit_maxbytes))
                .max()
                .unwrap_or(0),
            hit_percent: (self.gets > 0).then(|| percent(self.hits, self.gets)),
        }
    }
}

/// `part` in whole percent of `whole` (rounded down); 0 of nothing.
fn percent(part: u64, whole: u64) -> i32 {
    if whole == 0 {
        return 0;
    }
    i32::try_from(u128::from(part) * 100 / u128::from(whole)).unwrap_or(i32::MAX)
}

/// What only the user can change: connections near memcached's limit (more members do not
/// lower a hashing client's connections to each), and items refused as too large.
fn recommendations(last: Option<&Reading>, now: &Reading) -> Vec<String> {
    let mut advice = Vec::new();
    let busiest = now
        .members
        .iter()
        .flatten()
        .filter(|m| m.max_connections > 0)
        .max_by_key(|m| m.curr_connections * 100 / m.max_connections);
    if let Some(m) = busiest
        && m.curr_connections * 100 >= CONNECTIONS_PERCENT * m.max_connections
    {
        advice.push(format!(
            "raise maxConnections: a member holds {} of its {} connections",
            m.curr_connections, m.max_connections
        ));
    }
    let too_large: u64 = now
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let before = last?.members.get(i)?.as_ref()?;
            let m = m.as_ref()?;
            (m.uptime >= before.uptime)
                .then(|| m.store_too_large.saturating_sub(before.store_too_large))
        })
        .sum();
    if too_large > 0 {
        advice.push(format!(
            "raise maxItemSizeMiB: {too_large} items were refused as larger than the item size limit since the last reading"
        ));
    }
    advice
}

fn message(
    spec: &AutoscalingSpec,
    size: i32,
    scale_to: Option<i32>,
    reason: Reason,
    s: &Signals,
) -> String {
    let seen = format!(
        "{} of {size} members answering, {} evictions/s, fullest member {}% of its memory",
        s.members_answering, s.evictions_per_second, s.memory_percent
    );
    let what = match (scale_to, reason) {
        (Some(to), _) => format!("scaling {size} → {to}"),
        (None, Reason::PressureStabilizing) => format!(
            "evicting; one more member once that lasts {} s",
            spec.scale_out_stabilization_seconds
        ),
        (None, Reason::CalmStabilizing) => format!(
            "calm; one member fewer once that lasts {} s",
            spec.scale_in_stabilization_seconds
        ),
        (None, Reason::AtMaxSize) => format!(
            "evicting at maxSize {}: raise maxSize or maxMemoryMiB",
            spec.max_size
        ),
        (None, Reason::Measuring) => "a first reading; rates need a second".to_string(),
        (None, Reason::MembersNotAnswering) => "holding until every member answers".to_string(),
        (None, _) => format!("holding at {size}"),
    };
    format!("{what} ({seen})")
}

#[cfg(test)]
mod tests;
