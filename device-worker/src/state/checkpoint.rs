//! Recurrent-state checkpoints: a copy of a hybrid model's recurrent state (the conv and
//! delta-rule states of every Gated DeltaNet layer) at one token position, so a sequence can
//! be rewound to that position and continue from there.
//!
//! Why: the attention KV cache can be cut back to any prefix ([`crate::state::kv::KvCache::truncate`]), the
//! recurrent state cannot; it is valid only at the position it was computed for. A checkpoint
//! taken at position `p` plus a KV cache still holding positions `0..p` is the full state of
//! the sequence after `p` tokens. Naming follows llama.cpp's server
//! (`server_prompt_checkpoint`: `pos`, `data`, `size()`), which keeps the same thing for
//! recurrent and SWA models; this module is the mechanism only (where to place checkpoints is
//! decided elsewhere).
//!
//! Size: `bytes = n_gdn_layers · 4 · ((K − 1) · conv_channels + n_v_heads · d_k · d_v)`
//! (f32 conv state plus f32 delta-rule state per layer; see
//! [`SequenceShape::checkpoint_bytes`](super::sequence::SequenceShape::checkpoint_bytes)). It does
//! not depend on the position. For the tiny test fixture (3 GDN layers, conv `[3, 128]`, state
//! `[4, 16, 16]`) that is 16 896 bytes; for Qwen3.5-0.8B shapes (18 GDN layers, conv
//! `[3, 6144]`, state `[16, 128, 128]`) 1 122 304 bytes per layer, 20 201 472 bytes
//! (≈ 19.3 MiB) per checkpoint.
//!
//! Exactness: restoring copies every float, so processing the same tokens with the same
//! micro-batch boundaries after a restore gives bit-identical states and logits to the run
//! that saved the checkpoint (tested in `tests/qwen35_checkpoint.rs`).

use super::recurrent::RecurrentState;
use super::sequence::SequenceState;
use super::error::CheckpointError;

/// The recurrent state of a sequence after its first `pos` tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pos: usize,
    recurrent: RecurrentState,
    bytes: usize,
}

impl Checkpoint {
    /// Tokens processed when the checkpoint was taken (llama.cpp `pos`/`n_tokens`).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes held: the f32 conv and delta-rule states of all GDN layers
    /// ([`RecurrentState::bytes`]).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The saved recurrent state.
    pub fn recurrent(&self) -> &RecurrentState {
        &self.recurrent
    }

    /// A checkpoint of `recurrent` as the state after the first `pos` tokens (the caller's
    /// contract: e.g. a rollback slot of a pass covering `pos`,
    /// [`super::rollback::RollbackStates::checkpoint_at`]).
    pub fn from_state(pos: usize, recurrent: RecurrentState) -> Self {
        let bytes = recurrent.bytes();
        Self { pos, recurrent, bytes }
    }
}

impl SequenceState {
    /// Copies the recurrent state at the current length `self.len()`. `None` for
    /// attention-only models: their KV cache is truncatable, there is nothing to save.
    /// Allocates [`Checkpoint::bytes`].
    pub fn save_checkpoint(&self) -> Option<Checkpoint> {
        self.recurrent.as_ref().map(|r| Checkpoint {
            pos: self.len(),
            recurrent: r.clone(),
            bytes: r.bytes(),
        })
    }

