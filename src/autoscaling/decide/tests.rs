use super::*;

const MIB: u64 = 1024 * 1024;

fn spec() -> AutoscalingSpec {
    AutoscalingSpec {
        enabled: true,
        min_size: 1,
        max_size: 5,
        ..AutoscalingSpec::default()
    }
}

/// A member of 64 MiB, `full` percent used, that has evicted `evictions` items `uptime`
/// seconds into its life.
fn member(uptime: u64, evictions: u64, full: u64) -> Option<MemberStats> {
    Some(MemberStats {
        uptime,
        evictions,
        bytes: (full * 64 * MIB).div_ceil(100),
        limit_maxbytes: 64 * MIB,
        max_connections: 1024,
        ..MemberStats::default()
    })
}

/// Replays readings taken every 10 s from t = 0 and keeps the decisions.
struct Run {
    spec: AutoscalingSpec,
    size: i32,
    last_scale: Option<Timestamp>,
    history: History,
    t: i64,
    decisions: Vec<Decision>,
}

impl Run {
    fn of(size: i32) -> Run {
        Run {
            spec: spec(),
            size,
            last_scale: None,
            history: History::default(),
            t: 0,
            decisions: Vec::new(),
        }
    }

    /// One reading; a scale is applied as the operator would.
    fn read(&mut self, members: Vec<Option<MemberStats>>) -> &Decision {
        let reading = Reading {
            at: Timestamp::from_second(self.t).unwrap(),
            members,
        };
        let (decision, history) = decide(
            &self.spec,
            self.size,
            self.last_scale,
            reading,
            std::mem::take(&mut self.history),
        );
        self.history = history;
        if let Some(to) = decision.scale_to {
            self.size = to;
            self.last_scale = Some(Timestamp::from_second(self.t).unwrap());
        }
        self.t += 10;
        self.decisions.push(decision);
        self.decisions.last().unwrap()
    }

    /// Readings of `size` members each evicting `rate` items/s at `full` percent, until `until` s.
    fn steady(&mut self, rate: u64, full: u64, until: i64) -> &Decision {
        while self.t < until {
            let (t, size) = (self.t as u64, self.size as usize);
            self.read(vec![member(1000 + t, rate * t, full); size]);
        }
        self.decisions.last().unwrap()
    }

    fn sizes(&self) -> Vec<i32> {
        let mut sizes: Vec<i32> = self.decisions.iter().filter_map(|d| d.scale_to).collect();
        sizes.dedup();
        sizes
    }
}

#[test]
fn a_first_reading_only_measures() {
    let mut run = Run::of(2);
    let d = run.read(vec![member(100, 500, 99); 2]);
    assert_eq!((d.scale_to, d.reason), (None, Reason::Measuring));
}

#[test]
fn evictions_with_a_full_memory_add_one_member_once_they_last_the_window() {
    let mut run = Run::of(2);
    // Evicting from t = 0; the pressure is seen from the second reading (t = 10), and the
    // default window is 30 s.
    let d = run.steady(5, 95, 40).clone();
    assert_eq!(d.reason, Reason::PressureStabilizing, "{}", d.message);
    assert_eq!(
        d.next_scale,
        Some(Timestamp::from_second(40).unwrap()),
        "10 s + 30 s"
    );
    let d = run.steady(5, 95, 50);
    assert_eq!((d.scale_to, d.reason), (Some(3), Reason::Evicting));
    assert!(d.message.contains("scaling 2 → 3"), "{}", d.message);
}

#[test]
fn after_a_scale_the_window_starts_again() {
    let mut run = Run::of(2);
    run.steady(5, 95, 50);
    assert_eq!(run.size, 3);
    // Still evicting (the new member is filling): no second member before another 30 s.
    let d = run.steady(5, 95, 70).clone();
    assert_eq!(d.reason, Reason::PressureStabilizing);
    run.steady(5, 95, 80);
    assert_eq!(run.sizes(), [3, 4], "one step at a time");
}

#[test]
fn pressure_that_comes_and_goes_never_lasts_the_window() {
    let mut run = Run::of(2);
    let mut evicted = 0;
    for i in 0..20u64 {
        // Evicting one round in two.
        evicted += if i % 2 == 0 { 50 } else { 0 };
        run.read(vec![member(1000 + i * 10, evicted, 95); 2]);
    }
    assert!(run.sizes().is_empty(), "flapping scaled: {:?}", run.sizes());
}

#[test]
fn evictions_below_the_threshold_are_no_pressure() {
    let mut run = Run::of(2);
    run.spec.evictions_per_second = 10;
    let d = run.steady(5, 99, 100);
    assert_eq!((d.scale_to, d.reason), (None, Reason::Steady));
}

#[test]
fn at_max_size_pressure_is_reported_not_acted_on() {
    let mut run = Run::of(5);
    let d = run.steady(5, 95, 100);
    assert_eq!((d.scale_to, d.reason), (None, Reason::AtMaxSize));
    assert!(d.message.contains("raise maxSize"), "{}", d.message);
}

