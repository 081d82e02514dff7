//! Blocks every architecture is built from: [`Attention`] (grouped-query attention with
//! RoPE, optionally gated and with q/k norms), [`Mlp`] (SwiGLU), [`RmsNorm`], [`Embedding`]
//! and the [`OutputHead`]. Each binds its weights with `new(loader, prefix, ..)`
//! ([`crate::model::loader::Loader`]) and runs with `forward`; an architecture's file only
//! wires them (and its own blocks, e.g. `qwen35/gdn.rs`) in its graph's order.

pub mod attention;
pub mod embedding;
pub mod head;
pub mod mlp;
pub mod norm;

use dsp::pool::ThreadPool;

pub use attention::{Attention, AttentionConfig, AttentionScratch, Rope, RopePositions};
pub use embedding::Embedding;
pub use head::{OutputHead, Outputs};
pub use mlp::{Mlp, MlpScratch};
pub use norm::RmsNorm;

/// What a block's `forward` runs with besides its inputs: the thread pool and the bytes of
/// the memory-mapped GGUF file its weight handles point into (`GgufFile::bytes()`).
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub pool: &'a ThreadPool,
    pub bytes: &'a [u8],
}

/// `1 / (1 + e^−x)`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
