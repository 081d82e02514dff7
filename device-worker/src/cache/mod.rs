//! Cross-request reuse for hybrid models: checkpoint policies, the slot/prompt-cache metadata
//! and the dry-run planner (DESIGN.md "Cross-request reuse"; Tandem §2.4, §3.2, §4.2).
//!
//! [`plan::plan`] is pure; [`store::CacheState::apply`] advances the metadata after a plan ran.
//! `device-worker plan` replays prompts through them alone.

pub mod chat_tokens;
pub mod execute;
pub mod plan;
pub mod policy;
pub mod store;

pub use chat_tokens::{chat_tokens, ChatTokens};
pub use execute::{CacheEvents, SlotCache};
pub use plan::{plan, Batch, Plan, PlanRequest, Source, Start};
pub use policy::{PlanConfig, Policy};
pub use store::{CacheState, CachedSequence, CheckpointMeta, PromptCacheEntry};
