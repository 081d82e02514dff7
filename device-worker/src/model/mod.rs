//! Model files and forward passes.
//!
//! - [`blocks`]: the blocks every architecture is built from (attention, SwiGLU MLP, RMSNorm,
//!   token embedding, output head), each bound by name through the [`loader::Loader`].
//! - One file per architecture (`llama.rs`, `qwen35.rs` with its GDN and MTP blocks) wires
//!   the blocks in its graph's order and implements [`CausalLm`]; [`ARCHITECTURES`] lists
//!   them (adding an architecture = its file and one line there).
//! - [`multimodal`]: images inside a text sequence (their embeddings and multimodal rotary
//!   positions), handed to a model with [`CausalLm::set_images`].
//! - [`Model`] is the loaded model the engine, the drafters and the bench use; it owns its
//!   activation buffers, so no buffer of another architecture can be handed to it.
pub mod blocks;
pub mod error;
pub mod llama;
pub mod loader;
pub mod multimodal;
pub mod op_profile;
pub mod parallel;
pub(crate) mod project;
pub mod qwen35;
pub mod vision;
pub mod weights;

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use dsp::pool::ThreadPool;

pub use blocks::Outputs;
pub use error::ModelError;
pub use llama::LlamaModel;
pub use qwen35::Qwen35Model;
use crate::state::checkpoint::Checkpoint;
use crate::state::mtp::MtpCache;
use crate::state::rollback::RollbackPrefill;
use crate::state::sequence::{SequenceShape, SequenceState};
use gguf::GgufFile;

/// Which output head an MTP pass drafts with ([`CausalLm::mtp_forward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpHead {
    /// The tied LM head over the whole vocabulary (`mtp`).
    Full,
    /// The trimmed draft head over N rows of the vocabulary (`mtp-trimmed`).
    Trimmed,
}

/// What one MTP pass runs on ([`CausalLm::mtp_forward`], `speculative::mtp::MtpStep::step`):
/// the rows of positions `pos0..pos0 + n` with `n = next.len()`, their input hidden states
/// `hidden` `[n, n_embd]` (the target's `h_i`, or the MTP block's own output for recursive
/// draft steps), `next`, the token after each position, and the `head` the last row drafts
/// with (`None`: the pass only writes cache entries).
#[derive(Clone, Copy, Debug)]
pub struct MtpPass<'a> {
    pub pos0: usize,
    pub hidden: &'a [f32],
    pub next: &'a [u32],
    pub head: Option<MtpHead>,
}

/// Binds the weights of a file of one architecture (buffers for 1-token batches; see
/// [`CausalLm::set_max_batch`]).
pub type LoadFn = fn(Arc<GgufFile>) -> Result<Box<dyn CausalLm>, ModelError>;

/// The sequence-state shapes of a file of one architecture, reading no tensor (the dry run
/// and the planner).
pub type ShapeFn = fn(&GgufFile) -> Result<SequenceShape, ModelError>;

/// One supported architecture (`general.architecture`): how to bind a file of it and its
/// sequence-state shapes from metadata alone.
pub struct Architecture {
    pub name: &'static str,
    pub load: LoadFn,
    pub shape: ShapeFn,
}

/// The architectures this build runs: one line per architecture file.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture { name: "llama", load: llama::load, shape: llama::sequence_shape },
    Architecture { name: "qwen35", load: qwen35::load, shape: qwen35::sequence_shape },
];

/// The registry entry of the architecture of `file`.
///
/// Errors: [`ModelError::UnsupportedArchitecture`] naming it and the supported ones;
/// [`ModelError::Gguf`] without `general.architecture`.
fn architecture_of(file: &GgufFile) -> Result<&'static Architecture, ModelError> {
    let arch = file.architecture()?;
    ARCHITECTURES
        .iter()
        .find(|a| a.name == arch)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            arch: arch.to_string(),
            supported: Model::supported().collect::<Vec<_>>().join(", "),
        })
}

