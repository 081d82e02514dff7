//! Errors of the telemetry crate.

/// What went wrong setting up telemetry.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A recorder other than [`crate::prometheus::install`]'s is already installed.
    #[error("a metrics recorder is already installed in this process: {0}")]
    RecorderTaken(String),
    /// The histogram bucket list of a metric was rejected (expected a non-empty list).
    #[error("buckets of {metric}: {reason}")]
    Buckets { metric: &'static str, reason: String },
    /// The OTLP span exporter could not be built for the endpoint.
    #[error("OTLP exporter for {endpoint}: {reason}")]
    Otlp { endpoint: String, reason: String },
    /// A global `tracing` subscriber is already set.
    #[error("a tracing subscriber is already installed: {0}")]
    SubscriberTaken(String),
    /// The metrics listener could not be served.
    #[error("metrics server on {addr}: {reason}")]
    Serve { addr: String, reason: String },
}
