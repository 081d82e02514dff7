//! The worker's options as the user writes them: clap flags, mirrored by the keys of a
//! `--config` TOML file (the long flag names; [`tandem_options`]), serialisable so
//! `--print-config` shows the effective values as such a file. Validated into
//! [`super::EngineSettings`] before anything uses them.

use std::path::PathBuf;

use super::defaults as d;
use super::{at_least_one, at_least_one_u64, default_model_path};
pub use crate::speculative::DraftLengthMode;

/// The engine's options (`serve`).
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct EngineOptions {
    /// GGUF model file (architectures `llama` and `qwen35`). Default: the SmolLM2-135M-Instruct Q4_1 file
    /// fetched by `tools/fetch_model.sh` into $TANDEM_CACHE (or ~/.cache/tandem).
    #[arg(long, env = "TANDEM_MODEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Vision projector GGUF for screenshots (llama.cpp's `convert_hf_to_gguf.py --mmproj`,
    /// projector `qwen3vl_merger`); its projection size must equal the model's hidden size.
    /// Without it the worker is text-only and refuses images with INVALID_ARGUMENT.
    #[arg(long, env = "TANDEM_MMPROJ")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
    /// Fewest image tokens per image (llama.cpp's `--image-min-tokens`; its default for
    /// Qwen-VL is 8): smaller images are upscaled.
    #[arg(long, default_value_t = crate::model::vision::preprocess::DEFAULT_MIN_TOKENS)]
    pub image_min_tokens: usize,
    /// Most image tokens per image (llama.cpp's `--image-max-tokens`; its default for Qwen-VL
    /// is 4096; a 1080×2400 screenshot takes 2550): larger images are downscaled.
    #[arg(long, default_value_t = crate::model::vision::preprocess::DEFAULT_MAX_TOKENS)]
    pub image_max_tokens: usize,
    /// Image embeddings kept by content (SHA-256 of the image bytes), in MiB, so an unchanged
    /// screenshot is not encoded again (0 disables it). A 1080×2400 screenshot at the default
    /// budget is 2550 tokens × hidden × 4 bytes (10 MiB at hidden 1024).
    #[arg(long, default_value_t = d::IMAGE_CACHE_MIB)]
    pub image_cache_mib: usize,
    /// Most decoded pixels of all images of one request together, in megapixels (10⁶ px;
    /// a 1080×2400 screenshot is 2.6), checked from each image's header before it is
    /// decoded; over it the request is INVALID_ARGUMENT. Each image is decoded, resized and
    /// freed before the next, so this bounds a request's decoding time, not its memory.
    #[arg(long, default_value_t = crate::model::vision::decode::DEFAULT_REQUEST_MPX, value_parser = at_least_one_u64)]
    pub image_request_mpx: u64,
    /// Compute threads (the engine thread included). Default: all cores.
    #[arg(long, short = 't', value_parser = at_least_one)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Kernel backend (see `kernels`).
    #[command(flatten)]
    #[serde(flatten)]
    pub kernels: KernelArgs,
    /// Context length per slot, in tokens (prompt + output); at least 64. Over the model's
    /// trained context it is lowered to that, with a warning.
    #[arg(long, default_value_t = d::CTX_SIZE, value_parser = super::ctx_size)]
    pub ctx_size: usize,
    /// Slots (sequences with their own KV cache). Episodes are pinned to slots.
    #[arg(long, default_value_t = d::SLOTS, value_parser = at_least_one)]
    pub slots: usize,
    /// Micro-batch size for prefill, in tokens.
    #[arg(long, default_value_t = d::MICRO_BATCH, value_parser = at_least_one)]
    pub micro_batch: usize,
    /// Requests that may wait for the engine; more get RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = d::MAX_QUEUE, value_parser = at_least_one)]
    pub max_queue: usize,
    /// Output budget when a request says 0.
    #[arg(long, default_value_t = d::DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: u32,
    /// Milliseconds without requests or batches after which every power vote is released
    /// (weights, slots and caches stay in memory).
    #[arg(long, default_value_t = d::IDLE_RELEASE_MS)]
    pub idle_release_ms: u64,
    /// Seconds without requests or batches after which the model is unloaded (the next
    /// request reloads it: a cold start); 0 never unloads.
    #[arg(long, default_value_t = d::UNLOAD_AFTER_IDLE_S)]
    pub unload_after_idle_s: u64,
    /// Power backend: `linux` (PM QoS + cpufreq floor), `recording` (records votes only) or
    /// `none`. Every backend parks the thread pool on release.
    #[arg(long, value_enum, default_value_t = PowerBackendKind::Linux)]
    #[serde(serialize_with = "as_value_enum")]
    pub power_backend: PowerBackendKind,
    /// Root directory under which the `linux` backend finds `dev/cpu_dma_latency` and
    /// `sys/devices/system/cpu/cpufreq` (tests point it at fake files).
    #[arg(long, default_value = "/")]
    pub power_root: PathBuf,
    /// Where the `linux` backend saves the original cpufreq floors it changes (removed after
    /// the exit restore; `device-worker power-restore` writes them back after a SIGKILL).
    /// Default: `run/device-worker-power.json` under `--power-root`.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_state_file: Option<PathBuf>,
    /// Milliseconds a batch (one prefill micro-batch or one decode step) may run before the
    /// watchdog fails the request with UNAVAILABLE and restarts the engine.
    #[arg(long, default_value_t = d::WATCHDOG_MS, value_parser = at_least_one_u64)]
    pub watchdog_ms: u64,
    /// TEST ONLY (fault injection): the batch after this many batches hangs until the
    /// watchdog abandons the engine. Fires once per worker process.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub fault_hang_after_batches: Option<u64>,
    /// Where recurrent-state checkpoints are saved (hybrid models): `divergence` (where
    /// consecutive prompts diverge), `stock` (llama.cpp's server) or `marconi` (every branch
    /// point); compare them on the corpus with `tandem-tools dry-run`.
    #[arg(long, value_enum, default_value_t = crate::state::planner::Policy::Divergence)]
    #[serde(serialize_with = "as_value_enum")]
    pub cache_policy: crate::state::planner::Policy,
    /// Batch consolidation: one batch boundary `--micro-batch` tokens before the prompt's end
    /// instead of llama.cpp's at end − 516 and end − 4 (`--consolidate false` for the stock
    /// boundaries).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub consolidate: bool,
    /// Recurrent-state checkpoints kept per slot.
    #[arg(long, default_value_t = d::CHECKPOINTS, value_parser = at_least_one)]
    pub checkpoints: usize,
    /// Divergence policy: save at the divergence point L only when L − R ≥ this many tokens
    /// (R: where the request resumed). 32 is Tandem §4.2's value, calibrated to a phone NPU's
    /// prefill and checkpoint costs; a smaller gap saves more often (see `tandem-tools dry-run
    /// --checkpoint-min-gap`).
    #[arg(long, default_value_t = d::CHECKPOINT_MIN_GAP)]
    pub checkpoint_min_gap: usize,
    /// Host prompt cache for earlier slot contents, in MiB (0 disables it).
    #[arg(long, default_value_t = d::PROMPT_CACHE_MIB)]
    pub prompt_cache_mib: usize,
    /// Also save a checkpoint right after the prompt's last image (hybrid models), so a
    /// prompt with the same text and image up to there does not encode or prefill the image
    /// again. Off by default (Tandem §4.5: no reuse beyond the divergence checkpoints on
    /// agent traces, one more state copy per screenshot step).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub checkpoint_after_image: bool,
    /// Speculative decoding: drafters asked for a draft each round, comma-separated:
    /// `experience` (continuations of the agent's own earlier outputs), `prompt-lookup`
    /// (n-gram match of the output against the prompt), `mtp` (the model's MTP block;
    /// Qwen3.5 GGUFs with the nextn layer), `mtp-trimmed` (the MTP block with a trimmed draft
    /// vocabulary, added by `tandem-tools draft-vocab`), or `none`. With --draft-length
    /// adaptive the proposal with the most expected tokens per ms wins; with fixed, the first
    /// in this order. Greedy requests only; the output is plain greedy decoding's on the same
    /// prefill (hybrid models: see --rollback-prefill). The MTP drafters also fill the MTP
    /// block's KV cache during prefill (a small prefill cost), so they are not in the default
    /// even for models that have the block. Each drafter may be named once.
    #[arg(long, default_value = d::DRAFTERS)]
    #[serde(serialize_with = "as_display")]
    pub drafters: Drafters,
    /// Most drafts verified in one pass, 1..=8 (the verification pass holds n + 1 tokens).
    #[arg(long, default_value_t = d::N_DRAFT, value_parser = super::n_draft())]
    pub n_draft: u32,
    /// `adaptive`: draft length chosen per round from measured acceptance and pass latency;
    /// `fixed`: always the longest proposal up to --n-draft.
    #[arg(long, value_enum, default_value_t = DraftLengthMode::Adaptive)]
    #[serde(serialize_with = "as_value_enum")]
    pub draft_length: DraftLengthMode,
    /// How prefill batches keep the recurrent states a rollback needs (hybrid models, with
    /// drafters on): `aware` (chunked kernel for all but the last n_draft tokens) or
    /// `per-token` (llama.cpp's behaviour: the whole batch per token; for ablations). Both
    /// round differently from the all-chunked prefill of `--drafters none`, so where two
    /// logits nearly tie the output can differ from it, as between llama.cpp's modes.
    #[arg(long, value_enum, default_value_t = crate::state::rollback::RollbackPrefill::Aware)]
    #[serde(serialize_with = "as_value_enum")]
    pub rollback_prefill: crate::state::rollback::RollbackPrefill,
    /// Experience drafter memory (earlier outputs and their hidden states), in MiB; the oldest
    /// outputs are evicted beyond it.
    #[arg(long, default_value_t = d::EXPERIENCE_MIB)]
    pub experience_mib: usize,
    /// File the experience memory is loaded from at start (when it exists) and saved to when
    /// the engine stops and every 16 requests; none: memory only.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experience_file: Option<PathBuf>,
    /// TEST ONLY: the last token of every draft is replaced by another token, so every round
    /// ends in a rejection and a rollback (greedy-equivalence tests).
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub test_corrupt_drafts: bool,
}

