//! Compute kernels of tandem: GGML-quantized matrix products with ggml's CPU numerics
//! ([`matmul`]), the row ops of the forward pass ([`ops`]) and of encoders such as a vision
//! tower ([`encoder`]: LayerNorm, GELU, 2-D rotary, grid resampling, full attention), GGML
//! block formats ([`quant`]),
//! per-ISA kernel backends checked against a scalar reference ([`backend`]) and a parkable
//! thread pool ([`pool`]).
//!
//! Backend choice is the caller's: [`backend::resolve`] a name (the binaries read
//! `TANDEM_KERNELS`), [`backend::install`] it; [`backend::select`] returns it to the kernels
//! (AVX-512 VNNI, else AVX2, NEON or scalar when nothing was installed).
// Kernels index several parallel arrays (scales, mins, quants) by the same block index;
// iterator chains there read worse than the ggml formulas they transcribe.
#![allow(clippy::needless_range_loop)]

pub mod backend;
pub mod encoder;
pub mod error;
pub mod gdn;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant;

pub use backend::{select, KernelBackend};
pub use error::DspError;
pub use matmul::{matmul, QMatRef};
pub use pool::ThreadPool;
pub use quant::GgmlType;
