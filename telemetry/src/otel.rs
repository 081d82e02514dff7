//! Tracing setup shared by the worker and the gateway: a `tracing` subscriber (log lines to
//! stderr, `RUST_LOG` filter) with, when an OTLP endpoint is given, an OpenTelemetry layer
//! exporting spans over OTLP/gRPC (batched); and W3C trace context (`traceparent`,
//! <https://www.w3.org/TR/trace-context/>) injected into and extracted from tonic metadata, so
//! a worker's `request` span is a child of the gateway's `generate` span.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::error::TelemetryError;

/// The OpenTelemetry options of `serve` (worker and gateway).
#[derive(clap::Args, Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct OtelArgs {
    /// OTLP/gRPC endpoint spans are exported to (e.g. `http://127.0.0.1:4317`); unset: no
    /// export, spans only reach the log.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}

/// Flushes and shuts the span exporter down when dropped (keep it alive in `main`).
pub struct TracingGuard(Option<SdkTracerProvider>);

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("OpenTelemetry span exporter shutdown: {e}");
            }
        }
    }
}

/// A tracer provider named `service` (the `service.name` resource) whose spans go to
/// `exporter` in batches.
pub fn batch_provider(service: &'static str, exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static) -> SdkTracerProvider {
    SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service).build())
        .with_batch_exporter(exporter)
        .build()
}

/// The OTLP/gRPC (tonic) span exporter for `endpoint` (e.g. `http://127.0.0.1:4317`), batched
/// in a provider named `service` — the export path [`init`] sets up for `--otlp-endpoint`,
/// without installing any subscriber (pair it with [`layer`]). Call it inside a tokio runtime
/// (the gRPC channel is created lazily on it); spans reach the endpoint in batches, or on
/// `force_flush`/`shutdown` of the returned provider.
///
/// Errors: [`TelemetryError::Otlp`] when the exporter cannot be built (e.g. a malformed
/// endpoint URI).
pub fn otlp_provider(service: &'static str, endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Otlp { endpoint: endpoint.to_string(), reason: e.to_string() })?;
    Ok(batch_provider(service, exporter))
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider, service: &'static str) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(service))
}

/// Installs the global subscriber: the `RUST_LOG` filter (default `info`), log lines to
/// stderr, and with `otlp_endpoint` the OTLP/gRPC span export as `service`. Call it inside a
/// tokio runtime when an endpoint is given (the gRPC channel is created on it).
///
/// Errors: [`TelemetryError::Otlp`] when the exporter cannot be built;
/// [`TelemetryError::SubscriberTaken`] when a global subscriber is already set.
pub fn init(service: &'static str, otlp_endpoint: Option<&str>) -> Result<TracingGuard, TelemetryError> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer().with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr);
    let provider = match otlp_endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => Some(otlp_provider(service, endpoint)?),
        None => None,
    };
    let otel = provider.as_ref().map(|p| layer(p, service));
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| TelemetryError::SubscriberTaken(e.to_string()))?;
    if let Some(endpoint) = otlp_endpoint {
        tracing::info!(%endpoint, service, "exporting spans over OTLP/gRPC");
    }
    Ok(TracingGuard(provider))
}

/// Writes the W3C `traceparent` (and `tracestate`) of `span` into `metadata`; writes nothing
/// when the span has no OpenTelemetry context (no OTel layer installed, or a disabled span).
pub fn inject(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    let cx = span.context();
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
}

/// The remote parent context carried by `metadata`'s `traceparent` (an empty context when
/// absent or malformed).
pub fn extract(metadata: &tonic::metadata::MetadataMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&MetadataExtractor(metadata))
}

/// Makes `span` a child of the remote context in `metadata` (no-op without one).
pub fn set_remote_parent(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let cx = extract(metadata);
    if opentelemetry::trace::TraceContextExt::has_active_span(&cx) {
        if let Err(e) = span.set_parent(cx) {
            tracing::debug!(error = %e, "cannot set the remote trace parent");
        }
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let (Ok(k), Ok(v)) = (tonic::metadata::MetadataKey::from_bytes(key.as_bytes()), value.parse()) else { return };
        self.0.insert(k, v);
    }
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_through_metadata() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
        let cx = extract(&md);
        use opentelemetry::trace::TraceContextExt;
        let sc = cx.span().span_context().clone();
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_remote() && sc.is_sampled());
        let mut out = tonic::metadata::MetadataMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(&mut out));
        assert_eq!(out.get("traceparent").and_then(|v| v.to_str().ok()), md.get("traceparent").and_then(|v| v.to_str().ok()));
    }

    #[test]
    fn no_context_injects_nothing_and_garbage_extracts_nothing() {
        let mut md = tonic::metadata::MetadataMap::new();
        inject(&tracing::Span::none(), &mut md);
        assert!(md.get("traceparent").is_none());
        md.insert("traceparent", "not-a-traceparent".parse().unwrap());
        use opentelemetry::trace::TraceContextExt;
        assert!(!extract(&md).has_active_span());
    }
}
