//! Shared pieces of the forward passes: weight products (`y = W x` for a micro-batch) and
//! causal grouped-query attention over the f16 KV cache. Numerics follow ggml's CPU ops
//! (`ggml_mul_mat`, `ggml_soft_max_ext` over the masked scores), as in each architecture's
//! llama.cpp graph.

use dsp::ops;
use dsp::pool::ThreadPool;

use crate::error::ModelError;
use crate::model::parallel::DisjointMut;
use crate::model::weights::Linear;
use crate::state::kv::KvCache;

/// Maps a kernel error to [`ModelError::Kernel`] naming the op.
pub(crate) fn kernel(name: &'static str) -> impl Fn(dsp::DspError) -> ModelError {
    move |source| ModelError::Kernel {
        name: name.to_string(),
        source,
    }
}

/// Several products of one input `x` (`[n, cols]`), e.g. q/k/v or gate/up: the input is
/// converted to the weights' activation type once when they share it.
///
/// Errors: [`ModelError::Kernel`] naming the weight.
pub(crate) fn mm_shared(
    pool: &ThreadPool,
    bytes: &[u8],
    x: &[f32],
    n: usize,
    outs: &mut [(&Linear, &mut [f32])],
) -> Result<(), ModelError> {
    let ty = outs[0].0.ty.vec_dot_type();
    if outs
        .iter()
        .any(|(w, _)| w.ty.vec_dot_type() != ty || w.cols != outs[0].0.cols)
    {
        for (w, y) in outs.iter_mut() {
            mm(pool, w, bytes, x, n, y)?;
        }
        return Ok(());
    }
    let acts = dsp::matmul::quantize_activations(pool, ty, x, n, outs[0].0.cols)
        .map_err(kernel("activations"))?;
    for (w, y) in outs.iter_mut() {
        dsp::matmul::matmul_quantized(dsp::backend::select(), pool, &w.mat(bytes), &acts, y)
            .map_err(|source| ModelError::Kernel {
                name: w.name.clone(),
                source,
            })?;
    }
    Ok(())
}

/// `y = W x` for `n` rows: `x` `[n, w.cols]`, `y` `[n, w.rows]`.
///
/// Errors: [`ModelError::Kernel`] naming the weight.
pub(crate) fn mm(
    pool: &ThreadPool,
    w: &Linear,
    bytes: &[u8],
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), ModelError> {
    dsp::matmul::matmul(pool, &w.mat(bytes), x, n, y).map_err(|source| ModelError::Kernel {
        name: w.name.clone(),
        source,
    })
}

/// Head geometry of one attention layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// Tokens per attention task: the task's queries (these tokens × the query heads of one KV
/// head) share every K/V row read.
const ATTN_TOKENS: usize = 8;

/// Causal grouped-query attention of `n` new tokens (queries `[n, n_head*head_dim]`) over
/// the cache positions `0..=pos0+t` of cache layer `layer` for token `t`; writes
/// `out` `[n, n_head*head_dim]`. Query head `h` reads KV head `h / (n_head / n_head_kv)`
/// (llama.cpp / Hugging Face `repeat_kv`); scale `1/√head_dim`. One task per (block of
/// [`ATTN_TOKENS`] tokens, KV head) through [`ops::attention_queries`]; results do not depend
/// on the blocking (each query is bit-identical to [`ops::attention_head`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_attention(
    pool: &ThreadPool,
    kv: &KvCache,
    layer: usize,
    s: AttnShape,
    pos0: usize,
    n: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let out = DisjointMut::new(out);
    let n_blocks = n.div_ceil(ATTN_TOKENS);
    pool.run(n_blocks * s.n_head_kv, &|task| {
        let (b, g) = (task / s.n_head_kv, task % s.n_head_kv);
        let tokens = b * ATTN_TOKENS..((b + 1) * ATTN_TOKENS).min(n);
        let n_q = tokens.len() * group;
        let mut qs = Vec::with_capacity(n_q * hd);
        let mut n_ctx = Vec::with_capacity(n_q);
        for t in tokens.clone() {
            let row = t * s.n_head + g * group;
            qs.extend_from_slice(&q[row * hd..(row + group) * hd]);
            n_ctx.extend(std::iter::repeat_n(pos0 + t + 1, group));
        }
        let max_ctx = pos0 + tokens.end;
        let (k, v) = kv.head(layer, g, max_ctx);
        let mut scores = vec![0f32; n_q * max_ctx];
        let mut o = vec![0f32; n_q * hd];
        ops::attention_queries(
            dsp::select(),
            &qs,
            &n_ctx,
            hd,
            k,
            v,
            scale,
            &mut scores,
            &mut o,
        )
        .expect("attention shapes follow the config");
        for (i, t) in tokens.enumerate() {
            let row = t * s.n_head + g * group;
            // SAFETY: each task writes the rows of its own (tokens, KV head) queries.
            let dst = unsafe { out.chunk(row * hd, group * hd) };
            dst.copy_from_slice(&o[i * group * hd..(i + 1) * group * hd]);
        }
    });
}

