//! The engine side of a [`Plan`]: a slot's saved recurrent states and its prompt-cache
//! entries, moved exactly as the plan says, with the planner's metadata ([`CacheState`])
//! advanced by the same [`CacheState::apply`] the dry run uses — so the engine and
//! `tandem-tools dry-run` cannot disagree on which tokens a request processes.

use std::collections::BTreeMap;

use super::meta::{CacheState, CachedSequence, PromptCacheEntry};
use super::plan::{Plan, Source, Start};
use super::policy::PlanConfig;
use crate::state::checkpoint::Checkpoint;
use crate::state::error::CheckpointError;
use crate::state::prompt_cache::{PromptCache, Stashed};
use crate::state::sequence::SequenceState;

/// Planner metadata plus the states it describes, for one slot.
#[derive(Default)]
pub struct SlotCache {
    /// What the planner sees (tokens, checkpoint positions, prompt-cache entries).
    pub meta: CacheState,
    checkpoints: BTreeMap<usize, Checkpoint>,
    /// The states of the prompt-cache entries in `meta`.
    prompt_cache: PromptCache,
}

/// The host prompt cache shared by all slots: entries' metadata, their states and the logical
/// clock their ids come from. Lent to the slot a request runs on ([`SlotCache::lend`]) for the
/// request's plan and execution, then given back ([`SlotCache::give_back`]), so every slot's
/// requests find what any slot stashed (the shared rules prefix of a new episode included).
#[derive(Default)]
pub struct SharedPromptCache {
    entries: Vec<PromptCacheEntry>,
    states: PromptCache,
    clock: u64,
}

impl SharedPromptCache {
    /// Bytes held by the entries' states (while not lent).
    pub fn bytes(&self) -> usize {
        self.states.bytes()
    }

    /// Entries held (while not lent).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held (while not lent).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Checkpoint activity of one request, for the per-step figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheEvents {
    pub saved: u32,
    pub restored: u32,
    pub evicted: u32,
    /// Bytes held by the slot's checkpoints and the prompt cache after the request.
    pub bytes_held: u64,
}

impl SlotCache {
    /// Prepares `seq` for the plan's prefill: stashes the slot's content into the prompt cache
    /// or loads an entry from it, drops checkpoints past the divergence point, then continues,
    /// restores a checkpoint or resets, so that `seq.len() == plan.resume` on return.
    ///
    /// Errors: [`CheckpointError::PlanMismatch`] when the saved states do not match the plan
    /// (a bug, reported instead of computing from a wrong state), and checkpoint restore
    /// errors (reported as a mismatch too).
    pub fn begin(&mut self, plan: &Plan, seq: &mut SequenceState) -> Result<(), CheckpointError> {
        let stash_id = self.meta.clock + 1;
        if plan.stash_slot && !self.meta.slot.tokens.is_empty() {
            let st = Stashed::copy_of(seq, std::mem::take(&mut self.checkpoints)).map_err(cp_err)?;
            self.prompt_cache.insert(stash_id, st);
        }
        match plan.source {
            Source::PromptCache(i) => {
                let id = self
                    .meta
                    .prompt_cache
                    .get(i)
                    .map(|e| e.stored)
                    .ok_or_else(|| mismatch("prompt-cache entry planned but absent"))?;
                let missing = || mismatch("prompt-cache state missing");
                self.checkpoints = if plan.keep_entry {
                    let st = self.prompt_cache.get(id).ok_or_else(missing)?;
                    st.copy_into(seq).map_err(cp_err)?
                } else {
                    let st = self.prompt_cache.take(id).ok_or_else(missing)?;
                    st.load_into(seq).map_err(cp_err)?
                };
            }
            Source::Slot if plan.stash_slot => seq.reset(),
            Source::Slot => {}
        }
        for p in &plan.dropped {
            self.checkpoints.remove(p);
        }
        match plan.start {
            Start::Continue => {
                if seq.recurrent.is_none() {
                    seq.truncate(plan.resume);
                }
            }
            Start::Restore(p) => {
                let cp = self
                    .checkpoints
                    .get(&p)
                    .ok_or_else(|| mismatch("planned checkpoint is not held"))?;
                seq.restore_checkpoint(cp).map_err(cp_err)?;
            }
            Start::Reset => seq.reset(),
        }
        if seq.len() != plan.resume {
            return Err(mismatch(&format!(
                "state at {} tokens, plan resumes at {}",
                seq.len(),
                plan.resume
            )));
        }
        Ok(())
    }

    /// Saves the state after a batch the plan marks `save` (a position already held is kept:
    /// its copy is the same state).
    pub fn save(&mut self, seq: &SequenceState) {
        if let Some(cp) = seq.save_checkpoint() {
            self.keep(cp);
        }
    }

    /// Keeps `cp` (the plan's end-of-prompt state, taken from the last batch's rollback
    /// states); a position already held is kept as it is.
    pub fn keep(&mut self, cp: Checkpoint) {
        self.checkpoints.entry(cp.pos()).or_insert(cp);
    }

