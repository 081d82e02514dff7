//! The output head: `hidden = rms_norm(x_t)·output_norm` for the rows a pass asks for, then
//! `logits = W_out hidden` (llama.cpp `build_norm` + `build_lora_mm(model.output)` at the end
//! of every decoder graph). `output.weight` falls back to the tied token embedding.

use super::{Ctx, Embedding, RmsNorm};
use crate::model::loader::Loader;
use crate::model::project::mm;
use crate::model::weights::Linear;
use crate::model::ModelError;

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

/// `output_norm.weight` `[n_embd]` and the LM head `[n_vocab, n_embd]`.
pub struct OutputHead {
    norm: RmsNorm,
    output: Linear,
    /// Whether `output` is the embedding table (counted once in parameter counts).
    tied: bool,
}

impl OutputHead {
    /// Binds `output_norm.weight` `[n_embd]` (RMSNorm with `eps`) and `output.weight`
    /// `[n_vocab, n_embd]`, or the table of `embedding` when the file has no `output.weight`
    /// (tied embeddings); `n_vocab` and `n_embd` are the embedding table's.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn new(loader: &Loader<'_>, embedding: &Embedding, eps: f32) -> Result<Self, ModelError> {
        let (n_vocab, n_embd) = (embedding.table().rows, embedding.table().cols);
        let norm = RmsNorm::new(loader, "output_norm", n_embd, eps)?;
        let (output, tied) = match loader.has("output.weight") {
            true => (loader.linear("output.weight", n_vocab, n_embd)?, false),
            false => (embedding.table().clone(), true),
        };
        Ok(Self { norm, output, tied })
    }

    /// The output norm (also the input norm of hidden states handed to drafters).
    pub fn norm(&self) -> &RmsNorm {
        &self.norm
    }

    /// The LM head `[n_vocab, n_embd]`.
    pub fn output(&self) -> &Linear {
        &self.output
    }

    /// Weights of the head not shared with the embedding.
    pub fn numel(&self) -> usize {
        self.norm.len() + if self.tied { 0 } else { self.output.numel() }
    }

    /// The head over the rows of `x` `[n, e]` that `outputs` asks for: on return `hidden` is
    /// `[rows, e]` and `logits` `[rows, n_vocab]` (grown when needed, never shrunk). Returns
    /// `rows` (0, 1 or `n`).
    ///
    /// Errors: [`ModelError::Kernel`] naming the op or weight.
    pub fn forward(
        &self,
        ctx: Ctx<'_>,
        x: &[f32],
        n: usize,
        outputs: Outputs,
        hidden: &mut Vec<f32>,
        logits: &mut Vec<f32>,
    ) -> Result<usize, ModelError> {
        let e = self.norm.len();
        let first = match outputs {
            Outputs::None => return Ok(0),
            Outputs::Last => n - 1,
            Outputs::All => 0,
        };
        let rows = n - first;
        if hidden.len() < rows * e {
            hidden.resize(rows * e, 0.0);
        }
        if logits.len() < rows * self.output.rows {
            logits.resize(rows * self.output.rows, 0.0);
        }
        self.norm.forward(&x[first * e..n * e], &mut hidden[..rows * e])?;
        mm(
            ctx.pool,
            &self.output,
            ctx.bytes,
            &hidden[..rows * e],
            rows,
            &mut logits[..rows * self.output.rows],
        )?;
        Ok(rows)
    }
}
