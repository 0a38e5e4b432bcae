//! memcached-operator: a Kubernetes operator for Memcached.

pub mod agent;
pub mod api;
#[cfg(any(test, feature = "arbitrary"))]
pub mod arbitrary;
pub mod autoscaling;
pub mod certificate;
pub mod config;
pub mod controller;
pub mod error;
pub mod manager;
pub mod metrics;
pub mod resources;
pub mod service_monitor;
pub mod status;
pub mod validation;
pub mod watch;

#[cfg(test)]
pub mod fixtures;