/// `--kernels` (`serve` and `bench`): the binaries choose dsp's kernel backend, dsp reads
/// no environment.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args, serde::Serialize)]
pub struct KernelArgs {
    /// Kernel backend: `scalar` (the reference), `avx2`, `avx512-vnni` (x86_64) or `neon`,
    /// `neon-dotprod`, `neon-i8mm` (aarch64), among those this CPU has; default: the fastest.
    /// For ablations and for bisecting numerical differences; a name this CPU cannot run
    /// (unknown, another architecture's, or missing a CPU feature) is a usage error that
    /// says why.
    #[arg(long, env = "TANDEM_KERNELS", value_parser = kernels_name)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<String>,
}

/// `--kernels` (and `TANDEM_KERNELS`): the name of a backend this CPU can run, as dsp spells
/// it; empty asks for the fastest.
///
/// Errors: [`dsp::backend::BackendNameError`]'s message (an unknown name with the known
/// ones, another architecture's backend, or the CPU features this CPU lacks).
fn kernels_name(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Ok(String::new()),
        name => dsp::backend::resolve(Some(name)).map(|b| b.name().to_string()).map_err(|e| e.to_string()),
    }
}

impl KernelArgs {
    /// Installs the backend named by `--kernels` (or the fastest) as dsp's backend for the
    /// process.
    ///
    /// # Errors
    /// The name is no backend this CPU can run (clap's parser has refused it already on a
    /// command line), or a kernel already ran with another backend
    /// ([`dsp::backend::AlreadySelected`]).
    pub fn install(&self) -> Result<(), String> {
        let backend = dsp::backend::resolve(self.kernels.as_deref()).map_err(|e| format!("--kernels (TANDEM_KERNELS): {e}"))?;
        dsp::backend::install(backend).map_err(|e| e.to_string())
    }