/// The sequence-state shapes of the model in `file`, from its metadata alone (no tensor is
/// read): what the worker allocates per slot and the checkpoint planner counts.
///
/// Errors: [`ModelError::UnsupportedArchitecture`]; a missing or inconsistent hyperparameter.
pub fn sequence_shape(file: &GgufFile) -> Result<SequenceShape, ModelError> {
    (architecture_of(file)?.shape)(file)
}

/// A decoder-only language model of one architecture with its activation buffers: a forward
/// pass over a micro-batch appends to a [`SequenceState`] and yields logits. The MTP,
/// rollback and hidden-row methods have defaults for architectures without them (no MTP
/// block; attention-only, whose rollback is a KV truncation).
pub trait CausalLm: Send + Sync {
    /// The shapes of one sequence's state (see [`sequence_shape`]).
    fn sequence_shape(&self) -> SequenceShape;

    /// Vocabulary size (rows of the LM head).
    fn n_vocab(&self) -> usize;

    /// Hidden size (`n_embd`).
    fn n_embd(&self) -> usize;

    /// Context length the model was trained with.
    fn n_ctx_train(&self) -> usize;

    /// Parameter count (every bound tensor; a tied output head counted once).
    fn n_params(&self) -> u64;

    /// Whether the model has recurrent layers (its sequence state cannot be rewound to an
    /// arbitrary position; see [`SequenceState::truncate`]).
    fn is_recurrent(&self) -> bool {
        false
    }

    /// Sizes the activation buffers for micro-batches of up to `n_batch` tokens (at least
    /// 1), keeping the rollback, hidden-row and profiling settings.
    fn set_max_batch(&mut self, n_batch: usize);

    /// Tokens a micro-batch may hold ([`CausalLm::set_max_batch`]).
    fn max_batch(&self) -> usize;

    /// One micro-batch: `tokens` at positions `seq.len()..seq.len() + tokens.len()`,
    /// appended to `seq`. Returns the logits `[rows, n_vocab]` of the positions `outputs`
    /// asks for (`None` for [`Outputs::None`]); their output-normed hidden states are then
    /// in [`CausalLm::hidden`].
    ///
    /// Errors: [`ModelError::BatchTooLarge`], [`ModelError::ContextFull`],
    /// [`ModelError::TokenOutOfRange`], [`ModelError::Invalid`] for an empty batch or a
    /// sequence state of another model; kernel errors.
    fn pass(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        outputs: Outputs,
    ) -> Result<Option<&[f32]>, ModelError>;

    /// Sets (or clears, `None`) the images of the sequence the following passes extend: in
    /// their spans the passes take the image embeddings instead of the token embeddings,
    /// and every position rotates by its multimodal position
    /// ([`multimodal::SequenceImages`]). Without images a pass is exactly the text pass.
    /// Default: no architecture without multimodal positions takes images.
    ///
    /// Errors: [`ModelError::Invalid`] for images on a model that cannot take them.
    fn set_images(&mut self, images: Option<std::sync::Arc<multimodal::SequenceImages>>) -> Result<(), ModelError> {
        match images {
            None => Ok(()),
            Some(_) => Err(ModelError::Invalid("this architecture takes no images".into())),
        }
    }

    /// Output-normed hidden states `[rows, n_embd]` of the positions that got logits in the
    /// last pass (1 row after a prefill's last batch or a decode step, `n` after a
    /// verification pass).
    fn hidden(&self) -> &[f32];

    /// Every following pass keeps what a rollback of up to `k − 1` of its tokens needs:
    /// nothing for attention-only models (the default: the KV cache is truncated), the last
    /// `k` recurrent states for hybrid ones, produced as `mode` says. `k = 0` turns it off.
    fn set_rollback(&mut self, _k: usize, _mode: RollbackPrefill) {}

    /// Cuts `seq` back to `len <= seq.len()` positions inside the last pass (rejected
    /// drafts); [`Model::rollback`] checks `len`. Default: KV truncation.
    ///
    /// Errors: [`ModelError::Invalid`] (hybrid) outside the rollback states of the last pass
    /// or with rollback states off.
    fn rewind(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), ModelError> {
        seq.kv.truncate(len);
        Ok(())
    }

