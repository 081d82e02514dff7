//! Telemetry shared by the device-worker and the agent-gateway (and nothing of either):
//!
//! - [`otel`]: the `tracing` subscriber (log lines to stderr, `RUST_LOG`) with an optional
//!   OTLP/gRPC span exporter, and W3C `traceparent` inject/extract on tonic metadata, so a
//!   worker's `request` span joins the gateway's step trace.
//! - [`prometheus`]: the process-wide Prometheus recorder, installed once with the buckets of
//!   [`metric_names::HISTOGRAMS`] (both servers share it when they run in one process, as in
//!   the e2e tests), and its text rendering.
//! - [`metric_names`]: every metric name, label and bucket list, the one definition the
//!   binaries, the Grafana dashboards and the recording rules use.
//! - [`shutdown`]: the graceful-shutdown signal (SIGINT/SIGTERM, then a bounded drain).
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod error;
pub mod metric_names;
pub mod otel;
pub mod prometheus;
pub mod shutdown;

pub use error::TelemetryError;
