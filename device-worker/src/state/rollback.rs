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
//! - the delta-rule states by replay ([`dsp::gdn::gdn_replay`]): the pass runs its last
//!   tokens, from `log_start`, through the per-token recurrence with a rollback log, which
//!   leaves `base` = the state before token `log_start` (`[n_v_heads, d_k, d_v]`) and logs
//!   each token's `k`, `gate` and write `δ` ([`TokenLog`]). The state after token `j` is
//!   `base` with tokens `log_start ..= j` replayed (element-wise, the recurrence's bits). A
//!   rollback swaps `base` in as the live state and hands the log to the sequence as its
//!   pending replay ([`super::recurrent::PendingReplay`]), which the sequence's next pass
//!   applies inside the sweep over the state it makes anyway. So a verification pass writes
//!   one state (its final one, into the buffer that was `base`) instead of a copy per token,
//!   and a rollback copies no state.
//!
//! `m = min(K, n)` states are kept after a pass of `n` tokens: conv slots `0..m − 1` and the
//! replays hold them and the last one is the live state itself (a rollback to the end of the
//! pass is no rollback). One set lives in the model's activation buffers (`CausalLm::set_rollback`): it
//! describes the last pass of whichever sequence ran it, so a rollback must follow that pass
//! before any other.

use dsp::gdn::{gdn_replay, GdnShape};
use dsp::pool::ThreadPool;

use super::checkpoint::Checkpoint;
use super::recurrent::{PendingReplay, RecurrentState, TokenLog};
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
    /// GDN kernel, only the last `K − 1` through the per-token recurrence that logs them.
    Aware,
    /// Stock behaviour (llama.cpp with speculative decoding on a hybrid model): the whole
    /// batch through the per-token recurrence, keeping the last `K` states.
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

/// One GDN layer's rollback slots and log (shapes in the module docs).
#[derive(Clone, Debug)]
pub struct RollbackLayer {
    pub conv: Vec<f32>,
    /// The delta-rule state before the first logged token; between passes the spare buffer
    /// the next logged pass writes its final state to.
    pub base: Vec<f32>,
    pub log: TokenLog,
    /// A log buffer handed back by a consumed pending replay, reused by the next rollback.
    pub spare: Option<TokenLog>,
}

/// A replay the kernel refused (a shape bug: the log is sized from the same shape).
fn replay_error(len: usize, layer: usize, e: dsp::DspError) -> RollbackError {
    RollbackError { len, reason: format!("replay of GDN layer {layer}: {e}") }
}

/// The last `K` recurrent states of the latest forward pass (module docs).
#[derive(Clone, Debug)]
pub struct RollbackStates {
    k: usize,
    conv_len: usize,
    conv_channels: usize,
    shape: GdnShape,
    pub mode: RollbackPrefill,
    layers: Vec<RollbackLayer>,
    /// The pass the slots describe: first position, token count, valid slots, first logged
    /// token (index in the pass).
    pos0: usize,
    n: usize,
    m: usize,
    log_start: usize,
}

impl RollbackStates {
    /// Zeroed slots for `k` states of `n_layers` GDN layers (`conv_len` floats of conv
    /// state in rows of `conv_channels`, delta-rule states of `shape`). `k = 0` keeps nothing
    /// (passes then produce no rollback states).
    pub fn new(
        k: usize,
        n_layers: usize,
        conv_len: usize,
        conv_channels: usize,
        shape: GdnShape,
        mode: RollbackPrefill,
    ) -> Self {
        Self {
            k,
            conv_len,
            conv_channels,
            shape,
            mode,
            layers: (0..n_layers)
                .map(|_| RollbackLayer {
                    conv: vec![0.0; (k.max(2) - 2) * conv_channels + conv_len],
                    base: vec![0.0; shape.state_len()],
                    log: TokenLog::new(k, shape),
                    spare: None,
                })
                .collect(),
            pos0: 0,
            n: 0,
            m: 0,
            log_start: 0,
        }
    }

    /// States kept per pass (`K`).
    pub fn capacity(&self) -> usize {
        self.k
    }

    /// Bytes held by the conv rows, bases and logs.
    pub fn bytes(&self) -> usize {
        let layer = |l: &RollbackLayer| {
            (l.conv.len() + l.base.len()) * 4 + l.log.bytes() + l.spare.as_ref().map_or(0, TokenLog::bytes)
        };
        self.layers.iter().map(layer).sum()
    }

    /// Slots a pass of `n` tokens fills: `min(K, n)`.
    pub fn slots_for(&self, n: usize) -> usize {
        self.k.min(n)
    }

    /// Marks the slots as describing a pass of `n` tokens from `pos0` whose tokens from
    /// `log_start` (index in the pass, `≤ n − m + 1`) were logged (called by the model after
    /// writing them); `m = min(K, n)`.
    pub fn record_pass(&mut self, pos0: usize, n: usize, log_start: usize) {
        self.pos0 = pos0;
        self.n = n;
        self.m = self.slots_for(n);
        self.log_start = log_start;
    }

