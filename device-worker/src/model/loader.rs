//! The adaptor every block binds its weights through: tensors of the GGUF file by name, with
//! their shapes checked against what the block expects.
//!
//! Names follow llama.cpp's GGUF conventions (`llm_tensor` names in `src/llama-arch.cpp`):
//! a block gets a `prefix` such as `blk.3` or `token_embd` and asks for `{prefix}.{tensor}.weight`
//! ([`Loader::weight_name`]).

use gguf::reader::GgufFile;

use super::weights::Linear;
use super::ModelError;

/// Tensors of one memory-mapped GGUF file, by name. Borrowed while the model binds its
/// weights; the handles it gives out ([`Linear`]) and the vectors it copies outlive it.
#[derive(Clone, Copy)]
pub struct Loader<'a> {
    file: &'a GgufFile,
}

impl<'a> Loader<'a> {
    /// The loader of `file`.
    pub fn new(file: &'a GgufFile) -> Self {
        Self { file }
    }

    /// The file (metadata, optional tensors).
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// `{prefix}.{tensor}.weight` (`blk.3`, `attn_q` → `blk.3.attn_q.weight`).
    pub fn weight_name(prefix: &str, tensor: &str) -> String {
        format!("{prefix}.{tensor}.weight")
    }

    /// Whether tensor `name` is in the file.
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor_opt(name).is_some()
    }

    /// The 2-D weight `name` as a `[rows, cols]` matrix handle (GGUF dims `[cols, rows]`).
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        Linear::load(self.file, name, rows, cols)
    }

    /// The tensor `name` of `len` values (norm weights, biases, conv kernels) as f32,
    /// dequantized if stored quantized.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`] (another element
    /// count), [`ModelError::Kernel`] when it cannot be dequantized.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let view = self.view(name)?;
        if view.dims.iter().product::<u64>() as usize != len {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: vec![len as u64],
                actual: view.dims.clone(),
            });
        }
        self.dequantized(name, view.ty, view.data, len)
    }

    /// The tensor `name` with exactly the GGUF dims `dims` (fastest-varying first, e.g. a
    /// patch-embedding kernel `[16, 16, 3, n_embd]`) as f32 in file order, dequantized if
    /// stored quantized.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`] (other dims),
    /// [`ModelError::Kernel`] when it cannot be dequantized.
    pub fn shaped(&self, name: &str, dims: &[u64]) -> Result<Vec<f32>, ModelError> {
        let view = self.view(name)?;
        if view.dims != dims {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: dims.to_vec(),
                actual: view.dims.clone(),
            });
        }
        let len = dims.iter().product::<u64>() as usize;
        self.dequantized(name, view.ty, view.data, len)
    }

    fn view(&self, name: &str) -> Result<gguf::TensorView<'a>, ModelError> {
        self.file
            .tensor_opt(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    fn dequantized(
        &self,
        name: &str,
        ty: dsp::GgmlType,
        data: &[u8],
        len: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; len];
        dsp::quant::dequantize_row(ty, data, &mut out).map_err(|e| {
            ModelError::Kernel {
                name: name.to_string(),
                source: e,
            }
        })?;
        Ok(out)
    }
}
