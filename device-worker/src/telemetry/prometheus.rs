//! The worker's Prometheus series: HELP lines and zero values of the `worker_*` metrics,
//! installed once per process on top of the shared recorder ([`tandem_telemetry::prometheus`]).

use std::sync::Once;

use metrics_exporter_prometheus::PrometheusHandle;
use tandem_telemetry::metric_names as m;
use tandem_telemetry::TelemetryError;

static WORKER_SERIES: Once = Once::new();

/// Installs the recorder (see [`install`]) and, once per process, the HELP lines of the
/// `worker_*` metrics and zero values for the series that may stay at zero for a long time
/// (so dashboards and `rate()` see 0 rather than nothing). Called by the worker's metrics
/// server; a gateway-only process never shows `worker_*` series.
///
/// Errors: those of [`install`].
pub fn install_worker() -> Result<PrometheusHandle, TelemetryError> {
    let h = tandem_telemetry::prometheus::install()?;
    WORKER_SERIES.call_once(|| {
        describe_worker();
        ::metrics::gauge!(m::WORKER_REQUESTS_IN_FLIGHT).increment(0.0);
        for outcome in super::request::Outcome::ALL {
            ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => outcome.as_str()).increment(0);
        }
        for class in crate::error::ErrorClass::ALL {
            ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => "refused", m::LABEL_REASON => class.as_str()).increment(0);
        }
        ::metrics::counter!(m::WORKER_REQUESTS_TOTAL, m::LABEL_OUTCOME => "refused", m::LABEL_REASON => super::request::UNAUTHENTICATED_REASON).increment(0);
        // Whether a drafter proposes at all depends on timing and on the machine (the
        // policy drafts only when verification pays off), so its series start at 0.
        for drafter in crate::speculative::DrafterKind::ALL {
            for outcome in ["proposed", "accepted"] {
                ::metrics::counter!(m::WORKER_DRAFT_TOKENS_TOTAL, m::LABEL_DRAFTER => drafter.name(), m::LABEL_OUTCOME => outcome).increment(0);
            }
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
    describe_counter!(m::WORKER_REQUESTS_TOTAL, "Requests by outcome (ok, error, cancelled; refused at admission or for their token, by reason).");
    describe_counter!(m::WORKER_PREFILL_TOKENS_TOTAL, "Prompt tokens, new (prefilled) or reused (KV cache).");
    describe_counter!(m::WORKER_KV_BOUND_TOKENS_TOTAL, "Prompt tokens an ideal LCP KV cache would reuse.");
    describe_counter!(m::WORKER_DECODE_TOKENS_TOTAL, "Output tokens.");
    describe_counter!(m::WORKER_DECODE_PASSES_TOTAL, "Target-model passes of the decode phase (plain steps and verification passes).");
    describe_counter!(m::WORKER_DRAFT_TOKENS_TOTAL, "Speculative draft tokens by drafter, proposed or accepted by verification.");
    describe_counter!(m::WORKER_CHECKPOINT_EVENTS_TOTAL, "Recurrent-state checkpoint events.");
    describe_gauge!(m::WORKER_CHECKPOINT_BYTES_HELD, "Bytes of saved checkpoint states held after the latest request.");
    describe_counter!(m::WORKER_SLOT_EVICTIONS_TOTAL, "Live sessions that lost their slot to a new session (every slot bound).");
    describe_gauge!(m::WORKER_POWER_STATE, "1 for the current power state.");
    describe_counter!(m::WORKER_COLD_STARTS_TOTAL, "Model reloads after an idle unload.");
    describe_counter!(m::WORKER_RELEASE_CYCLES_TOTAL, "Power-vote releases (active to released).");
    describe_counter!(m::WORKER_WATCHDOG_RESTARTS_TOTAL, "Engines restarted by the watchdog.");
    describe_gauge!(m::WORKER_ENERGY_AVAILABLE, "1 when an energy source exists (label source), else 0 with source=unavailable.");
    describe_counter!(m::WORKER_ENERGY_JOULES_TOTAL, "Energy measured since the worker started, joules.");
    describe_gauge!(m::WORKER_IDLE_POWER_WATTS, "Power measured while no request ran, watts.");
}
