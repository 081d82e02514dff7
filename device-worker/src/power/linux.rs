//! The Linux backend (any Linux or Android host):
//!
//! - wake-latency request: a PM QoS request through `/dev/cpu_dma_latency`. Writing a 32-bit
//!   latency in µs adds a request that lasts while the file stays open; closing it removes the
//!   request (kernel `Documentation/power/pm_qos_interface.rst`). Held open while active,
//!   closed on release.
//! - clock floor: `scaling_min_freq` of every cpufreq policy under
//!   `/sys/devices/system/cpu/cpufreq/policy*` where it exists and is writable; raised to the
//!   turbo (`cpuinfo_max_freq`) or nominal (middle of the range) level, restored to the value
//!   found at start on release.
//! - memory bandwidth and matrix unit: no generic Linux interface; reported once, skipped.
//!
//! Parking the compute thread pool is done by the engine for every backend (module `power`).
//! Missing or refused interfaces are reported once and skipped, never fatal.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{ClockLevel, PowerBackend, Votes};

/// Default PM QoS device.
pub const CPU_DMA_LATENCY: &str = "/dev/cpu_dma_latency";
/// Default cpufreq policy root.
pub const CPUFREQ_ROOT: &str = "/sys/devices/system/cpu/cpufreq";

/// One cpufreq policy whose floor we move. Frequencies in kHz, as sysfs writes them.
#[derive(Debug)]
struct Policy {
    min_path: PathBuf,
    original_min_khz: u64,
    cpuinfo_min_khz: u64,
    cpuinfo_max_khz: u64,
}

/// Interfaces reported missing so far (each is reported once).
#[derive(Debug, Default)]
struct Reported {
    qos: bool,
    cpufreq: bool,
    memory: bool,
    matrix: bool,
}

/// PM QoS + cpufreq floor. See the module docs.
#[derive(Debug)]
pub struct LinuxBackend {
    qos_path: PathBuf,
    /// The open PM QoS request (while a wake-latency vote is held) and its value in µs.
    qos: Option<(File, u32)>,
    policies: Vec<Policy>,
    floor_raised: bool,
    reported: Reported,
}

impl LinuxBackend {
    /// The backend on the real `/dev/cpu_dma_latency` and cpufreq sysfs tree.
    pub fn new() -> Self {
        Self::with_paths(Path::new(CPU_DMA_LATENCY), Path::new(CPUFREQ_ROOT))
    }

    /// The backend on other paths (tests point these at a temporary directory).
    /// `cpufreq_root` holds `policy*/{scaling_min_freq,cpuinfo_min_freq,cpuinfo_max_freq}`.
    pub fn with_paths(qos_path: &Path, cpufreq_root: &Path) -> Self {
        let mut reported = Reported::default();
        let policies = probe_policies(cpufreq_root);
        if policies.is_empty() {
            tracing::warn!(
                root = %cpufreq_root.display(),
                "power: no writable cpufreq scaling_min_freq; the clock floor vote is skipped"
            );
            reported.cpufreq = true;
        }
        Self {
            qos_path: qos_path.to_path_buf(),
            qos: None,
            policies,
            floor_raised: false,
            reported,
        }
    }

    /// Number of cpufreq policies whose floor this backend moves.
    pub fn n_policies(&self) -> usize {
        self.policies.len()
    }

    /// Whether a PM QoS request is held open now.
    pub fn holds_qos_request(&self) -> bool {
        self.qos.is_some()
    }

    fn set_wake_latency(&mut self, latency_us: Option<u32>) {
        match latency_us {
            None => self.qos = None, // closing the file drops the request
            Some(us) => {
                if self.qos.as_ref().is_some_and(|(_, v)| *v == us) {
                    return;
                }
                if self.reported.qos {
                    return;
                }
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&self.qos_path)
                    .and_then(|mut f| {
                        // The device takes a native-endian s32 in µs.
                        f.write_all(&(us as i32).to_ne_bytes())?;
                        Ok(f)
                    });
                match opened {
                    Ok(f) => self.qos = Some((f, us)),
                    Err(e) => {
                        tracing::warn!(path = %self.qos_path.display(), error = %e,
                            "power: PM QoS request unavailable; the wake-latency vote is skipped");
                        self.reported.qos = true;
                    }
                }
            }
        }
    }

    fn set_clock_floor(&mut self, level: ClockLevel) {
        let raise = level != ClockLevel::Off;
        if !raise && !self.floor_raised {
            return;
        }
        let mut failed = None;
        for p in &self.policies {
            let khz = match level {
                ClockLevel::Off => p.original_min_khz,
                ClockLevel::Nominal => (p.cpuinfo_min_khz + p.cpuinfo_max_khz) / 2,
                ClockLevel::Turbo => p.cpuinfo_max_khz,
            };
            if let Err(e) = std::fs::write(&p.min_path, format!("{khz}\n")) {
                failed = Some((p.min_path.clone(), e));
            }
        }
        self.floor_raised = raise;
        if let Some((path, e)) = failed {
            if !self.reported.cpufreq {
                tracing::warn!(path = %path.display(), error = %e,
                    "power: cannot write scaling_min_freq; the clock floor vote is skipped");
                self.reported.cpufreq = true;
            }
            if raise {
                // Stop trying: restore what we can and forget the policies.
                for p in &self.policies {
                    let _ = std::fs::write(&p.min_path, format!("{}\n", p.original_min_khz));
                }
                self.policies.clear();
                self.floor_raised = false;
            }
        }
    }
}

