//! Cross-request reuse for hybrid models: where checkpoints go and what each request
//! processes (DESIGN.md "Cross-request reuse"; Tandem §2.4, §3.2, §4.2).
//!
//! - [`policy`]: the policies (`stock`, `marconi`, `divergence`) and [`PlanConfig`].
//! - [`plan`]: the pure planner — for a slot's metadata and a prompt: the resume point, the
//!   batches, the checkpoints saved, restored and evicted.
//! - [`meta`]: what the planner knows ([`CacheState`]: a slot's tokens and checkpoint
//!   positions, the prompt-cache entries), advanced by [`CacheState::apply`] after a plan ran.
//! - [`execute`]: [`SlotCache`], the engine side: the saved states moved exactly as planned.
//!
//! The engine and the dry run (`tandem-tools dry-run`) run the same [`plan`] and
//! [`CacheState::apply`], so they cannot disagree on which tokens a request processes.

pub mod execute;
pub mod meta;
pub mod plan;
pub mod policy;

pub use execute::{CacheEvents, SharedPromptCache, SlotCache};
pub use meta::{CacheState, CachedSequence, CheckpointMeta, PromptCacheEntry};
pub use plan::{plan, resume_point, Batch, Plan, PlanRequest, Source, Start};
pub use policy::{PlanConfig, Policy};
