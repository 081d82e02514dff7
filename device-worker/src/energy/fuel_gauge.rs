//! Battery fuel gauge: instantaneous power `|current_now| × voltage_now` of a
//! `ROOT/sys/class/power_supply/*` supply whose `type` is `Battery`, integrated over time with
//! the trapezoid rule between samples. Units: `current_now` µA, `voltage_now` µV (kernel
//! `Documentation/ABI/testing/sysfs-class-power`). The sign of `current_now` differs between
//! vendors (negative or positive while discharging), so its magnitude is used; while the phone
//! charges the figure is the charge current, not the consumption (unplug for measurements).
//!
//! Accuracy follows the sampling: the meter samples at every step boundary and on an idle tick.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{read_i64, EnergyError, PowerSource};

/// A battery's power readings, integrated.
#[derive(Debug)]
pub struct FuelGauge {
    current_path: PathBuf,
    voltage_path: PathBuf,
    /// The previous sample: (time, watts).
    last: Option<(Duration, f64)>,
    total_j: f64,
}

impl FuelGauge {
    /// The first supply (by name) under `root/sys/class/power_supply` with `type` `Battery`
    /// and readable `current_now` and `voltage_now`; `None` otherwise.
    pub fn open(root: &Path) -> Option<Self> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("sys/class/power_supply")).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        dirs.sort();
        dirs.into_iter().find_map(|d| {
            let ty = std::fs::read_to_string(d.join("type")).ok()?;
            if ty.trim() != "Battery" {
                return None;
            }
            let g = FuelGauge { current_path: d.join("current_now"), voltage_path: d.join("voltage_now"), last: None, total_j: 0.0 };
            g.power_watts().ok().map(|_| g)
        })
    }

    /// Instantaneous power, watts: |µA| × µV × 1e-12.
    ///
    /// Errors: [`EnergyError::Read`], [`EnergyError::NotAnInteger`].
    pub fn power_watts(&self) -> Result<f64, EnergyError> {
        let i_ua = read_i64(&self.current_path)?;
        let v_uv = read_i64(&self.voltage_path)?;
        Ok((i_ua as f64).abs() * (v_uv as f64) * 1e-12)
    }
}

impl PowerSource for FuelGauge {
    fn name(&self) -> &'static str {
        "fuel_gauge"
    }

    /// Adds (t − t_prev) × (P + P_prev) / 2 to the total.
    fn energy_joules(&mut self, now: Duration) -> Result<f64, EnergyError> {
        let p = self.power_watts()?;
        if let Some((t0, p0)) = self.last {
            if now < t0 {
                return Err(EnergyError::TimeWentBack { now_s: now.as_secs_f64(), previous_s: t0.as_secs_f64() });
            }
            self.total_j += (now - t0).as_secs_f64() * (p + p0) / 2.0;
        }
        self.last = Some((now, p));
        Ok(self.total_j)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{battery, write};
    use super::*;

    #[test]
    fn integrates_power_with_the_trapezoid_rule() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // A USB supply with current figures must be skipped: only type Battery counts.
        write(root, "sys/class/power_supply/usb/type", "USB");
        write(root, "sys/class/power_supply/usb/current_now", "900000");
        write(root, "sys/class/power_supply/usb/voltage_now", "5000000");
        write(root, "sys/class/power_supply/battery/type", "Battery");
        battery(root, -1_000_000, 4_000_000); // 1 A × 4 V = 4 W (negative: discharging)
        let mut g = FuelGauge::open(root).unwrap();
        assert_eq!(g.power_watts().unwrap(), 4.0);
        assert_eq!(g.energy_joules(Duration::from_secs(10)).unwrap(), 0.0);
        battery(root, 500_000, 4_000_000); // 2 W
        // 2 s × (4 W + 2 W) / 2 = 6 J
        assert_eq!(g.energy_joules(Duration::from_secs(12)).unwrap(), 6.0);
        // 0.5 s at 2 W both ends: +1 J
        assert_eq!(g.energy_joules(Duration::from_millis(12_500)).unwrap(), 7.0);
        assert!(matches!(g.energy_joules(Duration::from_secs(1)), Err(EnergyError::TimeWentBack { .. })));
    }

    #[test]
    fn no_battery_no_gauge() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "sys/class/power_supply/ac/type", "Mains");
        assert!(FuelGauge::open(dir.path()).is_none());
        write(dir.path(), "sys/class/power_supply/bms/type", "Battery");
        write(dir.path(), "sys/class/power_supply/bms/voltage_now", "3900000");
        assert!(FuelGauge::open(dir.path()).is_none(), "a battery without current_now is no source");
    }
}
