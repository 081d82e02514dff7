//! Error types of the device-worker library.
//!
//! Each concern has its own enum beside its code (`GgufError`, `TokenizerError` and
//! `TemplateError` in the gguf crate, [`ModelError`] in `model`, [`CheckpointError`] in
//! `state`, [`ConstraintError`] in `constraint`, `SpecError` in `spec`), re-exported here;
//! [`WorkerError`] wraps them for callers that cross concerns (engine, gRPC service). Lower
//! modules never name `WorkerError`, so this module sits above them.

pub use crate::constraint::ConstraintError;
pub use crate::model::ModelError;
pub use crate::speculative::SpecError;
pub use crate::state::CheckpointError;
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
    /// The projector file (`--mmproj`) or a request's image.
    #[error(transparent)]
    Vision(#[from] crate::model::vision::VisionError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {n_tokens} tokens; the context holds {n_ctx} (prompt + at least one output token)")]
    PromptTooLong { n_tokens: usize, n_ctx: usize },
    #[error("the prompt has {n_bytes} bytes of text, at least {min_tokens} tokens; the context holds {n_ctx} (refused before tokenizing)")]
    PromptTextTooLong { n_bytes: usize, min_tokens: usize, n_ctx: usize },
    /// Tokenizing stopped once the prompt was known to be over the context
    /// ([`gguf::tokenizer::Tokenizer::encode_bounded`]): `at_least` tokens in the first
    /// `bytes_read` of the rendered prompt's `n_bytes` bytes.
    #[error("the prompt has at least {at_least} tokens (counted in its first {bytes_read} of {n_bytes} bytes, where tokenizing stopped); the context holds {n_ctx} (prompt + at least one output token)")]
    PromptOverContext { at_least: usize, bytes_read: usize, n_bytes: usize, n_ctx: usize },
    /// An explicit `max_tokens` that does not fit the context after the prompt (OpenAI's
    /// "maximum context length" refusal; without `max_tokens` generation stops at the end
    /// of the context instead).
    #[error("max_tokens {max_tokens} does not fit: the context holds {n_ctx} tokens, the request asks for {} ({n_prompt} prompt + {max_tokens} max_tokens); expected max_tokens at most {}", n_prompt + *max_tokens as usize, n_ctx - n_prompt)]
    MaxTokensOverContext { max_tokens: u32, n_prompt: usize, n_ctx: usize },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A field outside its rule ([`tandem_proto::limits`]): the message names the field and
    /// the allowed values.
    #[error("invalid request: {0}")]
    InvalidField(#[from] tandem_proto::limits::FieldError),
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
    /// A drafter cannot start (an experience file that does not load, an MTP drafter on a
    /// model without the parts it needs).
    #[error(transparent)]
    Spec(#[from] SpecError),
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

impl ErrorClass {
    /// Every class, for zero-initialising series.
    pub const ALL: [ErrorClass; 4] = [Self::InvalidArgument, Self::ResourceExhausted, Self::Unavailable, Self::Internal];

    /// The gRPC code in snake case: `"invalid_argument"`, `"resource_exhausted"`,
    /// `"unavailable"`, `"internal"` (the `reason` label of refused requests).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::ResourceExhausted => "resource_exhausted",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}

impl WorkerError {
    /// The gRPC class of this error.
    pub fn grpc_class(&self) -> ErrorClass {
        match self {
            Self::EmptyPrompt
            | Self::PromptTooLong { .. }
            | Self::PromptTextTooLong { .. }
            | Self::PromptOverContext { .. }
            | Self::MaxTokensOverContext { .. }
            | Self::InvalidRequest(_)
            | Self::InvalidField(_)
            | Self::Tokenizer(_)
            | Self::Template(_) => ErrorClass::InvalidArgument,
            Self::Constraint(ConstraintError::InvalidSchema(_)) => ErrorClass::InvalidArgument,
            Self::Vision(e) if e.is_invalid_input() => ErrorClass::InvalidArgument,
            Self::QueueFull => ErrorClass::ResourceExhausted,
            Self::Loading
            | Self::LoadFailed(_)
            | Self::Spec(_)
            | Self::EngineStopped
            | Self::WatchdogTimeout { .. }
            | Self::Abandoned => ErrorClass::Unavailable,
            _ => ErrorClass::Internal,
        }
    }
}

