//! Rollback states for speculative decoding (Tandem §3.3, DESIGN.md "Within-request"): the
//! recurrent (GDN) state after each of the last `K` tokens of the latest forward pass, so a
//! verification pass whose drafts are partly rejected can resume from the last accepted
//! token without re-running anything. The attention KV cache needs no copy: it is truncated.
//!
//! Layout, per GDN layer (layer order of [`super::recurrent::RecurrentState`]):
//! - `conv`: `[K + K_conv − 3, conv_channels]`, rows `n − m + 1 ..` of the pass's extended
//!   conv input `x_ext = conv state before the pass ++ the pass's inputs`: slot `i`, the conv
//!   state `[K_conv − 1, conv_channels]` after token `n − m + i` of the pass, is rows
//!   `i .. i + K_conv − 1` (the slots overlap, so a pass copies `m + K_conv − 3` rows instead
//!   of `(m − 1)·(K_conv − 1)`);
//! - `ssm`: `K` slots of `ssm_len`, slot `i` = the delta-rule state `[n_v_heads, d_k, d_v]`
//!   after the same token (the snapshot layout of [`dsp::gdn::gdn_recurrent`]). Each slot is
//!   its own buffer, so a rollback swaps it in as the live state instead of copying a whole
//!   recurrent state (the old live buffer becomes the slot, and the states describe no pass
//!   afterwards).
//!
//! `m = min(K, n)` states are kept after a pass of `n` tokens: slots `0..m − 1` hold them and
//! the last one is the live state itself (slot `m − 1` is never written: a rollback to the
//! end of the pass is no rollback, and the copy would cost a full recurrent state). One set lives in the model's activation buffers (`CausalLm::set_rollback`): it
//! describes the last pass of whichever sequence ran it, so a rollback must follow that pass
//! before any other.

use super::checkpoint::Checkpoint;
use super::recurrent::RecurrentState;
use super::sequence::SequenceState;

/// A rollback the last pass's rollback states cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("rollback to {len}: {reason}")]
pub struct RollbackError {
    /// The length asked for.
    pub len: usize,
    pub reason: String,
}

/// How a forward pass of `n ≥ K` tokens produces its `K` rollback states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[value(rename_all = "kebab-case")]
#[serde(rename_all = "kebab-case")]
pub enum RollbackPrefill {
    /// Rollback-aware prefill (Tandem §3.3): the first `n − K + 1` tokens through the chunked
    /// GDN kernel, only the last `K − 1` through the per-token recurrence that writes
    /// snapshots.
    Aware,
    /// Stock behaviour (llama.cpp with speculative decoding on a hybrid model): the whole
    /// batch through the per-token recurrence, snapshotting the last `K` states.
    PerToken,
}

impl RollbackPrefill {
    pub fn name(self) -> &'static str {
        match self {
            Self::Aware => "aware",
            Self::PerToken => "per-token",
        }
    }
}

/// One GDN layer's rollback slots (shapes in the module docs).
#[derive(Clone, Debug)]
pub struct RollbackLayer {
    pub conv: Vec<f32>,
    pub ssm: Vec<Vec<f32>>,
}

/// The last `K` recurrent states of the latest forward pass (module docs).
#[derive(Clone, Debug)]
pub struct RollbackStates {
    k: usize,
    conv_len: usize,
    conv_channels: usize,
    ssm_len: usize,
    pub mode: RollbackPrefill,
    layers: Vec<RollbackLayer>,
    /// The pass the slots describe: first position, token count, valid slots.
    pos0: usize,
    n: usize,
    m: usize,
}

impl RollbackStates {
    /// Zeroed slots for `k` states of `n_layers` GDN layers (`conv_len` floats of conv state
    /// in rows of `conv_channels`, `ssm_len` floats of delta-rule state). `k = 0` keeps
    /// nothing (passes then produce no rollback states).
    pub fn new(
        k: usize,
        n_layers: usize,
        conv_len: usize,
        conv_channels: usize,
        ssm_len: usize,
        mode: RollbackPrefill,
    ) -> Self {
        Self {
            k,
            conv_len,
            conv_channels,
            ssm_len,
            mode,
            layers: (0..n_layers)
                .map(|_| RollbackLayer {
                    conv: vec![0.0; (k.max(2) - 2) * conv_channels + conv_len],
                    ssm: (0..k).map(|_| vec![0.0; ssm_len]).collect(),
                })
                .collect(),
            pos0: 0,
            n: 0,
            m: 0,
        }
    }

