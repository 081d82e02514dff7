//! Linux powercap / RAPL energy counters: `ROOT/sys/class/powercap/intel-rapl:N/energy_uj`
//! (µJ, wraps at `max_energy_range_uj`). Source: the kernel's
//! `Documentation/power/powercap/powercap.rst`.
//!
//! Zones used: the top-level `intel-rapl:N` zones (their `intel-rapl:N:M` subzones are parts of
//! them and are not added again). When a `psys` zone (the whole platform) exists only it is
//! used, since it already contains the packages. AMD CPUs expose the same interface.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{read_u64, EnergyError, PowerSource};

/// One counter: its `energy_uj` path, wrap range and the last raw value.
#[derive(Debug)]
struct Zone {
    energy_path: PathBuf,
    /// `max_energy_range_uj`: the counter wraps to 0 after this value; `None` when absent.
    range_uj: Option<u64>,
    last_uj: u64,
}

/// RAPL package (or platform) energy, summed over the zones used.
#[derive(Debug)]
pub struct Rapl {
    zones: Vec<Zone>,
    /// Joules accumulated since [`Rapl::open`].
    total_j: f64,
}

impl Rapl {
    /// The RAPL zones under `root/sys/class/powercap`, each read once; `None` when there is no
    /// zone or one cannot be read (on most hosts `energy_uj` is readable by root only).
    pub fn open(root: &Path) -> Option<Self> {
        let dir = root.join("sys/class/powercap");
        let mut top: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                // Top level only: "intel-rapl:0", not "intel-rapl:0:1".
                let is_top = name.strip_prefix("intel-rapl:").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                is_top.then(|| {
                    let domain = std::fs::read_to_string(e.path().join("name")).map(|s| s.trim().to_string()).unwrap_or_default();
                    (domain, e.path())
                })
            })
            .collect();
        if top.iter().any(|(d, _)| d == "psys") {
            top.retain(|(d, _)| d == "psys");
        }
        top.sort_by(|a, b| a.1.cmp(&b.1));
        let zones = top
            .into_iter()
            .map(|(_, p)| {
                let energy_path = p.join("energy_uj");
                let last_uj = read_u64(&energy_path)?;
                let range_uj = read_u64(&p.join("max_energy_range_uj")).ok();
                Ok(Zone { energy_path, range_uj, last_uj })
            })
            .collect::<Result<Vec<_>, EnergyError>>()
            .ok()?;
        (!zones.is_empty()).then_some(Rapl { zones, total_j: 0.0 })
    }

    /// Number of zones summed.
    pub fn n_zones(&self) -> usize {
        self.zones.len()
    }
}

impl PowerSource for Rapl {
    fn name(&self) -> &'static str {
        "rapl"
    }

    /// Reads every zone and adds each one's increase since the last read (modulo its range
    /// when it wrapped). `now` is not needed: the counters are cumulative.
    fn energy_joules(&mut self, _now: Duration) -> Result<f64, EnergyError> {
        for z in &mut self.zones {
            let cur = read_u64(&z.energy_path)?;
            let delta_uj = if cur >= z.last_uj {
                cur - z.last_uj
            } else {
                match z.range_uj {
                    // Wrapped once: (range - last) up to the wrap, then cur.
                    Some(r) if z.last_uj <= r => r - z.last_uj + cur,
                    _ => {
                        return Err(EnergyError::CounterJump {
                            path: z.energy_path.clone(),
                            previous_uj: z.last_uj,
                            current_uj: cur,
                            range_uj: z.range_uj.unwrap_or(0),
                        })
                    }
                }
            };
            z.last_uj = cur;
            self.total_j += delta_uj as f64 * 1e-6;
        }
        Ok(self.total_j)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::write;
    use super::*;

    fn zone(root: &Path, n: &str, name: &str, uj: u64, range: u64) {
        write(root, &format!("sys/class/powercap/intel-rapl:{n}/name"), name);
        write(root, &format!("sys/class/powercap/intel-rapl:{n}/energy_uj"), &uj.to_string());
        write(root, &format!("sys/class/powercap/intel-rapl:{n}/max_energy_range_uj"), &range.to_string());
    }

    #[test]
    fn sums_packages_ignores_subzones_and_handles_wrap() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        zone(root, "0", "package-0", 5_000_000, 10_000_000);
        zone(root, "1", "package-1", 1_000, 10_000_000);
        zone(root, "0:0", "core", 4_000_000, 10_000_000); // part of package-0
        let mut r = Rapl::open(root).unwrap();
        assert_eq!(r.n_zones(), 2);
        assert_eq!(r.energy_joules(Duration::ZERO).unwrap(), 0.0);
        // +1.5 J on package 0, +0.25 J on package 1; the subzone's change is not added.
        zone(root, "0", "package-0", 6_500_000, 10_000_000);
        zone(root, "1", "package-1", 251_000, 10_000_000);
        zone(root, "0:0", "core", 9_000_000, 10_000_000);
        assert!((r.energy_joules(Duration::from_secs(1)).unwrap() - 1.75).abs() < 1e-12);
        // package 0 wraps: 6.5 J → 10 J (range) → 0.5 J: +4 J.
        zone(root, "0", "package-0", 500_000, 10_000_000);
        assert!((r.energy_joules(Duration::from_secs(2)).unwrap() - 5.75).abs() < 1e-12);
    }

    #[test]
    fn psys_alone_when_present() {
        let dir = tempfile::tempdir().unwrap();
        zone(dir.path(), "0", "package-0", 0, 1 << 30);
        zone(dir.path(), "1", "psys", 100, 1 << 30);
        let mut r = Rapl::open(dir.path()).unwrap();
        assert_eq!(r.n_zones(), 1);
        r.energy_joules(Duration::ZERO).unwrap();
        zone(dir.path(), "0", "package-0", 3_000_000, 1 << 30);
        zone(dir.path(), "1", "psys", 2_000_100, 1 << 30);
        assert!((r.energy_joules(Duration::ZERO).unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn unreadable_or_garbled_counters() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Rapl::open(dir.path()).is_none());
        write(dir.path(), "sys/class/powercap/intel-rapl:0/energy_uj", "n/a");
        assert!(Rapl::open(dir.path()).is_none(), "a zone that does not parse is no source");
        write(dir.path(), "sys/class/powercap/intel-rapl:0/energy_uj", "100");
        let mut r = Rapl::open(dir.path()).unwrap();
        write(dir.path(), "sys/class/powercap/intel-rapl:0/energy_uj", "50");
        // No range file: a decrease cannot be explained.
        assert!(matches!(r.energy_joules(Duration::ZERO), Err(EnergyError::CounterJump { previous_uj: 100, current_uj: 50, .. })));
    }
}
