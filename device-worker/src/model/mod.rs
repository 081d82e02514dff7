//! Model files and forward passes. Loading (GGUF names and metadata) stays in each
//! architecture's `from_gguf`; `forward` never sees tensor names.
pub mod gguf;
pub mod llama;
pub mod parallel;
pub mod weights;

use std::sync::Arc;

use dsp::pool::ThreadPool;

use crate::error::ModelError;
use crate::state::kv::KvCache;
use gguf::GgufFile;
pub use llama::{LlamaModel, Scratch};

/// A loaded model of one of the supported architectures.
pub enum Model {
    Llama(LlamaModel),
}

impl Model {
    /// Architectures this build runs (`general.architecture`).
    pub const SUPPORTED: &'static [&'static str] = &["llama"];

    /// Binds the weights of `file` for its architecture.
    ///
    /// Errors: [`ModelError::UnsupportedArchitecture`] naming the architecture and the
    /// supported ones; missing tensors or metadata.
    pub fn load(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        match arch.as_str() {
            "llama" => Ok(Self::Llama(LlamaModel::from_gguf(file)?)),
            _ => Err(ModelError::UnsupportedArchitecture { arch, supported: Self::SUPPORTED.join(", ") }),
        }
    }

    pub fn architecture(&self) -> &'static str {
        match self {
            Self::Llama(_) => "llama",
        }
    }

    pub fn n_vocab(&self) -> usize {
        match self {
            Self::Llama(m) => m.cfg.n_vocab,
        }
    }

    pub fn n_ctx_train(&self) -> usize {
        match self {
            Self::Llama(m) => m.cfg.n_ctx_train,
        }
    }

    pub fn n_params(&self) -> u64 {
        match self {
            Self::Llama(m) => m.n_params(),
        }
    }

    pub fn new_kv_cache(&self, n_ctx: usize) -> KvCache {
        match self {
            Self::Llama(m) => m.new_kv_cache(n_ctx),
        }
    }

    pub fn new_scratch(&self, n_batch: usize) -> Scratch {
        match self {
            Self::Llama(m) => m.new_scratch(n_batch),
        }
    }

    /// One micro-batch at positions `kv.len()..`; see [`LlamaModel::forward`].
    pub fn forward<'s>(
        &self,
        pool: &ThreadPool,
        kv: &mut KvCache,
        tokens: &[u32],
        scratch: &'s mut Scratch,
        want_logits: bool,
    ) -> Result<Option<&'s [f32]>, ModelError> {
        match self {
            Self::Llama(m) => m.forward(pool, kv, tokens, scratch, want_logits),
        }
    }
}
