//! Energy measurement: a [`PowerSource`] trait with two sysfs backends, and the
//! [`EnergyMeter`] that samples one around each step and while idle.
//!
//! - [`rapl`]: Linux powercap / RAPL package energy counters
//!   (`/sys/class/powercap/intel-rapl:N/energy_uj`, the kernel's "Power Capping Framework"
//!   documentation), exact counters with wrap-around.
//! - [`fuel_gauge`]: an Android (or laptop) battery fuel gauge,
//!   `/sys/class/power_supply/*/current_now` (µA) × `voltage_now` (µV), integrated over time
//!   with the trapezoid rule between samples (kernel `sysfs-class-power` ABI).
//! - Neither present: [`detect`] returns `None` and callers report "unavailable"; no number is
//!   ever invented.
//!
//! Every path is taken relative to a root directory so tests run against a fake sysfs tree.

pub mod error;
pub mod fuel_gauge;
pub mod meter;
pub mod rapl;

use std::path::Path;
use std::time::Duration;

pub use error::EnergyError;
pub use fuel_gauge::FuelGauge;
pub use meter::{EnergyMeter, StepEnergy, StepMark};
pub use rapl::Rapl;

/// Something that measures the energy the device (or package) has used.
pub trait PowerSource: Send {
    /// Short name, the `source` label of the energy metrics: `"rapl"` or `"fuel_gauge"`.
    fn name(&self) -> &'static str;

    /// Cumulative energy in joules since the first call, at time `now` (any monotonic clock,
    /// the same for every call). The first call returns 0.
    ///
    /// Errors: [`EnergyError`] when a sysfs attribute cannot be read or parsed, a counter
    /// jumps back, or `now` is earlier than the previous call's.
    fn energy_joules(&mut self, now: Duration) -> Result<f64, EnergyError>;
}

/// The first power source found under `root` (`/` on a real host): RAPL counters first
/// (exact), then a battery fuel gauge; `None` when neither is readable.
pub fn detect(root: &Path) -> Option<Box<dyn PowerSource>> {
    if let Some(r) = Rapl::open(root) {
        return Some(Box::new(r));
    }
    FuelGauge::open(root).map(|g| Box::new(g) as Box<dyn PowerSource>)
}

/// Reads a sysfs attribute holding one unsigned integer.
///
/// Errors: [`EnergyError::Read`], [`EnergyError::NotAnInteger`].
pub(crate) fn read_u64(path: &Path) -> Result<u64, EnergyError> {
    let s = std::fs::read_to_string(path).map_err(|source| EnergyError::Read { path: path.to_path_buf(), source })?;
    s.trim().parse().map_err(|_| EnergyError::NotAnInteger { path: path.to_path_buf(), found: s.trim().to_string() })
}

/// Reads a sysfs attribute holding one signed integer.
///
/// Errors: [`EnergyError::Read`], [`EnergyError::NotAnInteger`].
pub(crate) fn read_i64(path: &Path) -> Result<i64, EnergyError> {
    let s = std::fs::read_to_string(path).map_err(|source| EnergyError::Read { path: path.to_path_buf(), source })?;
    s.trim().parse().map_err(|_| EnergyError::NotAnInteger { path: path.to_path_buf(), found: s.trim().to_string() })
}

#[cfg(test)]
pub(crate) mod fake {
    //! Writing fake sysfs trees for the tests.
    use std::path::Path;

    /// Writes `value` to `root/rel`, creating the folders.
    pub fn write(root: &Path, rel: &str, value: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("a file path has a parent")).expect("create fake sysfs folder");
        std::fs::write(&p, format!("{value}\n")).expect("write fake sysfs file");
    }

    /// Sets the battery's current (`ua` µA, negative: discharging) and voltage (`uv` µV).
    pub fn battery(root: &Path, ua: i64, uv: i64) {
        write(root, "sys/class/power_supply/battery/current_now", &ua.to_string());
        write(root, "sys/class/power_supply/battery/voltage_now", &uv.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_prefers_rapl_then_fuel_gauge_then_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(detect(dir.path()).is_none(), "an empty tree has no source");
        fake::write(dir.path(), "sys/class/power_supply/battery/type", "Battery");
        fake::write(dir.path(), "sys/class/power_supply/battery/current_now", "-500000");
        fake::write(dir.path(), "sys/class/power_supply/battery/voltage_now", "4000000");
        assert_eq!(detect(dir.path()).map(|s| s.name()), Some("fuel_gauge"));
        fake::write(dir.path(), "sys/class/powercap/intel-rapl:0/energy_uj", "1000");
        fake::write(dir.path(), "sys/class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850");
        assert_eq!(detect(dir.path()).map(|s| s.name()), Some("rapl"));
    }
}
