//! RMSNorm with a learned scale (Zhang & Sennrich 2019, "Root Mean Square Layer
//! Normalization"): `y = x / sqrt(mean(x²) + ε) · w` per row of `w.len()` values (llama.cpp
//! `build_norm` with `LLM_NORM_RMS`: `ggml_rms_norm` then `ggml_mul`; the row kernel is
//! [`dsp::ops::rms_norm`]).

use dsp::ops;

use crate::model::loader::Loader;
use crate::model::ModelError;

/// An RMSNorm weight `[len]` and its ε.
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
    /// The tensor name (for kernel errors).
    name: String,
}

impl RmsNorm {
    /// Binds `{prefix}.weight` (`blk.3.attn_norm` → `blk.3.attn_norm.weight`) of `len`
    /// values; `eps` is the architecture's `attention.layer_norm_rms_epsilon`.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn new(loader: &Loader<'_>, prefix: &str, len: usize, eps: f32) -> Result<Self, ModelError> {
        let name = format!("{prefix}.weight");
        Ok(Self {
            weight: loader.vector(&name, len)?,
            eps,
            name,
        })
    }

    /// Values in the weight.
    pub fn len(&self) -> usize {
        self.weight.len()
    }

    /// Whether the weight is empty (never, for a bound norm).
    pub fn is_empty(&self) -> bool {
        self.weight.is_empty()
    }

    /// `out = rms_norm(x)·w` for every `len()`-wide row of `x` (`x` and `out` of the same
    /// length, a multiple of `len()`).
    ///
    /// Errors: [`ModelError::Kernel`] naming the weight for mismatched lengths.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) -> Result<(), ModelError> {
        ops::rms_norm(x, &self.weight, self.eps, out).map_err(|source| ModelError::Kernel {
            name: self.name.clone(),
            source,
        })
    }

    /// [`RmsNorm::forward`] in place, each row through a copy (per-head q/k norms).
    ///
    /// Errors: as [`RmsNorm::forward`].
    pub fn forward_inplace(&self, x: &mut [f32]) -> Result<(), ModelError> {
        let mut tmp = vec![0f32; self.weight.len()];
        for row in x.chunks_exact_mut(self.weight.len()) {
            self.forward(row, &mut tmp)?;
            row.copy_from_slice(&tmp);
        }
        Ok(())
    }
}