    /// Rewinds the sequence to `cp.pos()`: truncates the KV cache to `cp.pos()` positions and
    /// copies the recurrent state in (no allocation). The KV positions `0..cp.pos()` must be
    /// the ones of the sequence the checkpoint was taken from (this slot's own, or copied
    /// with [`crate::state::kv::KvCache::copy_prefix_from`]); that is the caller's contract, not checked.
    ///
    /// Errors (the state is left unchanged): [`CheckpointError::NotRecurrent`] for an
    /// attention-only state, [`CheckpointError::BeyondKv`] if `cp.pos()` exceeds the KV length,
    /// [`CheckpointError::ShapeMismatch`] if the layer count or buffer sizes differ.
    pub fn restore_checkpoint(&mut self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        let kv_len = self.kv.len();
        let rec = self
            .recurrent
            .as_mut()
            .ok_or(CheckpointError::NotRecurrent)?;
        if cp.pos > kv_len {
            return Err(CheckpointError::BeyondKv {
                pos: cp.pos,
                kv_len,
            });
        }
        let shape_err = CheckpointError::ShapeMismatch {
            expected_layers: rec.n_layers(),
            expected_bytes: rec.bytes(),
            actual_layers: cp.recurrent.n_layers(),
            actual_bytes: cp.recurrent.bytes(),
        };
        // copy_from checks every layer's sizes before writing anything.
        rec.copy_from(&cp.recurrent).map_err(|_| shape_err)?;
        self.kv.truncate(cp.pos);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::kv::KvCache;

    fn hybrid(n_ctx: usize) -> SequenceState {
        SequenceState {
            kv: KvCache::new(1, 1, 2, n_ctx),
            recurrent: Some(RecurrentState::new(2, 3, 4)),
        }
    }

    #[test]
    fn save_restore_roundtrip_and_errors_leave_state_unchanged() {
        let mut s = hybrid(8);
        s.kv.set_len(3);
        s.recurrent.as_mut().unwrap().layer_mut(1).ssm[2] = 7.0;
        let cp = s.save_checkpoint().expect("hybrid state saves");
        assert_eq!((cp.pos(), cp.bytes()), (3, 2 * (3 + 4) * 4));

        s.kv.set_len(6);
        s.recurrent.as_mut().unwrap().layer_mut(1).ssm[2] = -1.0;
        s.restore_checkpoint(&cp).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s.recurrent.as_ref().unwrap().layer(1).ssm[2], 7.0);

        // Beyond the KV length.
        s.kv.truncate(2);
        let before = s.recurrent.clone();
        assert!(matches!(
            s.restore_checkpoint(&cp),
            Err(CheckpointError::BeyondKv { pos: 3, kv_len: 2 })
        ));
        assert_eq!((s.len(), &s.recurrent), (2, &before));

        // Other shape.
        let mut other = SequenceState {
            kv: KvCache::new(1, 1, 2, 8),
            recurrent: Some(RecurrentState::new(3, 3, 4)),
        };
        other.kv.set_len(5);
        assert!(matches!(
            other.restore_checkpoint(&cp),
            Err(CheckpointError::ShapeMismatch {
                expected_layers: 3,
                actual_layers: 2,
                ..
            })
        ));
        assert_eq!(other.len(), 5);

        // Attention-only: nothing to save, nothing to restore into.
        let mut att = SequenceState::attention_only(KvCache::new(1, 1, 2, 8));
        att.kv.set_len(4);
        assert!(att.save_checkpoint().is_none());
        assert!(matches!(
            att.restore_checkpoint(&cp),
            Err(CheckpointError::NotRecurrent)
        ));
    }

    #[test]
    fn byte_formula_matches_the_allocated_state() {
        use crate::state::sequence::{RecurrentShape, SequenceShape};
        use dsp::gdn::GdnShape;
        // Qwen3.5-0.8B GDN shapes: 16 key and 16 value heads of 128, conv kernel 4,
        // conv channels q | k | v = 2·16·128 + 16·128; 18 of its 24 layers are GDN.
        let gdn = GdnShape {
            n_k_heads: 16,
            n_v_heads: 16,
            d_k: 128,
            d_v: 128,
        };
        let ch = 2 * 16 * 128 + 16 * 128;
        let shape = SequenceShape {
            kv_layers: 6,
            n_kv_head: 2,
            head_dim: 256,
            recurrent: Some(RecurrentShape {
                n_layers: 18,
                conv_len: 3 * ch,
                ssm_len: gdn.state_len(),
            }),
        };
        let allocated = RecurrentState::new(18, 3 * ch, gdn.state_len()).bytes();
        assert_eq!(shape.checkpoint_bytes(), allocated);
        assert_eq!(shape.new_state(8).recurrent.map(|r| r.bytes()), Some(allocated));
        assert_eq!(shape.kv_bytes_per_token() * 8, shape.new_state(8).kv.bytes_allocated());
        eprintln!(
            "Qwen3.5-0.8B shapes: {} bytes per GDN layer, {allocated} bytes per checkpoint",
            allocated / 18
        );
    }
}
