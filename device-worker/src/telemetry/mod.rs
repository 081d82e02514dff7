//! Telemetry of the worker (and the shared pieces the gateway uses): Prometheus metrics,
//! energy sampling, and OpenTelemetry tracing with W3C trace-context propagation.
//!
//! - [`prometheus`]: installing the process-wide recorder once (gateway and worker share it
//!   when they run in one process), rendering it, and the worker's `GET /metrics` server.
//! - [`request`]: [`request::RequestObserver`], the one place a Generate request's metrics and
//!   spans (`request` → `prefill` → `decode`, checkpoint restores as events) are recorded.
//! - [`power`]: the power figures ([`crate::power::PowerFigures`]) as gauges and counters.
//! - [`energy`]: the process's [`crate::energy::EnergyMeter`] (source detected once), sampled
//!   around each request by the engine and every second while idle.
//! - [`otel`]: the `tracing` subscriber with an optional OTLP/gRPC span exporter, and
//!   `traceparent` inject/extract on tonic metadata.
//!
//! Metric names, labels and buckets: [`tandem_proto::metric_names`].

pub mod energy;
pub mod error;
pub mod otel;
pub mod power;
pub mod prometheus;
pub mod request;

pub use error::TelemetryError;

/// The telemetry options of `device-worker serve`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TelemetryArgs {
    /// Address to serve Prometheus `GET /metrics` on (e.g. `127.0.0.1:9464`); unset: off.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub otel: otel::OtelArgs,
}
