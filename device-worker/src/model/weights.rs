//! Weight handles that point into the memory-mapped GGUF file.
//!
//! A model keeps its `Arc<GgufFile>` and these small handles (type, shape, byte range) instead
//! of borrowed slices, so the model owns its file without self-references. The forward pass
//! resolves a handle against `GgufFile::bytes()` once per use.

use std::ops::Range;

use dsp::matmul::QMatRef;
use dsp::GgmlType;

use super::ModelError;
use gguf::reader::GgufFile;

/// A 2-D weight `[rows, cols]` in GGUF order (each of the `rows` output features is a
/// contiguous row of `cols` input features), as used by `y = W x`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
}

impl Linear {
    /// Looks up tensor `name` and checks it is `[cols, rows]` in GGUF dims (`dims[0] = cols`).
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn load(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Self, ModelError> {
        let view = file
            .tensor_opt(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let dims: Vec<u64> = view.dims.clone();
        let ok = dims.len() == 2 && dims[0] as usize == cols && dims[1] as usize == rows
            || dims.len() == 1 && rows == 1 && dims[0] as usize == cols;
        if !ok {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: vec![cols as u64, rows as u64],
                actual: dims,
            });
        }
        let base = file.bytes().as_ptr() as usize;
        let start = view.data.as_ptr() as usize - base;
        Ok(Self {
            name: name.to_string(),
            ty: view.ty,
            rows,
            cols,
            range: start..start + view.data.len(),
        })
    }

    /// The quantized matrix view for the kernels; `bytes` is `GgufFile::bytes()`.
    pub fn mat<'a>(&self, bytes: &'a [u8]) -> QMatRef<'a> {
        QMatRef::new(self.ty, self.rows, self.cols, &bytes[self.range.clone()])
            .expect("weight shape was checked at load time")
    }

    /// Raw bytes of row `r` (for embedding lookup).
    pub fn row_bytes<'a>(&self, bytes: &'a [u8], r: usize) -> &'a [u8] {
        let rb = self.range.len() / self.rows;
        &bytes[self.range.start + r * rb..self.range.start + (r + 1) * rb]
    }

    /// Number of weights.
    pub fn numel(&self) -> usize {
        self.rows * self.cols
    }
}