    /// Installs the backend `TANDEM_KERNELS` names (unset or empty: the fastest), as
    /// [`KernelArgs::install`] does for the binaries: for in-process engines without a command
    /// line (the integration tests), so a test run can be repeated per backend.
    ///
    /// # Errors
    /// As [`KernelArgs::install`].
    pub fn install_env() -> Result<(), String> {
        KernelArgs { kernels: std::env::var("TANDEM_KERNELS").ok() }.install()
    }
}

/// The `--drafters` list (empty for `none`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drafters(pub Vec<crate::speculative::DrafterKind>);

impl std::str::FromStr for Drafters {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        use clap::ValueEnum;
        let s = s.trim();
        if s == "none" {
            return Ok(Self(Vec::new()));
        }
        if s.is_empty() {
            return Err(
                "empty drafter list: name drafters (experience, prompt-lookup, mtp, mtp-trimmed) or none".into(),
            );
        }
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part == "none" {
                return Err(
                    "`none` turns speculation off and cannot be combined with drafters".into(),
                );
            }
            let kind = crate::speculative::DrafterKind::from_str(part, true).map_err(|_| {
                format!("unknown drafter {part:?}: expected prompt-lookup, experience, mtp, mtp-trimmed or none")
            })?;
            if out.contains(&kind) {
                return Err(format!("drafter {} is listed twice: name each drafter once", kind.name()));
            }
            out.push(kind);
        }
        Ok(Self(out))
    }
}

