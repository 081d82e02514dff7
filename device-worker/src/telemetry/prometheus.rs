//! The process-wide Prometheus recorder (`metrics-exporter-prometheus`, no listener of its
//! own), installed once and shared by the gateway and the worker when both run in one process
//! (the e2e tests), and the worker's `GET /metrics` server (`--metrics-listen`).

use std::sync::{Once, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tandem_proto::metric_names as m;

use super::TelemetryError;
use crate::engine::EngineHandle;

/// The `Content-Type` of the Prometheus text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
static WORKER_SERIES: Once = Once::new();

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

/// Installs the recorder (see [`install`]) and, once per process, the HELP lines of the
/// `worker_*` metrics and zero values for the series that may stay at zero for a long time
/// (so dashboards and `rate()` see 0 rather than nothing). Called by the worker's metrics
/// server; a gateway-only process never shows `worker_*` series.
///
/// Errors: those of [`install`].
pub fn install_worker() -> Result<PrometheusHandle, TelemetryError> {
    let h = install()?;
    WORKER_SERIES.call_once(|| {
        describe_worker();
        ::metrics::gauge!(m::WORKER_REQUESTS_IN_FLIGHT).increment(0.0);
        for outcome in super::request::Outcome::ALL {
            ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => outcome.as_str()).increment(0);
        }
        for event in ["save", "restore", "evict"] {
            ::metrics::counter!(m::WORKER_CHECKPOINT_EVENTS_TOTAL, m::LABEL_EVENT => event).increment(0);
        }
        super::energy::publish_availability();
    });
    Ok(h)
}

/// HELP lines of the worker's metrics (see [`m`] for labels).
fn describe_worker() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(m::WORKER_REQUEST_DURATION_SECONDS, Unit::Seconds, "Generate request, dequeue to last token.");
    describe_histogram!(m::WORKER_QUEUE_WAIT_SECONDS, Unit::Seconds, "Time a request waited in the queue.");
    describe_histogram!(m::WORKER_TIME_TO_FIRST_TOKEN_SECONDS, Unit::Seconds, "Dequeue to the first output token.");
    describe_histogram!(m::WORKER_PREFILL_DURATION_SECONDS, Unit::Seconds, "Prefill time per request.");
    describe_histogram!(m::WORKER_DECODE_DURATION_SECONDS, Unit::Seconds, "Decode time per request.");
    describe_histogram!(m::WORKER_WAKEUP_DURATION_SECONDS, Unit::Seconds, "Wake-up latency a request paid after a power release.");
    describe_histogram!(m::WORKER_STEP_ENERGY_JOULES, "Energy of one request above idle power, joules.");
    describe_gauge!(m::WORKER_REQUESTS_IN_FLIGHT, "Requests admitted and not finished.");
    describe_counter!(m::WORKER_REQUESTS_TOTAL, "Finished requests by outcome.");
    describe_counter!(m::WORKER_PREFILL_TOKENS_TOTAL, "Prompt tokens, new (prefilled) or reused (KV cache).");
    describe_counter!(m::WORKER_KV_BOUND_TOKENS_TOTAL, "Prompt tokens an ideal LCP KV cache would reuse.");
    describe_counter!(m::WORKER_DECODE_TOKENS_TOTAL, "Output tokens.");
    describe_counter!(m::WORKER_DECODE_PASSES_TOTAL, "Target-model passes of the decode phase (plain steps and verification passes).");
    describe_counter!(m::WORKER_DRAFT_TOKENS_TOTAL, "Speculative draft tokens by drafter, proposed or accepted by verification.");
    describe_counter!(m::WORKER_CHECKPOINT_EVENTS_TOTAL, "Recurrent-state checkpoint events.");
    describe_gauge!(m::WORKER_CHECKPOINT_BYTES_HELD, "Bytes of saved checkpoint states held after the latest request.");
    describe_gauge!(m::WORKER_POWER_STATE, "1 for the current power state.");
    describe_counter!(m::WORKER_COLD_STARTS_TOTAL, "Model reloads after an idle unload.");
    describe_counter!(m::WORKER_RELEASE_CYCLES_TOTAL, "Power-vote releases (active to released).");
    describe_counter!(m::WORKER_WATCHDOG_RESTARTS_TOTAL, "Engines restarted by the watchdog.");
    describe_gauge!(m::WORKER_ENERGY_AVAILABLE, "1 when an energy source exists (label source), else 0 with source=unavailable.");
    describe_counter!(m::WORKER_ENERGY_JOULES_TOTAL, "Energy measured since the worker started, joules.");
    describe_gauge!(m::WORKER_IDLE_POWER_WATTS, "Power measured while no request ran, watts.");
}

/// The worker's `/metrics` router: refreshes the power figures of `engine` (so the power
/// state is current at each scrape), then renders `handle`.
pub fn app(engine: EngineHandle, handle: PrometheusHandle) -> axum::Router {
    use axum::http::{header, HeaderValue};
    use axum::response::IntoResponse;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let engine = engine.clone();
            let handle = handle.clone();
            async move {
                super::power::record(&engine.power(), super::power::is_loading(&engine));
                let mut resp = render(&handle).into_response();
                resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
                resp
            }
        }),
    )
}

/// Serves [`app`] on `listener` until `shutdown` resolves (installs the recorder and the
/// worker's series first, see [`install_worker`]).
///
/// Errors: [`install_worker`]'s; [`TelemetryError::Serve`] when the server fails.
pub async fn serve(
    engine: EngineHandle,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), TelemetryError> {
    let handle = install_worker()?;
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    axum::serve(listener, app(engine, handle))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| TelemetryError::Serve { addr, reason: e.to_string() })
}
