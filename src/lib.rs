//! memcached-operator: a Kubernetes operator for Memcached.

pub mod api;
pub mod backoff;
pub mod config;
pub mod controller;
pub mod drift;
pub mod error;
pub mod manager;
pub mod metrics;
pub mod resources;
pub mod shutdown;
pub mod status;
pub mod telemetry;

#[cfg(test)]
pub mod fixtures;
