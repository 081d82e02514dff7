//! The Linux backend (any Linux or Android host). It changes two system-wide settings, both
//! only where the interface exists and this process may write it (root):
//!
//! - wake-latency request: a PM QoS request through `/dev/cpu_dma_latency`. Writing a 32-bit
//!   latency in µs adds a request that lasts while the file stays open; closing it removes the
//!   request (kernel `Documentation/power/pm_qos_interface.rst`). Held open while active,
//!   closed on release. Nothing is written to a setting: the kernel drops the request when the
//!   descriptor closes, also when the process dies by any signal (SIGKILL included), so the
//!   request can never outlive the worker.
//! - clock floor: `scaling_min_freq` of every cpufreq policy under
//!   `/sys/devices/system/cpu/cpufreq/policy*` (the `cpu*/cpufreq` directories are links to
//!   these) where it exists and is writable; raised to the turbo (`cpuinfo_max_freq`) or
//!   nominal (middle of the range) level. The value found at start is recorded before the
//!   first write and written back on every release and on exit ([`LinuxBackend`]'s `Drop`
//!   and its [`Restorer`]).
//! - memory bandwidth and matrix unit: no generic Linux interface; reported once, skipped.
//!
//! At start the backend logs (info) each setting it will change: its path, the value found and
//! the values it writes. The originals are also saved in a small JSON state file
//! ([`STATE_FILE`] under the root; [`SavedSettings`]) that is removed after the exit restore:
//! after a SIGKILL, `device-worker power-restore` writes them back ([`restore_from_state_file`]),
//! and the next worker started on the host takes its originals from the file instead of the
//! raised values it finds.
//!
//! Every path is under a root directory (`/` on a host, `--power-root`; tests point it at a
//! temporary directory holding fake `sys/devices/system/cpu/cpufreq/policy*` files).
//! Parking the compute thread pool is done by the engine for every backend (module `power`).
//! Missing or refused interfaces are reported once and skipped, never fatal; a failed restore
//! is logged with its path, never a panic.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{ClockLevel, PowerBackend, Restorer, Votes};

/// PM QoS device, relative to the root.
pub const CPU_DMA_LATENCY: &str = "dev/cpu_dma_latency";
/// cpufreq policy directory, relative to the root.
pub const CPUFREQ_ROOT: &str = "sys/devices/system/cpu/cpufreq";
/// Default state file with the recorded originals, relative to the root.
pub const STATE_FILE: &str = "run/device-worker-power.json";

/// One cpufreq policy whose floor we move. Frequencies in kHz, as sysfs writes them.
#[derive(Debug)]
struct Policy {
    min_path: PathBuf,
    original_min_khz: u64,
    cpuinfo_min_khz: u64,
    cpuinfo_max_khz: u64,
}

impl Policy {
    fn khz(&self, level: ClockLevel) -> u64 {
        match level {
            ClockLevel::Off => self.original_min_khz,
            ClockLevel::Nominal => (self.cpuinfo_min_khz + self.cpuinfo_max_khz) / 2,
            ClockLevel::Turbo => self.cpuinfo_max_khz,
        }
    }
}

/// One recorded original: a file and the value found in it before the worker's first write.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedSetting {
    pub path: PathBuf,
    pub original: String,
}

/// The state file's content (JSON): the worker's pid and every setting it may change.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedSettings {
    pub pid: u32,
    pub settings: Vec<SavedSetting>,
}

/// Interfaces reported missing so far (each is reported once).
#[derive(Debug, Default)]
struct Reported {
    qos: bool,
    cpufreq: bool,
    memory: bool,
    matrix: bool,
}

/// What the backend and its [`Restorer`] share.
#[derive(Debug)]
struct Host {
    qos_path: PathBuf,
    /// The open PM QoS request (while a wake-latency vote is held) and its value in µs.
    qos: Option<(File, u32)>,
    policies: Vec<Policy>,
    floor_raised: bool,
    reported: Reported,
    /// Where the originals were saved (`None`: not saved).
    state_file: Option<PathBuf>,
    /// Set by the exit restore: from then on no vote changes anything.
    closed: bool,
}