/// The SwiGLU feed-forward block shared by the architectures: `down(silu(gate(h)) * up(h))`
/// (GGUF `blk.{i}.ffn_gate|ffn_up|ffn_down.weight`; llama.cpp `build_ffn` with
/// `LLM_FFN_SILU, LLM_FFN_PAR`).
pub(crate) struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// Buffers of one [`Mlp::forward`] call: `gate`, `up`, `act` are `[n, n_ff]`, `out` is
/// `[n, n_embd]`.
pub(crate) struct MlpBuffers<'a> {
    pub gate: &'a mut [f32],
    pub up: &'a mut [f32],
    pub act: &'a mut [f32],
    pub out: &'a mut [f32],
}

impl Mlp {
    /// Binds `ffn_{gate,up,down}` for `n_embd → n_ff → n_embd`; `n` maps a tensor's short
    /// name to its GGUF name (`ffn_gate` → `blk.3.ffn_gate.weight`).
    ///
    /// Errors: missing tensors, wrong shapes.
    pub fn load(
        file: &gguf::reader::GgufFile,
        n: &dyn Fn(&str) -> String,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gate: Linear::load(file, &n("ffn_gate"), n_ff, n_embd)?,
            up: Linear::load(file, &n("ffn_up"), n_ff, n_embd)?,
            down: Linear::load(file, &n("ffn_down"), n_embd, n_ff)?,
        })
    }

    /// Weights in the block.
    pub fn numel(&self) -> usize {
        self.gate.numel() + self.up.numel() + self.down.numel()
    }

    /// `buf.out = down(silu(gate(h)) * up(h))` for `h` `[n, n_embd]`.
    ///
    /// Errors: [`ModelError::Kernel`] naming the weight or op.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        bytes: &[u8],
        h: &[f32],
        n: usize,
        buf: MlpBuffers<'_>,
    ) -> Result<(), ModelError> {
        mm_shared(
            pool,
            bytes,
            h,
            n,
            &mut [(&self.gate, &mut *buf.gate), (&self.up, &mut *buf.up)],
        )?;
        ops::swiglu(buf.gate, buf.up, buf.act).map_err(kernel("swiglu"))?;
        mm(pool, &self.down, bytes, buf.act, n, buf.out)
    }
}

/// Which positions of a forward pass get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// None (a prefill micro-batch that is not the prompt's last).
    None,
    /// The last position (prefill end, plain decode).
    Last,
    /// Every position (a verification pass of speculative decoding).
    All,
}

/// The output head shared by the architectures: `hidden = rms_norm(x_t)·output_norm` for the
/// rows `outputs` asks for, then `logits = W_out hidden` (llama.cpp `build_norm` +
/// `build_lora_mm(model.output)`). `x` is `[n, e]`; on return `hidden` is `[rows, e]` and
/// `logits` `[rows, n_vocab]` (grown when needed, never shrunk). Returns `rows` (0, 1 or `n`).
///
/// Errors: [`ModelError::Kernel`] naming the op or weight.
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_head(
    pool: &ThreadPool,
    bytes: &[u8],
    x: &[f32],
    n: usize,
    e: usize,
    outputs: Outputs,
    (norm, eps, output): (&[f32], f32, &Linear),
    hidden: &mut Vec<f32>,
    logits: &mut Vec<f32>,
) -> Result<usize, ModelError> {
    let first = match outputs {
        Outputs::None => return Ok(0),
        Outputs::Last => n - 1,
        Outputs::All => 0,
    };
    let rows = n - first;
    if hidden.len() < rows * e {
        hidden.resize(rows * e, 0.0);
    }
    if logits.len() < rows * output.rows {
        logits.resize(rows * output.rows, 0.0);
    }
    for (t, h) in (first..n).zip(hidden.chunks_exact_mut(e)) {
        ops::rms_norm(&x[t * e..(t + 1) * e], norm, eps, h).map_err(kernel("output_norm"))?;
    }
    mm(
        pool,
        output,
        bytes,
        &hidden[..rows * e],
        rows,
        &mut logits[..rows * output.rows],
    )?;
    Ok(rows)
}