    /// The recurrent state after the first `len` positions of the last pass, as a checkpoint,
    /// from its rollback states ([`crate::state::rollback::RollbackStates::checkpoint_at`]);
    /// `seq` is unchanged. Default: `None` (attention-only: nothing to save).
    ///
    /// Errors: [`ModelError::Invalid`] (hybrid) outside the rollback states of the last pass
    /// or with rollback states off.
    fn rollback_checkpoint(
        &self,
        _pool: &ThreadPool,
        _seq: &SequenceState,
        _len: usize,
    ) -> Result<Option<Checkpoint>, ModelError> {
        Ok(None)
    }

    /// Milliseconds the passes spent producing rollback states since the last call.
    fn take_rollback_ms(&mut self) -> f64 {
        0.0
    }

    /// Makes every following pass keep (or not) the output-normed hidden state of every
    /// position ([`CausalLm::hidden_rows`]). Default: no-op (no MTP block).
    fn set_hidden_rows(&mut self, _on: bool) {}

    /// Output-normed hidden states `[n, n_embd]` of every position of the last pass, when
    /// kept ([`CausalLm::set_hidden_rows`]); empty otherwise.
    fn hidden_rows(&self) -> &[f32] {
        &[]
    }

    /// Starts (`true`: a fresh [`op_profile::OpProfile`]) or stops per-op timing of the
    /// forward passes. Returns `false` when the architecture has no per-op timing (the
    /// default).
    fn set_profiling(&mut self, _on: bool) -> bool {
        false
    }

    /// The per-op timing collected since [`CausalLm::set_profiling`]`(true)`.
    fn profile(&self) -> Option<&op_profile::OpProfile> {
        None
    }

    /// Whether the model has an MTP block (Qwen3.5 files with the nextn block).
    fn has_mtp(&self) -> bool {
        false
    }

    /// Rows of the MTP block's trimmed draft head (`None`: no such head).
    fn mtp_draft_rows(&self) -> Option<usize> {
        None
    }

    /// An empty MTP cache for a slot of `n_ctx` positions (`None` without an MTP block).
    fn new_mtp_cache(&self, _n_ctx: usize) -> Option<MtpCache> {
        None
    }

    /// Rows one MTP pass may hold (the micro-batch size; 0 without an MTP block).
    fn mtp_max_rows(&self) -> usize {
        0
    }

    /// One pass of the MTP block ([`MtpPass`]: positions `pos0..pos0 + next.len()`, `hidden`
    /// `[n, n_embd]` their input hidden states, `next` the token after each); the entries
    /// are appended to `cache`. Returns the last row's logits over `pass.head`
    /// (`[n_vocab]` or `[N]`), none without a head; the last row's output hidden is in
    /// [`CausalLm::mtp_hidden`].
    ///
    /// Errors: [`ModelError::Invalid`] without an MTP block (the default), for a trimmed
    /// head the file lacks, mismatched lengths or entries that cannot be appended;
    /// [`ModelError::BatchTooLarge`], [`ModelError::TokenOutOfRange`], kernel errors.
    fn mtp_forward(
        &mut self,
        _pool: &ThreadPool,
        _cache: &mut MtpCache,
        _pass: MtpPass<'_>,
    ) -> Result<Option<&[f32]>, ModelError> {
        Err(ModelError::Invalid("the model has no MTP block".into()))
    }

    /// The output hidden `[n_embd]` of the last row of the last MTP pass.
    fn mtp_hidden(&self) -> &[f32] {
        &[]
    }

    /// The original token id of row `row` of an MTP head (identity for [`MtpHead::Full`]);
    /// `None` outside the head or without an MTP block.
    fn mtp_token_id(&self, _head: MtpHead, _row: u32) -> Option<u32> {
        None
    }
}

/// Work a [`Model`] has done since it was loaded, counted by the model itself at every
/// pass that returns ([`Model::forward`]: prefill micro-batches and decode steps;
/// [`Model::verify`]: verification passes). MTP draft passes run the MTP block on its own
/// and are not counted. Tests check the engine's and the planner's figures against it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Passes (micro-batches) run.
    pub passes: u64,
    /// Tokens those passes processed (the sum of their batch lengths).
    pub tokens: u64,
}

