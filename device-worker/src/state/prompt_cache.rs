//! The host prompt cache (llama.cpp's `server_prompt_cache`): earlier slot contents — the KV
//! cache of their tokens, the recurrent state at their end and their checkpoints — kept when a
//! slot moves on to another prompt, so a later request sharing their prefix resumes from them
//! instead of from nothing. Byte-limited (`--prompt-cache-mib`); which entries exist, and which
//! are evicted, is the planner's decision ([`super::planner::meta::PromptCacheEntry`], oldest
//! first); this type holds their states, keyed by the entry's `stored` clock value.

use std::collections::{BTreeMap, HashMap};

use super::checkpoint::Checkpoint;
use super::error::CheckpointError;
use super::kv::KvCache;
use super::recurrent::RecurrentState;
use super::sequence::SequenceState;

/// One slot's content parked in the prompt cache.
pub struct Stashed {
    /// The KV cache of its `kv.len()` tokens (a copy sized to them, not to the context).
    kv: KvCache,
    /// The recurrent state after its last token (hybrid models).
    recurrent: Option<RecurrentState>,
    /// Its checkpoints by position.
    checkpoints: BTreeMap<usize, Checkpoint>,
}

impl Stashed {
    /// A copy of `seq` (its `seq.len()` positions) with the slot's `checkpoints`.
    ///
    /// Errors: [`CheckpointError::KvPrefix`] (cannot happen for a consistent `seq`).
    pub fn copy_of(
        seq: &SequenceState,
        checkpoints: BTreeMap<usize, Checkpoint>,
    ) -> Result<Self, CheckpointError> {
        let n = seq.len();
        let mut kv = KvCache::like(&seq.kv, n);
        kv.copy_prefix_from(&seq.kv, n)?;
        Ok(Self {
            kv,
            recurrent: seq.recurrent.clone(),
            checkpoints,
        })
    }

    /// A copy of the first `pos` positions of `seq` (another slot's shared prefix, e.g. the
    /// rules): their KV cache and, for a hybrid model, the recurrent state after them — `cp`
    /// (a checkpoint at `pos`, also kept as the entry's checkpoint) or, when `cp` is `None`
    /// and `pos == seq.len()`, the live state.
    ///
    /// Errors: [`CheckpointError::PlanMismatch`] for a hybrid `seq` with neither a checkpoint
    /// at `pos` nor its live state there; [`CheckpointError::KvPrefix`].
    pub fn prefix_of(
        seq: &SequenceState,
        pos: usize,
        cp: Option<&Checkpoint>,
    ) -> Result<Self, CheckpointError> {
        let mut kv = KvCache::like(&seq.kv, pos);
        kv.copy_prefix_from(&seq.kv, pos)?;
        let (recurrent, checkpoints) = match (&seq.recurrent, cp) {
            (None, _) => (None, BTreeMap::new()),
            (Some(_), Some(cp)) if cp.pos() == pos => {
                (Some(cp.recurrent().clone()), BTreeMap::from([(pos, cp.clone())]))
            }
            (Some(r), None) if seq.len() == pos => (Some(r.clone()), BTreeMap::new()),
            _ => {
                return Err(CheckpointError::PlanMismatch(format!(
                    "no recurrent state at {pos} to copy"
                )))
            }
        };
        Ok(Self { kv, recurrent, checkpoints })
    }

    /// Writes the parked content into `seq` (KV prefix and recurrent state) and returns its
    /// checkpoints.
    ///
    /// Errors: [`CheckpointError::PlanMismatch`] when the entry is longer than `seq`'s context,
    /// [`CheckpointError::ShapeMismatch`] for a recurrent state of another shape,
    /// [`CheckpointError::KvPrefix`].
    pub fn load_into(
        self,
        seq: &mut SequenceState,
    ) -> Result<BTreeMap<usize, Checkpoint>, CheckpointError> {
        self.write_into(seq)?;
        Ok(self.checkpoints)
    }

    /// As [`Stashed::load_into`], the entry staying as it is: returns copies of its
    /// checkpoints.
    ///
    /// Errors: as [`Stashed::load_into`].
    pub fn copy_into(
        &self,
        seq: &mut SequenceState,
    ) -> Result<BTreeMap<usize, Checkpoint>, CheckpointError> {
        self.write_into(seq)?;
        Ok(self.checkpoints.clone())
    }

    /// Writes the KV prefix and the recurrent state into `seq`.
    fn write_into(&self, seq: &mut SequenceState) -> Result<(), CheckpointError> {
        let n = self.kv.len();
        if seq.kv.n_ctx() < n {
            return Err(CheckpointError::PlanMismatch(
                "prompt-cache entry longer than the slot".into(),
            ));
        }
        seq.kv.copy_prefix_from(&self.kv, n)?;
        if let (Some(dst), Some(src)) = (seq.recurrent.as_mut(), self.recurrent.as_ref()) {
            dst.copy_from(src)?;
        }
        Ok(())
    }

    /// Bytes held: KV of its tokens, its recurrent state and checkpoints.
    pub fn bytes(&self) -> usize {
        self.kv.bytes_used()
            + self.recurrent.as_ref().map_or(0, |r| r.bytes())
            + self.checkpoints.values().map(|c| c.bytes()).sum::<usize>()
    }
}

/// The states of the prompt-cache entries, by entry id (the entry's `stored` clock value).
#[derive(Default)]
pub struct PromptCache {
    entries: HashMap<u64, Stashed>,
}

impl PromptCache {
    /// Parks `st` as entry `id`.
    pub fn insert(&mut self, id: u64, st: Stashed) {
        self.entries.insert(id, st);
    }

    /// Entry `id`, left in place (a slot gets a copy: [`Stashed::copy_into`]).
    pub fn get(&self, id: u64) -> Option<&Stashed> {
        self.entries.get(&id)
    }

    /// Removes and returns entry `id` (its content goes back into a slot).
    pub fn take(&mut self, id: u64) -> Option<Stashed> {
        self.entries.remove(&id)
    }

    /// Frees every entry whose id is not in `live` (the planner evicted it).
    pub fn retain(&mut self, live: &[u64]) {
        self.entries.retain(|id, _| live.contains(id));
    }

    /// Bytes held by all entries.
    pub fn bytes(&self) -> usize {
        self.entries.values().map(Stashed::bytes).sum()
    }
}
