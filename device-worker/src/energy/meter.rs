//! [`EnergyMeter`]: samples a [`PowerSource`] at step boundaries and on idle ticks, and derives
//! each step's energy, its energy above idle, and the idle power.
//!
//! Definitions (DESIGN.md "Figures every step records"):
//! - step energy E = E(t_end) − E(t_begin), the whole device (or package) over the step; with
//!   concurrent requests their spans overlap and each is charged the whole device.
//! - idle power P_idle = ΔE / Δt over the latest sampling interval of at least
//!   [`MIN_IDLE_INTERVAL`] during which no step ran.
//! - energy above idle = E − P_idle × (t_end − t_begin) (may be slightly negative from noise;
//!   reported as measured). Unknown until one idle interval was seen.

use std::time::Duration;

use super::{EnergyError, PowerSource};

/// Shortest idle interval that updates the idle power (shorter ones are too noisy for a fuel
/// gauge and too short for RAPL's ~1 ms update period to matter).
pub const MIN_IDLE_INTERVAL: Duration = Duration::from_millis(100);

/// A step's start sample, from [`EnergyMeter::begin_step`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepMark {
    t: Duration,
    energy_j: f64,
}

/// One step's energy figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepEnergy {
    /// Step duration.
    pub duration: Duration,
    /// Energy over the step, joules.
    pub energy_j: f64,
    /// Energy above idle power over the step, joules; `None` before the first idle interval.
    pub above_idle_j: Option<f64>,
}

/// Samples one power source; without one every figure is `None` ("unavailable").
pub struct EnergyMeter {
    source: Option<Box<dyn PowerSource>>,
    /// The latest sample: (time, cumulative joules).
    last: Option<(Duration, f64)>,
    idle_power_w: Option<f64>,
    /// Steps running now.
    running: usize,
    /// A step ran at some time since the latest sample.
    busy_since_last: bool,
}

impl EnergyMeter {
    /// A meter over `source` (`None`: energy unavailable, see [`super::detect`]).
    pub fn new(source: Option<Box<dyn PowerSource>>) -> Self {
        Self { source, last: None, idle_power_w: None, running: 0, busy_since_last: false }
    }

