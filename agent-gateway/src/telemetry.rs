//! Tracing around a step: the gateway runs each step in a `step` span (fields `episode`,
//! `step`, `kind`) with children `route` and `generate` (see [`crate::step`]); they reach the
//! log through `tracing-subscriber`.
//!
//! Not built yet: the OpenTelemetry OTLP export of these spans and the W3C `traceparent`
//! propagation to the worker. [`with_trace_context`] is the one place a worker request is
//! wrapped, so the propagation goes in here.

/// Wraps a worker request in a [`tonic::Request`]. Today it carries no trace metadata (see
/// the module docs).
pub fn with_trace_context<T>(message: T) -> tonic::Request<T> {
    tonic::Request::new(message)
}