    /// Forgets the last pass (nothing can be rolled back).
    pub fn clear(&mut self) {
        self.m = 0;
        self.n = 0;
    }

    /// Buffers of GDN layer `layer` (module docs).
    pub fn layer_mut(&mut self, layer: usize) -> &mut RollbackLayer {
        &mut self.layers[layer]
    }

    /// The shape of the delta-rule states.
    pub fn shape(&self) -> GdnShape {
        self.shape
    }

    /// Positions the sequence can be rolled back to after the last pass:
    /// `pos0 + n − m + 1 ..= pos0 + n` (`None` when nothing was kept).
    pub fn reachable(&self) -> Option<std::ops::RangeInclusive<usize>> {
        let end = self.pos0 + self.n;
        (self.m > 0).then(|| end + 1 - self.m..=end)
    }

    /// Cuts `seq` back to `len` positions, inside the last pass: the KV cache is truncated and
    /// every GDN layer's conv state is restored from the slot of token `len − 1`; its
    /// delta-rule base is swapped in as the live state with the logged tokens up to `len − 1`
    /// as its pending replay (module docs; no state is copied or swept here). The states then
    /// describe no pass. `len` equal to the current length is a no-op.
    ///
    /// Errors: [`RollbackError`] when `seq` is not at the end of the recorded pass or `len`
    /// is outside [`Self::reachable`], or a layer of `seq` still holds a pending replay (the
    /// pass did not consume it).
    pub fn rollback(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), RollbackError> {
        let slot = self.slot_of(seq, len)?;
        if let (Some(slot), Some(rec)) = (slot, seq.recurrent.as_mut()) {
            self.check_layers(rec, len)?;
            if let Some(i) = (0..rec.n_layers()).find(|&i| rec.layer(i).pending.is_some()) {
                return Err(RollbackError { len, reason: format!("GDN layer {i} still holds a pending replay") });
            }
            let tokens = self.replay_tokens(slot);
            for (i, l) in self.layers.iter_mut().enumerate() {
                let st = rec.layer_mut(i);
                st.conv.copy_from_slice(&l.conv[slot * self.conv_channels..][..self.conv_len]);
                std::mem::swap(&mut st.ssm, &mut l.base);
                if tokens > 0 {
                    let fresh = l.spare.take().unwrap_or_else(|| TokenLog::new(self.k, self.shape));
                    st.pending = Some(PendingReplay { tokens, log: std::mem::replace(&mut l.log, fresh) });
                }
            }
            self.clear();
        }
        seq.kv.truncate(len);
        Ok(())
    }

