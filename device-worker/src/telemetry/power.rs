//! The power figures ([`PowerFigures`], kept by the idle controller and the watchdog) as
//! Prometheus series: copied as they are at each scrape (counters set to the figures' totals,
//! the state as a 0/1 gauge per state). Wake-up latencies are recorded per request from
//! `FinalStats.wake_ms` by [`super::request`], with the shared latency buckets.

use tandem_telemetry::metric_names as m;

use crate::power::PowerFigures;

/// Every value of the `state` label of [`m::WORKER_POWER_STATE`].
pub const STATES: [&str; 4] = ["active", "released", "unloaded", "loading"];

/// Sets the power series from `f`: state gauge (1 for `f.state`, or for `"loading"` when
/// `loading`; 0 for the others), cold starts, release cycles and watchdog restarts (absolute
/// counter values). A no-op without an installed recorder.
pub fn record(f: &PowerFigures, loading: bool) {
    let current = if loading { "loading" } else { f.state.as_str() };
    for s in STATES {
        ::metrics::gauge!(m::WORKER_POWER_STATE, m::LABEL_STATE => s).set(if s == current { 1.0 } else { 0.0 });
    }
    ::metrics::counter!(m::WORKER_COLD_STARTS_TOTAL).absolute(f.cold_starts);
    ::metrics::counter!(m::WORKER_RELEASE_CYCLES_TOTAL).absolute(f.release_cycles);
    ::metrics::counter!(m::WORKER_WATCHDOG_RESTARTS_TOTAL).absolute(f.watchdog_restarts);
}
