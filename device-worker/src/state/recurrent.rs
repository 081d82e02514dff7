//! Recurrent state of the linear-attention (Gated DeltaNet) layers of one sequence.
//!
//! For each GDN layer, in layer order:
//! - `conv`: `[K − 1, conv_channels]` f32, the last `K − 1` inputs of the short causal
//!   convolution (row `K − 2` is the latest; zeros at the start of a sequence). Layout of
//!   [`dsp::gdn::conv1d_silu`]; `conv_channels = 2·n_k_heads·d_k + n_v_heads·d_v` (q | k | v).
//! - `ssm`: `[n_v_heads, d_k, d_v]` f32, the delta-rule state `S` of every value head (layout
//!   of [`dsp::gdn::GdnShape`], the Hugging Face `recurrent_state` order).
//!
//! - `pending`: logged tokens not yet replayed ([`PendingReplay`]): the layer's delta-rule
//!   state is then `ssm` advanced by the pending tokens. A pass that keeps rollback states
//!   leaves its log there, a rollback shortens it (`state/rollback.rs`), the layer's next
//!   forward pass consumes it (fused into the per-token recurrence's first sweep, which
//!   reads the state anyway), and [`RecurrentState::settle`] applies it on its own. Clones
//!   and copies carry it.
//!
//! Unlike a KV cache, this state cannot be truncated: it is valid only at the one position
//! it was computed for. Checkpoints are whole copies ([`Clone`], or [`RecurrentState::copy_from`]
//! into a preallocated one, which does not allocate).

use dsp::gdn::{gdn_replay, GdnShape, ReplayInputs};
use dsp::pool::ThreadPool;
use dsp::DspError;

use super::error::CheckpointError;

/// Conv and delta-rule state of one GDN layer (shapes in the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct GdnLayerState {
    /// `[K − 1, conv_channels]`.
    pub conv: Vec<f32>,
    /// `[n_v_heads, d_k, d_v]`.
    pub ssm: Vec<f32>,
    /// Tokens still to replay onto `ssm` (module docs).
    pub pending: Option<PendingReplay>,
}

/// The logged tokens of one GDN layer's pass, for a rollback by replay
/// ([`dsp::gdn::gdn_replay`]; `K` token slots each): `k` `[K, n_k_heads·d_k]`, `gate` (log
/// decay) `[K, n_v_heads]`, `delta` (the writes `δ`, [`dsp::gdn::RollbackLog::delta`])
/// `[K, n_v_heads·d_v]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLog {
    pub shape: GdnShape,
    pub k: Vec<f32>,
    pub gate: Vec<f32>,
    pub delta: Vec<f32>,
}

impl TokenLog {
    /// Zeroed slots for `slots` tokens of `shape`.
    pub fn new(slots: usize, shape: GdnShape) -> Self {
        Self {
            shape,
            k: vec![0.0; slots * shape.n_k_heads * shape.d_k],
            gate: vec![0.0; slots * shape.n_v_heads],
            delta: vec![0.0; slots * shape.n_v_heads * shape.d_v],
        }
    }

    /// The first `tokens` logged tokens, as [`gdn_replay`] reads them.
    ///
    /// # Panics
    /// If `tokens` exceeds the slots.
    pub fn inputs(&self, tokens: usize) -> ReplayInputs<'_> {
        let g = self.shape;
        ReplayInputs {
            shape: g,
            k: &self.k[..tokens * g.n_k_heads * g.d_k],
            gate: &self.gate[..tokens * g.n_v_heads],
            delta: &self.delta[..tokens * g.n_v_heads * g.d_v],
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.gate.len() + self.delta.len()) * 4
    }

    /// Token slots.
    pub fn slots(&self) -> usize {
        self.gate.len() / self.shape.n_v_heads.max(1)
    }
}

