//! The process's energy meter: the power source is detected once (RAPL, then a battery fuel
//! gauge, see [`crate::energy::detect`]); the engine samples it around each request
//! ([`begin_request`] / [`end_request`]) and a background thread every [`IDLE_TICK`] while
//! idle. Without a source `worker_energy_available{source="unavailable"}` is 0 and no energy
//! figure is ever recorded.

use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tandem_telemetry::metric_names as m;

use crate::energy::{detect, EnergyMeter, StepEnergy, StepMark};

/// Interval of the idle sampler thread.
pub const IDLE_TICK: Duration = Duration::from_secs(1);

static METER: OnceLock<Option<Mutex<EnergyMeter>>> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Monotonic time since the first call in this process (the meter's clock).
fn now() -> Duration {
    EPOCH.get_or_init(Instant::now).elapsed()
}

/// The process's meter, detecting the source under `/` on the first call and starting the
/// idle sampler thread when one exists; `None` when energy is unavailable.
pub fn meter() -> Option<&'static Mutex<EnergyMeter>> {
    METER
        .get_or_init(|| {
            let meter = EnergyMeter::new(detect(Path::new("/")));
            let name = meter.source_name();
            tracing::info!(source = name.unwrap_or("unavailable"), "energy source");
            name.map(|_| Mutex::new(meter))
        })
        .as_ref()
        .inspect(|_| start_idle_sampler())
}

/// Spawns the idle sampler thread once (only called when a source exists).
fn start_idle_sampler() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new().name("energy-idle".into()).spawn(|| loop {
            std::thread::sleep(IDLE_TICK);
            if let Some(meter) = METER.get().and_then(Option::as_ref) {
                let mut mt = meter.lock().unwrap_or_else(PoisonError::into_inner);
                match mt.idle_tick(now()) {
                    Ok(_) => record_totals(&mt),
                    Err(e) => tracing::debug!(error = %e, "energy idle sample failed"),
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the energy idle sampler; idle power stays unknown");
        }
    });
}

/// Sets [`m::WORKER_ENERGY_AVAILABLE`] for the detected source (1), or
/// `{source="unavailable"}` 0 (detects the source if not done yet).
pub fn publish_availability() {
    match meter() {
        Some(mt) => {
            let mt = mt.lock().unwrap_or_else(PoisonError::into_inner);
            record_availability(mt.source_name());
        }
        None => record_availability(None),
    }
}

/// Sets [`m::WORKER_ENERGY_AVAILABLE`]: `{source=name}` 1, or `{source="unavailable"}` 0.
fn record_availability(source: Option<&'static str>) {
    match source {
        Some(name) => ::metrics::gauge!(m::WORKER_ENERGY_AVAILABLE, m::LABEL_SOURCE => name).set(1.0),
        None => ::metrics::gauge!(m::WORKER_ENERGY_AVAILABLE, m::LABEL_SOURCE => "unavailable").set(0.0),
    }
}

/// Total joules and idle power of `mt`, when known.
fn record_totals(mt: &EnergyMeter) {
    let Some(source) = mt.source_name() else { return };
    if let Some(j) = mt.total_joules() {
        // The counter takes integers: millijoules would change the unit, so whole joules.
        ::metrics::counter!(m::WORKER_ENERGY_JOULES_TOTAL, m::LABEL_SOURCE => source).absolute(j.max(0.0) as u64);
    }
    if let Some(w) = mt.idle_power_watts() {
        ::metrics::gauge!(m::WORKER_IDLE_POWER_WATTS, m::LABEL_SOURCE => source).set(w);
    }
}

/// One request's start sample (or nothing when energy is unavailable).
#[must_use = "pass it to end_request"]
pub struct RequestEnergy(Option<StepMark>);

/// Samples the meter as the engine starts serving a request.
pub fn begin_request() -> RequestEnergy {
    let Some(meter) = meter() else { return RequestEnergy(None) };
    let mut mt = meter.lock().unwrap_or_else(PoisonError::into_inner);
    match mt.begin_step(now()) {
        Ok(mark) => RequestEnergy(mark),
        Err(e) => {
            tracing::debug!(error = %e, "energy sample at request start failed");
            RequestEnergy(None)
        }
    }
}

/// Samples the meter as the request ends and records its energy above idle
/// ([`m::WORKER_STEP_ENERGY_JOULES`], once the idle power is known) and the totals. Returns
/// the request's figures (`None` when unavailable).
pub fn end_request(begun: RequestEnergy) -> Option<StepEnergy> {
    // No mark: energy unavailable, or the start sample failed (the meter then did not count
    // the request as running).
    let mark = begun.0?;
    let meter = meter()?;
    let mut mt = meter.lock().unwrap_or_else(PoisonError::into_inner);
    match mt.end_step(mark, now()) {
        Ok(e) => {
            record_step(mt.source_name(), &e);
            record_totals(&mt);
            Some(e)
        }
        Err(err) => {
            tracing::debug!(error = %err, "energy sample at request end failed");
            None
        }
    }
}

/// Records one request's energy above idle (when known) under `source`.
fn record_step(source: Option<&'static str>, e: &StepEnergy) {
    if let (Some(source), Some(j)) = (source, e.above_idle_j) {
        ::metrics::histogram!(m::WORKER_STEP_ENERGY_JOULES, m::LABEL_SOURCE => source).record(j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::request::tests::with_recorder;

    #[test]
    fn unavailable_source_is_a_zero_gauge_and_no_energy_series() {
        let text = with_recorder(|| {
            record_availability(None);
            record_step(None, &StepEnergy { duration: Duration::from_secs(1), energy_j: 3.0, above_idle_j: Some(1.0) });
        });
        assert!(text.contains("worker_energy_available{source=\"unavailable\"} 0"), "{text}");
        assert!(!text.contains("worker_step_energy_joules"), "{text}");
    }

    #[test]
    fn a_source_records_energy_above_idle() {
        let text = with_recorder(|| {
            record_availability(Some("rapl"));
            record_step(Some("rapl"), &StepEnergy { duration: Duration::from_secs(2), energy_j: 9.0, above_idle_j: Some(4.5) });
            // Before the first idle interval there is no "above idle" figure: nothing recorded.
            record_step(Some("rapl"), &StepEnergy { duration: Duration::from_secs(2), energy_j: 9.0, above_idle_j: None });
        });
        assert!(text.contains("worker_energy_available{source=\"rapl\"} 1"), "{text}");
        assert!(text.contains("worker_step_energy_joules_sum{source=\"rapl\"} 4.5"), "{text}");
        assert!(text.contains("worker_step_energy_joules_count{source=\"rapl\"} 1"), "{text}");
    }
}
