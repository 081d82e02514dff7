//! Model files and forward passes. Loading (GGUF names and metadata) stays in each
//! architecture's `from_gguf`; `forward` never sees tensor names.
pub mod error;
pub mod llama;
pub mod op_profile;
pub mod parallel;
pub(crate) mod project;
pub mod qwen35;
pub mod weights;

use std::sync::Arc;

use dsp::pool::ThreadPool;

pub use error::ModelError;
use crate::state::mtp::MtpCache;
use crate::state::rollback::RollbackPrefill;
use crate::state::sequence::{SequenceShape, SequenceState};
use gguf::GgufFile;
pub use llama::LlamaModel;
pub use project::Outputs;
pub use qwen35::Qwen35Model;

/// A loaded model of one of the supported architectures. One value lives per engine, so the
/// variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Model {
    Llama(LlamaModel),
    Qwen35(Qwen35Model),
}

/// Which output head an MTP pass drafts with ([`Model::mtp_forward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpHead {
    /// The tied LM head over the whole vocabulary (`mtp`).
    Full,
    /// The trimmed draft head over N rows of the vocabulary (`mtp-trimmed`).
    Trimmed,
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

/// The sequence-state shapes of the model in `file`, from its metadata alone (no tensor is
/// read): what the worker allocates per slot and the checkpoint planner counts.
///
/// Errors: [`ModelError::UnsupportedArchitecture`]; a missing or inconsistent hyperparameter.
pub fn sequence_shape(file: &GgufFile) -> Result<SequenceShape, ModelError> {
    let arch = file.architecture()?.to_string();
    match arch.as_str() {
        "llama" => Ok(llama::LlamaConfig::from_gguf(file)?.sequence_shape()),
        "qwen35" => Ok(qwen35::Qwen35Config::from_gguf(file)?.sequence_shape()),
        _ => Err(ModelError::UnsupportedArchitecture {
            arch,
            supported: Model::SUPPORTED.join(", "),
        }),
    }
}