/// Logged tokens not yet replayed: the delta-rule state is `ssm` advanced by the first
/// `tokens` tokens of `log`, written by the pass with id `pass` (`state/rollback.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct PendingReplay {
    pub tokens: usize,
    pub log: TokenLog,
    pub pass: u64,
}

impl PendingReplay {
    /// The pending tokens, as the kernels read them.
    pub fn inputs(&self) -> ReplayInputs<'_> {
        self.log.inputs(self.tokens)
    }
}

/// The recurrent state of every GDN layer of one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState {
    layers: Vec<GdnLayerState>,
}

impl RecurrentState {
    /// Zeroed state for `n_layers` GDN layers, each with a `conv_len`-float conv state and an
    /// `ssm_len`-float delta-rule state.
    pub fn new(n_layers: usize, conv_len: usize, ssm_len: usize) -> Self {
        Self {
            layers: (0..n_layers)
                .map(|_| GdnLayerState {
                    conv: vec![0.0; conv_len],
                    ssm: vec![0.0; ssm_len],
                    pending: None,
                })
                .collect(),
        }
    }

    /// Number of GDN layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// State of GDN layer `i` (the `i`-th recurrent layer, not the model layer index).
    pub fn layer_mut(&mut self, i: usize) -> &mut GdnLayerState {
        &mut self.layers[i]
    }

    /// State of GDN layer `i`.
    pub fn layer(&self, i: usize) -> &GdnLayerState {
        &self.layers[i]
    }

    /// Back to the start-of-sequence state (all zeros), keeping the allocation.
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.conv.fill(0.0);
            l.ssm.fill(0.0);
            l.pending = None;
        }
    }

    /// Bytes held (f32 conv and delta-rule states of all layers).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.conv.len() + l.ssm.len()) * 4 + l.pending.as_ref().map_or(0, |p| p.log.bytes()))
            .sum()
    }

    /// Overwrites this state with `src` without allocating (restore a checkpoint, or save one
    /// into a preallocated buffer).
    ///
    /// Errors: [`CheckpointError::ShapeMismatch`] if `src` has another layer count or buffer
    /// sizes.
    pub fn copy_from(&mut self, src: &Self) -> Result<(), CheckpointError> {
        let same = self.layers.len() == src.layers.len()
            && self
                .layers
                .iter()
                .zip(&src.layers)
                .all(|(a, b)| a.conv.len() == b.conv.len() && a.ssm.len() == b.ssm.len());
        if !same {
            return Err(CheckpointError::ShapeMismatch {
                expected_layers: self.layers.len(),
                expected_bytes: self.bytes(),
                actual_layers: src.layers.len(),
                actual_bytes: src.bytes(),
            });
        }
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            d.conv.copy_from_slice(&s.conv);
            d.ssm.copy_from_slice(&s.ssm);
            d.pending.clone_from(&s.pending);
        }
        Ok(())
    }

    /// Applies every layer's pending replay (module docs) to its `ssm`, on `pool`: the state
    /// then holds the same bits the next pass would have computed from it.
    ///
    /// Errors: a [`DspError`] from the replay kernel (a log of another shape than the state).
    pub fn settle(&mut self, pool: &ThreadPool) -> Result<(), DspError> {
        for l in &mut self.layers {
            if let Some(p) = l.pending.take() {
                gdn_replay(pool, p.inputs(), &mut l.ssm)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_reset_and_copy() {
        let mut a = RecurrentState::new(3, 3 * 8, 2 * 4 * 4);
        assert_eq!(a.bytes(), 3 * (24 + 32) * 4);
        a.layer_mut(1).ssm[5] = 2.5;
        a.layer_mut(2).conv[0] = -1.0;
        let saved = a.clone();
        a.reset();
        assert!(a.layer(1).ssm.iter().all(|&x| x == 0.0));
        a.copy_from(&saved).unwrap();
        assert_eq!(a, saved);
        let mut other = RecurrentState::new(2, 24, 32);
        assert!(other.copy_from(&saved).is_err());
    }
}
