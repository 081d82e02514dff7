//! Model files and forward passes. Loading (GGUF names and metadata) stays in each
//! architecture's `from_gguf`; `forward` never sees tensor names.
pub mod gguf;
pub mod llama;
pub mod op_profile;
pub mod parallel;
pub mod prefill;
pub(crate) mod project;
pub mod qwen35;
pub mod weights;

use std::sync::Arc;

use dsp::pool::ThreadPool;

use crate::error::ModelError;
use crate::state::sequence::SequenceState;
use gguf::GgufFile;
pub use llama::LlamaModel;
pub use qwen35::Qwen35Model;

/// A loaded model of one of the supported architectures. One value lives per engine, so the
/// variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Model {
    Llama(LlamaModel),
    Qwen35(Qwen35Model),
}

/// Activation buffers of one architecture's forward pass (see [`Model::new_scratch`]); one
/// per engine.
#[allow(clippy::large_enum_variant)]
pub enum Scratch {
    Llama(llama::Scratch),
    Qwen35(qwen35::Scratch),
}

impl Scratch {
    /// Starts (`true`: a fresh [`op_profile::OpProfile`]) or stops per-op timing of the forward
    /// passes that use this scratch. Returns `false` when the architecture has no per-op
    /// timing (llama).
    pub fn set_profiling(&mut self, on: bool) -> bool {
        match self {
            Scratch::Qwen35(s) => {
                s.profile = on.then(op_profile::OpProfile::default);
                true
            }
            Scratch::Llama(_) => false,
        }
    }

    /// The per-op timing collected since [`Scratch::set_profiling`]`(true)`.
    pub fn profile(&self) -> Option<&op_profile::OpProfile> {
        match self {
            Scratch::Qwen35(s) => s.profile.as_ref(),
            Scratch::Llama(_) => None,
        }
    }
}

impl Model {
    /// Architectures this build runs (`general.architecture`).
    pub const SUPPORTED: &'static [&'static str] = &["llama", "qwen35"];

    /// Binds the weights of `file` for its architecture.
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] naming the architecture and the
    /// supported ones; missing tensors or metadata.
    pub fn load(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        match arch.as_str() {
            "llama" => Ok(Self::Llama(LlamaModel::from_gguf(file)?)),
            "qwen35" => Ok(Self::Qwen35(Qwen35Model::from_gguf(file)?)),
            _ => Err(ModelError::UnsupportedArchitecture {
                arch,
                supported: Self::SUPPORTED.join(", "),
            }),
        }
    }

    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Llama(_) => "llama",
            Self::Qwen35(_) => "qwen35",
        }
    }

    pub fn n_vocab(&self) -> usize {
        match self {
            Self::Llama(m) => m.cfg.n_vocab,
            Self::Qwen35(m) => m.cfg.n_vocab,
        }
    }

    pub fn n_ctx_train(&self) -> usize {
        match self {
            Self::Llama(m) => m.cfg.n_ctx_train,
            Self::Qwen35(m) => m.cfg.n_ctx_train,
        }
    }

    pub fn n_params(&self) -> u64 {
        match self {
            Self::Llama(m) => m.n_params(),
            Self::Qwen35(m) => m.n_params(),
        }
    }

    /// Whether the model has recurrent layers (its sequence state cannot be rewound to an
    /// arbitrary position; see [`SequenceState::truncate`]).
    pub fn is_recurrent(&self) -> bool {
        matches!(self, Self::Qwen35(_))
    }

    /// Per-sequence state (KV cache, and recurrent state for hybrid models) for `n_ctx`
    /// positions.
    pub fn new_sequence_state(&self, n_ctx: usize) -> SequenceState {
        match self {
            Self::Llama(m) => SequenceState::attention_only(m.new_kv_cache(n_ctx)),
            Self::Qwen35(m) => m.new_sequence_state(n_ctx),
        }
    }

    /// Buffers for micro-batches of up to `n_batch` tokens.
    pub fn new_scratch(&self, n_batch: usize) -> Scratch {
        match self {
            Self::Llama(m) => Scratch::Llama(m.new_scratch(n_batch)),
            Self::Qwen35(m) => Scratch::Qwen35(m.new_scratch(n_batch)),
        }
    }

    /// One micro-batch at positions `seq.len()..`; see [`LlamaModel::forward`] and
    /// [`Qwen35Model::forward`]. Returns the last token's logits `[n_vocab]` when
    /// `want_logits`.
    ///
    /// Errors: as the architecture's `forward`; [`ModelError::Invalid`] for a scratch made by
    /// another architecture.
    pub fn forward<'s>(
        &self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        scratch: &'s mut Scratch,
        want_logits: bool,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        match (self, scratch) {
            (Self::Llama(m), Scratch::Llama(s)) => {
                m.forward(pool, &mut seq.kv, tokens, s, want_logits)
            }
            (Self::Qwen35(m), Scratch::Qwen35(s)) => m.forward(pool, seq, tokens, s, want_logits),
            _ => Err(ModelError::Invalid(
                "scratch buffers were made for another architecture".into(),
            )),
        }
    }
}
