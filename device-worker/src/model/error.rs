//! Errors of the model: binding weights from the GGUF file and running a forward pass.

use gguf::GgufError;

use crate::state::rollback::RollbackError;

/// Errors binding weights or running a forward pass (`model`).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("architecture {arch:?} is not supported (supported: {supported})")]
    UnsupportedArchitecture { arch: String, supported: String },
    #[error("tensor {name:?} is missing from the model file")]
    MissingTensor { name: String },
    #[error("tensor {name:?} has GGUF dims {actual:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        actual: Vec<u64>,
    },
    #[error("kernel failed on {name}: {source}")]
    Kernel {
        name: String,
        #[source]
        source: dsp::DspError,
    },
    #[error("micro-batch of {n} tokens exceeds the scratch size {max}")]
    BatchTooLarge { n: usize, max: usize },
    #[error("context full: {needed} positions needed, {n_ctx} available")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary ({n_vocab})")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("invalid model: {0}")]
    Invalid(String),
    /// A rollback outside the rollback states of the last pass.
    #[error(transparent)]
    Rollback(#[from] RollbackError),
}

