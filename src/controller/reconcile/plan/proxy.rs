//! The proxy's layout (`spec.proxy`): which members it routes to, and the handover from the
//! layout before. Pure: the time is observed.
//!
//! A member joins the layout once it and every member before it is Ready, so that no key is
//! routed to a member that refuses it; keys move by the jump hash's share (a quarter, 3 → 4).
//! For `handoverSeconds` after a change, reads that miss ask the previous layout and deletes go
//! to both; a member leaving the layout keeps serving until then, and is deleted after. A
//! change during a handover starts a new one from the layout it replaces. Before any change,
//! the members are swept against the layout in force (`controller/sweep.rs`), so that no copy
//! a key left behind reads back when a later layout routes the key there again.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{Handover, Memcached};
use crate::resources::members;
use crate::resources::proxy::{self, Layout};

/// What the proxy routes to, as planned.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyPlan {
    pub layout: Layout,
    /// Members in the layout (`status.proxy.members`).
    pub members: i32,
    pub handover: Option<Handover>,
    /// Members kept running: `spec.size`, or the previous layout's while it still serves.
    pub keep: i32,
    /// When the handover ends, from now.
    pub ends_in: Option<Duration>,
    /// Before the layout changes: the members to sweep first.
    pub sweep: Option<Sweep>,
    /// While the members are updated: since when the layout holds requests (`Layout::hold`).
    pub holding_since: Option<Time>,
    /// How long the members' update waits yet for the proxies to load the layout that holds.
    pub members_wait: Option<Duration>,
}

/// How long the proxies get to load a layout that holds before a member restarts: the kubelet
/// refreshes the mounted ConfigMap at once (`LAYOUT_ANNOTATION`), the agent reads it within a
/// second and memcached loads it at its next tick.
pub const HOLD_LEAD: SignedDuration = SignedDuration::from_secs(5);

impl ProxyPlan {
    /// While the members are `updating`, the layout holds what a member restarting does not
    /// answer, since the last reported start of the hold, or now; the members' update waits
    /// until the proxies have had `HOLD_LEAD` to load it.
    pub fn holding(mut self, mc: &Memcached, updating: bool, now: Timestamp) -> Self {
        if !updating || self.members == 0 {
            return self;
        }
        let reported = mc.status.as_ref().and_then(|s| s.proxy.as_ref());
        // The status keeps whole seconds: the start is one, and the wait counts from the
        // second after it, so that it is never shorter than `HOLD_LEAD`.
        let since = reported
            .and_then(|p| p.holding_since.clone())
            .filter(|since| since.0 <= now)
            .unwrap_or_else(|| Time(Timestamp::from_second(now.as_second()).unwrap_or(now)));
        let from = since.0 + SignedDuration::from_secs(1);
        let left = (from + HOLD_LEAD).duration_since(now);
        self.members_wait = Some(left.max(SignedDuration::ZERO).unsigned_abs());
        self.layout.hold = true;
        self.holding_since = Some(since);
        self
    }

