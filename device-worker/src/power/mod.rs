//! Idle power: power *votes* held while batches are submitted or running, released after
//! `idle_release_ms` without any, re-applied before the next batch (DESIGN.md "Idle power",
//! Tandem §3.4 and §4.6; the sleeping queue follows llama.cpp `tools/server/server-queue.h`).
//!
//! - [`PowerBackend`]: the trait every backend implements; [`Votes`]: what is voted.
//! - [`linux`]: PM QoS (`/dev/cpu_dma_latency`) and a cpufreq floor, restored on release,
//!   on exit ([`Restorer`]) and after a SIGKILL by `device-worker power-restore`.
//! - [`recording`]: records every vote change with a timestamp (tests).
//! - `hexagon` (feature `hexagon`, off by default): the phone's FastRPC power calls,
//!   designed but not buildable here.
//! - [`idle`]: the [`IdleController`] that decides when to release and re-apply.
//! - [`clock`]: the boot-time clock the idle timers use.
//! - [`figures`]: power state, release cycles, wake-up latency histogram, cold starts,
//!   watchdog restarts.
//!
//! Parking the compute thread pool is part of every release: the engine thread owns the pool
//! and parks it right after the controller releases the votes, and unparks it when the
//! controller re-applies them (see `engine`).

pub mod clock;
pub mod figures;
#[cfg(feature = "hexagon")]
pub mod hexagon;
pub mod idle;
pub mod linux;
pub mod recording;

use std::sync::Arc;

pub use clock::{BootClock, Clock, ManualClock};
pub use figures::{LatencyHistogram, PowerFigures, PowerState};
pub use idle::{IdleConfig, IdleController, TickAction};
pub use linux::{restore_from_state_file, LinuxBackend};
pub use recording::{RecordingBackend, VoteChange};

/// Minimum CPU/NPU clock the worker asks for (a floor, not a cap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClockLevel {
    /// No floor: the governor decides.
    Off,
    /// About the middle of the frequency range (DCVS "nominal" corner).
    Nominal,
    /// The highest frequency (DCVS "turbo" corner).
    Turbo,
}

/// Everything a backend can vote for. [`Votes::ACTIVE`] is held while batches are submitted
/// or running; [`Votes::RELEASED`] asks for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Votes {
    /// Clock level / frequency floor.
    pub clock: ClockLevel,
    /// Memory bandwidth / DDR performance mode.
    pub memory_perf: bool,
    /// Sleep-disable (wake-latency) request: the largest wake-up latency, in µs, the worker
    /// tolerates from idle states; `None`: no request (deep sleep allowed).
    pub wake_latency_us: Option<u32>,
    /// Matrix unit (HMX on Hexagon) powered up.
    pub matrix_unit: bool,
}

impl Votes {
    /// Votes held while the worker computes: turbo floor, memory performance mode, idle
    /// states limited to 100 µs exit latency (shallow C-states / WFI stay allowed, power
    /// collapse does not), matrix unit on.
    pub const ACTIVE: Votes = Votes {
        clock: ClockLevel::Turbo,
        memory_perf: true,
        wake_latency_us: Some(100),
        matrix_unit: true,
    };
    /// No votes at all.
    pub const RELEASED: Votes = Votes {
        clock: ClockLevel::Off,
        memory_perf: false,
        wake_latency_us: None,
        matrix_unit: false,
    };

    /// Whether nothing is voted for.
    pub fn is_released(&self) -> bool {
        *self == Self::RELEASED
    }
}

/// A power backend: moves the hardware votes to the requested set.
///
/// Backends never fail the worker: an interface that is missing or refuses a write is
/// reported once (a `tracing` warning) and skipped from then on.
pub trait PowerBackend: Send {
    /// Short name for status and logs ("linux", "recording", "none", "hexagon").
    fn name(&self) -> &'static str;

    /// Moves every vote to `votes` (both raising and releasing).
    fn apply(&mut self, votes: &Votes);

    /// Blocks until the hardware has recovered after votes were raised (clocks ramped, the
    /// matrix unit powered). Default: returns at once (nothing to wait for).
    fn wait_recovered(&mut self) {}

    /// A handle that puts back every system-wide setting this backend changed, callable from
    /// outside the engine (`main`'s exit paths: the end of `serve`, a forced exit, a panic
    /// unwinding through `main`). Default: `None` (the backend changes nothing system-wide).
    fn restorer(&self) -> Option<Restorer> {
        None
    }
}

/// Restores a backend's system-wide settings (see [`PowerBackend::restorer`]). Idempotent:
/// the first [`restore`](Self::restore) writes the originals back and closes the backend (its
/// later votes change nothing), the next ones do nothing. Clones share the backend.
#[derive(Clone)]
pub struct Restorer(Arc<dyn Fn(&str) + Send + Sync>);

impl Restorer {
    /// A restorer that runs `f` with the reason ("exit", "forced exit", ...).
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Writes the originals back now; `why` is logged.
    pub fn restore(&self, why: &str) {
        (self.0)(why)
    }
}

impl std::fmt::Debug for Restorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Restorer")
    }
}

/// Calls [`Restorer::restore`] when dropped: `main` holds one for the whole of `serve`, so an
/// early return or a panic unwinding through `main` still restores.
#[derive(Debug)]
pub struct RestoreOnDrop(pub Option<Restorer>);

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        if let Some(r) = &self.0 {
            r.restore("exit");
        }
    }
}

/// A backend that votes for nothing (`--power-backend none`). The thread pool is still
/// parked on release.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPowerBackend;

impl PowerBackend for NoPowerBackend {
    fn name(&self) -> &'static str {
        "none"
    }

    fn apply(&mut self, _votes: &Votes) {}
}
