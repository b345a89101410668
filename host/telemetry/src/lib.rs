//! What the node tells its operators about itself: the Prometheus registry and its `/metrics`
//! endpoint ([`metrics`]), and the OTLP export of those metrics and of one trace per placement
//! ([`telemetry`]).
//!
//! It records and exports; it decides nothing. Nothing here reads a metric back to change what
//! the node does, and it holds no Kubernetes client.

pub mod metrics;
pub mod telemetry;
