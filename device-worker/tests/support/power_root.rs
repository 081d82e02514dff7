//! A fake `--power-root` for the Linux power backend's tests, shared by the unit tests of
//! `src/power/linux.rs` and `tests/power_restore.rs` (each includes this file with `#[path]`;
//! the including module's parent names `CPUFREQ_ROOT` and `CPU_DMA_LATENCY`).

use super::{CPUFREQ_ROOT, CPU_DMA_LATENCY};

/// One cpufreq policy of a fake root: (name, `cpuinfo_min_freq`, `scaling_min_freq` (the
/// original floor), `cpuinfo_max_freq`), kHz.
pub type FakePolicy = (&'static str, u64, u64, u64);

/// A fake root in a fresh temporary folder: `dev/cpu_dma_latency` (a plain file), `run/`,
/// and per policy `sys/devices/system/cpu/cpufreq/NAME/` with its `cpuinfo_min_freq`,
/// `cpuinfo_max_freq` and `scaling_min_freq` files.
pub fn fake_root(policies: &[FakePolicy]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path();
    std::fs::create_dir_all(r.join("dev")).unwrap();
    std::fs::create_dir_all(r.join("run")).unwrap();
    std::fs::write(r.join(CPU_DMA_LATENCY), b"").unwrap();
    for &(name, min, original, max) in policies {
        let d = r.join(CPUFREQ_ROOT).join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpuinfo_min_freq"), format!("{min}\n")).unwrap();
        std::fs::write(d.join("cpuinfo_max_freq"), format!("{max}\n")).unwrap();
        std::fs::write(d.join("scaling_min_freq"), format!("{original}\n")).unwrap();
    }
    tmp
}
