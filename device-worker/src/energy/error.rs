//! Errors of the energy sources.

use std::path::PathBuf;

/// Reading a power source failed.
#[derive(Debug, thiserror::Error)]
pub enum EnergyError {
    /// A sysfs attribute could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A sysfs attribute did not hold the integer it should.
    #[error("{path}: expected an integer, found {found:?}")]
    NotAnInteger { path: PathBuf, found: String },
    /// A RAPL counter went backwards by more than its range allows (counter reset, or a
    /// `max_energy_range_uj` smaller than the jump).
    #[error("{path}: energy counter went from {previous_uj} µJ to {current_uj} µJ with a range of {range_uj} µJ")]
    CounterJump { path: PathBuf, previous_uj: u64, current_uj: u64, range_uj: u64 },
    /// Samples must come in time order.
    #[error("sample at {now_s} s is before the previous one at {previous_s} s")]
    TimeWentBack { now_s: f64, previous_s: f64 },
}