    /// States kept per pass (`K`).
    pub fn capacity(&self) -> usize {
        self.k
    }

    /// Bytes held by the slots.
    pub fn bytes(&self) -> usize {
        self.layers.len() * (self.layers.first().map_or(0, |l| l.conv.len()) + self.k * self.ssm_len) * 4
    }

    /// Slots a pass of `n` tokens fills: `min(K, n)`.
    pub fn slots_for(&self, n: usize) -> usize {
        self.k.min(n)
    }

    /// Marks the slots as describing a pass of `n` tokens from `pos0` (called by the model
    /// after writing them); `m = min(K, n)`.
    pub fn record_pass(&mut self, pos0: usize, n: usize) {
        self.pos0 = pos0;
        self.n = n;
        self.m = self.slots_for(n);
    }

    /// Forgets the last pass (nothing can be rolled back).
    pub fn clear(&mut self) {
        self.m = 0;
        self.n = 0;
    }

    /// Slot buffers of GDN layer `layer`: `conv` rows (module docs), `K` delta-rule slots.
    pub fn layer_mut(&mut self, layer: usize) -> &mut RollbackLayer {
        &mut self.layers[layer]
    }

    /// Floats of one conv slot.
    pub fn conv_len(&self) -> usize {
        self.conv_len
    }

    /// Floats of one delta-rule slot.
    pub fn ssm_len(&self) -> usize {
        self.ssm_len
    }

    /// Positions the sequence can be rolled back to after the last pass:
    /// `pos0 + n − m + 1 ..= pos0 + n` (`None` when nothing was kept).
    pub fn reachable(&self) -> Option<std::ops::RangeInclusive<usize>> {
        let end = self.pos0 + self.n;
        (self.m > 0).then(|| end + 1 - self.m..=end)
    }

    /// Cuts `seq` back to `len` positions, inside the last pass: the KV cache is truncated and
    /// every GDN layer's conv state is restored from the slot of token `len − 1`, its
    /// delta-rule slot swapped in as the live state (no copy; the states then describe no
    /// pass). `len` equal to the current length is a no-op.
    ///
    /// Errors: [`RollbackError`] when `seq` is not at the end of the recorded pass or `len`
    /// is outside [`Self::reachable`].
    pub fn rollback(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), RollbackError> {
        let slot = self.slot_of(seq, len)?;
        if let (Some(slot), Some(rec)) = (slot, seq.recurrent.as_mut()) {
            self.check_layers(rec, len)?;
            for (i, l) in self.layers.iter_mut().enumerate() {
                let st = rec.layer_mut(i);
                st.conv.copy_from_slice(&l.conv[slot * self.conv_channels..][..self.conv_len]);
                std::mem::swap(&mut st.ssm, &mut l.ssm[slot]);
            }
            self.clear();
        }
        seq.kv.truncate(len);
        Ok(())
    }

    /// The recurrent state after the first `len` tokens of the last pass as a checkpoint,
    /// without changing `seq` (the end-of-prompt state of the planner, `state/planner/`: the
    /// state after `n − 1` prompt tokens from the last prefill batch, no extra pass). Copies
    /// one recurrent state ([`Checkpoint::bytes`]); `None` for an attention-only `seq`.
    ///
    /// Errors: as [`Self::rollback`].
    pub fn checkpoint_at(
        &self,
        seq: &SequenceState,
        len: usize,
    ) -> Result<Option<Checkpoint>, RollbackError> {
        let slot = self.slot_of(seq, len)?;
        let Some(mut rec) = seq.recurrent.clone() else {
            return Ok(None);
        };
        if let Some(slot) = slot {
            self.write_slot(&mut rec, slot, len)?;
        }
        Ok(Some(Checkpoint::from_state(len, rec)))
    }

    /// The slot holding the state after `len` tokens (`None`: `len` is the current length,
    /// the live state).
    fn slot_of(&self, seq: &SequenceState, len: usize) -> Result<Option<usize>, RollbackError> {
        let end = self.pos0 + self.n;
        let fail = |reason: String| Err(RollbackError { len, reason });
        if seq.len() != end || self.m == 0 {
            return fail(format!(
                "the sequence is at {} but the rollback states describe a pass ending at {end} ({} kept)",
                seq.len(),
                self.m
            ));
        }
        if !self.reachable().is_some_and(|r| r.contains(&len)) {
            return fail(format!("only positions {:?} are reachable", self.reachable()));
        }
        Ok((len != end).then(|| len - 1 - (end - self.m)))
    }

