//! Every default of the worker's options, defined once: the clap attributes of
//! [`super::options`], `Default` for the options and the planner, the benchmark and the dry
//! run all read these.

/// Context length per slot, tokens (prompt + output).
pub const CTX_SIZE: usize = 4096;
/// The smallest `--ctx-size` a worker starts with, tokens: room for a chat template's
/// markers, a short prompt and some output (a smaller context refuses every chat request).
pub const MIN_CTX_SIZE: usize = 64;
/// Slots (sequences with their own KV cache).
pub const SLOTS: usize = 2;
/// Prefill micro-batch, tokens (llama.cpp's `n_batch`/`n_ubatch` 512).
pub const MICRO_BATCH: usize = 512;
/// Requests that may wait for the engine.
pub const MAX_QUEUE: usize = 32;
/// Output budget when a request says 0, tokens.
pub const DEFAULT_MAX_TOKENS: u32 = 256;
/// Idle time before every power vote is released, ms (Tandem §3.4: 3 s).
pub const IDLE_RELEASE_MS: u64 = 3000;
/// Idle time before the model is unloaded, s (Tandem §3.4: 5 min).
pub const UNLOAD_AFTER_IDLE_S: u64 = 300;
/// Longest batch before the watchdog restarts the engine, ms.
pub const WATCHDOG_MS: u64 = 60_000;
/// Recurrent-state checkpoints per slot (DESIGN.md: `n_checkpoints` 8).
pub const CHECKPOINTS: usize = 8;
/// Divergence policy's minimum `L − R` for a save, tokens (half of it at a recurring
/// divergence point). Tandem §4.2 uses 32; 20 measured better on the corpus dry run (both
/// prompt formats ≤ 1.03× the KV bound, +0.08 passes per step; issue 21).
pub const CHECKPOINT_MIN_GAP: usize = 20;
/// Host prompt cache, MiB (DESIGN.md: 512 MiB).
pub const PROMPT_CACHE_MIB: usize = 512;
/// Image-embedding cache (`--image-cache-mib`): a dozen 1080×2400 screenshots of a 0.8B
/// projector (10 MiB each), four of a 4B one (2560 wide, 25 MiB).
pub const IMAGE_CACHE_MIB: usize = 128;
/// Speculative drafters (`--drafters`).
pub const DRAFTERS: &str = "experience,prompt-lookup";
/// Most drafts verified per pass (DESIGN.md: up to 3).
pub const N_DRAFT: u32 = 3;
/// The most drafts per verification pass `--n-draft` takes, on `serve` and `bench` alike
/// ([`super::n_draft`]).
pub const MAX_N_DRAFT: u32 = 8;
/// Experience drafter memory, MiB.
pub const EXPERIENCE_MIB: usize = 64;
