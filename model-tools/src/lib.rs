//! Model-file tools of tandem (the `tandem-tools` binary): what needs both the gateway's prompt
//! building and the worker's model-side code, so that neither server links the other.
//!
//! - [`dry_run`]: the corpus through the worker's checkpoint planner alone (no model run).
//! - [`draft_vocab`]: adds a trimmed draft vocabulary to a GGUF (the `mtp-trimmed` drafter).
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod draft_vocab;
pub mod dry_run;
pub mod error;

pub use error::ToolsError;
