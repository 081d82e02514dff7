//! Checkpoint policies and the planner's configuration (Tandem §2.4, §4.2; DESIGN.md
//! "Cross-request reuse").

/// Where recurrent-state checkpoints are saved while a prompt is processed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// llama.cpp's server on a hybrid model: checkpoints 516 and 4 tokens before the prompt's
    /// end (`STOCK_FAR`, `STOCK_NEAR`) and at the start of the last user message; evicts the
    /// oldest first.
    Stock,
    /// Marconi (Pan et al. 2025): a checkpoint at every branch point (the divergence point L)
    /// and at the prompt's end; evicts the lowest utility (recency plus compute saved per
    /// byte).
    Marconi,
    /// Tandem §4.2: split the batch that crosses the divergence point L and save there iff L is
    /// before the prompt's end and any image and L − R ≥ `--checkpoint-min-gap` (default 20;
    /// half of it when L starts a line and the previous request diverged there too), with L
    /// moved back to the start of its line when that is still far enough from R; at most one
    /// new checkpoint per request; evicts the oldest first. A slot with no checkpoint (its
    /// first request) saves once at the last user message's start, else at the start of the
    /// prompt's last paragraph, else near or at the prompt's end, so later prompts can resume;
    /// with an image, before the image (the start of its line when the last user message
    /// starts past it).
    /// Besides, the end-of-prompt state (`n − 1`,
    /// [`PlanConfig::end_state`]) replaces the previous one, so a repeated prompt processes
    /// one token.
    #[default]
    Divergence,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Stock, Policy::Marconi, Policy::Divergence];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Stock => "stock",
            Policy::Marconi => "marconi",
            Policy::Divergence => "divergence",
        }
    }
}

/// llama.cpp's server ends a batch (and saves a checkpoint) this many tokens before the end of
/// the prompt: `n_batch + 4` (observed at 516, ../shared/PEER.md).
pub const STOCK_FAR: usize = 516;
/// ... and this many tokens before the end (the last tokens are re-processed on an exact
/// repeat, so their logits exist).
pub const STOCK_NEAR: usize = 4;

/// Everything the planner needs besides the slot and the request (built from the typed
/// settings, `config::PlannerSettings::plan_config`; `Default` is defined there too).
#[derive(Clone, Debug, PartialEq)]
pub struct PlanConfig {
    pub policy: Policy,
    /// One batch boundary [`PlanConfig::n_batch`] tokens before the prompt's end instead of the
    /// stock ones at `end − 516` and `end − 4` (600 tokens run as 88 + 512, not 84 + 512 + 4);
    /// a save at a restored checkpoint's position reuses that copy.
    pub consolidate: bool,
    /// Micro-batch limit (tokens per forward pass).
    pub n_batch: usize,
    /// Checkpoints kept per slot.
    pub n_checkpoints: usize,
    /// Divergence policy: minimum `L − R` for a new checkpoint (Tandem §4.2: 32).
    pub min_gap: usize,
    /// Whether the model has recurrent layers. Without them a slot resumes at `L` (a KV cache
    /// truncates anywhere) and no checkpoints are planned.
    pub hybrid: bool,
    /// Bytes of one checkpoint (the recurrent state), for eviction by bytes and the figures.
    pub checkpoint_bytes: usize,
    /// Bytes of KV cache per cached token (prompt-cache entry sizes).
    pub kv_bytes_per_token: usize,
    /// Host prompt-cache byte limit (0 disables the prompt cache).
    pub prompt_cache_bytes: usize,
    /// Divergence policy: save the end-of-prompt state (`n − 1`) from the last prefill batch's
    /// rollback states (`state/rollback.rs`), so an identical prompt processes one token. Only
    /// when the model keeps rollback states (speculative decoding on: `K = n_draft + 1 ≥ 2`).
    pub end_state: bool,
    /// Save a checkpoint right after the prompt's last image (`--checkpoint-after-image`,
    /// off by default as in Tandem §4.5), so a prompt with the same text and image up to
    /// there resumes past the image (not encoded or prefilled again).
    pub after_image: bool,
}