    /// The recurrent state after the first `len` tokens of the last pass as a checkpoint,
    /// without changing `seq` (the end-of-prompt state of the planner, `state/planner/`: the
    /// state after `n − 1` prompt tokens from the last prefill batch, no extra pass). Copies
    /// one recurrent state ([`Checkpoint::bytes`]) and replays the logged tokens into it (on
    /// `pool`); `None` for an attention-only `seq`.
    ///
    /// Errors: as [`Self::rollback`].
    pub fn checkpoint_at(
        &self,
        pool: &ThreadPool,
        seq: &SequenceState,
        len: usize,
    ) -> Result<Option<Checkpoint>, RollbackError> {
        let slot = self.slot_of(seq, len)?;
        let Some(mut rec) = seq.recurrent.clone() else {
            return Ok(None);
        };
        if let Some(slot) = slot {
            self.check_layers(&rec, len)?;
            let tokens = self.replay_tokens(slot);
            for (i, l) in self.layers.iter().enumerate() {
                let st = rec.layer_mut(i);
                st.conv.copy_from_slice(&l.conv[slot * self.conv_channels..][..self.conv_len]);
                st.ssm.copy_from_slice(&l.base);
                st.pending = None;
                gdn_replay(pool, l.log.inputs(tokens), &mut st.ssm).map_err(|e| replay_error(len, i, e))?;
            }
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

    /// Logged tokens to replay onto the base for the state of slot `slot` (after token
    /// `n − m + slot` of the pass).
    fn replay_tokens(&self, slot: usize) -> usize {
        self.n - self.m + slot + 1 - self.log_start
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

    /// One head of 2 × 2: `state_len` 4.
    const SHAPE: GdnShape = GdnShape { n_k_heads: 1, n_v_heads: 1, d_k: 2, d_v: 2 };

    /// Rollback states of a 5-token pass at positions 5..10 keeping 3 states (after 8, 9, 10
    /// positions), tokens 2.. of the pass logged (`log_start` = n − m): two GDN layers with
    /// conv states of 2 rows × 1 channel (kept conv row `r` of layer `l` is `10l + r`), bases
    /// all ones, two logged tokens `k = e_0, δ = [1, 2]` (no decay) and `k = e_1, δ = [3, 4]`
    /// (decay 1/2, layer 1: 1/4).
    fn states() -> (RollbackStates, SequenceState) {
        let mut rb = RollbackStates::new(3, 2, 2, 1, SHAPE, RollbackPrefill::Aware);
        for l in 0..2 {
            let layer = rb.layer_mut(l);
            assert_eq!(layer.conv.len(), 3, "K + K_conv − 3 rows");
            for (r, v) in layer.conv.iter_mut().enumerate() {
                *v = (10 * l + r) as f32;
            }
            layer.base.fill(1.0);
            layer.log.k[..4].copy_from_slice(&[1.0, 0.0, 0.0, 1.0]);
            layer.log.delta[..4].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
            layer.log.gate[..2].copy_from_slice(&[0.0, -((l + 1) as f32) * 2f32.ln()]);
        }
        let mut seq = SequenceState {
            kv: KvCache::new(1, 1, 2, 16),
            recurrent: Some(RecurrentState::new(2, 2, 4)),
        };
        seq.kv.set_len(10);
        rb.record_pass(5, 5, 2);
        (rb, seq)
    }

    /// Layer `l`'s state after the two logged tokens, by hand.
    fn after_two(rb: &RollbackStates, l: usize) -> Vec<f32> {
        let d = rb.layers[l].log.gate[1].exp();
        // After token a: [[2, 3], [1, 1]]; then S·d + e_1 ⊗ [3, 4].
        vec![2.0 * d, 3.0 * d, d + 3.0, d + 4.0]
    }

    #[test]
    fn rollback_swaps_the_base_in_with_the_kept_tokens_pending() {
        let (mut rb, mut seq) = states();
        assert_eq!(rb.reachable(), Some(8..=10));
        assert!(rb.rollback(&mut seq, 7).is_err(), "before the first kept state");
        let want: Vec<Vec<f32>> = (0..2).map(|l| after_two(&rb, l)).collect();
        rb.rollback(&mut seq, 9).unwrap(); // after token 3 of the pass: conv slot 1, tokens 2, 3 pending
        assert_eq!(seq.len(), 9);
        let r = seq.recurrent.as_mut().unwrap();
        assert_eq!(r.layer(0).conv, vec![1.0, 2.0], "rows 1, 2");
        assert_eq!(r.layer(1).conv, vec![11.0, 12.0]);
        assert_eq!(r.layer(1).ssm, vec![1.0; 4], "the base, not yet replayed");
        assert_eq!(r.layer(1).pending.as_ref().map(|p| p.tokens), Some(2));
        assert_eq!(rb.layer_mut(0).base, vec![0.0; 4], "swapped: the base buffer holds the old live state");
        assert!(rb.reachable().is_none(), "the states describe no pass after a rollback");
        r.settle(&ThreadPool::new(2).unwrap()).unwrap();
        for l in 0..2 {
            assert_eq!(r.layer(l).ssm, want[l], "layer {l} settled");
            assert!(r.layer(l).pending.is_none());
        }
        assert!(rb.rollback(&mut seq, 8).is_err(), "the sequence moved off the pass");
    }

    #[test]
    fn rollback_to_the_first_kept_state_leaves_one_token_pending() {
        let (mut rb, mut seq) = states();
        rb.rollback(&mut seq, 8).unwrap();
        let r = seq.recurrent.as_mut().unwrap();
        assert_eq!(r.layer(1).conv, vec![10.0, 11.0]);
        r.settle(&ThreadPool::new(1).unwrap()).unwrap();
        assert_eq!(r.layer(1).ssm, vec![2.0, 3.0, 1.0, 1.0]);
    }

    #[test]
    fn rollback_refuses_a_sequence_with_a_pending_replay() {
        let (mut rb, mut seq) = states();
        let other = TokenLog::new(1, SHAPE);
        seq.recurrent.as_mut().unwrap().layer_mut(1).pending = Some(PendingReplay { tokens: 1, log: other });
        let before = seq.clone();
        assert!(rb.rollback(&mut seq, 9).is_err_and(|e| e.reason.contains("pending")));
        assert_eq!(seq.recurrent, before.recurrent, "nothing changed");
    }

    #[test]
    fn checkpoint_at_replays_into_a_copy_and_leaves_the_sequence() {
        let (rb, seq) = states();
        let pool = ThreadPool::new(1).unwrap();
        let cp = rb.checkpoint_at(&pool, &seq, 9).unwrap().expect("hybrid");
        assert_eq!(cp.pos(), 9);
        assert_eq!(cp.recurrent().layer(0).conv, vec![1.0, 2.0]);
        assert_eq!(cp.recurrent().layer(1).ssm, after_two(&rb, 1));
        assert!(cp.recurrent().layer(1).pending.is_none());
        assert_eq!(seq.len(), 10, "the sequence is unchanged");
        assert_eq!(seq.recurrent.as_ref().unwrap().layer(0).ssm, vec![0.0; 4]);
        assert_eq!(rb.layers[0].base, vec![1.0; 4], "the base is unchanged");
        assert!(rb.checkpoint_at(&pool, &seq, 7).is_err(), "before the first kept state");
        let end = rb.checkpoint_at(&pool, &seq, 10).unwrap().expect("hybrid");
        assert_eq!(end.recurrent(), seq.recurrent.as_ref().unwrap(), "the end is the live state");
    }
}
