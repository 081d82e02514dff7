//! Weight products of the forward passes: `y = W x` for a micro-batch, one input against
//! several weights. Numerics follow ggml's CPU `ggml_mul_mat` (activations converted to the
//! weight's `vec_dot_type`, then row dot products), as in each architecture's llama.cpp graph.

use dsp::pool::ThreadPool;

use super::weights::Linear;
use super::ModelError;

/// Maps a kernel error to [`ModelError::Kernel`] naming the op.
pub(crate) fn kernel(name: &'static str) -> impl Fn(dsp::DspError) -> ModelError {
    move |source| ModelError::Kernel {
        name: name.to_string(),
        source,
    }
}

/// Several products of one input `x` (`[n, cols]`), e.g. q/k/v or gate/up: the input is
/// converted to the weights' activation type once when they share it, and the products then
/// run in one pool run ([`dsp::matmul::matmul_quantized_many`]).
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
    // One pool run for all of them (one wake-up and join per step, not one per weight).
    let mut products: Vec<_> = outs
        .iter_mut()
        .map(|(w, y)| (w.mat(bytes), &mut **y))
        .collect();
    dsp::matmul::matmul_quantized_many(dsp::backend::select(), pool, &acts, &mut products).map_err(
        |source| ModelError::Kernel {
            name: outs
                .iter()
                .map(|(w, _)| w.name.as_str())
                .collect::<Vec<_>>()
                .join(" + "),
            source,
        },
    )
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
