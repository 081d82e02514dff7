//! Errors of the per-slot state.

/// Errors saving, restoring or copying saved states (`state::checkpoint`, the KV prefix
/// copies of the prompt cache, `state::planner::execute`).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint at position {pos} cannot be restored: the KV cache holds only {kv_len} positions")]
    BeyondKv { pos: usize, kv_len: usize },
    #[error("checkpoint has {actual_layers} recurrent layers / {actual_bytes} bytes; the sequence state has {expected_layers} layers / {expected_bytes} bytes")]
    ShapeMismatch {
        expected_layers: usize,
        expected_bytes: usize,
        actual_layers: usize,
        actual_bytes: usize,
    },
    #[error(
        "the sequence state has no recurrent state (attention-only model): nothing to restore"
    )]
    NotRecurrent,
    #[error("KV prefix of {n} positions cannot be copied: {reason}")]
    KvPrefix { n: usize, reason: String },
    /// The saved states of a slot do not match what the planner says they are (a bug;
    /// reported instead of computing from a wrong state).
    #[error("cache plan does not match the slot's saved states: {0}")]
    PlanMismatch(String),
}

