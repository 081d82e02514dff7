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
//!   leaves the live state as the base (the state before token `log_start`) and logs each
//!   token's `k`, `gate` and write `δ` ([`TokenLog`]). The state after token `j` is the base
//!   with tokens `log_start ..= j` replayed (element-wise, the recurrence's bits), the pass's
//!   final state included: the pass hands its whole log to the sequence as its pending
//!   replay ([`super::recurrent::PendingReplay`]), which the sequence's next pass applies
//!   inside the sweep over the state it makes anyway. A rollback only shortens the pending
//!   replay to the kept tokens. So a verification pass writes no state (a decode pass's
//!   traffic: one read of the state, one write when it applies a pending replay), and a
//!   rollback copies no state. Here only a free log buffer per layer is kept.
//!
//! `m = min(K, n)` states are kept after a pass of `n` tokens: conv slots `0..m − 1` and the
//! replays hold them and the last one is the live state itself (a rollback to the end of the
//! pass is no rollback). One set lives in the model's activation buffers (`CausalLm::set_rollback`): it
//! describes the last pass of whichever sequence ran it (each pass has an id that its logs
//! carry), so a rollback must follow that pass before any other.

use dsp::gdn::GdnShape;
use dsp::pool::ThreadPool;

use super::checkpoint::Checkpoint;
use super::recurrent::{GdnLayerState, PendingReplay, RecurrentState, TokenLog};
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

/// One GDN layer's rollback slots and log buffers (shapes in the module docs).
#[derive(Clone, Debug)]
pub struct RollbackLayer {
    pub conv: Vec<f32>,
    /// The buffer the next logged pass writes its tokens to (then handed to the sequence).
    pub log: TokenLog,
    /// A log buffer handed back by a consumed pending replay, the next `log`.
    pub spare: Option<TokenLog>,
}

/// A new id for a forward pass, unique in the process (the logs a pass hands to its sequence
/// carry it, so a rollback can tell them from another pass's).
fn next_pass_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The last `K` recurrent states of the latest forward pass (module docs).
#[derive(Clone, Debug)]
pub struct RollbackStates {
    k: usize,
    conv_channels: usize,
    shape: GdnShape,
    pub mode: RollbackPrefill,
    layers: Vec<RollbackLayer>,
    /// The id of the pass now running or last run ([`Self::begin_pass`]).
    pass: u64,
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
            conv_channels,
            shape,
            mode,
            layers: (0..n_layers)
                .map(|_| RollbackLayer {
                    conv: vec![0.0; (k.max(2) - 2) * conv_channels + conv_len],
                    log: TokenLog::new(k, shape),
                    spare: None,
                })
                .collect(),
            pass: 0,
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

