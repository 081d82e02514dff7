//! Errors of the GGUF crate: reading a file ([`GgufError`]), writing one
//! ([`crate::writer::GgufWriteError`]), building or running the tokenizer ([`TokenizerError`])
//! and the chat template ([`TemplateError`]).

use std::path::PathBuf;

// === GGUF ===

/// Errors reading a GGUF model file (`reader`). Offsets and sizes are in bytes.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first 4 bytes are not `GGUF`; `found` holds them, non-printable bytes escaped
    /// (`PK\x03\x04` for a zip file).
    #[error("not a GGUF file: it starts with \"{found}\", expected \"GGUF\"")]
    BadMagic { found: String },
    /// The path is a directory, not a file.
    #[error("{path} is a directory, not a GGUF file")]
    IsDirectory { path: PathBuf },
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error("GGUF header truncated while reading {what} at offset {offset}: needs {needed} bytes, file has {file_bytes}")]
    HeaderTruncated {
        what: String,
        offset: u64,
        needed: u64,
        file_bytes: u64,
    },
    /// A length or count in the header promises more data than the rest of the file holds:
    /// `len` items of `unit` need at least `needed` bytes, and only `remaining` of the
    /// `file_bytes`-byte file follow `offset` (a file cut short, or a corrupt count).
    #[error(
        "{what} at offset {offset} declares {len} {unit}, needing at least {needed} bytes, but only {remaining} bytes of the {file_bytes}-byte file follow (truncated or corrupt model file?)"
    )]
    LengthExceedsFile {
        what: String,
        offset: u64,
        len: u64,
        unit: &'static str,
        needed: u64,
        remaining: u64,
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

