//! The worker's settings: [`super::EngineOptions`] validated once into typed values. The
//! engine, the benchmark and the dry run consume these, never the raw options.

use std::path::PathBuf;
use std::time::Duration;

use super::options::{EngineOptions, PowerBackendKind};
pub use crate::speculative::{pass_tokens, SpecSettings};
use super::defaults as d;
use crate::power::IdleConfig;
use crate::state::planner::{PlanConfig, Policy};
use crate::state::sequence::SequenceShape;

/// An option value the engine cannot run with (the flags' parsers reject these already; a
/// config built in code, e.g. by a test, can still hold them).
#[derive(Debug, thiserror::Error)]
#[error("--{option} = {value}: {reason}")]
pub struct ConfigError {
    pub option: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// The image-token budget of `--image-min-tokens` and `--image-max-tokens`, one check for
/// every command that takes them (`serve`, `bench`, `tandem-tools dry-run`).
///
/// Errors: [`ConfigError`] naming `image-max-tokens` when it is 0, else `image-min-tokens`
/// unless `1 <= min_tokens <= max_tokens`.
pub fn image_budget(
    min_tokens: usize,
    max_tokens: usize,
) -> Result<crate::model::vision::ImageBudget, ConfigError> {
    for (option, v) in [("image-max-tokens", max_tokens), ("image-min-tokens", min_tokens)] {
        if v == 0 {
            return Err(ConfigError { option, value: v.to_string(), reason: "must be at least 1" });
        }
    }
    crate::model::vision::ImageBudget::new(min_tokens, max_tokens).map_err(|_| ConfigError {
        option: "image-min-tokens",
        value: format!("{min_tokens} (--image-max-tokens {max_tokens})"),
        reason: "must be at most --image-max-tokens",
    })
}

/// `(option, changed from its default, value)` of `--image-min-tokens` and
/// `--image-max-tokens`.
fn budget_options(min_tokens: usize, max_tokens: usize) -> [(&'static str, bool, String); 2] {
    use crate::model::vision::preprocess::{DEFAULT_MAX_TOKENS, DEFAULT_MIN_TOKENS};
    [
        ("image-min-tokens", min_tokens != DEFAULT_MIN_TOKENS, min_tokens.to_string()),
        ("image-max-tokens", max_tokens != DEFAULT_MAX_TOKENS, max_tokens.to_string()),
    ]
}

/// Refuses an image option changed from its default (`(option, changed, value)`) without a
/// projector: a command without `--mmproj` takes no images, so the value would be silently
/// ignored. By value: an option given explicitly at its default is accepted.
///
/// Errors: [`ConfigError`] naming the first such option.
fn image_options_need_mmproj(
    has_mmproj: bool,
    options: impl IntoIterator<Item = (&'static str, bool, String)>,
) -> Result<(), ConfigError> {
    if has_mmproj {
        return Ok(());
    }
    match options.into_iter().find(|(_, changed, _)| *changed) {
        Some((option, _, value)) => Err(ConfigError {
            option,
            value,
            reason: "is an image option and needs --mmproj (without a projector no image is read)",
        }),
        None => Ok(()),
    }
}

/// The usage checks of `--image-min-tokens` and `--image-max-tokens` for `bench` and
/// `tandem-tools dry-run`, as `serve` makes them: off their defaults only with `--mmproj`,
/// and a valid budget ([`image_budget`]).
///
/// Errors: [`ConfigError`] naming the option.
pub fn check_image_budget_usage(has_mmproj: bool, min_tokens: usize, max_tokens: usize) -> Result<(), ConfigError> {
    image_options_need_mmproj(has_mmproj, budget_options(min_tokens, max_tokens))?;
    image_budget(min_tokens, max_tokens).map(|_| ())
}

/// `ctx_size` if it is at least [`d::MIN_CTX_SIZE`] (also `--ctx-size`'s value parser,
/// [`super::ctx_size`]).
///
/// Errors: [`ConfigError`] (`ctx-size`) for a smaller one.
pub(super) fn at_least_min_ctx(ctx_size: usize) -> Result<usize, ConfigError> {
    if ctx_size < d::MIN_CTX_SIZE {
        return Err(ConfigError {
            option: "ctx-size",
            value: ctx_size.to_string(),
            reason: "must be at least 64 tokens (a prompt with its template and some output)",
        });
    }
    Ok(ctx_size)
}

/// The projector file, the image-token budget, the embedding cache and the request's pixel
/// budget (`--mmproj`, `--image-min-tokens`, `--image-max-tokens`, `--image-cache-mib`,
/// `--image-request-mpx`).
#[derive(Clone, Debug)]
pub struct VisionSettings {
    pub mmproj: PathBuf,
    pub budget: crate::model::vision::ImageBudget,
    /// Byte limit of the image-embedding cache (0: off).
    pub cache_bytes: usize,
    /// Most decoded pixels (width · height summed) of one request's images.
    pub request_pixels: u64,
}

/// Everything the engine runs with.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// The GGUF model file.
    pub model: PathBuf,
    /// The screenshot path: `None` without `--mmproj` (text-only).
    pub vision: Option<VisionSettings>,
    /// Compute threads, the engine thread included (resolved: `--threads` or every core).
    pub threads: usize,
    /// Context length per slot, tokens (capped by the model's training context at load).
    pub ctx_size: usize,
    pub slots: usize,
    /// Prefill micro-batch, tokens.
    pub micro_batch: usize,
    /// Requests that may wait for the engine.
    pub max_queue: usize,
    /// Output budget of a request that asks for 0 tokens.
    pub default_max_tokens: u32,
    /// Power-vote release and model unload timers.
    pub idle: IdleConfig,
    pub power_backend: PowerBackendKind,
    /// The `linux` backend's root directory (`/` on a host) and state file (`None`: the
    /// default under the root).
    pub power_root: PathBuf,
    pub power_state_file: Option<PathBuf>,
    /// Longest batch before the watchdog restarts the engine.
    pub watchdog: Duration,
    /// TEST ONLY fault injection (`--fault-hang-after-batches`).
    pub fault_hang_after_batches: Option<u64>,
    pub planner: PlannerSettings,
    /// `None`: speculative decoding off (`--drafters none`).
    pub speculative: Option<SpecSettings>,
}

/// The checkpoint planner's settings (the model's state sizes come at load, see
/// [`PlannerSettings::plan_config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannerSettings {
    pub policy: Policy,
    pub consolidate: bool,
    /// Checkpoints kept per slot.
    pub n_checkpoints: usize,
    /// Divergence policy's minimum `L − R` for a save, tokens.
    pub min_gap: usize,
    /// Host prompt-cache byte limit (0: off).
    pub prompt_cache_bytes: usize,
    /// Save the end-of-prompt state from the last batch's rollback states
    /// ([`PlanConfig::end_state`]); on when speculative decoding keeps rollback states.
    pub end_state: bool,
    /// Save right after the prompt's last image ([`PlanConfig::after_image`]).
    pub after_image: bool,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        Self {
            policy: Policy::Divergence,
            consolidate: true,
            n_checkpoints: d::CHECKPOINTS,
            min_gap: d::CHECKPOINT_MIN_GAP,
            prompt_cache_bytes: d::PROMPT_CACHE_MIB << 20,
            end_state: true,
            after_image: false,
        }
    }
}

