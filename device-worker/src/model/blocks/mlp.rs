//! The SwiGLU feed-forward block (Shazeer 2020, "GLU Variants Improve Transformer"):
//! `down(silu(gate(h)) * up(h))`, GGUF `{prefix}.ffn_gate|ffn_up|ffn_down.weight` (llama.cpp
//! `build_ffn` with `LLM_FFN_SILU, LLM_FFN_PAR`).

use dsp::ops;

use super::Ctx;
use crate::model::loader::Loader;
use crate::model::project::{kernel, mm, mm_shared};
use crate::model::weights::Linear;
use crate::model::ModelError;

/// Weights of one SwiGLU block: `n_embd → n_ff → n_embd`.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Buffers of [`Mlp::forward`] for micro-batches of up to `n_batch` tokens: `gate`, `up`,
/// `act`, each `[n_batch, n_ff]`.
pub struct MlpScratch {
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
}

impl MlpScratch {
    /// Buffers for `n_batch` tokens and `n_ff` hidden features.
    pub fn new(n_batch: usize, n_ff: usize) -> Self {
        Self {
            gate: vec![0.0; n_batch * n_ff],
            up: vec![0.0; n_batch * n_ff],
            act: vec![0.0; n_batch * n_ff],
        }
    }
}

impl Mlp {
    /// Binds `{prefix}.ffn_{gate,up,down}.weight` (`prefix` e.g. `blk.3`).
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn new(
        loader: &Loader<'_>,
        prefix: &str,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| Loader::weight_name(prefix, t);
        Ok(Self {
            gate: loader.linear(&n("ffn_gate"), n_ff, n_embd)?,
            up: loader.linear(&n("ffn_up"), n_ff, n_embd)?,
            down: loader.linear(&n("ffn_down"), n_embd, n_ff)?,
        })
    }

    /// Weights in the block.
    pub fn numel(&self) -> usize {
        self.gate.numel() + self.up.numel() + self.down.numel()
    }

    /// `out = down(silu(gate(h)) * up(h))` for `h` `[n, n_embd]`; `out` is `[n, n_embd]`.
    ///
    /// Errors: [`ModelError::Kernel`] naming the weight or op.
    pub fn forward(
        &self,
        ctx: Ctx<'_>,
        h: &[f32],
        n: usize,
        s: &mut MlpScratch,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let f = self.gate.rows;
        let (gate, up, act) = (&mut s.gate[..n * f], &mut s.up[..n * f], &mut s.act[..n * f]);
        mm_shared(
            ctx.pool,
            ctx.bytes,
            h,
            n,
            &mut [(&self.gate, &mut *gate), (&self.up, &mut *up)],
        )?;
        ops::swiglu(gate, up, act).map_err(kernel("swiglu"))?;
        mm(ctx.pool, &self.down, ctx.bytes, act, n, out)
    }
}
