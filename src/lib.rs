//! memcached-operator: a Kubernetes operator for Memcached.

pub mod api;
pub mod backoff;
pub mod config;
pub mod controller;
pub mod drift;
pub mod manager;
pub mod shutdown;
pub mod telemetry;
pub mod error;
pub mod metrics;
pub mod resources;
pub mod status;

#[cfg(test)]
pub mod fixtures;
