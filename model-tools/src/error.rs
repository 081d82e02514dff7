//! Errors of the model tools (the dry run; `draft-vocab` has its own
//! [`crate::draft_vocab::DraftVocabError`]).

use std::path::PathBuf;

use agent_gateway::error::{CorpusError, GatewayError};

/// What can stop a dry run.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// The corpus folder or an episode in it cannot be read.
    #[error("corpus: {0}")]
    Corpus(#[from] CorpusError),
    /// A step's prompt cannot be built (an observation that does not parse, a missing step).
    #[error(transparent)]
    Step(#[from] GatewayError),
    /// A model file cannot be read, or has no tokenizer, template or known architecture.
    #[error("model {path}: {reason}")]
    Model { path: PathBuf, reason: String },
    /// The `--state-shapes` file cannot be read or has no known architecture.
    #[error("state shapes {path}: {reason}")]
    StateShapes { path: PathBuf, reason: String },
    /// The `--mmproj` file cannot be read, is no vision projector, or does not fit the model.
    #[error("projector {path}: {reason}")]
    Mmproj { path: PathBuf, reason: String },
    /// Options that cannot go together (`--screenshots` without `--mmproj`, an image-token
    /// budget with min > max): a usage error, reported before any file is read.
    #[error(transparent)]
    Usage(#[from] device_worker::config::ConfigError),
    /// A step's prompt cannot be rendered or tokenized.
    #[error("episode {episode} step {step}: {reason}")]
    Prompt { episode: String, step: usize, reason: String },
    /// The tables cannot be written (a reader that went away ends the run quietly instead,
    /// [`tandem_options::write_stdout`]).
    #[error("writing to standard output: {0}")]
    Output(#[from] std::io::Error),
}