    /// Bytes held by the conv rows and free logs.
    pub fn bytes(&self) -> usize {
        let layer = |l: &RollbackLayer| l.conv.len() * 4 + l.log.bytes() + l.spare.as_ref().map_or(0, TokenLog::bytes);
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

    /// Starts a pass: forgets the last one and takes a new id for the logs this one hands
    /// out ([`Self::hand_log`]).
    pub fn begin_pass(&mut self) {
        self.clear();
        self.pass = next_pass_id();
    }

    /// Hands GDN layer `layer`'s log of this pass, `tokens` tokens written to its `log`
    /// buffer, to the sequence as its pending replay, and takes `freed` (the log of the
    /// replay the pass consumed, if any) or a new buffer as the next `log`.
    pub fn hand_log(&mut self, layer: usize, tokens: usize, freed: Option<TokenLog>) -> PendingReplay {
        let (k, shape) = (self.k, self.shape);
        let l = &mut self.layers[layer];
        let fits = |t: &TokenLog| t.shape == shape && t.slots() >= k;
        let next = freed.filter(fits).or_else(|| l.spare.take()).unwrap_or_else(|| TokenLog::new(k, shape));
        PendingReplay { tokens, log: std::mem::replace(&mut l.log, next), pass: self.pass }
    }

    /// Keeps `freed` (a consumed pending replay's log) for a later [`Self::hand_log`].
    pub fn keep_free_log(&mut self, layer: usize, freed: TokenLog) {
        self.layers[layer].spare = Some(freed);
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

    /// Positions the sequence can be rolled back to after the last pass:
    /// `pos0 + n − m + 1 ..= pos0 + n` (`None` when nothing was kept).
    pub fn reachable(&self) -> Option<std::ops::RangeInclusive<usize>> {
        let end = self.pos0 + self.n;
        (self.m > 0).then(|| end + 1 - self.m..=end)
    }

    /// Cuts `seq` back to `len` positions, inside the last pass: the KV cache is truncated and
    /// every GDN layer's conv state is restored from the slot of token `len − 1`; its
    /// pending replay (the pass's log) is cut to the logged tokens up to `len − 1` (module
    /// docs; no state is copied or swept here). The states then describe no pass. `len`
    /// equal to the current length is a no-op.
    ///
    /// Errors: [`RollbackError`] when `seq` is not at the end of the recorded pass or `len`
    /// is outside [`Self::reachable`], or a layer of `seq` does not hold that pass's log as
    /// its pending replay. Nothing changes then.
    pub fn rollback(&mut self, seq: &mut SequenceState, len: usize) -> Result<(), RollbackError> {
        let slot = self.slot_of(seq, len)?;
        if let (Some(slot), Some(rec)) = (slot, seq.recurrent.as_mut()) {
            self.check_layers(rec, len)?;
            let tokens = self.replay_tokens(slot);
            for (i, l) in self.layers.iter_mut().enumerate() {
                if let Some(freed) = l.cut(slot, self.conv_channels, tokens, rec.layer_mut(i)) {
                    l.spare = Some(freed);
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
    /// one recurrent state ([`Checkpoint::bytes`]) and replays the kept logged tokens into it
    /// (on `pool`), so the checkpoint holds no pending replay; `None` for an attention-only
    /// `seq`.
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
                l.cut(slot, self.conv_channels, tokens, rec.layer_mut(i));
            }
        }
        rec.settle(pool).map_err(|e| RollbackError { len, reason: format!("replay: {e}") })?;
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

    /// `rec` must have as many GDN layers as the rollback states, each holding the last
    /// pass's log as its pending replay.
    fn check_layers(&self, rec: &RecurrentState, len: usize) -> Result<(), RollbackError> {
        let fail = |reason: String| Err(RollbackError { len, reason });
        if rec.n_layers() != self.layers.len() {
            return fail(format!(
                "rollback states of {} GDN layers for a sequence of {}",
                self.layers.len(),
                rec.n_layers()
            ));
        }
        let logged = self.n - self.log_start;
        let ours = |i: usize| rec.layer(i).pending.as_ref().is_some_and(|p| p.pass == self.pass && p.tokens == logged);
        match (0..rec.n_layers()).find(|&i| !ours(i)) {
            Some(i) => fail(format!("GDN layer {i} does not hold the last pass's log as its pending replay")),
            None => Ok(()),
        }
    }
}

impl RollbackLayer {
    /// Cuts `st` (holding the last pass's log as its pending replay) back to the state of
    /// slot `slot`: copies conv slot `slot` (rows `slot .. slot + K_conv − 1`) into its conv
    /// state and keeps the first `tokens` logged tokens pending. Returns the log when none is
    /// kept (`tokens == 0`: the base is that state), for reuse.
    fn cut(&self, slot: usize, conv_channels: usize, tokens: usize, st: &mut GdnLayerState) -> Option<TokenLog> {
        let len = st.conv.len();
        st.conv.copy_from_slice(&self.conv[slot * conv_channels..][..len]);
        if tokens == 0 {
            return st.pending.take().map(|p| p.log);
        }
        if let Some(p) = st.pending.as_mut() {
            p.tokens = tokens;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::kv::KvCache;

    /// One head of 2 × 2: `state_len` 4.
    const SHAPE: GdnShape = GdnShape { n_k_heads: 1, n_v_heads: 1, d_k: 2, d_v: 2 };

    /// Log decay of the second logged token of layer `l`: `exp` gives 1/2 (layer 0), 1/4.
    fn gate(l: usize) -> f32 {
        -((l + 1) as f32) * 2f32.ln()
    }

    /// Rollback states of a 5-token pass at positions 5..10 keeping 3 states (after 8, 9, 10
    /// positions), tokens 2.. of the pass logged (`log_start` = n − m) and handed to the
    /// sequence as its pending replay: two GDN layers with conv states of 2 rows × 1 channel
    /// (kept conv row `r` of layer `l` is `10l + r`), bases (the live `ssm`) all ones, logged
    /// tokens `k = e_0, δ = [1, 2]` (no decay), `k = e_1, δ = [3, 4]` (decay [`gate`]) and a
    /// third that changes nothing (`k = 0`, no decay).
    fn states() -> (RollbackStates, SequenceState) {
        let mut rb = RollbackStates::new(3, 2, 2, 1, SHAPE, RollbackPrefill::Aware);
        rb.begin_pass();
        let mut rec = RecurrentState::new(2, 2, 4);
        for l in 0..2 {
            let layer = rb.layer_mut(l);
            assert_eq!(layer.conv.len(), 3, "K + K_conv − 3 rows");
            for (r, v) in layer.conv.iter_mut().enumerate() {
                *v = (10 * l + r) as f32;
            }
            layer.log.k[..4].copy_from_slice(&[1.0, 0.0, 0.0, 1.0]);
            layer.log.delta[..4].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
            layer.log.gate[..2].copy_from_slice(&[0.0, gate(l)]);
            let st = rec.layer_mut(l);
            st.ssm.fill(1.0);
            st.pending = Some(rb.hand_log(l, 3, None));
        }
        let mut seq = SequenceState { kv: KvCache::new(1, 1, 2, 16), recurrent: Some(rec) };
        seq.kv.set_len(10);
        rb.record_pass(5, 5, 2);
        (rb, seq)
    }

    /// Layer `l`'s state after the first two logged tokens (and the third), by hand.
    fn after_two(l: usize) -> Vec<f32> {
        let d = gate(l).exp();
        // After token a: [[2, 3], [1, 1]]; then S·d + e_1 ⊗ [3, 4].
        vec![2.0 * d, 3.0 * d, d + 3.0, d + 4.0]
    }

    #[test]
    fn a_logged_pass_leaves_the_base_with_its_log_pending() {
        let (_, mut seq) = states();
        let r = seq.recurrent.as_mut().unwrap();
        assert_eq!(r.layer(1).ssm, vec![1.0; 4], "the base");
        assert_eq!(r.layer(1).pending.as_ref().map(|p| p.tokens), Some(3));
        r.settle(&ThreadPool::new(1).unwrap()).unwrap();
        for l in 0..2 {
            assert_eq!(r.layer(l).ssm, after_two(l), "layer {l}: the pass's final state");
        }
    }

    #[test]
    fn rollback_cuts_the_pending_log_to_the_kept_tokens() {
        let (mut rb, mut seq) = states();
        assert_eq!(rb.reachable(), Some(8..=10));
        assert!(rb.rollback(&mut seq, 7).is_err(), "before the first kept state");
        rb.rollback(&mut seq, 9).unwrap(); // after token 3 of the pass: conv slot 1, tokens 2, 3 pending
        assert_eq!(seq.len(), 9);
        let r = seq.recurrent.as_mut().unwrap();
        assert_eq!(r.layer(0).conv, vec![1.0, 2.0], "rows 1, 2");
        assert_eq!(r.layer(1).conv, vec![11.0, 12.0]);
        assert_eq!(r.layer(1).ssm, vec![1.0; 4], "the base, not yet replayed");
        assert_eq!(r.layer(1).pending.as_ref().map(|p| p.tokens), Some(2));
        assert!(rb.reachable().is_none(), "the states describe no pass after a rollback");
        r.settle(&ThreadPool::new(2).unwrap()).unwrap();
        for l in 0..2 {
            assert_eq!(r.layer(l).ssm, after_two(l), "layer {l} settled");
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
        assert_eq!(r.layer(1).pending.as_ref().map(|p| p.tokens), Some(1));
        r.settle(&ThreadPool::new(1).unwrap()).unwrap();
        assert_eq!(r.layer(1).ssm, vec![2.0, 3.0, 1.0, 1.0]);
    }

    #[test]
    fn rollback_refuses_a_sequence_without_the_pass_log() {
        let (mut rb, mut seq) = states();
        let before = seq.clone();
        // Another pass's log, then none.
        let mut other = RollbackStates::new(3, 2, 2, 1, SHAPE, RollbackPrefill::Aware);
        other.begin_pass();
        let foreign = other.hand_log(1, 3, None);
        seq.recurrent.as_mut().unwrap().layer_mut(1).pending = Some(foreign);
        assert!(rb.rollback(&mut seq, 9).is_err_and(|e| e.reason.contains("last pass's log")));
        assert_eq!(seq.recurrent.as_ref().unwrap().layer(0), before.recurrent.as_ref().unwrap().layer(0), "nothing changed");
        seq.recurrent.as_mut().unwrap().layer_mut(1).pending = None;
        assert!(rb.rollback(&mut seq, 9).is_err_and(|e| e.reason.contains("last pass's log")));
        assert_eq!(seq.len(), 10);
    }

    #[test]
    fn hand_log_reuses_the_consumed_log_buffer() {
        let (mut rb, mut seq) = states();
        rb.begin_pass();
        let consumed = seq.recurrent.as_mut().unwrap().layer_mut(0).pending.take().unwrap().log;
        let ptr = consumed.delta.as_ptr();
        let p = rb.hand_log(0, 2, Some(consumed));
        assert_eq!(p.tokens, 2);
        assert_eq!(rb.layer_mut(0).log.delta.as_ptr(), ptr, "the next pass writes into the freed buffer");
        let small = TokenLog::new(1, SHAPE);
        rb.hand_log(0, 1, Some(small));
        assert_eq!(rb.layer_mut(0).log.slots(), 3, "a buffer with too few slots is not reused");
    }

    #[test]
    fn checkpoint_at_replays_into_a_copy_and_leaves_the_sequence() {
        let (rb, seq) = states();
        let pool = ThreadPool::new(1).unwrap();
        let cp = rb.checkpoint_at(&pool, &seq, 9).unwrap().expect("hybrid");
        assert_eq!(cp.pos(), 9);
        assert_eq!(cp.recurrent().layer(0).conv, vec![1.0, 2.0]);
        assert_eq!(cp.recurrent().layer(1).ssm, after_two(1));
        assert!(cp.recurrent().layer(1).pending.is_none());
        assert_eq!(seq.len(), 10, "the sequence is unchanged");
        assert_eq!(seq.recurrent.as_ref().unwrap().layer(0).ssm, vec![1.0; 4]);
        assert_eq!(seq.recurrent.as_ref().unwrap().layer(0).pending.as_ref().map(|p| p.tokens), Some(3));
        assert!(rb.checkpoint_at(&pool, &seq, 7).is_err(), "before the first kept state");
        let first = rb.checkpoint_at(&pool, &seq, 8).unwrap().expect("hybrid");
        assert_eq!(first.recurrent().layer(1).ssm, vec![2.0, 3.0, 1.0, 1.0]);
        let end = rb.checkpoint_at(&pool, &seq, 10).unwrap().expect("hybrid");
        let mut live = seq.recurrent.clone().unwrap();
        live.settle(&pool).unwrap();
        assert_eq!(end.recurrent(), &live, "the end is the live state, settled");
    }
}