impl std::fmt::Display for Drafters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.0.iter().map(|k| k.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// Which [`crate::power::PowerBackend`] the worker uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PowerBackendKind {
    Linux,
    Recording,
    None,
}

impl Default for EngineOptions {
    /// The options with every flag at its default (as `device-worker serve` with no flags
    /// and no `TANDEM_MODEL`).
    fn default() -> Self {
        Self {
            model: None,
            mmproj: None,
            image_min_tokens: crate::model::vision::preprocess::DEFAULT_MIN_TOKENS,
            image_max_tokens: crate::model::vision::preprocess::DEFAULT_MAX_TOKENS,
            image_cache_mib: d::IMAGE_CACHE_MIB,
            image_request_mpx: crate::model::vision::decode::DEFAULT_REQUEST_MPX,
            threads: None,
            kernels: KernelArgs::default(),
            ctx_size: d::CTX_SIZE,
            slots: d::SLOTS,
            micro_batch: d::MICRO_BATCH,
            max_queue: d::MAX_QUEUE,
            default_max_tokens: d::DEFAULT_MAX_TOKENS,
            idle_release_ms: d::IDLE_RELEASE_MS,
            unload_after_idle_s: d::UNLOAD_AFTER_IDLE_S,
            power_backend: PowerBackendKind::Linux,
            power_root: PathBuf::from("/"),
            power_state_file: None,
            watchdog_ms: d::WATCHDOG_MS,
            fault_hang_after_batches: None,
            cache_policy: crate::state::planner::Policy::Divergence,
            consolidate: true,
            checkpoints: d::CHECKPOINTS,
            checkpoint_min_gap: d::CHECKPOINT_MIN_GAP,
            prompt_cache_mib: d::PROMPT_CACHE_MIB,
            checkpoint_after_image: false,
            drafters: d::DRAFTERS.parse().expect("the default drafters parse"),
            n_draft: d::N_DRAFT,
            draft_length: DraftLengthMode::Adaptive,
            rollback_prefill: crate::state::rollback::RollbackPrefill::Aware,
            experience_mib: d::EXPERIENCE_MIB,
            experience_file: None,
            test_corrupt_drafts: false,
        }
    }
}

impl EngineOptions {
    /// The model file: `--model`, else the default model's path.
    pub fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }
}

/// `serve --config`'s help, with this program's keys as examples.
const CONFIG_HELP: &str = "TOML file of options: its keys are this command's long flags (`model = \"/data/local/tmp/model.gguf\"`, `ctx-size = 4096`, `micro-batch = 256`, `listen = \"unix:/data/local/tmp/worker.sock\"`); flags and environment variables override it. `--print-config` writes one";

/// The `serve` command's options.
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[command(mut_arg("config", |a| a.help(CONFIG_HELP)))]
pub struct ServeOptions {
    #[command(flatten)]
    #[serde(skip)]
    pub config: tandem_options::ConfigArgs,
    /// Address for StepService (gRPC): `HOST:PORT`, or `unix:PATH` for a Unix-domain socket
    /// (mode 0600, only this user can connect; a stale socket file is replaced, the file is
    /// removed on exit; the gateway dials it as `--worker unix:PATH`). Use 127.0.0.1 on a
    /// phone reached by `adb forward`, a Unix socket between two processes of one app.
    #[arg(long, default_value = "127.0.0.1:50051")]
    #[serde(serialize_with = "as_display")]
    pub listen: tandem_auth::ListenAddr,
    #[command(flatten)]
    #[serde(flatten)]
    pub engine: EngineOptions,
    #[command(flatten)]
    #[serde(flatten)]
    pub telemetry: crate::telemetry::TelemetryArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub auth: tandem_auth::AuthArgs,
}

/// Serializes a value by its `Display` text (e.g. [`Drafters`] as `"experience,prompt-lookup"`).
fn as_display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Serializes a clap value enum by its command-line name (`divergence`, `per-token`).
fn as_value_enum<T: clap::ValueEnum, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    match v.to_possible_value() {
        Some(p) => s.serialize_str(p.get_name()),
        None => Err(serde::ser::Error::custom("a skipped value-enum variant")),
    }
}
