//! Idle power: power *votes* held while batches are submitted or running, released after
//! `idle_release_ms` without any, re-applied before the next batch (DESIGN.md "Idle power",
//! Tandem §3.4 and §4.6; the sleeping queue follows llama.cpp `tools/server/server-queue.h`).
//!
//! - [`PowerBackend`]: the trait every backend implements; [`Votes`]: what is voted.
//! - [`linux`]: PM QoS (`/dev/cpu_dma_latency`) and a cpufreq floor.
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

pub use clock::{BootClock, Clock, ManualClock};
pub use figures::{LatencyHistogram, PowerFigures, PowerState};
pub use idle::{IdleConfig, IdleController, TickAction};
pub use linux::LinuxBackend;
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
