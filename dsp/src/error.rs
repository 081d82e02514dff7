//! Errors of the dsp entry points: shape, type and alignment mismatches, each carrying the
//! operation and what was expected versus what was passed.

use crate::quant::GgmlType;

/// What went wrong in a dsp call. Hot inner loops only `debug_assert!`; the public entry points
/// (`matmul`, `dequantize_row`, the quantizers and the ops) validate and return these.
#[derive(Debug, thiserror::Error)]
pub enum DspError {
    /// A slice had the wrong number of elements (or bytes, for raw tensor data).
    #[error("{op}: {what} has length {actual}, expected {expected}")]
    LengthMismatch {
        op: &'static str,
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// A row length is not a whole number of blocks of a quantized type.
    #[error("{op}: {n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        op: &'static str,
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    /// The operation does not implement this tensor type.
    #[error("{op}: type {actual} is not supported here (expected one of: {expected})")]
    UnsupportedType {
        op: &'static str,
        actual: GgmlType,
        expected: &'static str,
    },
    /// Raw tensor bytes are not aligned for the block struct of their type.
    #[error("{op}: {ty} data at address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        op: &'static str,
        ty: GgmlType,
        addr: usize,
        align: usize,
    },
    /// A scalar argument is out of its valid range.
    #[error("{op}: invalid {what}: {detail}")]
    InvalidArgument {
        op: &'static str,
        what: &'static str,
        detail: String,
    },
    /// The thread pool could not start a worker thread.
    #[error("thread pool: could not spawn worker {index}")]
    ThreadSpawn {
        index: usize,
        #[source]
        source: std::io::Error,
    },
}

impl DspError {
    /// `Err(LengthMismatch)` unless `actual == expected`.
    pub(crate) fn check_len(
        op: &'static str,
        what: &'static str,
        expected: usize,
        actual: usize,
    ) -> Result<(), DspError> {
        if expected == actual {
            Ok(())
        } else {
            Err(DspError::LengthMismatch {
                op,
                what,
                expected,
                actual,
            })
        }
    }

    /// `Err(LengthMismatch)` unless `actual >= need` (a buffer that may be longer than used).
    pub(crate) fn check_at_least(
        op: &'static str,
        what: &'static str,
        need: usize,
        actual: usize,
    ) -> Result<(), DspError> {
        if actual >= need {
            Ok(())
        } else {
            Err(DspError::LengthMismatch {
                op,
                what,
                expected: need,
                actual,
            })
        }
    }
}
