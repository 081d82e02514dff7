//! Per-slot inference state, and where it is kept across requests.
//!
//! - One sequence's model state: [`kv`] (the attention KV cache), [`recurrent`] (the Gated
//!   DeltaNet conv and delta-rule states), [`sequence`] (both, with their shapes), [`mtp`]
//!   (the MTP block's own KV cache, beside the slot's sequence).
//! - Saved copies: [`checkpoint`] (a recurrent state at one position), [`rollback`] (the
//!   states a pass keeps so speculative drafts can be rolled back), [`prompt_cache`] (earlier
//!   slot contents on the host), [`image_cache`] (image embeddings by content).
//! - [`slot`]: a slot (tokens, state, saved copies, session) and the choice of slot.
//! - [`planner`]: where checkpoints go and what a request processes (policy, a pure plan, its
//!   execution on a slot), the same code the dry run uses.
//!
//! Nothing here runs the model: the model writes these states, the engine moves them.

pub mod checkpoint;
pub mod error;
pub mod image_cache;
pub mod kv;
pub mod mtp;
pub mod planner;
pub mod prompt_cache;
pub mod recurrent;
pub mod rollback;
pub mod sequence;
pub mod slot;

pub use error::CheckpointError;