    /// With zone-local reads, the layout names each member's zone (`Layout::in_zones`), and
    /// the sweep places each member's keys over its zone's members in the layout in force.
    /// A change of zones alone (a member found in another zone, zone-local reads turned on or
    /// off) moves keys as a change of members does: the members `ready` are swept first.
    pub fn in_zones(
        mut self,
        mc: &Memcached,
        zone: impl Fn(i32) -> Option<String>,
        ready: impl Fn(i32) -> bool,
    ) -> Self {
        let last = mc.status.as_ref().and_then(|s| s.proxy.as_ref());
        let routed = last.map_or(0, |l| l.members);
        // The zones in force, by ordinal, as the status reports them (none: one pool).
        let reported: HashMap<i32, &str> = last
            .into_iter()
            .flat_map(|l| &l.zones)
            .flat_map(|z| z.members.iter().map(move |m| (m, z.zone.as_str())))
            .filter_map(|(m, zone)| Some((members::ordinal(mc, m)?, zone)))
            .collect();
        let was = |n: i32| reported.get(&n).copied();
        // A member's pod recreated has no zone until it is bound: it keeps the one in force.
        let zone = |n: i32| zone(n).or_else(|| was(n).map(str::to_string));
        self.layout = self.layout.in_zones(mc, zone);
        let zoned = !self.layout.zones.is_empty();
        let zoned_before = !reported.is_empty();
        let moved = routed > 0
            && self.members == routed
            && (zoned != zoned_before
                || zoned && (0..routed).any(|n| was(n) != Some(&self.layout.zones[n as usize])));
        if moved && self.sweep.is_none() {
            self.sweep = Some(Sweep {
                members: (0..self.keep).filter(|n| ready(*n)).collect(),
                layout: routed,
                // During a handover the previous layout still reads from the owners before.
                keep_moved: !self.layout.previous.is_empty(),
                zones: Vec::new(),
            })
            .filter(|s| !s.members.is_empty());
        }
        if let Some(sweep) = self.sweep.as_mut().filter(|_| zoned_before) {
            let beyond = sweep.members.iter().map(|n| n + 1).max().unwrap_or(0);
            sweep.zones = (0..sweep.layout.max(beyond))
                .map(|n| {
                    was(n)
                        .map(str::to_string)
                        .or_else(|| zone(n))
                        .unwrap_or_default()
                })
                .collect();
        }
        self
    }
}

/// The members swept before a change of layout, against the layout the proxies route by.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    /// The Ready members that may hold keys, by ordinal: in either layout, or joining.
    pub members: Vec<i32>,
    /// The members in the layout in force (the first that many).
    pub layout: i32,
    /// The previous layout still serves what misses: a key owned elsewhere is handed to its
    /// owner, not dropped.
    pub keep_moved: bool,
    /// With zone-local reads, each member's zone by ordinal: a member is swept against its
    /// zone's members in the layout in force.
    pub zones: Vec<String>,
}

impl Sweep {
    /// The members of the layout in force that `n`'s keys are placed over (with zones, its
    /// zone's alone), and its place among them (None: outside the layout).
    pub fn owners_of(&self, n: i32) -> (Vec<i32>, Option<usize>) {
        let zone = |m: i32| self.zones.get(m as usize);
        let owners: Vec<i32> = (0..self.layout)
            .filter(|m| self.zones.is_empty() || zone(*m) == zone(n))
            .collect();
        let place = owners.iter().position(|m| *m == n);
        (owners, place)
    }
}

/// How long members the previous layout held stay after the handover ends: the proxies load the
/// layout without them first (within seconds), so no request is sent to a member gone.
pub const DRAIN_GRACE: SignedDuration = SignedDuration::from_secs(15);

