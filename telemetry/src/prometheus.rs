//! The process-wide Prometheus recorder (`metrics-exporter-prometheus`, no listener of its
//! own), installed once and shared by the gateway and the worker when both run in one process
//! (the e2e tests), and its text rendering for the `GET /metrics` handlers of both servers.

use std::sync::{Mutex, OnceLock, PoisonError};

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
    // One installer at a time: a second caller waits and then finds the first one's handle
    // (without the lock, a caller that lost the race to set the global recorder could look
    // for the handle before the winner stored it, and fail: seen in the e2e tests, whose
    // tests each start servers in one process).
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(PoisonError::into_inner);
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


#[cfg(test)]
mod tests {
    /// Callers racing from many threads all get the one recorder's handle (one of them failed
    /// now and then when the handle was stored after the global recorder was set).
    #[test]
    fn concurrent_installs_all_get_the_handle() {
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            let calls: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        super::install().map(|_| ())
                    })
                })
                .collect();
            for c in calls {
                c.join().expect("no panic").expect("every caller gets the handle");
            }
        });
    }
}
