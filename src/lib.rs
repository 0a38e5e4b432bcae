//! memcached-operator: a Kubernetes operator for Memcached.

pub mod admin;
pub mod api;
#[cfg(any(test, feature = "arbitrary"))]
pub mod arbitrary;
pub mod backoff;
pub mod config;
pub mod controller;
pub mod drift;
pub mod error;
pub mod health;
pub mod leader;
pub mod manager;
pub mod metrics;
pub mod metrics_auth;
pub mod resources;
pub mod service_monitor;
pub mod shutdown;
pub mod status;
pub mod telemetry;
pub mod validation;
pub mod watch_namespace;

#[cfg(test)]
pub mod fixtures;