    /// After the request: evictions, then the metadata update with the tokens the slot's
    /// state now holds (`processed`: prompt plus the output tokens fed back, or what was
    /// processed before a cancellation). Returns the request's checkpoint events.
    pub fn finish(&mut self, cfg: &PlanConfig, plan: &Plan, processed: &[u32]) -> CacheEvents {
        for p in &plan.evicted {
            self.checkpoints.remove(p);
        }
        self.meta.apply(cfg, plan, processed);
        // Keep metadata and states in step: a save the request did not reach (cancelled) is
        // not held; prompt-cache entries the byte limit evicted are freed.
        let held = &self.checkpoints;
        self.meta.slot.checkpoints.retain(|c| held.contains_key(&c.pos));
        let saved = plan.saved.iter().chain(&plan.end_state).filter(|p| held.contains_key(p));
        let saved = saved.count() as u32;
        self.drop_evicted_entries();
        CacheEvents {
            saved,
            restored: plan.restored.is_some() as u32,
            evicted: (plan.evicted.len() + plan.dropped.len()) as u32,
            bytes_held: self.bytes_held() as u64,
        }
    }

    /// Forgets the slot's own states (its state was lost, e.g. a failed request); a lent
    /// prompt cache and the clock stay (their states are copies, still valid).
    pub fn clear(&mut self) {
        let prompt_cache = std::mem::take(&mut self.prompt_cache);
        let entries = std::mem::take(&mut self.meta.prompt_cache);
        let clock = self.meta.clock;
        *self = SlotCache::default();
        (self.prompt_cache, self.meta.prompt_cache, self.meta.clock) = (prompt_cache, entries, clock);
    }

    /// Takes the shared prompt cache (and the clock) for one request; the slot's own prompt
    /// cache is empty outside a request.
    pub fn lend(&mut self, shared: &mut SharedPromptCache) {
        std::mem::swap(&mut self.meta.prompt_cache, &mut shared.entries);
        std::mem::swap(&mut self.prompt_cache, &mut shared.states);
        self.meta.clock = self.meta.clock.max(shared.clock);
    }

    /// Gives the prompt cache (and the clock) back after the request.
    pub fn give_back(&mut self, shared: &mut SharedPromptCache) {
        std::mem::swap(&mut self.meta.prompt_cache, &mut shared.entries);
        std::mem::swap(&mut self.prompt_cache, &mut shared.states);
        shared.clock = self.meta.clock;
    }

    /// Moves the slot's content (`seq` and its checkpoints) into the prompt cache and empties
    /// the slot (its session was evicted for another one); metadata through
    /// [`CacheState::stash_slot`].
    ///
    /// Errors: [`CheckpointError::KvPrefix`] (cannot happen for a consistent `seq`); the slot
    /// is then emptied without a stash.
    pub fn stash(&mut self, cfg: &PlanConfig, seq: &mut SequenceState) -> Result<(), CheckpointError> {
        let copied = if self.meta.slot.tokens.is_empty() {
            None
        } else {
            Some(Stashed::copy_of(seq, std::mem::take(&mut self.checkpoints)))
        };
        seq.reset();
        self.checkpoints.clear();
        match copied {
            Some(Ok(st)) => {
                self.prompt_cache.insert(self.meta.clock + 1, st);
                self.meta.stash_slot(cfg);
            }
            Some(Err(e)) => {
                self.meta.slot = CachedSequence::default();
                return Err(e);
            }
            None => self.meta.slot = CachedSequence::default(),
        }
        self.drop_evicted_entries();
        Ok(())
    }

    /// Adds a prefix copied from another slot (`seq` metadata, `st` its states) to the
    /// prompt cache.
    pub fn add_entry(&mut self, cfg: &PlanConfig, seq: CachedSequence, st: Stashed) {
        let id = self.meta.push_entry(cfg, seq);
        self.prompt_cache.insert(id, st);
        self.drop_evicted_entries();
    }

    /// The checkpoint held at `pos`, if any.
    pub fn checkpoint(&self, pos: usize) -> Option<&Checkpoint> {
        self.checkpoints.get(&pos)
    }

    /// Frees the states of prompt-cache entries the metadata no longer lists.
    fn drop_evicted_entries(&mut self) {
        let live: Vec<u64> = self.meta.prompt_cache.iter().map(|e| e.stored).collect();
        self.prompt_cache.retain(&live);
    }

    /// Bytes of saved states: the slot's checkpoints and the prompt cache.
    pub fn bytes_held(&self) -> usize {
        self.checkpoints.values().map(|c| c.bytes()).sum::<usize>() + self.prompt_cache.bytes()
    }

    /// Positions of the checkpoints held (for tests and status).
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.keys().copied().collect()
    }
}

fn cp_err(e: CheckpointError) -> CheckpointError {
    mismatch(&e.to_string())
}

fn mismatch(what: &str) -> CheckpointError {
    CheckpointError::PlanMismatch(what.to_string())
}
