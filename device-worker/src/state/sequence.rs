//! Everything a model keeps per sequence between micro-batches: the attention KV cache and,
//! for hybrid models (Qwen3.5), the recurrent state of the linear-attention layers.

use super::kv::KvCache;
use super::recurrent::RecurrentState;

/// The shapes of one sequence's state, from the model's hyperparameters alone: what
/// [`SequenceShape::new_state`] allocates, and the sizes the checkpoint planner counts (a
/// dry run computes them from GGUF metadata without loading weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceShape {
    /// Attention layers (the KV cache holds only these), KV heads, head dimension.
    pub kv_layers: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Recurrent layers (`None` for attention-only models).
    pub recurrent: Option<RecurrentShape>,
}

/// The recurrent (GDN) part of a [`SequenceShape`]: per layer a `conv_len`-float conv state
/// and an `ssm_len`-float delta-rule state (layouts in [`super::recurrent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentShape {
    pub n_layers: usize,
    pub conv_len: usize,
    pub ssm_len: usize,
}

impl SequenceShape {
    /// A zeroed state with room for `n_ctx` positions.
    pub fn new_state(&self, n_ctx: usize) -> SequenceState {
        SequenceState {
            kv: KvCache::new(self.kv_layers, self.n_kv_head, self.head_dim, n_ctx),
            recurrent: self
                .recurrent
                .map(|r| RecurrentState::new(r.n_layers, r.conv_len, r.ssm_len)),
        }
    }

    /// Whether the model has recurrent layers (resumes only from checkpoints).
    pub fn hybrid(&self) -> bool {
        self.recurrent.is_some()
    }

    /// Bytes of one checkpoint: the whole recurrent state (f32), 0 for attention-only models;
    /// equals [`RecurrentState::bytes`] of a state this shape made.
    pub fn checkpoint_bytes(&self) -> usize {
        self.recurrent
            .map_or(0, |r| r.n_layers * (r.conv_len + r.ssm_len) * 4)
    }

    /// KV-cache bytes per position (f16 keys and values of every attention layer); equals
    /// [`KvCache::bytes_allocated`] / `n_ctx` of a state this shape made.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * 2 * self.kv_layers * self.n_kv_head * self.head_dim
    }
}

/// Per-sequence model state. `kv.len()` is the number of positions processed; the recurrent
/// state (when present) belongs to exactly that position.
#[derive(Clone)]
pub struct SequenceState {
    pub kv: KvCache,
    /// `Some` for models with recurrent layers.
    pub recurrent: Option<RecurrentState>,
}

impl SequenceState {
    /// State of an attention-only model.
    pub fn attention_only(kv: KvCache) -> Self {
        Self {
            kv,
            recurrent: None,
        }
    }

    /// Positions processed.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kv.is_empty()
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Whether the state can be cut back to `n` positions: always for attention-only models;
    /// for hybrid ones only at the current length (the recurrent state cannot be rewound
    /// without a checkpoint) or at 0.
    pub fn can_truncate_to(&self, n: usize) -> bool {
        self.recurrent.is_none() || n == 0 || n == self.len()
    }

    /// Keeps the first `n` positions where [`Self::can_truncate_to`] allows it, else resets
    /// to the empty sequence. Returns the positions kept. `n > len` keeps everything.
    pub fn truncate(&mut self, n: usize) -> usize {
        let n = n.min(self.len());
        if self.can_truncate_to(n) {
            self.kv.truncate(n);
            if n == 0 {
                if let Some(r) = &mut self.recurrent {
                    r.reset();
                }
            }
            n
        } else {
            self.reset();
            0
        }
    }

    /// Back to the empty sequence.
    pub fn reset(&mut self) {
        self.kv.truncate(0);
        if let Some(r) = &mut self.recurrent {
            r.reset();
        }
    }

    /// Bytes of the valid KV positions plus the recurrent state.
    pub fn bytes_used(&self) -> usize {
        self.kv.bytes_used() + self.recurrent.as_ref().map_or(0, |r| r.bytes())
    }

    /// Bytes allocated for the KV cache plus the recurrent state.
    pub fn bytes_allocated(&self) -> usize {
        self.kv.bytes_allocated() + self.recurrent.as_ref().map_or(0, |r| r.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hybrid_truncation_keeps_only_the_current_length() {
        let mut s = SequenceState {
            kv: KvCache::new(1, 1, 2, 8),
            recurrent: Some(RecurrentState::new(1, 3, 4)),
        };
        s.kv.set_len(5);
        s.recurrent.as_mut().unwrap().layer_mut(0).ssm[0] = 1.0;
        assert_eq!(s.truncate(7), 5, "beyond the length keeps all");
        assert_eq!(s.recurrent.as_ref().unwrap().layer(0).ssm[0], 1.0);
        assert_eq!(s.truncate(3), 0, "a hybrid state cannot be rewound");
        assert_eq!(s.len(), 0);
        assert_eq!(s.recurrent.as_ref().unwrap().layer(0).ssm[0], 0.0);

        let mut a = SequenceState::attention_only(KvCache::new(1, 1, 2, 8));
        a.kv.set_len(5);
        assert_eq!(a.truncate(3), 3);
    }
}
