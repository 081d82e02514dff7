//! The engine side of a [`Plan`]: a slot's saved recurrent states and its prompt-cache
//! entries, moved exactly as the plan says, with the planner's metadata ([`CacheState`])
//! advanced by the same [`CacheState::apply`] the dry run uses — so the engine and
//! `replay --dry-run` cannot disagree on which tokens a request processes.

use std::collections::{BTreeMap, HashMap};

use super::plan::{Plan, Source, Start};
use super::policy::PlanConfig;
use super::store::CacheState;
use crate::error::WorkerError;
use crate::state::checkpoint::Checkpoint;
use crate::state::kv::KvCache;
use crate::state::recurrent::RecurrentState;
use crate::state::sequence::SequenceState;

/// A slot's content parked in the host prompt cache.
struct Stashed {
    kv: KvCache,
    recurrent: Option<RecurrentState>,
    checkpoints: BTreeMap<usize, Checkpoint>,
}

/// Planner metadata plus the states it describes, for one slot.
#[derive(Default)]
pub struct SlotCache {
    /// What the planner sees (tokens, checkpoint positions, prompt-cache entries).
    pub meta: CacheState,
    checkpoints: BTreeMap<usize, Checkpoint>,
    /// Prompt-cache entries by [`super::store::PromptCacheEntry::stored`] (unique per entry).
    stash: HashMap<u64, Stashed>,
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
    /// Errors: [`WorkerError::Internal`] when the saved states do not match the plan (a bug,
    /// reported instead of computing from a wrong state), and checkpoint restore errors.
    pub fn begin(&mut self, plan: &Plan, seq: &mut SequenceState) -> Result<(), WorkerError> {
        let stash_id = self.meta.clock + 1;
        if plan.stash_slot && !self.meta.slot.tokens.is_empty() {
            let n = seq.len();
            let mut kv = KvCache::like(&seq.kv, n);
            kv.copy_prefix_from(&seq.kv, n).map_err(cp_err)?;
            let st = Stashed {
                kv,
                recurrent: seq.recurrent.clone(),
                checkpoints: std::mem::take(&mut self.checkpoints),
            };
            self.stash.insert(stash_id, st);
        }
        match plan.source {
            Source::PromptCache(i) => {
                let id = self
                    .meta
                    .prompt_cache
                    .get(i)
                    .map(|e| e.stored)
                    .ok_or_else(|| mismatch("prompt-cache entry planned but absent"))?;
                let st = self
                    .stash
                    .remove(&id)
                    .ok_or_else(|| mismatch("prompt-cache state missing"))?;
                let n = st.kv.len();
                if seq.kv.n_ctx() < n {
                    return Err(mismatch("prompt-cache entry longer than the slot"));
                }
                seq.kv.copy_prefix_from(&st.kv, n).map_err(cp_err)?;
                if let (Some(dst), Some(src)) = (seq.recurrent.as_mut(), st.recurrent.as_ref()) {
                    dst.copy_from(src).map_err(|_| mismatch("recurrent state shape"))?;
                }
                self.checkpoints = st.checkpoints;
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
            self.checkpoints.entry(cp.pos()).or_insert(cp);
        }
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
        let live: Vec<u64> = self.meta.prompt_cache.iter().map(|e| e.stored).collect();
        self.stash.retain(|id, _| live.contains(id));
        CacheEvents {
            saved: plan.saved.iter().filter(|p| held.contains_key(p)).count() as u32,
            restored: plan.restored.is_some() as u32,
            evicted: (plan.evicted.len() + plan.dropped.len()) as u32,
            bytes_held: self.bytes_held() as u64,
        }
    }

    /// Forgets everything (the slot's state was lost, e.g. a failed request).
    pub fn clear(&mut self) {
        *self = SlotCache::default();
    }

    /// Bytes of saved states: the slot's checkpoints and the prompt cache.
    pub fn bytes_held(&self) -> usize {
        let cps = |m: &BTreeMap<usize, Checkpoint>| m.values().map(|c| c.bytes()).sum::<usize>();
        cps(&self.checkpoints)
            + self
                .stash
                .values()
                .map(|s| s.kv.bytes_used() + s.recurrent.as_ref().map_or(0, |r| r.bytes()) + cps(&s.checkpoints))
                .sum::<usize>()
    }

    /// Positions of the checkpoints held (for tests and status).
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.keys().copied().collect()
    }
}

fn cp_err(e: crate::error::CheckpointError) -> WorkerError {
    mismatch(&e.to_string())
}

fn mismatch(what: &str) -> WorkerError {
    WorkerError::Internal(format!("cache plan does not match the slot's saved states: {what}"))
}