impl Default for LinuxBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl PowerBackend for LinuxBackend {
    fn name(&self) -> &'static str {
        "linux"
    }

    fn apply(&mut self, votes: &Votes) {
        self.set_wake_latency(votes.wake_latency_us);
        self.set_clock_floor(votes.clock);
        if votes.memory_perf && !self.reported.memory {
            tracing::info!("power: no generic Linux memory-bandwidth vote; skipped");
            self.reported.memory = true;
        }
        if votes.matrix_unit && !self.reported.matrix {
            tracing::info!("power: no matrix unit on this host; its vote is skipped");
            self.reported.matrix = true;
        }
    }
}

impl Drop for LinuxBackend {
    /// Leaves the host as found: the floor restored, the QoS request closed.
    fn drop(&mut self) {
        self.set_clock_floor(ClockLevel::Off);
        self.qos = None;
    }
}

/// Policies whose `scaling_min_freq` exists, parses and can be opened for writing.
fn probe_policies(root: &Path) -> Vec<Policy> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let read_khz =
        |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut out: Vec<Policy> = dir
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("policy"))
        .filter_map(|e| {
            let d = e.path();
            let min_path = d.join("scaling_min_freq");
            let original_min_khz = read_khz(&min_path)?;
            let cpuinfo_min_khz = read_khz(&d.join("cpuinfo_min_freq"))?;
            let cpuinfo_max_khz = read_khz(&d.join("cpuinfo_max_freq"))?;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&min_path)
                .ok()?;
            Some(Policy {
                min_path,
                original_min_khz,
                cpuinfo_min_khz,
                cpuinfo_max_khz,
            })
        })
        .collect();
    out.sort_by(|a, b| a.min_path.cmp(&b.min_path));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_policy(root: &Path, name: &str, min: u64, max: u64) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("scaling_min_freq"), format!("{min}\n")).unwrap();
        std::fs::write(d.join("cpuinfo_min_freq"), format!("{min}\n")).unwrap();
        std::fs::write(d.join("cpuinfo_max_freq"), format!("{max}\n")).unwrap();
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    #[test]
    fn raises_and_restores_the_floor_and_holds_the_qos_request_while_active() {
        let tmp = tempfile::tempdir().unwrap();
        let qos = tmp.path().join("cpu_dma_latency");
        std::fs::write(&qos, b"").unwrap();
        let root = tmp.path().join("cpufreq");
        fake_policy(&root, "policy0", 300_000, 2_000_000);
        fake_policy(&root, "policy4", 500_000, 3_000_000);
        let mut b = LinuxBackend::with_paths(&qos, &root);
        assert_eq!(b.n_policies(), 2);

        b.apply(&Votes::ACTIVE);
        assert!(b.holds_qos_request());
        assert_eq!(std::fs::read(&qos).unwrap(), 100i32.to_ne_bytes());
        assert_eq!(read(root.join("policy0/scaling_min_freq")), "2000000");
        assert_eq!(read(root.join("policy4/scaling_min_freq")), "3000000");

        b.apply(&Votes {
            clock: ClockLevel::Nominal,
            ..Votes::ACTIVE
        });
        assert_eq!(read(root.join("policy0/scaling_min_freq")), "1150000");

        b.apply(&Votes::RELEASED);
        assert!(!b.holds_qos_request());
        assert_eq!(read(root.join("policy0/scaling_min_freq")), "300000");
        assert_eq!(read(root.join("policy4/scaling_min_freq")), "500000");
    }

    #[test]
    fn missing_interfaces_are_skipped_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let mut b =
            LinuxBackend::with_paths(&tmp.path().join("no-such-dev"), &tmp.path().join("none"));
        assert_eq!(b.n_policies(), 0);
        for _ in 0..3 {
            b.apply(&Votes::ACTIVE);
            assert!(!b.holds_qos_request());
            b.apply(&Votes::RELEASED);
        }
    }
}
