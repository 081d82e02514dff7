//! Errors of the draft side of speculative decoding ([`crate::speculative`]).

use std::path::PathBuf;

/// What went wrong building a drafter or controller, storing an output in the experience
/// memory, or saving/loading the memory file.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// `--drafters mtp` / `mtp-trimmed` on a model without an MTP ("nextn") block.
    #[error("--drafters {drafter}: the {arch} model {model} has no MTP (nextn) block; use a Qwen3.5 GGUF converted with its MTP layer, or other drafters (experience, prompt-lookup)")]
    NoMtpBlock {
        drafter: &'static str,
        arch: &'static str,
        model: PathBuf,
    },

    /// `--drafters mtp-trimmed` on a model without the trimmed draft head.
    #[error("--drafters mtp-trimmed: {model} has no trimmed draft head (tensor blk.N.nextn.draft_output.weight and key <arch>.nextn_draft_token_ids); write a copy with one: `{tool}`")]
    NoDraftVocab { model: PathBuf, tool: &'static str },

    /// `PromptLookup` n-gram bounds must satisfy `1 <= min_ngram <= max_ngram`.
    #[error(
        "prompt lookup n-gram range {min_ngram}..={max_ngram} is invalid (need 1 <= min <= max)"
    )]
    InvalidNgramRange { min_ngram: usize, max_ngram: usize },

    /// A `DraftLengthConfig` value is out of its range.
    #[error("draft-length config `{field}` = {value} is out of range ({expected})")]
    InvalidConfig {
        field: &'static str,
        value: f64,
        expected: &'static str,
    },

    /// `--experience-file` exists but cannot be loaded (unreadable, another hidden size).
    #[error("--experience-file {path}: {source}")]
    ExperienceFile {
        path: PathBuf,
        #[source]
        source: Box<SpecError>,
    },

    /// `--experience-file`'s folder does not exist: the memory could never be saved.
    #[error("--experience-file {path}: the folder {folder} does not exist (the memory could never be saved)")]
    ExperienceFolder { path: PathBuf, folder: PathBuf },

    /// A slice handed to the experience memory has the wrong length.
    #[error("{what}: expected {expected} values, got {actual}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },

    /// A hidden state holds NaN or infinity.
    #[error("{what}: row {row} holds a non-finite value")]
    NonFiniteHidden { what: &'static str, row: usize },

    /// Reading or writing the memory file failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file does not start with the experience-memory magic.
    #[error("{path} is not an experience-memory file: magic {found:?}, expected {expected:?}")]
    BadMagic {
        path: PathBuf,
        expected: [u8; 4],
        found: [u8; 4],
    },

    /// The file was written by another format version.
    #[error("{path}: format version {found}, this build reads version {expected}")]
    UnsupportedVersion {
        path: PathBuf,
        expected: u32,
        found: u32,
    },

    /// The file was written for a model with another hidden size.
    #[error("{path}: stored for n_embd {found}, the model has n_embd {expected}")]
    EmbdMismatch {
        path: PathBuf,
        expected: usize,
        found: usize,
    },

    /// The file ends before the data its header announces.
    #[error(
        "{path} is truncated: {what} needs {needed} bytes at offset {offset}, {available} left"
    )]
    Truncated {
        path: PathBuf,
        what: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },

    /// The checksum trailer does not match the contents.
    #[error("{path} is corrupt: checksum {actual:#018x}, trailer says {expected:#018x}")]
    ChecksumMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// The contents are structurally invalid (checksum passed but a value is impossible).
    #[error("{path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}
