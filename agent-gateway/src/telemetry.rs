//! Tracing around a step: the gateway runs each step in a `step` span (fields `episode`,
//! `step`, `kind`) with children `route` and `generate` (see [`crate::step`]). With
//! `--otlp-endpoint` they are exported over OTLP/gRPC
//! ([`tandem_telemetry::otel::init`]), and each worker request carries the W3C
//! `traceparent` of the current span, so the worker's `request` → `prefill` → `decode` spans
//! join the step's trace as children of `generate`.

/// Wraps a worker request in a [`tonic::Request`] whose metadata carries the trace context
/// (`traceparent`, `tracestate`) of the current span; no metadata when tracing has no
/// OpenTelemetry layer.
pub fn with_trace_context<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    tandem_telemetry::otel::inject(&tracing::Span::current(), request.metadata_mut());
    request
}
