//! The worker's own telemetry, recorded on top of the shared recorder and tracing setup of
//! [`tandem_telemetry`] (names, labels and buckets: [`tandem_telemetry::metric_names`]):
//!
//! - [`prometheus`]: the `worker_*` series' HELP lines and zero values, installed once.
//! - [`request`]: [`request::RequestObserver`], the one place a Generate request's metrics and
//!   spans (`request` → `prefill` → `decode`, checkpoint restores as events) are recorded.
//! - [`power`]: the power figures ([`crate::power::PowerFigures`]) as gauges and counters.
//! - [`energy`]: the process's [`crate::energy::EnergyMeter`] (source detected once), sampled
//!   around each request by the engine and every second while idle.
//!
//! The `GET /metrics` server lives with the other servers in [`crate::service::metrics`]:
//! nothing here knows the engine.

pub mod energy;
pub mod power;
pub mod prometheus;
pub mod request;

/// The telemetry options of `device-worker serve`.
#[derive(clap::Args, Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TelemetryArgs {
    /// Address to serve Prometheus `GET /metrics` on, IP:PORT (e.g. `127.0.0.1:9464`); unset:
    /// off.
    #[arg(long, value_name = "ADDR", value_parser = tandem_auth::listen::socket_addr)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    #[serde(flatten)]
    pub otel: tandem_telemetry::otel::OtelArgs,
}
