//! Error types of the device-worker library.
//!
//! Each concern has its own enum (`GgufError` for the model file, `TokenizerError`,
//! `TemplateError`, `ConstraintError`); [`WorkerError`] wraps them for callers that cross
//! concerns (engine, gRPC service).

use std::path::PathBuf;

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

// === GGUF ===

/// Errors reading a GGUF model file (`model::gguf`). Offsets and sizes are in bytes.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error("GGUF header truncated while reading {what} at offset {offset}: needs {needed} bytes, file has {file_bytes}")]
    HeaderTruncated {
        what: String,
        offset: u64,
        needed: u64,
        file_bytes: u64,
    },
    #[error(
        "{what} at offset {offset} declares length {len}, which exceeds the {file_bytes}-byte file"
    )]
    LengthExceedsFile {
        what: String,
        offset: u64,
        len: u64,
        file_bytes: u64,
    },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("metadata key {key:?} has unknown value type id {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata arrays nested deeper than {max_depth} levels under key {key:?}")]
    NestingTooDeep { key: String, max_depth: usize },
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey { key: String },
    #[error(
        "tensor {tensor:?} has type id {type_id} ({type_name}), which this build does not support"
    )]
    UnknownTensorType {
        tensor: String,
        type_id: u32,
        type_name: &'static str,
    },
    #[error("tensor {tensor:?} has {n_dims} dimensions; at most {max} are allowed")]
    TooManyDims {
        tensor: String,
        n_dims: u32,
        max: u32,
    },
    #[error("tensor {tensor:?} of type {ty} has invalid shape {dims:?}: {reason}")]
    BadShape {
        tensor: String,
        ty: dsp::GgmlType,
        dims: Vec<u64>,
        reason: &'static str,
    },
    #[error("duplicate tensor name {tensor:?}")]
    DuplicateTensor { tensor: String },
    #[error("general.alignment = {alignment} is not a non-zero power of two")]
    InvalidAlignment { alignment: u64 },
    #[error(
        "tensor {tensor:?} data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {tensor:?} data ends at byte {needed}, past the end of the {file_bytes}-byte file (truncated model file?)")]
    Truncated {
        tensor: String,
        needed: u64,
        file_bytes: u64,
    },
    #[error("tensor {name:?} not found in the GGUF file")]
    TensorNotFound { name: String },
    #[error("metadata key {key:?} not found")]
    MissingKey { key: String },
    #[error("metadata key {key:?}: expected {expected}, found {actual}")]
    WrongType {
        key: String,
        expected: &'static str,
        actual: String,
    },
}

// === Tokenizer ===

/// Errors building or running the tokenizer (`tokenizer`).
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported tokenizer model {model:?} (supported: \"gpt2\")")]
    UnsupportedModel { model: String },
    #[error("unsupported pre-tokenizer {pre:?} (supported: {supported})")]
    UnsupportedPreTokenizer {
        pre: String,
        supported: &'static str,
    },
    #[error("tokenizer vocabulary is inconsistent: {0}")]
    BadVocab(String),
    #[error("merge #{index} {merge:?} is not two space-separated tokens")]
    BadMerge { index: usize, merge: String },
    #[error("special token id {id} is outside the vocabulary of {vocab_size} tokens")]
    BadSpecialId { id: u32, vocab_size: usize },
    #[error("building the tokenizer failed: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
}

// === Chat template ===

/// Errors compiling or rendering the chat template (`chat_template`).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("chat template does not compile: {0}")]
    Compile(#[source] minijinja::Error),
    #[error("chat template failed to render: {0}")]
    Render(#[source] minijinja::Error),
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
