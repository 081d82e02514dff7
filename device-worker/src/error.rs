//! Error types of the device-worker library.
//!
//! Each concern has its own enum (`GgufError` for the model file, `TokenizerError`,
//! `TemplateError`, `ConstraintError`); [`WorkerError`] wraps them for callers that cross
//! concerns (engine, gRPC service).

pub use gguf::{GgufError, TemplateError, TokenizerError};

/// Everything that can go wrong in the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {n_tokens} tokens; the context holds {n_ctx} (prompt + at least one output token)")]
    PromptTooLong { n_tokens: usize, n_ctx: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the request queue is full; retry later")]
    QueueFull,
    #[error("the model is still loading")]
    Loading,
    #[error("the model failed to load: {0}")]
    LoadFailed(String),
    #[error("the engine has stopped")]
    EngineStopped,
    #[error("a batch ran {elapsed_ms} ms, over the watchdog limit of {limit_ms} ms; the engine is restarting")]
    WatchdogTimeout { limit_ms: u64, elapsed_ms: u64 },
    #[error("the engine was abandoned by the watchdog; its results are discarded")]
    Abandoned,
    #[error("--experience-file {path}: {source}")]
    ExperienceFile {
        path: std::path::PathBuf,
        source: crate::spec::SpecError,
    },
    #[error("--experience-file {path}: the folder {folder} does not exist (the memory could never be saved)")]
    ExperienceFolder {
        path: std::path::PathBuf,
        folder: std::path::PathBuf,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

/// How an error is reported at the gRPC boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The caller's input is wrong (INVALID_ARGUMENT).
    InvalidArgument,
    /// Too much load (RESOURCE_EXHAUSTED).
    ResourceExhausted,
    /// Loading, stopped or sleeping (UNAVAILABLE).
    Unavailable,
    /// A bug or a broken model (INTERNAL).
    Internal,
}

impl WorkerError {
    /// The gRPC class of this error.
    pub fn grpc_class(&self) -> ErrorClass {
        match self {
            Self::EmptyPrompt
            | Self::PromptTooLong { .. }
            | Self::InvalidRequest(_)
            | Self::Tokenizer(_)
            | Self::Template(_) => ErrorClass::InvalidArgument,
            Self::Constraint(ConstraintError::InvalidSchema(_)) => ErrorClass::InvalidArgument,
            Self::QueueFull => ErrorClass::ResourceExhausted,
            Self::Loading
            | Self::LoadFailed(_)
            | Self::ExperienceFile { .. }
            | Self::ExperienceFolder { .. }
            | Self::EngineStopped
            | Self::WatchdogTimeout { .. }
            | Self::Abandoned => ErrorClass::Unavailable,
            _ => ErrorClass::Internal,
        }
    }
}

// === Model ===

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
}

// === Checkpoint ===

/// Errors saving, restoring or placing recurrent-state checkpoints (`state::checkpoint`,
/// `model::prefill`).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint at position {pos} cannot be restored: the KV cache holds only {kv_len} positions")]
    BeyondKv { pos: usize, kv_len: usize },
    #[error("checkpoint has {actual_layers} recurrent layers / {actual_bytes} bytes; the sequence state has {expected_layers} layers / {expected_bytes} bytes")]
    ShapeMismatch {
        expected_layers: usize,
        expected_bytes: usize,
        actual_layers: usize,
        actual_bytes: usize,
    },
    #[error(
        "the sequence state has no recurrent state (attention-only model): nothing to restore"
    )]
    NotRecurrent,
    #[error("checkpoint position {pos} is outside {start}..={end} of this prefill or not after the previous one ({prev:?})")]
    SavePosition {
        pos: usize,
        start: usize,
        end: usize,
        prev: Option<usize>,
    },
    #[error("KV prefix of {n} positions cannot be copied: {reason}")]
    KvPrefix { n: usize, reason: String },
    #[error(transparent)]
    Model(#[from] ModelError),
}

// === Constraint ===

/// Errors building or driving a grammar constraint (`constraint`).
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    #[error("building the token trie / parser factory failed: {0}")]
    Setup(String),
    #[error("invalid JSON schema: {0}")]
    InvalidSchema(String),
    #[error("token {token} is not allowed by the grammar here: {reason}")]
    TokenRejected { token: u32, reason: String },
    #[error("grammar parser error: {0}")]
    Parser(String),
}