/// The layout of `mc`'s proxy, from the members Ready (`ready(ordinal)`) at `now`; None while
/// the proxy is off.
pub fn layout(mc: &Memcached, ready: impl Fn(i32) -> bool, now: Timestamp) -> Option<ProxyPlan> {
    let spec = mc.spec.proxy.as_ref().filter(|_| proxy::enabled(mc))?;
    let size = mc.spec.size.max(0);
    let last = mc.status.as_ref().and_then(|s| s.proxy.as_ref());
    // What the proxies route by now (nothing, the first time), and the handover under way, with
    // its grace.
    let routed = last.map_or(0, |l| l.members);
    let running = last
        .and_then(|l| l.handover.clone())
        .filter(|h| h.until.0 + DRAIN_GRACE > now && spec.handover_seconds > 0);
    let members = match size > routed {
        true if (routed..size).all(&ready) => size,
        true => routed,
        false => size,
    };
    let held = running.as_ref().map_or(0, |h| h.previous_members);
    let keep_moved = running.as_ref().is_some_and(|h| h.until.0 > now);
    let window = SignedDuration::from_secs(i64::from(spec.handover_seconds));
    let handover = match members == routed {
        true => running,
        // Nothing to hand over from, or to (scaled to 0: every read misses).
        false if spec.handover_seconds > 0 && routed > 0 && members > 0 => Some(Handover {
            previous_members: routed,
            until: Time(now + window),
        }),
        false => None,
    };
    // The previous layout serves until the window ends; its members stay for the grace after.
    let serving = handover.as_ref().filter(|h| h.until.0 > now);
    let next = handover.as_ref().map(|h| match h.until.0 > now {
        true => h.until.0,
        false => h.until.0 + DRAIN_GRACE,
    });
    let keep = size.max(handover.as_ref().map_or(0, |h| h.previous_members));
    // Nothing to sweep against before the first layout (or from none), nor what is deleted
    // now (scaled to 0, or in without a window).
    let sweep = (members != routed && routed > 0)
        .then(|| Sweep {
            members: (0..routed.max(held).max(members).min(keep))
                .filter(|n| ready(*n))
                .collect(),
            layout: routed,
            keep_moved,
            zones: Vec::new(),
        })
        .filter(|s| !s.members.is_empty());
    Some(ProxyPlan {
        layout: Layout::of(mc, members, serving.map(|h| h.previous_members)),
        members,
        keep,
        ends_in: next.map(|at| at.duration_since(now).unsigned_abs()),
        handover,
        sweep,
        holding_since: None,
        members_wait: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ProxySpec, ProxyStatus, ZoneMembers};
    use crate::fixtures::memcached;

    fn proxied(size: i32, last: Option<(i32, Option<(i32, i64)>)>, now: Timestamp) -> Memcached {
        let mut mc = memcached("cache", size);
        mc.spec.proxy = Some(ProxySpec {
            enabled: true,
            handover_seconds: 600,
            ..ProxySpec::default()
        });
        if let Some((members, handover)) = last {
            mc.status.get_or_insert_default().proxy = Some(ProxyStatus {
                members,
                handover: handover.map(|(previous_members, left)| Handover {
                    previous_members,
                    until: Time(now + SignedDuration::from_secs(left)),
                }),
                ..ProxyStatus::default()
            });
        }
        mc
    }

    fn all(_: i32) -> bool {
        true
    }

    #[test]
    fn the_first_layout_waits_for_the_members_and_hands_over_from_nothing() {
        let now = Timestamp::now();
        let starting = layout(&proxied(3, None, now), |n| n < 2, now).unwrap();
        assert_eq!((starting.members, starting.handover), (0, None));
        let plan = layout(&proxied(3, None, now), all, now).unwrap();
        assert_eq!((plan.members, plan.keep, plan.handover), (3, 3, None));
        assert!(plan.layout.previous.is_empty());
        assert!(layout(&memcached("cache", 3), all, now).is_none(), "off");
        // Scaled to 0 and back: no handover to or from an empty layout, the members Ready first.
        let to_zero = layout(&proxied(0, Some((3, None)), now), all, now).unwrap();
        assert_eq!(
            (to_zero.members, to_zero.keep, to_zero.handover),
            (0, 0, None)
        );
        let back = layout(&proxied(3, Some((0, None)), now), |n| n < 1, now).unwrap();
        assert_eq!(back.members, 0, "cache-1 and cache-2 not Ready yet");
    }

    #[test]
    fn a_new_member_joins_once_ready_and_the_previous_layout_serves_misses_for_the_window() {
        let now = Timestamp::now();
        let mc = proxied(4, Some((3, None)), now);
        let waiting = layout(&mc, |n| n < 3, now).unwrap();
        assert_eq!((waiting.members, waiting.handover.is_none()), (3, true));
        let joined = layout(&mc, all, now).unwrap();
        assert_eq!(joined.members, 4);
        let handover = joined.handover.unwrap();
        assert_eq!(handover.previous_members, 3);
        assert_eq!(handover.until.0, now + SignedDuration::from_secs(600));
        assert_eq!(joined.layout.previous.len(), 3);
        assert_eq!(joined.ends_in, Some(Duration::from_secs(600)));
    }

    #[test]
    fn a_member_leaving_drains_until_the_window_ends_and_is_then_let_go() {
        let now = Timestamp::now();
        let scaled_in = layout(&proxied(3, Some((4, None)), now), all, now).unwrap();
        assert_eq!((scaled_in.members, scaled_in.keep), (3, 4));
        assert_eq!(scaled_in.layout.previous.len(), 4);
        // Later in the window: the same; after it: the previous layout dropped, the member too.
        let during = layout(&proxied(3, Some((3, Some((4, 60)))), now), all, now).unwrap();
        assert_eq!((during.keep, during.layout.previous.len()), (4, 4));
        assert_eq!(during.ends_in, Some(Duration::from_secs(60)));
        // The window over: the layout without cache-3 first, cache-3 kept for the grace.
        let ended = layout(&proxied(3, Some((3, Some((4, -1)))), now), all, now).unwrap();
        assert!(ended.layout.previous.is_empty());
        assert_eq!(
            (ended.keep, ended.ends_in),
            (4, Some(Duration::from_secs(14)))
        );
        let after = layout(&proxied(3, Some((3, Some((4, -16)))), now), all, now).unwrap();
        assert_eq!((after.keep, after.handover, after.ends_in), (3, None, None));
    }

    #[test]
    fn without_a_window_a_change_is_at_once() {
        let now = Timestamp::now();
        let mut mc = proxied(3, Some((4, None)), now);
        mc.spec.proxy.as_mut().unwrap().handover_seconds = 0;
        let plan = layout(&mc, all, now).unwrap();
        assert_eq!((plan.members, plan.keep, plan.handover), (3, 3, None));
        let mut draining = proxied(3, Some((3, Some((4, 60)))), now);
        draining.spec.proxy.as_mut().unwrap().handover_seconds = 0;
        let plan = layout(&draining, all, now).unwrap();
        assert_eq!((plan.keep, plan.handover), (3, None), "ended at once");
    }

    #[test]
    fn before_a_change_the_members_are_swept_against_the_layout_in_force() {
        let now = Timestamp::now();
        let sweep = |plan: ProxyPlan| plan.sweep.map(|s| (s.members, s.layout, s.keep_moved));
        // No change, or none from a layout: nothing to sweep.
        assert_eq!(
            sweep(layout(&proxied(3, Some((3, None)), now), all, now).unwrap()),
            None
        );
        assert_eq!(
            sweep(layout(&proxied(3, None, now), all, now).unwrap()),
            None
        );
        // 3 -> 4 after any window: what the jump hash moved elsewhere is dropped (nothing
        // serves it), the new member included.
        let out = layout(&proxied(4, Some((3, None)), now), all, now).unwrap();
        assert_eq!(sweep(out), Some((vec![0, 1, 2, 3], 3, false)));
        // 4 -> 3 within 3 -> 4's window: the copies on cache-0..2 of keys cache-3 owns go to
        // cache-3 if it has none, so that the next layout's reads find the newest value.
        let back = layout(&proxied(3, Some((4, Some((3, 120)))), now), all, now).unwrap();
        assert_eq!(sweep(back), Some((vec![0, 1, 2, 3], 4, true)));
        // Wanted again while it drains: cache-3 is swept too (emptied into the layout's
        // owners), once cache-4 is Ready and the layout changes.
        let waiting = layout(&proxied(5, Some((3, Some((4, 120)))), now), |n| n < 4, now).unwrap();
        assert_eq!((waiting.members, waiting.sweep), (3, None));
        let back = layout(&proxied(5, Some((3, Some((4, 120)))), now), all, now).unwrap();
        assert_eq!(sweep(back), Some((vec![0, 1, 2, 3, 4], 3, true)));
        // In the grace after the window: kept running, swept, nothing handed on; a member not
        // Ready is not asked.
        let grace = layout(&proxied(4, Some((3, Some((4, -5)))), now), |n| n != 1, now).unwrap();
        assert_eq!(sweep(grace), Some((vec![0, 2, 3], 3, false)));
        // What is deleted now is not swept: in without a window, or to 0.
        let mut at_once = proxied(3, Some((4, None)), now);
        at_once.spec.proxy.as_mut().unwrap().handover_seconds = 0;
        let at_once = layout(&at_once, all, now).unwrap();
        assert_eq!(sweep(at_once), Some((vec![0, 1, 2], 4, false)));
        assert_eq!(
            sweep(layout(&proxied(0, Some((3, None)), now), all, now).unwrap()),
            None
        );
    }

    #[test]
    fn while_the_members_are_updated_the_layout_holds_and_their_restarts_wait_for_the_proxies() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut mc = proxied(3, Some((3, None)), now);
        let plan = layout(&mc, all, now).unwrap();
        let quiet = plan.clone().holding(&mc, false, now);
        assert_eq!((quiet.layout.hold, quiet.members_wait), (false, None));
        let held = plan.clone().holding(&mc, true, now);
        assert!(held.layout.hold);
        assert_eq!(held.holding_since, Some(Time(now)));
        assert_eq!(held.members_wait, Some(Duration::from_secs(6)));
        // Half a second later, the start is still that second (as the status will keep it).
        let later = now + SignedDuration::from_millis(500);
        let held = plan.clone().holding(&mc, true, later);
        assert_eq!(held.holding_since, Some(Time(now)));
        assert_eq!(held.members_wait, Some(Duration::from_millis(5500)));
        // From the start the status reports: 2 s ago, 4 s left; 6 s ago, none.
        let since = |mc: &mut Memcached, ago: i64| {
            let proxy = mc.status.as_mut().unwrap().proxy.as_mut().unwrap();
            proxy.holding_since = Some(Time(now - SignedDuration::from_secs(ago)));
        };
        since(&mut mc, 2);
        let held = plan.clone().holding(&mc, true, now);
        assert_eq!(held.members_wait, Some(Duration::from_secs(4)));
        assert_eq!(
            held.holding_since,
            Some(Time(now - SignedDuration::from_secs(2)))
        );
        since(&mut mc, 6);
        let held = plan.clone().holding(&mc, true, now);
        assert_eq!(held.members_wait, Some(Duration::ZERO));
        // Nothing routed yet: nothing to hold, nothing to wait for.
        let first = layout(&proxied(3, None, now), |n| n < 2, now).unwrap();
        let first = first.holding(&proxied(3, None, now), true, now);
        assert_eq!((first.layout.hold, first.members_wait), (false, None));
    }

    /// The proxy's plan for `mc` (every member ready for the layout), its members in `zone`,
    /// those `ready` swept.
    fn zoned(
        mc: &Memcached,
        zone: impl Fn(i32) -> Option<String>,
        ready: impl Fn(i32) -> bool,
        now: Timestamp,
    ) -> ProxyPlan {
        layout(mc, all, now).unwrap().in_zones(mc, zone, ready)
    }

    /// `mc` with zone-local reads, its status reporting the layout in force in `zones`.
    fn in_zones(mut mc: Memcached, zones: &[(&str, &[&str])]) -> Memcached {
        mc.spec.proxy.as_mut().unwrap().zone_local_reads = true;
        let status = mc
            .status
            .get_or_insert_default()
            .proxy
            .get_or_insert_default();
        status.zones = zones
            .iter()
            .map(|(zone, members)| ZoneMembers {
                zone: zone.to_string(),
                members: members.iter().map(|m| m.to_string()).collect(),
            })
            .collect();
        mc
    }

    #[test]
    fn with_zone_local_reads_the_layout_names_each_members_zone_and_each_is_swept_in_its_own() {
        let now = Timestamp::now();
        let zones = ["b", "a", "c", "a"];
        let zone = |n: i32| zones.get(n as usize).map(|z| z.to_string());
        let plain = proxied(4, Some((3, None)), now);
        let plain = zoned(&plain, zone, all, now);
        assert!(plain.layout.zones.is_empty(), "off by default");
        assert!(plain.sweep.unwrap().zones.is_empty());
        let in_force: &[(&str, &[&str])] = &[
            ("a", &["cache-1"]),
            ("b", &["cache-0"]),
            ("c", &["cache-2"]),
        ];
        let mc = in_zones(proxied(4, Some((3, None)), now), in_force);
        let plan = zoned(&mc, zone, all, now);
        assert_eq!(plan.layout.zones, ["b", "a", "c", "a"]);
        assert_eq!(plan.layout.previous_zones, ["b", "a", "c"]);
        // 3 -> 4: cache-3 joins zone a, where cache-1 held every key alone: cache-1 keeps
        // what zone a's layout in force routes to it (all of it); cache-3 is emptied.
        let sweep = plan.sweep.unwrap();
        assert_eq!(sweep.owners_of(1), (vec![1], Some(0)));
        assert_eq!(sweep.owners_of(0), (vec![0], Some(0)));
        assert_eq!(sweep.owners_of(3), (vec![1], None));
        // 4 -> 3 after: cache-3 leaves zone a, whose keys were placed over cache-1 and cache-3.
        let four: &[(&str, &[&str])] = &[
            ("a", &["cache-1", "cache-3"]),
            ("b", &["cache-0"]),
            ("c", &["cache-2"]),
        ];
        let back = in_zones(proxied(3, Some((4, None)), now), four);
        let sweep = zoned(&back, zone, all, now).sweep.unwrap();
        assert_eq!(sweep.owners_of(3), (vec![1, 3], Some(1)));
        assert_eq!(sweep.owners_of(2), (vec![2], Some(0)));
        // A member whose pod has no zone label (nor had one) is in the zone "".
        let none = in_zones(proxied(4, Some((3, None)), now), &[]);
        let unlabelled = zoned(&none, |_| None, all, now);
        assert_eq!(unlabelled.layout.zones, ["", "", "", ""]);
    }

    #[test]
    fn a_change_of_zones_alone_sweeps_the_members_against_the_zones_in_force() {
        let now = Timestamp::now();
        let in_force: &[(&str, &[&str])] = &[("a", &["cache-0", "cache-2"]), ("b", &["cache-1"])];
        let mc = in_zones(proxied(3, Some((3, None)), now), in_force);
        let same = |n: i32| ["a", "b", "a"].get(n as usize).map(|z| z.to_string());
        let quiet = zoned(&mc, same, all, now);
        assert_eq!(quiet.sweep, None, "nothing moved");
        // cache-2 found in zone b: zone a's keys, placed over cache-0 and cache-2, move.
        let moved = |n: i32| ["a", "b", "b"].get(n as usize).map(|z| z.to_string());
        let plan = zoned(&mc, moved, |n| n != 1, now);
        assert_eq!(plan.layout.zones, ["a", "b", "b"]);
        let sweep = plan.sweep.unwrap();
        assert_eq!(
            (sweep.members.clone(), sweep.layout, sweep.keep_moved),
            (vec![0, 2], 3, false)
        );
        assert_eq!(sweep.zones, ["a", "b", "a"], "the zones in force");
        assert_eq!(sweep.owners_of(2), (vec![0, 2], Some(1)));
        // Turned on (the layout in force one pool) and off again: swept each time.
        let mut on = proxied(3, Some((3, None)), now);
        on.spec.proxy.as_mut().unwrap().zone_local_reads = true;
        let sweep = zoned(&on, same, all, now).sweep.unwrap();
        assert!(sweep.zones.is_empty(), "against the one pool in force");
        let mut off = mc.clone();
        off.spec.proxy.as_mut().unwrap().zone_local_reads = false;
        let sweep = zoned(&off, same, all, now).sweep.unwrap();
        assert_eq!(sweep.zones, ["a", "b", "a"]);
        // cache-2 recreated, not yet bound: no label, the zone in force kept; nothing moves.
        let unbound = |n: i32| ["a", "b"].get(n as usize).map(|z| z.to_string());
        let plan = zoned(&mc, unbound, all, now);
        assert_eq!(
            (plan.layout.zones.clone(), plan.sweep),
            (vec!["a".into(), "b".into(), "a".into()], None)
        );
        // During a handover, what the previous layout reads is handed to its owner, not lost.
        let handing = in_zones(proxied(3, Some((3, Some((4, 60)))), now), in_force);
        let plan = zoned(&handing, moved, all, now);
        assert!(plan.sweep.unwrap().keep_moved);
        // Nothing routed yet: nothing to sweep.
        let first = in_zones(proxied(3, None, now), &[]);
        assert_eq!(zoned(&first, moved, all, now).sweep, None);
    }

    #[test]
    fn a_change_during_a_handover_hands_over_from_the_layout_it_replaces() {
        let now = Timestamp::now();
        let plan = layout(&proxied(5, Some((4, Some((3, 300)))), now), all, now).unwrap();
        let handover = plan.handover.unwrap();
        assert_eq!((plan.members, handover.previous_members), (5, 4));
        assert_eq!(handover.until.0, now + SignedDuration::from_secs(600));
    }
}
