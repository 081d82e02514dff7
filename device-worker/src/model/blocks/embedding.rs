//! Token embedding: row `id` of the `[n_vocab, n_embd]` table `token_embd.weight`,
//! dequantized to f32 (llama.cpp `build_inp_embd`: `ggml_get_rows`).

use crate::model::loader::Loader;
use crate::model::weights::Linear;
use crate::model::ModelError;

/// The embedding table (memory-mapped, in its stored quantization).
pub struct Embedding {
    table: Linear,
}

impl Embedding {
    /// Binds `{prefix}.weight` (`token_embd` → `token_embd.weight`) as `[n_vocab, n_embd]`.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn new(
        loader: &Loader<'_>,
        prefix: &str,
        n_vocab: usize,
        n_embd: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            table: loader.linear(&format!("{prefix}.weight"), n_vocab, n_embd)?,
        })
    }

    /// The table as a matrix (the tied LM head of files without `output.weight`).
    pub fn table(&self) -> &Linear {
        &self.table
    }

    /// Weights in the table.
    pub fn numel(&self) -> usize {
        self.table.numel()
    }

    /// `out[t] = table[tokens[t]]`: `out` is `[tokens.len(), n_embd]`; `bytes` is
    /// `GgufFile::bytes()`.
    ///
    /// Errors: [`ModelError::TokenOutOfRange`] for an id `>= n_vocab` (rows before it are
    /// written); [`ModelError::Kernel`] naming the table.
    pub fn forward(&self, bytes: &[u8], tokens: &[u32], out: &mut [f32]) -> Result<(), ModelError> {
        let (n_vocab, e) = (self.table.rows, self.table.cols);
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= n_vocab {
                return Err(ModelError::TokenOutOfRange { id, n_vocab });
            }
            dsp::quant::dequantize_row(
                self.table.ty,
                self.table.row_bytes(bytes, id as usize),
                &mut out[t * e..(t + 1) * e],
            )
            .map_err(|source| ModelError::Kernel {
                name: self.table.name.clone(),
                source,
            })?;
        }
        Ok(())
    }
}
