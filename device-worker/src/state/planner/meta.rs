//! What the planner knows about cached state: per slot, its tokens and checkpoint positions;
//! on the host, a byte-limited prompt cache of earlier slot contents. Metadata only — the
//! engine keeps the states themselves beside it and changes both through
//! [`CacheState::apply`], so the two never disagree.

use super::plan::{Plan, Source};
use super::policy::PlanConfig;

/// One saved recurrent state: the state after the first `pos` tokens of its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckpointMeta {
    /// Tokens absorbed by the saved state.
    pub pos: usize,
    /// Logical clock value when saved.
    pub created: u64,
    /// Logical clock value when last saved or restored.
    pub last_used: u64,
    /// The end-of-prompt state (`n − 1` of the request that saved it, taken from its last
    /// batch's rollback states): at most one per sequence, replaced by the next one, not
    /// counted in [`PlanConfig::n_checkpoints`].
    pub end: bool,
}

/// A token sequence with its checkpoints (sorted by position, unique).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedSequence {
    /// Tokens the live state has absorbed (the slot's KV cache holds all of them).
    pub tokens: Vec<u32>,
    pub checkpoints: Vec<CheckpointMeta>,
    /// Where the last request served from this sequence diverged from it before its last
    /// prompt token (its `L`, see
    /// [`super::plan::Plan::divergence`]): the divergence policy saves at a recurring
    /// divergence point that starts a line even closer to the resume point than
    /// [`PlanConfig::min_gap`] (half of it).
    pub last_divergence: Option<usize>,
}

impl CachedSequence {
    /// Newest checkpoint at or before `limit`.
    pub fn checkpoint_at_or_before(&self, limit: usize) -> Option<&CheckpointMeta> {
        self.checkpoints.iter().rev().find(|c| c.pos <= limit)
    }

    /// Bytes held: KV cache of every token plus every checkpoint.
    pub fn bytes(&self, cfg: &PlanConfig) -> usize {
        self.tokens.len() * cfg.kv_bytes_per_token + self.checkpoints.len() * cfg.checkpoint_bytes
    }
}

/// A prompt-cache entry: a slot's content stashed when the slot moved to another prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptCacheEntry {
    pub seq: CachedSequence,
    /// Logical clock value when stored (eviction: oldest first, as llama.cpp's server).
    pub stored: u64,
}

/// A slot's cache metadata plus the host prompt cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheState {
    pub slot: CachedSequence,
    pub prompt_cache: Vec<PromptCacheEntry>,
    /// Logical clock, advanced once per applied plan.
    pub clock: u64,
}

impl CacheState {
    /// Bytes held by the prompt cache.
    pub fn prompt_cache_bytes(&self, cfg: &PlanConfig) -> usize {
        self.prompt_cache.iter().map(|e| e.seq.bytes(cfg)).sum()
    }

    /// Bytes held by the slot's checkpoints.
    pub fn checkpoint_bytes(&self, cfg: &PlanConfig) -> usize {
        self.slot.checkpoints.len() * cfg.checkpoint_bytes
    }

    /// Moves the slot's content into the prompt cache as a new entry (the slot changes
    /// session: its episode was evicted), leaving the slot empty. Advances the clock (the
    /// entry's `stored` value) and evicts the oldest entries past the byte limit, as
    /// [`CacheState::apply`] does. No-op for an empty slot.
    pub fn stash_slot(&mut self, cfg: &PlanConfig) {
        if self.slot.tokens.is_empty() {
            return;
        }
        let seq = std::mem::take(&mut self.slot);
        self.push_entry(cfg, seq);
    }

    /// Adds `seq` to the prompt cache as a new entry (a prefix copied from another slot, or
    /// the slot's own content); returns its `stored` value (the clock, advanced).
    pub fn push_entry(&mut self, cfg: &PlanConfig, seq: CachedSequence) -> u64 {
        self.clock += 1;
        let stored = self.clock;
        self.prompt_cache.push(PromptCacheEntry { seq, stored });
        self.limit_prompt_cache(cfg);
        stored
    }

    /// Prompt cache: oldest entries out until within the byte limit (llama.cpp's server).
    fn limit_prompt_cache(&mut self, cfg: &PlanConfig) {
        self.prompt_cache.sort_by_key(|e| e.stored);
        while !self.prompt_cache.is_empty() && self.prompt_cache_bytes(cfg) > cfg.prompt_cache_bytes
        {
            self.prompt_cache.remove(0);
        }
    }

    /// Applies an executed `plan` (made by [`super::plan::plan`] for this state and the same
    /// `cfg`): stash/load through the prompt cache, drop checkpoints past the divergence point,
    /// record restores and saves, evict, and set the slot's tokens to `processed` (the prompt
    /// plus the output tokens fed back during decode).
    pub fn apply(&mut self, cfg: &PlanConfig, plan: &Plan, processed: &[u32]) {
        self.clock += 1;
        let now = self.clock;
        if plan.stash_slot && !self.slot.tokens.is_empty() {
            let seq = std::mem::take(&mut self.slot);
            self.prompt_cache.push(PromptCacheEntry { seq, stored: now });
        }
        if let Source::PromptCache(i) = plan.source {
            self.slot = if plan.keep_entry {
                self.prompt_cache[i].seq.clone()
            } else {
                self.prompt_cache.remove(i).seq
            };
        } else if plan.stash_slot {
            self.slot = CachedSequence::default();
        }
        self.slot.checkpoints.retain(|c| !plan.dropped.contains(&c.pos));
        if let Some(r) = plan.restored {
            if let Some(c) = self.slot.checkpoints.iter_mut().find(|c| c.pos == r) {
                c.last_used = now;
            }
        }
        for &pos in &plan.saved {
            match self.slot.checkpoints.iter_mut().find(|c| c.pos == pos) {
                Some(c) => c.last_used = now,
                None => self.slot.checkpoints.push(CheckpointMeta {
                    pos,
                    created: now,
                    last_used: now,
                    end: false,
                }),
            }
        }
        if let Some(pos) = plan.end_state {
            self.slot.checkpoints.push(CheckpointMeta {
                pos,
                created: now,
                last_used: now,
                end: true,
            });
        }
        self.slot.checkpoints.retain(|c| !plan.evicted.contains(&c.pos));
        self.slot.checkpoints.sort_by_key(|c| c.pos);
        self.slot.tokens = processed.to_vec();
        // A prompt the sequence holds whole but for its last token (a repeat) has no
        // divergence point of its own: the previous one stays.
        if plan.divergence + 1 < plan.n_prompt {
            self.slot.last_divergence = Some(plan.divergence);
        }
        self.limit_prompt_cache(cfg);
    }
}
