//! Gated DeltaNet (GDN) kernels for the linear-attention layers of the Qwen3.5 / Qwen3-Next
//! hybrid models: the gated delta rule as a per-token recurrence ([`recurrent`], decode and
//! verification, with a rollback log), its rollback by replay ([`replay`]), as a chunked form
//! for prefill ([`chunked`]), and the short causal depthwise convolution in front of it
//! ([`conv`]).
//!
//! The rule (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks", eq. 10; the Hugging Face
//! `torch_recurrent_gated_delta_rule` in `modeling_qwen3_next.py` and llama.cpp
//! `ggml_compute_forward_gated_delta_net`), per value head `h` and token `t`, with state
//! `S ∈ R^{d_k × d_v}`:
//!
//! ```text
//! S      = exp(gate_t) · S                 (decay; gate_t ≤ 0 is a log-space decay)
//! δ      = beta_t · (v_t − Sᵀ k_t)         ([d_v])
//! S      = S + k_t ⊗ δ                     (outer product, [d_k, d_v])
//! o_t    = scale · Sᵀ q_t,  scale = 1/√d_k
//! ```
//!
//! All tensors are f32 and row-major; the shared conventions live in [`shape`].

// The per-token step and the tile kernels take their slices one by one (ggml's op does the
// same); the entry points take the five inputs as one [`GdnInputs`].
#![allow(clippy::too_many_arguments)]

pub mod chunked;
pub mod conv;
mod denormals;
mod heads;
pub mod recurrent;
pub mod replay;
pub mod shape;
mod tile;

pub use chunked::{gdn_chunked, DEFAULT_CHUNK};
/// [`gdn_chunked`] under the name the pooled callers use (it takes the pool itself).
pub use chunked::gdn_chunked as gdn_chunked_pooled;
pub use conv::{conv1d_silu, conv1d_silu_step, conv1d_silu_taps, ConvTaps};
/// [`conv1d_silu`] under the name the pooled callers use (it takes the pool itself).
pub use conv::conv1d_silu as conv1d_silu_pooled;
pub use recurrent::{gdn_recurrent, gdn_recurrent_with, RollbackLog};
pub use replay::{gdn_replay, gdn_replay_with, ReplayInputs};
/// [`gdn_recurrent`] under the name the pooled callers use (it takes the pool itself).
pub use recurrent::gdn_recurrent as gdn_recurrent_pooled;
pub use shape::{GdnInputs, GdnShape};