    /// The source's name (`"rapl"`, `"fuel_gauge"`), or `None` when unavailable.
    pub fn source_name(&self) -> Option<&'static str> {
        self.source.as_ref().map(|s| s.name())
    }

    /// Idle power, watts, from the latest idle interval; `None` before one or without a source.
    pub fn idle_power_watts(&self) -> Option<f64> {
        self.idle_power_w
    }

    /// Joules measured since the first sample; `None` without a source or before any sample.
    pub fn total_joules(&self) -> Option<f64> {
        self.last.map(|(_, e)| e)
    }

    /// Takes a sample at `now`; when no step ran since the previous sample and the interval
    /// is at least [`MIN_IDLE_INTERVAL`], updates the idle power.
    fn sample(&mut self, now: Duration) -> Result<Option<(Duration, f64)>, EnergyError> {
        let Some(src) = self.source.as_mut() else { return Ok(None) };
        let e = src.energy_joules(now)?;
        if let Some((t0, e0)) = self.last {
            let dt = now.saturating_sub(t0);
            if !self.busy_since_last && self.running == 0 && dt >= MIN_IDLE_INTERVAL {
                self.idle_power_w = Some((e - e0) / dt.as_secs_f64());
            }
        }
        self.last = Some((now, e));
        self.busy_since_last = self.running > 0;
        Ok(self.last)
    }

    /// Samples at an idle tick (call it periodically, e.g. every second, from the worker's
    /// idle loop); returns the idle power after it.
    ///
    /// Errors: the source's [`EnergyError`].
    pub fn idle_tick(&mut self, now: Duration) -> Result<Option<f64>, EnergyError> {
        self.sample(now)?;
        Ok(self.idle_power_w)
    }

    /// Samples at a step's start; `None` when energy is unavailable.
    ///
    /// Errors: the source's [`EnergyError`] (the step is then not counted as running).
    pub fn begin_step(&mut self, now: Duration) -> Result<Option<StepMark>, EnergyError> {
        let s = self.sample(now)?;
        self.running += 1;
        self.busy_since_last = true;
        Ok(s.map(|(t, energy_j)| StepMark { t, energy_j }))
    }

    /// Samples at the end of the step that `mark` began.
    ///
    /// Errors: the source's [`EnergyError`]; the step stops counting as running either way.
    pub fn end_step(&mut self, mark: StepMark, now: Duration) -> Result<StepEnergy, EnergyError> {
        self.busy_since_last = true;
        let sampled = self.sample(now);
        self.running = self.running.saturating_sub(1);
        self.busy_since_last = self.running > 0;
        let (t, e) = sampled?.unwrap_or((now, mark.energy_j));
        let duration = t.saturating_sub(mark.t);
        let energy_j = e - mark.energy_j;
        let above_idle_j = self.idle_power_w.map(|p| energy_j - p * duration.as_secs_f64());
        Ok(StepEnergy { duration, energy_j, above_idle_j })
    }

    /// A step that began but will not end normally (cancelled before [`Self::end_step`]).
    pub fn abandon_step(&mut self) {
        self.running = self.running.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{battery, write};
    use super::super::{detect, FuelGauge, Rapl};
    use super::*;

    fn set_uj(root: &std::path::Path, uj: u64) {
        write(root, "sys/class/powercap/intel-rapl:0/energy_uj", &uj.to_string());
    }

    #[test]
    fn without_a_source_everything_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = EnergyMeter::new(detect(dir.path()));
        assert_eq!(m.source_name(), None);
        assert_eq!(m.idle_tick(Duration::from_secs(1)).unwrap(), None);
        assert_eq!(m.begin_step(Duration::from_secs(2)).unwrap(), None);
        assert_eq!(m.total_joules(), None);
    }

    #[test]
    fn rapl_idle_power_and_step_energy_above_idle_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "sys/class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850");
        set_uj(root, 1_000_000);
        let mut m = EnergyMeter::new(Rapl::open(root).map(|r| Box::new(r) as Box<dyn PowerSource>));
        assert_eq!(m.source_name(), Some("rapl"));
        m.idle_tick(Duration::from_secs(0)).unwrap();
        // 2 s idle at 1.5 W: +3 J.
        set_uj(root, 4_000_000);
        assert_eq!(m.idle_tick(Duration::from_secs(2)).unwrap(), Some(1.5));
        let mark = m.begin_step(Duration::from_secs(2)).unwrap().unwrap();
        // Mid-step tick: not an idle interval, the idle power must stay 1.5 W.
        set_uj(root, 9_000_000);
        assert_eq!(m.idle_tick(Duration::from_secs(3)).unwrap(), Some(1.5));
        // Step of 4 s, 12 J in all → 12 − 1.5 × 4 = 6 J above idle.
        set_uj(root, 16_000_000);
        let e = m.end_step(mark, Duration::from_secs(6)).unwrap();
        assert_eq!(e.duration, Duration::from_secs(4));
        assert!((e.energy_j - 12.0).abs() < 1e-9, "{e:?}");
        assert!((e.above_idle_j.unwrap() - 6.0).abs() < 1e-9, "{e:?}");
        // The interval ending the step is busy; the next one is idle again: 1 s at 0.5 W.
        set_uj(root, 16_500_000);
        assert!((m.idle_tick(Duration::from_secs(7)).unwrap().unwrap() - 0.5).abs() < 1e-9);
        assert!((m.total_joules().unwrap() - 15.5).abs() < 1e-9);
    }

    #[test]
    fn fuel_gauge_step_before_any_idle_interval_has_no_above_idle_figure() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "sys/class/power_supply/battery/type", "Battery");
        battery(root, -750_000, 4_000_000); // 3 W
        let mut m = EnergyMeter::new(FuelGauge::open(root).map(|g| Box::new(g) as Box<dyn PowerSource>));
        let mark = m.begin_step(Duration::from_secs(1)).unwrap().unwrap();
        write(root, "sys/class/power_supply/battery/current_now", "-1250000"); // 5 W
        let e = m.end_step(mark, Duration::from_secs(3)).unwrap();
        // 2 s × (3 W + 5 W) / 2 = 8 J; no idle interval yet.
        assert_eq!(e.energy_j, 8.0);
        assert_eq!(e.above_idle_j, None);
        assert_eq!(m.idle_power_watts(), None);
    }
}