impl Default for PlanConfig {
    /// [`PlannerSettings::default`] for a hybrid model of unknown state sizes and
    /// micro-batches of [`d::MICRO_BATCH`] tokens (tests and the dry run fill in the rest).
    fn default() -> Self {
        let p = PlannerSettings::default();
        PlanConfig {
            policy: p.policy,
            consolidate: p.consolidate,
            n_batch: d::MICRO_BATCH,
            n_checkpoints: p.n_checkpoints,
            min_gap: p.min_gap,
            hybrid: true,
            checkpoint_bytes: 0,
            kv_bytes_per_token: 0,
            prompt_cache_bytes: p.prompt_cache_bytes,
            end_state: p.end_state,
            after_image: p.after_image,
        }
    }
}

impl PlannerSettings {
    /// The planner's configuration for micro-batches of `n_batch` tokens and a model whose
    /// sequence state has `shape` (hybrid or not, checkpoint bytes, KV bytes per token).
    pub fn plan_config(&self, n_batch: usize, shape: &SequenceShape) -> PlanConfig {
        PlanConfig {
            policy: self.policy,
            consolidate: self.consolidate,
            n_batch,
            n_checkpoints: self.n_checkpoints,
            min_gap: self.min_gap,
            hybrid: shape.hybrid(),
            checkpoint_bytes: shape.checkpoint_bytes(),
            kv_bytes_per_token: shape.kv_bytes_per_token(),
            prompt_cache_bytes: self.prompt_cache_bytes,
            end_state: self.end_state,
            after_image: self.after_image,
        }
    }
}

impl EngineOptions {
    /// Refuses an image option set to anything but its default without `--mmproj` (a
    /// text-only worker takes no images, so the value would be silently ignored). The check
    /// is by value: an option given explicitly at its default value (e.g.
    /// `--image-max-tokens 4096`) is accepted, as is the same key in a `--config` file.
    ///
    /// Errors: [`ConfigError`] naming the first such option (`image-min-tokens`,
    /// `image-max-tokens`, `image-cache-mib`, `image-request-mpx`, `checkpoint-after-image`).
    pub fn check_image_options_need_mmproj(&self) -> Result<(), ConfigError> {
        let d = Self::default();
        let set = [
            ("image-cache-mib", self.image_cache_mib != d.image_cache_mib, self.image_cache_mib.to_string()),
            ("image-request-mpx", self.image_request_mpx != d.image_request_mpx, self.image_request_mpx.to_string()),
            ("checkpoint-after-image", self.checkpoint_after_image != d.checkpoint_after_image, self.checkpoint_after_image.to_string()),
        ];
        let budget = budget_options(self.image_min_tokens, self.image_max_tokens);
        image_options_need_mmproj(self.mmproj.is_some(), budget.into_iter().chain(set))
    }