impl Model {
    /// Architectures this build runs (`general.architecture`).
    pub const SUPPORTED: &'static [&'static str] = &["llama", "qwen35"];

    /// The shapes of one sequence's state (see [`sequence_shape`]).
    pub fn sequence_shape(&self) -> SequenceShape {
        match self {
            Self::Llama(m) => m.cfg.sequence_shape(),
            Self::Qwen35(m) => m.cfg.sequence_shape(),
        }
    }

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
        self.sequence_shape().new_state(n_ctx)
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
        let outputs = if want_logits {
            Outputs::Last
        } else {
            Outputs::None
        };
        self.pass(pool, seq, tokens, scratch, outputs)
    }

    /// A verification pass of speculative decoding (Tandem §3.3): `tokens` = the last
    /// accepted token followed by the drafts, in one pass. Returns the logits
    /// `[tokens.len(), n_vocab]` of every position (row `i` predicts the token after
    /// `tokens[..=i]`); hidden states in [`Model::hidden`]. With rollback states on
    /// ([`Model::set_rollback`] with `K ≥ tokens.len()`) the sequence can then be cut back to
    /// any position of the pass ([`Model::rollback`]).
    ///
    /// Errors: as [`Model::forward`].
    pub fn verify<'s>(
        &self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        scratch: &'s mut Scratch,
    ) -> Result<&'s [f32], ModelError> {
        self.pass(pool, seq, tokens, scratch, Outputs::All)?
            .ok_or_else(|| ModelError::Invalid("verification pass returned no logits".into()))
    }

    fn pass<'s>(
        &self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        scratch: &'s mut Scratch,
        outputs: Outputs,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        match (self, scratch) {
            (Self::Llama(m), Scratch::Llama(s)) => m.forward(pool, &mut seq.kv, tokens, s, outputs),
            (Self::Qwen35(m), Scratch::Qwen35(s)) => m.forward(pool, seq, tokens, s, outputs),
            _ => Err(ModelError::Invalid(
                "scratch buffers were made for another architecture".into(),
            )),
        }
    }

    /// Hidden size (`n_embd`).
    pub fn n_embd(&self) -> usize {
        match self {
            Self::Llama(m) => m.cfg.n_embd,
            Self::Qwen35(m) => m.cfg.n_embd,
        }
    }

    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits in the
    /// last pass with `scratch` (1 row after a prefill's last batch or a decode step, `n`
    /// after a verification pass). Empty for a scratch of another architecture.
    pub fn hidden<'s>(&self, scratch: &'s Scratch) -> &'s [f32] {
        match scratch {
            Scratch::Llama(s) => s.hidden(self.n_embd()),
            Scratch::Qwen35(s) => s.hidden(self.n_embd()),
        }
    }

    /// Every following pass keeps what a rollback of up to `k − 1` of its tokens needs:
    /// nothing for attention-only models (the KV cache is truncated), the last `k` recurrent
    /// states for hybrid ones, produced as `mode` says. `k = 0` turns it off.
    pub fn set_rollback(&self, scratch: &mut Scratch, k: usize, mode: RollbackPrefill) {
        if let (Self::Qwen35(m), Scratch::Qwen35(s)) = (self, scratch) {
            m.set_rollback(s, k, mode);
        }
    }

    /// Cuts `seq` back to `len` positions inside the last pass run with `scratch` (rejected
    /// drafts): KV truncation, and for hybrid models the recurrent state of position `len`
    /// from the rollback states.
    ///
    /// Errors: [`ModelError::Invalid`] when `len` is beyond the sequence, or (hybrid) outside
    /// the rollback states of the last pass or with rollback states off.
    pub fn rollback(
        &self,
        seq: &mut SequenceState,
        scratch: &Scratch,
        len: usize,
    ) -> Result<(), ModelError> {
        if len > seq.len() {
            return Err(ModelError::Invalid(format!(
                "rollback to {len}: the sequence has only {} positions",
                seq.len()
            )));
        }
        match (self, scratch) {
            (Self::Qwen35(_), Scratch::Qwen35(s)) => match &s.rollback {
                Some(rb) => Ok(rb.rollback(seq, len)?),
                None if len == seq.len() => Ok(()),
                None => Err(ModelError::Invalid(
                    "rollback of a hybrid model needs rollback states (set_rollback)".into(),
                )),
            },
            _ => {
                seq.kv.truncate(len);
                Ok(())
            }
        }
    }

    /// Whether the model has an MTP block (Qwen3.5 files with the nextn block).
    pub fn has_mtp(&self) -> bool {
        matches!(self, Self::Qwen35(m) if m.has_mtp())
    }

    /// Rows of the MTP block's trimmed draft head (`None`: no such head).
    pub fn mtp_draft_rows(&self) -> Option<usize> {
        match self {
            Self::Qwen35(m) => m.mtp_draft_rows(),
            Self::Llama(_) => None,
        }
    }

    /// An empty MTP cache for a slot of `n_ctx` positions (`None` without an MTP block).
    pub fn new_mtp_cache(&self, n_ctx: usize) -> Option<MtpCache> {
        match self {
            Self::Qwen35(m) => m.new_mtp_cache(n_ctx),
            Self::Llama(_) => None,
        }
    }

    /// Makes every following pass with `scratch` keep (or not) the output-normed hidden
    /// state of every position ([`Model::hidden_rows`]). No-op for architectures without
    /// an MTP block.
    pub fn set_hidden_rows(&self, scratch: &mut Scratch, on: bool) {
        if let (Self::Qwen35(m), Scratch::Qwen35(s)) = (self, scratch) {
            m.set_hidden_rows(s, on);
        }
    }

    /// Output-normed hidden states `[n, n_embd]` of every position of the last pass with
    /// `scratch`, when kept ([`Model::set_hidden_rows`]); empty otherwise.
    pub fn hidden_rows<'s>(&self, scratch: &'s Scratch) -> &'s [f32] {
        match scratch {
            Scratch::Qwen35(s) => s.hidden_rows(self.n_embd()),
            Scratch::Llama(_) => &[],
        }
    }

    /// One pass of the MTP block over the rows of positions `pos0..pos0 + next.len()`; see
    /// [`Qwen35Model::mtp_forward`]. Returns the last row's logits over `head` (`[n_vocab]`
    /// or `[N]`), none without `head`; the last row's output hidden is in
    /// [`Model::mtp_hidden`].
    ///
    /// Errors: as [`Qwen35Model::mtp_forward`]; [`ModelError::Invalid`] for a model without
    /// an MTP block or a scratch of another architecture.
    #[allow(clippy::too_many_arguments)]
    pub fn mtp_forward<'s>(
        &self,
        pool: &ThreadPool,
        cache: &mut MtpCache,
        pos0: usize,
        hidden: &[f32],
        next: &[u32],
        scratch: &'s mut Scratch,
        head: Option<MtpHead>,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        match (self, scratch) {
            (Self::Qwen35(m), Scratch::Qwen35(s)) => {
                m.mtp_forward(pool, cache, pos0, hidden, next, s, head)
            }
            _ => Err(ModelError::Invalid(format!(
                "the {} model has no MTP block",
                self.architecture()
            ))),
        }
    }

    /// The output hidden `[n_embd]` of the last row of the last MTP pass with `scratch`.
    pub fn mtp_hidden<'s>(&self, scratch: &'s Scratch) -> &'s [f32] {
        match scratch {
            Scratch::Qwen35(s) => s.mtp_hidden(),
            Scratch::Llama(_) => &[],
        }
    }

    /// The original token id of row `row` of an MTP head (identity for [`MtpHead::Full`]);
    /// `None` outside the head.
    pub fn mtp_token_id(&self, head: MtpHead, row: u32) -> Option<u32> {
        match self {
            Self::Qwen35(m) => m.mtp_token_id(head, row),
            Self::Llama(_) => None,
        }
    }

    /// Rows one MTP pass with `scratch` may hold (its micro-batch size; 0 for
    /// architectures without an MTP block).
    pub fn mtp_max_rows(&self, scratch: &Scratch) -> usize {
        match scratch {
            Scratch::Qwen35(s) => s.n_batch(),
            Scratch::Llama(_) => 0,
        }
    }

    /// Milliseconds the passes spent producing rollback states since the last call.
    pub fn take_rollback_ms(&self, scratch: &mut Scratch) -> f64 {
        match scratch {
            Scratch::Qwen35(s) => s.take_rollback_ms(),
            Scratch::Llama(_) => 0.0,
        }
    }
}
