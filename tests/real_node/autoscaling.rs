//! Autoscaling for real: an application (pymemcache's `HashClient` over `status.servers`, cache
//! aside) whose working set is larger than one member's memory makes memcached evict; the
//! operator, reading the members' `stats` itself, adds members one at a time until the set
//! fits, the evictions stop and the hit ratio recovers. Once the load stops and its items expire
//! it removes one member per scale-in window, down to minSize.

use std::time::{Duration, Instant};

use kube::Api;
use memcached_operator::api::{AutoscalingSpec, Memcached};
use serde_json::json;

use crate::harness::{admin, create, events_for, memcached, wait_converged};
use crate::members::ring;
use crate::memcached::operator_for;
use crate::{RealNode, pymemcache, real_namespace};

/// 1,500 values of 10 kB: about two members' worth of 8 MiB (about 700 such items each).
const KEYS: u64 = 1_500;
const VALUE_BYTES: u64 = 10_000;
const MAX_MEMORY_MIB: i32 = 8;
const SCALE_IN_WINDOW: Duration = Duration::from_secs(30);
/// The application's items live this long: once it stops, the cache empties.
const TTL: u64 = 30;

fn spec() -> AutoscalingSpec {
    AutoscalingSpec {
        enabled: true,
        min_size: 1,
        max_size: 4,
        scale_out_stabilization_seconds: 20,
        scale_in_stabilization_seconds: SCALE_IN_WINDOW.as_secs() as i32,
        ..AutoscalingSpec::default()
    }
}

fn status_of(mc: &Memcached) -> (i32, String, i64) {
    let a = mc.status.as_ref().and_then(|s| s.autoscaling.clone());
    let a = a.unwrap_or_default();
    let evictions = a.signals.map_or(-1, |s| s.evictions_per_second);
    (mc.spec.size, a.reason, evictions)
}

fn message_of(mc: &Memcached) -> String {
    let a = mc.status.as_ref().and_then(|s| s.autoscaling.as_ref());
    a.map(|a| a.message.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_working_set_larger_than_a_member_scales_out_until_it_fits_then_in_after_the_window() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "autoscaling").await;
    let _op = operator_for(&client, &node, &ns).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let mut mc = memcached("cache", 1);
    mc.spec.max_memory_mib = MAX_MEMORY_MIB;
    mc.spec.autoscaling = Some(spec());
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 1).await;

    // Passes over the working set until the hit ratio has stayed high for three passes.
    let start = Instant::now();
    let (mut sizes, mut ratios) = (vec![1], Vec::new());
    let (mut detected, mut said) = (None, String::new());
    // Since when a reading under this load has seen no evictions at this size.
    let mut quiet_since: Option<(i32, Duration)> = None;
    while start.elapsed() < Duration::from_secs(420) {
        let mc = mcs.get("cache").await.unwrap();
        let (size, reason, evictions) = status_of(&mc);
        quiet_since = match quiet_since {
            Some((s, t)) if s == size && evictions == 0 => Some((s, t)),
            _ if evictions == 0 && reason == "Steady" => Some((size, start.elapsed())),
            _ => None,
        };
        if message_of(&mc) != said {
            said = message_of(&mc);
            println!("{:>5.1} s: {reason}: {said}", start.elapsed().as_secs_f64());
        }
        if detected.is_none() && (reason == "PressureStabilizing" || reason == "Evicting") {
            detected = Some(start.elapsed());
        }
        if sizes.last() != Some(&size) {
            sizes.push(size);
        }
        let (servers, addresses) = ring(&client, &node, &ns, size as usize).await;
        let answer = pymemcache(json!({
            "servers": servers, "addresses": addresses,
            "cache_aside": {"keys": KEYS, "value_bytes": VALUE_BYTES, "ttl": TTL},
        }))
        .await;
        assert!(answer.get("error").is_none(), "{answer}");
        let hits = answer["hits"].as_u64().unwrap();
        let ratio = 100.0 * hits as f64 / KEYS as f64;
        if ratios
            .last()
            .is_none_or(|(s, r): &(i32, f64)| *s != size || (r - ratio).abs() >= 5.0)
        {
            println!(
                "{:>5.1} s: size {size}, hit ratio {ratio:.1} % ({} batches of sets refused)",
                start.elapsed().as_secs_f64(),
                answer["refused_batches"]
            );
        }
        ratios.push((size, ratio));
        // An application's pace, and room on the machine's two cores for the rest.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Under load, every key found, and the members no longer evicting for 15 s (two
        // readings at least).
        let fits = ratios.len() >= 3 && ratios[ratios.len() - 3..].iter().all(|(_, r)| *r >= 99.0);
        if fits && quiet_since.is_some_and(|(_, t)| start.elapsed() - t >= Duration::from_secs(15))
        {
            break;
        }
    }
    let (last_size, _) = *ratios.last().unwrap();
    let before = ratios
        .iter()
        .skip(1)
        .find(|(size, _)| *size == 1)
        .map(|(_, r)| *r);
    println!(
        "detected after {:.0} s; sizes {sizes:?}; fits after {:.0} s; hit ratio before {before:?} %, after {:.1} %",
        detected.map_or(f64::NAN, |d| d.as_secs_f64()),
        start.elapsed().as_secs_f64(),
        ratios.last().unwrap().1,
    );
    assert!(quiet_since.is_some(), "no evictions under load at the end");
    assert!(
        ratios
            .iter()
            .skip(1)
            .any(|(size, r)| *size == 1 && *r < 70.0),
        "one member cannot hold the working set: {ratios:?}"
    );
    assert!(
        ratios.iter().rev().take(3).all(|(_, r)| *r >= 99.0),
        "the hit ratio recovered: {ratios:?}"
    );
    assert!(
        sizes.windows(2).all(|w| w[1] == w[0] + 1) && (2..=4).contains(&last_size),
        "one member at a time, within maxSize: {sizes:?}"
    );

    // The load stops and its items expire: one member fewer per window, down to minSize.
    let stopped = Instant::now();
    let mut steps = vec![(Duration::ZERO, last_size)];
    while steps.last().unwrap().1 > 1 && stopped.elapsed() < Duration::from_secs(300) {
        let size = mcs.get("cache").await.unwrap().spec.size;
        if size != steps.last().unwrap().1 {
            steps.push((stopped.elapsed(), size));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("without load: {steps:?}");
    assert_eq!(
        steps.last().unwrap().1,
        1,
        "scaled in to minSize: {steps:?}"
    );
    for w in steps.windows(2) {
        assert_eq!(w[1].1, w[0].1 - 1, "one member at a time: {steps:?}");
        assert!(
            w[1].0 - w[0].0 >= SCALE_IN_WINDOW,
            "a window between steps: {steps:?}"
        );
    }
    tokio::time::sleep(SCALE_IN_WINDOW + Duration::from_secs(10)).await;
    let (size, reason, _) = status_of(&mcs.get("cache").await.unwrap());
    assert_eq!(size, 1, "never below minSize ({reason})");
    let events = events_for(&client, &ns, "cache").await;
    let scaled = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Autoscaled"))
        .count();
    assert_eq!(
        scaled,
        2 * (last_size as usize - 1),
        "an event per scale: {events:#?}"
    );
}