    /// The checks of option combinations that clap cannot make, reported as usage errors
    /// (exit code 2) before anything is loaded: an image option without `--mmproj`
    /// ([`EngineOptions::check_image_options_need_mmproj`]) and the image-token budget
    /// ([`image_budget`]).
    ///
    /// Errors: [`ConfigError`] naming the option.
    pub fn check_usage(&self) -> Result<(), ConfigError> {
        self.check_image_options_need_mmproj()?;
        image_budget(self.image_min_tokens, self.image_max_tokens).map(|_| ())
    }

    /// The settings these options describe.
    ///
    /// Errors: [`ConfigError`] for a zero count or a draft count outside 1..=8 (values the
    /// flags' parsers already reject), and [`EngineOptions::check_usage`]'s.
    pub fn settings(&self) -> Result<EngineSettings, ConfigError> {
        let positive = |option: &'static str, v: usize| {
            if v == 0 {
                Err(ConfigError { option, value: v.to_string(), reason: "must be at least 1" })
            } else {
                Ok(v)
            }
        };
        if !(1..=d::MAX_N_DRAFT).contains(&self.n_draft) {
            return Err(ConfigError {
                option: "n-draft",
                value: format!("{} (not in 1..={})", self.n_draft, d::MAX_N_DRAFT),
                reason: "drafts per verification pass out of range",
            });
        }
        let threads = positive("threads", super::threads_or_all_cores(self.threads))?;
        let speculative = (!self.drafters.0.is_empty()).then(|| SpecSettings {
            drafters: self.drafters.0.clone(),
            n_draft: self.n_draft as usize,
            draft_length: self.draft_length,
            rollback_prefill: self.rollback_prefill,
            experience_bytes: self.experience_mib << 20,
            experience_file: self.experience_file.clone(),
            corrupt_drafts: self.test_corrupt_drafts,
        });
        self.check_usage()?;
        let budget = image_budget(self.image_min_tokens, self.image_max_tokens)?;
        let cache_bytes = self.image_cache_mib << 20;
        let request_pixels = self.image_request_mpx.saturating_mul(1_000_000);
        let vision = self.mmproj.clone().map(|mmproj| VisionSettings { mmproj, budget, cache_bytes, request_pixels });
        Ok(EngineSettings {
            model: self.model_path(),
            vision,
            threads,
            ctx_size: at_least_min_ctx(self.ctx_size)?,
            slots: positive("slots", self.slots)?,
            micro_batch: positive("micro-batch", self.micro_batch)?,
            max_queue: positive("max-queue", self.max_queue)?,
            default_max_tokens: self.default_max_tokens,
            idle: IdleConfig {
                idle_release: Duration::from_millis(self.idle_release_ms),
                unload_after_idle: (self.unload_after_idle_s > 0)
                    .then(|| Duration::from_secs(self.unload_after_idle_s)),
            },
            power_backend: self.power_backend,
            power_root: self.power_root.clone(),
            power_state_file: self.power_state_file.clone(),
            watchdog: Duration::from_millis(self.watchdog_ms.max(1)),
            fault_hang_after_batches: self.fault_hang_after_batches,
            planner: PlannerSettings {
                policy: self.cache_policy,
                consolidate: self.consolidate,
                n_checkpoints: positive("checkpoints", self.checkpoints)?,
                min_gap: self.checkpoint_min_gap,
                prompt_cache_bytes: self.prompt_cache_mib << 20,
                // The rollback states exist only with speculative decoding on.
                end_state: speculative.is_some(),
                after_image: self.checkpoint_after_image,
            },
            speculative,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_zero_counts_do_not() {
        let s = EngineOptions::default().settings().unwrap();
        assert_eq!(s.micro_batch, d::MICRO_BATCH);
        assert_eq!(s.planner, PlannerSettings::default());
        assert_eq!(s.speculative.as_ref().map(|s| s.pass_tokens()), Some(d::N_DRAFT as usize + 1));
        let bad = EngineOptions { slots: 0, ..Default::default() };
        assert_eq!(bad.settings().unwrap_err().option, "slots");
        let bad = EngineOptions { n_draft: 9, ..Default::default() };
        assert_eq!(bad.settings().unwrap_err().option, "n-draft");
        let off = EngineOptions { drafters: "none".parse().unwrap(), ..Default::default() };
        assert!(off.settings().unwrap().speculative.is_none());
    }

    #[test]
    fn clap_defaults_equal_the_default_options() {
        use clap::{Args, FromArgMatches};
        let cmd = EngineOptions::augment_args(clap::Command::new("t"));
        let m = cmd.try_get_matches_from(["t"]).unwrap();
        let parsed = EngineOptions::from_arg_matches(&m).unwrap();
        let mut want = EngineOptions::default();
        // TANDEM_MODEL may be set in the test environment.
        want.model = parsed.model.clone();
        assert_eq!(format!("{parsed:?}"), format!("{want:?}"));
    }
}
