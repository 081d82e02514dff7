//! Worker configuration, in two layers:
//!
//! - [`options`]: what a user writes — the clap options of `serve` and `bench`, mirrored
//!   key for key by a TOML file given with `--config FILE` (keys are the long flags;
//!   precedence defaults < file < environment < flags, [`tandem_options`]); every default
//!   is a constant of [`defaults`], defined once.
//! - [`settings`]: what the engine, the benchmark and the dry run consume — the options
//!   validated once into typed values (durations, bytes, the resolved model path and thread
//!   count, the verification pass size `K = n_draft + 1`, the planner's configuration).

pub mod defaults;
pub mod header;
pub mod options;
pub mod settings;

use std::path::PathBuf;

pub use header::{check_model_files, check_model_paths, ModelHeader};
pub use options::{
    DraftLengthMode, Drafters, EngineOptions, KernelArgs, PowerBackendKind, ServeOptions,
};
pub use settings::{check_image_budget_usage, image_budget, ConfigError, EngineSettings, PlannerSettings, SpecSettings, VisionSettings};

/// Where `tools/fetch_model.sh` puts the default model (`$TANDEM_CACHE/models/`, default
/// `~/.cache/tandem/models/`).
pub fn default_model_path() -> PathBuf {
    let cache = std::env::var_os("TANDEM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tandem")))
        .unwrap_or_else(|| PathBuf::from(".cache/tandem"));
    cache.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The compute threads of `--threads`: the value given, else every core of this machine
/// (one when the count is unknown). `serve` and `bench` use it, so both default alike.
pub fn threads_or_all_cores(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Clap value parser for counts that must be at least 1 (`must be at least 1` for 0); used
/// by serve, bench and the dry run.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Clap value parser for `--ctx-size` (`serve` and `tandem-tools dry-run`): at least
/// [`defaults::MIN_CTX_SIZE`] tokens.
pub fn ctx_size(s: &str) -> Result<usize, String> {
    let n = s.parse::<usize>().map_err(|e| e.to_string())?;
    settings::at_least_min_ctx(n).map_err(|e| e.reason.to_string())
}

/// Clap value parser for `--n-draft` (`serve` and `bench`): drafts per verification pass,
/// 1..=[`defaults::MAX_N_DRAFT`]; another value is clap's usage error naming the flag and the
/// range.
pub fn n_draft() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(defaults::MAX_N_DRAFT))
}

/// As [`at_least_one`] for `u64` values (milliseconds).
pub fn at_least_one_u64(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