#[test]
fn a_member_that_does_not_answer_holds_a_scale_out() {
    let mut run = Run::of(3);
    run.read(vec![member(1000, 0, 95), member(1000, 0, 95), None]);
    for t in 1..10u64 {
        run.read(vec![
            member(1000 + t * 10, t * 100, 95),
            member(1000 + t * 10, 0, 95),
            None,
        ]);
    }
    let d = run.decisions.last().unwrap();
    assert_eq!((d.scale_to, d.reason), (None, Reason::MembersNotAnswering));
    assert_eq!(d.signals.members_answering, 2);
    assert_eq!(d.signals.evictions_per_second, 10);
}

#[test]
fn a_restarted_member_counts_neither_as_evicting_nor_as_calm() {
    let mut run = Run::of(2);
    run.read(vec![member(5000, 900_000, 30), member(5000, 0, 20)]);
    // Member 0 restarted: its counters start again below the last reading's.
    let d = run
        .read(vec![member(3, 0, 30), member(5010, 0, 20)])
        .clone();
    assert_eq!(
        d.signals.evictions_per_second, 0,
        "no negative or huge rate"
    );
    assert_ne!(
        d.reason,
        Reason::CalmStabilizing,
        "a partial view is not calm"
    );
    // From the next reading on its rate is known again.
    let d = run.read(vec![member(13, 0, 30), member(5020, 0, 20)]);
    assert_eq!(d.reason, Reason::CalmStabilizing);
}

#[test]
fn calm_members_lose_one_member_after_the_long_window_and_never_go_below_min_size() {
    let mut run = Run::of(3);
    run.spec.min_size = 2;
    // 3 members at 30 %: 90 % of one member's worth, which fits 2 members at 45 % (< 75 %).
    let d = run.steady(0, 30, 300).clone();
    assert_eq!(d.reason, Reason::CalmStabilizing);
    assert_eq!(
        d.next_scale,
        Some(Timestamp::from_second(310).unwrap()),
        "10 s + 300 s"
    );
    let d = run.steady(0, 30, 320);
    assert_eq!((d.scale_to, d.reason), (Some(2), Reason::Calm));
    let d = run.steady(0, 30, 1000);
    assert_eq!((d.scale_to, d.reason), (None, Reason::Steady));
    assert_eq!(run.sizes(), [2]);
}

#[test]
fn no_scale_in_when_the_items_would_not_fit_one_member_fewer() {
    // 2 members at 40 %: one alone would be 80 % full (> 75 %).
    let mut run = Run::of(2);
    let d = run.steady(0, 40, 1000);
    assert_eq!((d.scale_to, d.reason), (None, Reason::Steady));
}

#[test]
fn a_member_that_does_not_answer_prevents_a_scale_in() {
    let mut run = Run::of(3);
    for t in 0..100u64 {
        run.read(vec![
            member(1000 + t * 10, 0, 10),
            member(1000 + t * 10, 0, 10),
            None,
        ]);
    }
    let d = run.decisions.last().unwrap();
    assert_eq!((d.scale_to, d.reason), (None, Reason::MembersNotAnswering));
}

#[test]
fn a_size_outside_the_bounds_is_brought_back_at_once() {
    let mut run = Run::of(9);
    assert_eq!(run.read(vec![member(10, 0, 50); 9]).scale_to, Some(5));
    run.spec.min_size = 7;
    run.spec.max_size = 8;
    let d = run.read(vec![member(20, 0, 50); 5]);
    assert_eq!((d.scale_to, d.reason), (Some(7), Reason::BelowMinSize));
}

#[test]
fn the_signals_sum_evictions_and_hits_and_take_the_fullest_member() {
    let at = |s| Timestamp::from_second(s).unwrap();
    let with_gets = |hits, misses, evictions, full| {
        member(100, evictions, full).map(|m| MemberStats {
            get_hits: hits,
            get_misses: misses,
            ..m
        })
    };
    let first = Reading {
        at: at(0),
        members: vec![with_gets(0, 0, 0, 40), with_gets(0, 0, 0, 40)],
    };
    let (_, history) = decide(&spec(), 2, None, first, History::default());
    let second = Reading {
        at: at(10),
        members: vec![with_gets(60, 20, 100, 97), with_gets(15, 5, 0, 40)],
    };
    let (d, _) = decide(&spec(), 2, None, second, history);
    assert_eq!(
        d.signals,
        Signals {
            members_answering: 2,
            evictions_per_second: 10,
            memory_percent: 97,
            hit_percent: Some(75),
        }
    );
}

#[test]
fn connections_near_the_limit_and_refused_large_items_are_recommendations() {
    let mut run = Run::of(1);
    let busy = |too_large| {
        member(100, 0, 50).map(|m| MemberStats {
            curr_connections: 900,
            store_too_large: too_large,
            ..m
        })
    };
    assert_eq!(run.read(vec![busy(3)]).recommendations.len(), 1);
    let d = run.read(vec![busy(10)]);
    assert_eq!(
        d.recommendations,
        [
            "raise maxConnections: a member holds 900 of its 1024 connections",
            "raise maxItemSizeMiB: 7 items were refused as larger than the item size limit since the last reading"
        ]
    );
    assert_eq!(d.scale_to, None, "neither is helped by more members");
}