/// A loaded model of one of the [`ARCHITECTURES`] (derefs to its [`CausalLm`]). One value
/// lives per engine; it owns its activation buffers.
pub struct Model {
    lm: Box<dyn CausalLm>,
    arch: &'static str,
    counts: PassCounts,
}

impl Deref for Model {
    type Target = dyn CausalLm;
    fn deref(&self) -> &Self::Target {
        &*self.lm
    }
}

impl DerefMut for Model {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.lm
    }
}

impl Model {
    /// Names of the architectures this build runs (`general.architecture`).
    pub fn supported() -> impl Iterator<Item = &'static str> {
        ARCHITECTURES.iter().map(|a| a.name)
    }

    /// Binds the weights of `file` for its architecture, with buffers for 1-token batches
    /// ([`CausalLm::set_max_batch`] sizes them).
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] naming the architecture and the
    /// supported ones; missing tensors or metadata.
    pub fn load(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let arch = architecture_of(&file)?;
        Ok(Self {
            lm: (arch.load)(file)?,
            arch: arch.name,
            counts: PassCounts::default(),
        })
    }

    /// The passes and tokens run since the model was loaded ([`PassCounts`]).
    pub fn pass_counts(&self) -> PassCounts {
        self.counts
    }

    /// One pass of the architecture, counted once it returns.
    fn counted_pass(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        outputs: Outputs,
    ) -> Result<Option<&[f32]>, ModelError> {
        let out = self.lm.pass(pool, seq, tokens, outputs)?;
        self.counts.passes += 1;
        self.counts.tokens += tokens.len() as u64;
        Ok(out)
    }

    /// The architecture's name (`general.architecture`).
    pub fn architecture(&self) -> &'static str {
        self.arch
    }

    /// Per-sequence state (KV cache, and recurrent state for hybrid models) for `n_ctx`
    /// positions.
    pub fn new_sequence_state(&self, n_ctx: usize) -> SequenceState {
        self.sequence_shape().new_state(n_ctx)
    }

    /// One micro-batch at positions `seq.len()..` ([`CausalLm::pass`]). Returns the last
    /// token's logits `[n_vocab]` when `want_logits`.
    ///
    /// Errors: as [`CausalLm::pass`].
    pub fn forward(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
        want_logits: bool,
    ) -> Result<Option<&[f32]>, ModelError> {
        let outputs = if want_logits {
            Outputs::Last
        } else {
            Outputs::None
        };
        self.counted_pass(pool, seq, tokens, outputs)
    }

    /// A verification pass of speculative decoding (Tandem §3.3): `tokens` = the last
    /// accepted token followed by the drafts, in one pass. Returns the logits
    /// `[tokens.len(), n_vocab]` of every position (row `i` predicts the token after
    /// `tokens[..=i]`); hidden states in [`CausalLm::hidden`]. With rollback states on
    /// ([`CausalLm::set_rollback`] with `K ≥ tokens.len()`) the sequence can then be cut back
    /// to any position of the pass ([`Model::rollback`]).
    ///
    /// Errors: as [`CausalLm::pass`].
    pub fn verify(
        &mut self,
        pool: &ThreadPool,
        seq: &mut SequenceState,
        tokens: &[u32],
    ) -> Result<&[f32], ModelError> {
        self.counted_pass(pool, seq, tokens, Outputs::All)?
            .ok_or_else(|| ModelError::Invalid("verification pass returned no logits".into()))
    }

    /// Cuts `seq` back to `len` positions inside the last pass (rejected drafts): KV
    /// truncation, and for hybrid models the recurrent state of position `len` from the
    /// rollback states ([`CausalLm::rewind`]).
    ///
    /// Errors: [`ModelError::Invalid`] when `len` is beyond the sequence, or (hybrid) outside
    /// the rollback states of the last pass or with rollback states off.
    pub fn rollback(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), ModelError> {
        if len > seq.len() {
            return Err(ModelError::Invalid(format!(
                "rollback to {len}: the sequence has only {} positions",
                seq.len()
            )));
        }
        self.lm.rewind(seq, len)
    }
}
