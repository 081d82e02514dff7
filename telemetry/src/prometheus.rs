//! The process-wide Prometheus recorder (`metrics-exporter-prometheus`, no listener of its
//! own), installed once and shared by the gateway and the worker when both run in one process
//! (the e2e tests), and its text rendering for the `GET /metrics` handlers of both servers.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use crate::error::TelemetryError;
use crate::metric_names as m;

/// The `Content-Type` of the Prometheus text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder with the buckets of [`m::HISTOGRAMS`], once; later
/// calls (from either crate) return the same handle.
///
/// Errors: [`TelemetryError::RecorderTaken`] when a recorder other than this one is already
/// installed; [`TelemetryError::Buckets`] for an empty bucket list.
pub fn install() -> Result<PrometheusHandle, TelemetryError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in m::HISTOGRAMS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)
            .map_err(|e| TelemetryError::Buckets { metric: name, reason: e.to_string() })?;
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    // Two racing callers: the loser's set_global_recorder fails, and it returns the winner's.
    match ::metrics::set_global_recorder(recorder) {
        Ok(()) => Ok(HANDLE.get_or_init(|| handle).clone()),
        Err(e) => HANDLE.get().cloned().ok_or_else(|| TelemetryError::RecorderTaken(e.to_string())),
    }
}

/// The text exposition of every metric recorded so far (runs the exporter's upkeep first so
/// histograms are drained).
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