/// PM QoS + cpufreq floor. See the module docs.
#[derive(Debug)]
pub struct LinuxBackend {
    host: Arc<Mutex<Host>>,
}

impl LinuxBackend {
    /// The backend on the host's real `/dev/cpu_dma_latency` and cpufreq sysfs tree.
    pub fn new() -> Self {
        Self::with_root(Path::new("/"), None)
    }

    /// The backend on the files under `root` ([`CPU_DMA_LATENCY`], [`CPUFREQ_ROOT`]), with
    /// the originals saved in `state_file` (default: [`STATE_FILE`] under `root`).
    pub fn with_root(root: &Path, state_file: Option<&Path>) -> Self {
        let state_file = state_file.map_or_else(|| root.join(STATE_FILE), Path::to_path_buf);
        Self::with_paths(&root.join(CPU_DMA_LATENCY), &root.join(CPUFREQ_ROOT), Some(&state_file))
    }

    /// The backend on other paths. `cpufreq_root` holds
    /// `policy*/{scaling_min_freq,cpuinfo_min_freq,cpuinfo_max_freq}`; `state_file: None`
    /// saves no originals. Records the originals, logs every setting it will change and
    /// writes the state file; writes no setting yet.
    pub fn with_paths(qos_path: &Path, cpufreq_root: &Path, state_file: Option<&Path>) -> Self {
        let mut reported = Reported::default();
        let mut policies = probe_policies(cpufreq_root);
        if policies.is_empty() {
            tracing::warn!(
                root = %cpufreq_root.display(),
                "power: no writable cpufreq scaling_min_freq; the clock floor vote is skipped"
            );
            reported.cpufreq = true;
        }
        if let Some((f, saved)) = state_file.and_then(|f| Some((f, read_state_file(f)?))) {
            // A worker that did not restore (killed) left these: they, not the raised values
            // found now, are what the host had.
            tracing::warn!(
                file = %f.display(),
                pid = saved.pid,
                "power: a previous worker did not restore its settings; using the originals it saved"
            );
            for p in &mut policies {
                let original = saved.settings.iter().find(|s| s.path == p.min_path);
                if let Some(khz) = original.and_then(|s| s.original.trim().parse().ok()) {
                    p.original_min_khz = khz;
                }
            }
        }
        for p in &policies {
            tracing::info!(
                path = %p.min_path.display(),
                original_khz = p.original_min_khz,
                turbo_khz = p.khz(ClockLevel::Turbo),
                nominal_khz = p.khz(ClockLevel::Nominal),
                "power: changes scaling_min_freq while votes are held; writes the original back on release and exit"
            );
        }
        if qos_path.exists() {
            tracing::info!(
                path = %qos_path.display(),
                active_us = Votes::ACTIVE.wake_latency_us.unwrap_or_default(),
                "power: holds a PM QoS wake-latency request open while votes are held; closing it (release, exit, any signal) removes it"
            );
        }
        let state_file = state_file.filter(|_| !policies.is_empty()).and_then(|f| {
            match write_state_file(f, &policies) {
                Ok(()) => Some(f.to_path_buf()),
                Err(e) => {
                    tracing::warn!(
                        file = %f.display(),
                        error = %e,
                        "power: cannot save the original settings; after a SIGKILL they must be written back by hand (see the paths above)"
                    );
                    None
                }
            }
        });
        Self {
            host: Arc::new(Mutex::new(Host {
                qos_path: qos_path.to_path_buf(),
                qos: None,
                policies,
                floor_raised: false,
                reported,
                state_file,
                closed: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Host> {
        self.host.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of cpufreq policies whose floor this backend moves.
    pub fn n_policies(&self) -> usize {
        self.lock().policies.len()
    }

    /// Whether a PM QoS request is held open now.
    pub fn holds_qos_request(&self) -> bool {
        self.lock().qos.is_some()
    }

    /// Where the originals are saved (`None`: nothing to save, or the file could not be
    /// written).
    pub fn state_file(&self) -> Option<PathBuf> {
        self.lock().state_file.clone()
    }
}

impl Host {
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
        if level == ClockLevel::Off {
            if self.floor_raised {
                self.restore_floor();
            }
            return;
        }
        let mut failed = None;
        for p in &self.policies {
            if let Err(e) = std::fs::write(&p.min_path, format!("{}\n", p.khz(level))) {
                failed = Some((p.min_path.clone(), e));
            }
        }
        self.floor_raised = true;
        if let Some((path, e)) = failed {
            if !self.reported.cpufreq {
                tracing::warn!(path = %path.display(), error = %e,
                    "power: cannot write scaling_min_freq; the clock floor vote is skipped");
                self.reported.cpufreq = true;
            }
            // Stop trying: restore what we can and forget the policies.
            self.restore_floor();
            self.policies.clear();
        }
    }

    /// Writes every recorded original back; a failure is logged with its path.
    fn restore_floor(&mut self) -> bool {
        let mut all = true;
        for p in &self.policies {
            if let Err(e) = std::fs::write(&p.min_path, format!("{}\n", p.original_min_khz)) {
                tracing::warn!(path = %p.min_path.display(), original_khz = p.original_min_khz,
                    error = %e, "power: cannot restore scaling_min_freq");
                all = false;
            }
        }
        self.floor_raised = false;
        all
    }

    /// The exit restore: the floor back, the QoS request closed, the state file removed
    /// (kept when a write failed, for `power-restore`); later votes change nothing.
    fn close(&mut self, why: &str) {
        if self.closed {
            return;
        }
        self.closed = true;
        let restored = !self.floor_raised || self.restore_floor();
        let had_qos = self.qos.take().is_some();
        if !restored {
            tracing::warn!(reason = why, file = ?self.state_file,
                "power: not every host setting could be restored (see above); the state file is kept for `device-worker power-restore`");
            return;
        }
        if let Some(f) = self.state_file.take() {
            if let Err(e) = std::fs::remove_file(&f) {
                tracing::warn!(file = %f.display(), error = %e, "power: cannot remove the state file");
            }
        }
        if had_qos || !self.policies.is_empty() {
            tracing::info!(reason = why, "power: host settings restored");
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
        let mut h = self.lock();
        if h.closed {
            return;
        }
        h.set_wake_latency(votes.wake_latency_us);
        h.set_clock_floor(votes.clock);
        if votes.memory_perf && !h.reported.memory {
            tracing::info!("power: no generic Linux memory-bandwidth vote; skipped");
            h.reported.memory = true;
        }
        if votes.matrix_unit && !h.reported.matrix {
            tracing::info!("power: no matrix unit on this host; its vote is skipped");
            h.reported.matrix = true;
        }
    }

    fn restorer(&self) -> Option<Restorer> {
        let host = self.host.clone();
        Some(Restorer::new(move |why| {
            host.lock().unwrap_or_else(PoisonError::into_inner).close(why)
        }))
    }
}

impl Drop for LinuxBackend {
    /// Leaves the host as found: the floor restored, the QoS request closed.
    fn drop(&mut self) {
        self.lock().close("backend dropped");
    }
}

/// Policies whose `scaling_min_freq` exists, parses and can be opened for writing.
fn probe_policies(root: &Path) -> Vec<Policy> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return Vec::new();
    };
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

fn read_khz(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn read_state_file(f: &Path) -> Option<SavedSettings> {
    let text = std::fs::read_to_string(f).ok()?;
    match serde_json::from_str(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(file = %f.display(), error = %e, "power: ignoring an unreadable state file");
            None
        }
    }
}

/// Writes the originals to `f` (a temporary file renamed over it: never half-written).
fn write_state_file(f: &Path, policies: &[Policy]) -> std::io::Result<()> {
    let saved = SavedSettings {
        pid: std::process::id(),
        settings: policies
            .iter()
            .map(|p| SavedSetting {
                path: p.min_path.clone(),
                original: p.original_min_khz.to_string(),
            })
            .collect(),
    };
    let tmp = f.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&saved)?)?;
    std::fs::rename(&tmp, f)
}

/// `device-worker power-restore`: writes back the originals a worker saved in `state_file`
/// (after it was killed without restoring) and removes the file. Returns the settings
/// written back; `Ok` with none when there is no state file (nothing to restore).
///
/// Errors: the file is unreadable or not a state file, or a setting cannot be written (the
/// others are still written; the file is then kept).
pub fn restore_from_state_file(state_file: &Path) -> anyhow::Result<Vec<SavedSetting>> {
    use anyhow::Context;
    let text = match std::fs::read_to_string(state_file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", state_file.display())),
    };
    let saved: SavedSettings = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a power state file", state_file.display()))?;
    let mut failed = Vec::new();
    for s in &saved.settings {
        if let Err(e) = std::fs::write(&s.path, format!("{}\n", s.original.trim())) {
            failed.push(format!("{}: {e}", s.path.display()));
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("cannot restore {}", failed.join("; "));
    }
    std::fs::remove_file(state_file)
        .with_context(|| format!("cannot remove {}", state_file.display()))?;
    Ok(saved.settings)
}

#[cfg(test)]
#[path = "../../tests/support/power_root.rs"]
mod power_root;

#[cfg(test)]
mod tests {
    use super::power_root::FakePolicy;
    use super::*;

    /// Two cpufreq policies; policy0's floor starts above cpuinfo_min (so "original" and
    /// "minimum" differ), policy4's at it.
    const POLICIES: [FakePolicy; 2] = [
        ("policy0", 300_000, 400_000, 2_000_000),
        ("policy4", 500_000, 500_000, 3_000_000),
    ];

    /// A fake root ([`super::power_root::fake_root`]) with [`POLICIES`].
    fn fake_root() -> tempfile::TempDir {
        super::power_root::fake_root(&POLICIES)
    }

    /// A backend on a fresh [`fake_root`] (which lives as long as the returned folder).
    fn fake_backend() -> (tempfile::TempDir, LinuxBackend) {
        let tmp = fake_root();
        let b = LinuxBackend::with_root(tmp.path(), None);
        (tmp, b)
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    fn floors(root: &Path) -> (String, String) {
        let c = root.join(CPUFREQ_ROOT);
        (read(c.join("policy0/scaling_min_freq")), read(c.join("policy4/scaling_min_freq")))
    }

    /// Descriptors of this process open on `path` (from `/proc/self/fd`).
    fn open_fds_on(path: &Path) -> usize {
        let path = path.canonicalize().unwrap();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
            .count()
    }

    #[test]
    fn raises_and_restores_the_floor_and_holds_the_qos_request_while_active() {
        let (tmp, mut b) = fake_backend();
        let root = tmp.path();
        let qos = root.join(CPU_DMA_LATENCY);
        assert_eq!(b.n_policies(), 2);
        // Nothing written at start.
        assert_eq!(floors(root), ("400000".into(), "500000".into()));

        b.apply(&Votes::ACTIVE);
        assert!(b.holds_qos_request());
        assert_eq!(open_fds_on(&qos), 1);
        assert_eq!(std::fs::read(&qos).unwrap(), 100i32.to_ne_bytes());
        assert_eq!(floors(root), ("2000000".into(), "3000000".into()));

        b.apply(&Votes {
            clock: ClockLevel::Nominal,
            ..Votes::ACTIVE
        });
        assert_eq!(floors(root).0, "1150000");

        b.apply(&Votes::RELEASED);
        assert!(!b.holds_qos_request());
        assert_eq!(open_fds_on(&qos), 0, "release closes the PM QoS request");
        assert_eq!(floors(root), ("400000".into(), "500000".into()), "the originals, not cpuinfo_min");

        // A second burst raises again and its release restores again.
        b.apply(&Votes::ACTIVE);
        assert_eq!(floors(root).1, "3000000");
        b.apply(&Votes::RELEASED);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
    }

    #[test]
    fn the_originals_are_saved_at_start_and_restored_on_drop() {
        let (tmp, mut b) = fake_backend();
        let root = tmp.path();
        let qos = root.join(CPU_DMA_LATENCY);
        let state = b.state_file().expect("state file written");
        assert_eq!(state, root.join(STATE_FILE));
        let saved: SavedSettings = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(saved.pid, std::process::id());
        let c = root.join(CPUFREQ_ROOT);
        assert_eq!(
            saved.settings,
            vec![
                SavedSetting { path: c.join("policy0/scaling_min_freq"), original: "400000".into() },
                SavedSetting { path: c.join("policy4/scaling_min_freq"), original: "500000".into() },
            ]
        );
        b.apply(&Votes::ACTIVE);
        assert_eq!(floors(root), ("2000000".into(), "3000000".into()));
        assert_eq!(open_fds_on(&qos), 1);
        drop(b);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        assert_eq!(open_fds_on(&qos), 0);
        assert!(!state.exists(), "the state file is removed after the exit restore");
    }

    #[test]
    fn the_restorer_restores_once_and_later_votes_change_nothing() {
        let (tmp, mut b) = fake_backend();
        let root = tmp.path();
        let restorer = b.restorer().expect("the linux backend has a restorer");
        b.apply(&Votes::ACTIVE);
        restorer.restore("test");
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        assert!(!b.holds_qos_request());
        assert!(!root.join(STATE_FILE).exists());
        // The engine may still vote while the process exits: nothing is raised again.
        b.apply(&Votes::ACTIVE);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        assert!(!b.holds_qos_request());
        restorer.restore("again");
        drop(b);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
    }

    #[test]
    fn a_panic_unwinding_past_the_guard_restores() {
        let (tmp, mut b) = fake_backend();
        let root = tmp.path();
        b.apply(&Votes::ACTIVE);
        let guard = super::super::RestoreOnDrop(b.restorer());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = guard;
            panic!("a bug in serve");
        }));
        assert!(unwound.is_err());
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        assert!(!b.holds_qos_request());
        assert!(!root.join(STATE_FILE).exists());
    }

    #[test]
    fn a_state_file_left_by_a_killed_worker_gives_the_originals_and_power_restore_writes_them() {
        let tmp = fake_root();
        let root = tmp.path();
        let mut killed = LinuxBackend::with_root(root, None);
        killed.apply(&Votes::ACTIVE);
        // SIGKILL: no destructor runs.
        std::mem::forget(killed);
        assert_eq!(floors(root), ("2000000".into(), "3000000".into()));

        // The next worker finds the raised values but restores the saved originals.
        let mut next = LinuxBackend::with_root(root, None);
        next.apply(&Votes::ACTIVE);
        next.apply(&Votes::RELEASED);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        next.apply(&Votes::ACTIVE);
        std::mem::forget(next);

        // By hand: power-restore writes them back and removes the file.
        let restored = restore_from_state_file(&root.join(STATE_FILE)).unwrap();
        assert_eq!(restored.len(), 2);
        assert_eq!(floors(root), ("400000".into(), "500000".into()));
        assert!(!root.join(STATE_FILE).exists());
        // Nothing left to restore: not an error.
        assert!(restore_from_state_file(&root.join(STATE_FILE)).unwrap().is_empty());
    }

    #[test]
    fn a_failed_restore_is_logged_and_keeps_the_state_file() {
        let (tmp, mut b) = fake_backend();
        let root = tmp.path();
        b.apply(&Votes::ACTIVE);
        // The policy disappears under us (CPU hot-unplug, a sysfs change): no panic.
        std::fs::remove_dir_all(root.join(CPUFREQ_ROOT).join("policy4")).unwrap();
        drop(b);
        assert_eq!(read(root.join(CPUFREQ_ROOT).join("policy0/scaling_min_freq")), "400000");
        assert!(root.join(STATE_FILE).exists(), "kept for power-restore");
        let err = restore_from_state_file(&root.join(STATE_FILE)).unwrap_err();
        assert!(err.to_string().contains("policy4/scaling_min_freq"), "{err}");
    }

    #[test]
    fn missing_interfaces_are_skipped_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let mut b = LinuxBackend::with_root(tmp.path(), None);
        assert_eq!(b.n_policies(), 0);
        assert_eq!(b.state_file(), None, "nothing to save");
        for _ in 0..3 {
            b.apply(&Votes::ACTIVE);
            assert!(!b.holds_qos_request());
            b.apply(&Votes::RELEASED);
        }
    }
}
