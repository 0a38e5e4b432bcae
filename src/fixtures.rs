//! Test fixtures: Memcached and Deployment objects as the API server would return them.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Memcached, MemcachedSpec};
use crate::resources;

/// A Memcached in namespace `default` with a uid and generation 1, as stored by the API server.
pub fn memcached(name: &str, size: i32) -> Memcached {
    let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({ "size": size })).unwrap();
    let mut mc = Memcached::new(name, spec);
    mc.metadata.namespace = Some("default".into());
    mc.metadata.uid = Some(format!("uid-{name}"));
    mc.metadata.generation = Some(1);
    mc.metadata.resource_version = Some("1".into());
    mc
}

/// The Deployment the operator would create for `mc`, with a status as the API server reports it.
pub fn deployment_with_status(mc: &Memcached, replicas: i32, ready: i32) -> Deployment {
    let mut d = resources::deployment(mc, resources::FALLBACK_MEMCACHED_IMAGE);
    d.metadata.generation = Some(1);
    d.metadata.resource_version = Some("10".into());
    d.status = Some(DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(replicas),
        ready_replicas: Some(ready),
        updated_replicas: Some(replicas),
        available_replicas: Some(ready),
        ..DeploymentStatus::default()
    });
    d
}

/// A fixed point in time, `secs` after the epoch.
pub fn time(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
}