    /// Copies slot `slot` of every GDN layer into `rec`.
    fn write_slot(&self, rec: &mut RecurrentState, slot: usize, len: usize) -> Result<(), RollbackError> {
        self.check_layers(rec, len)?;
        for (i, l) in self.layers.iter().enumerate() {
            let st = rec.layer_mut(i);
            st.conv
                .copy_from_slice(&l.conv[slot * self.conv_channels..][..self.conv_len]);
            st.ssm.copy_from_slice(&l.ssm[slot]);
        }
        Ok(())
    }

    /// `rec` must have as many GDN layers as the rollback states.
    fn check_layers(&self, rec: &RecurrentState, len: usize) -> Result<(), RollbackError> {
        if rec.n_layers() != self.layers.len() {
            return Err(RollbackError {
                len,
                reason: format!(
                    "rollback states of {} GDN layers for a sequence of {}",
                    self.layers.len(),
                    rec.n_layers()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::kv::KvCache;

    #[test]
    fn rollback_restores_the_slot_of_the_kept_position() {
        // Conv states of 2 rows of 1 channel: row r of the kept conv inputs is 10l + r.
        let mut rb = RollbackStates::new(3, 2, 2, 1, 4, RollbackPrefill::Aware);
        for l in 0..2 {
            let layer = rb.layer_mut(l);
            assert_eq!(layer.conv.len(), 3, "K + K_conv − 3 rows");
            for (r, v) in layer.conv.iter_mut().enumerate() {
                *v = (10 * l + r) as f32;
            }
            for s in 0..3 {
                layer.ssm[s].fill((100 * l + s) as f32);
            }
        }
        let mut seq = SequenceState {
            kv: KvCache::new(1, 1, 2, 16),
            recurrent: Some(RecurrentState::new(2, 2, 4)),
        };
        seq.kv.set_len(10);
        rb.record_pass(5, 5); // tokens at 5..10, slots hold states after 7, 8, 9
        assert_eq!(rb.reachable(), Some(8..=10));
        assert!(
            rb.rollback(&mut seq, 7).is_err(),
            "before the first kept state"
        );
        rb.rollback(&mut seq, 9).unwrap(); // state after token 8 = slot 1
        assert_eq!(seq.len(), 9);
        let r = seq.recurrent.as_ref().unwrap();
        assert_eq!(r.layer(0).conv, vec![1.0, 2.0], "rows 1, 2");
        assert_eq!(r.layer(1).conv, vec![11.0, 12.0]);
        assert_eq!(r.layer(1).ssm, vec![101.0; 4]);
        assert_eq!(rb.layer_mut(0).ssm[1], vec![0.0; 4], "swapped: the slot holds the old live state");
        assert!(rb.reachable().is_none(), "the states describe no pass after a rollback");
        assert!(
            rb.rollback(&mut seq, 8).is_err(),
            "the sequence moved off the pass"
        );
    }

    #[test]
    fn checkpoint_at_copies_the_slot_and_leaves_the_sequence() {
        let mut rb = RollbackStates::new(3, 1, 2, 1, 4, RollbackPrefill::Aware);
        rb.layer_mut(0).conv.copy_from_slice(&[1.0, 2.0, 3.0]);
        for s in 0..3 {
            rb.layer_mut(0).ssm[s].fill(s as f32 + 10.0);
        }
        let mut seq = SequenceState {
            kv: KvCache::new(1, 1, 2, 16),
            recurrent: Some(RecurrentState::new(1, 2, 4)),
        };
        seq.kv.set_len(6);
        rb.record_pass(2, 4); // tokens 2..6, slots hold states after 4, 5, 6 tokens
        let cp = rb.checkpoint_at(&seq, 5).unwrap().expect("hybrid");
        assert_eq!(cp.pos(), 5);
        assert_eq!(cp.recurrent().layer(0).conv, vec![2.0, 3.0]);
        assert_eq!(cp.recurrent().layer(0).ssm, vec![11.0; 4]);
        assert_eq!(seq.len(), 6, "the sequence is unchanged");
        assert_eq!(seq.recurrent.as_ref().unwrap().layer(0).ssm, vec![0.0; 4]);
        assert!(rb.checkpoint_at(&seq, 3).is_err(), "before the first kept state");
    }
}
