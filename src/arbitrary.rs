//! proptest strategies for Memcached specs: every value the CRD schema admits, within its
//! documented bounds, so property tests cover what users can store.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::collection::btree_map;
use proptest::option;
use proptest::prelude::*;

use crate::api::{MAX_SIZE, MemcachedSpec};

/// A non-negative quantity in one of the forms the API accepts: plain, decimal, milli, binary
/// and decimal suffixes, exponent.
pub fn quantity() -> impl Strategy<Value = Quantity> {
    let suffix = prop_oneof![
        Just(""),
        Just("m"),
        Just("k"),
        Just("M"),
        Just("G"),
        Just("Ki"),
        Just("Mi"),
        Just("Gi"),
        Just("e3"),
        Just("E-2"),
    ];
    (0u32..5000, option::of(0u32..100), suffix).prop_map(|(whole, fraction, suffix)| {
        let number = match fraction {
            Some(f) => format!("{whole}.{f}"),
            None => whole.to_string(),
        };
        Quantity(format!("{number}{suffix}"))
    })
}

fn quantities() -> impl Strategy<Value = Option<BTreeMap<String, Quantity>>> {
    let resource = prop_oneof![
        Just("cpu".to_string()),
        Just("memory".to_string()),
        Just("ephemeral-storage".to_string()),
    ];
    option::of(btree_map(resource, quantity(), 0..3))
}

fn image() -> impl Strategy<Value = Option<String>> {
    option::of(prop_oneof![
        Just("memcached:1.6.45-alpine".to_string()),
        Just("memcached".to_string()),
        "[a-z][a-z0-9]{0,12}(/[a-z0-9]{1,12}){0,2}(:[a-z0-9.]{1,10})?",
    ])
}

/// Any spec the schema admits.
pub fn spec() -> impl Strategy<Value = MemcachedSpec> {
    let resources = option::of((quantities(), quantities()).prop_map(|(requests, limits)| {
        ResourceRequirements {
            requests,
            limits,
            ..Default::default()
        }
    }));
    (0..=MAX_SIZE, image(), 1..=65535i32, 1..=65536i32, resources).prop_map(
        |(size, image, container_port, max_memory_mib, resources)| MemcachedSpec {
            size,
            image,
            container_port,
            max_memory_mib,
            resources,
        },
    )
}
