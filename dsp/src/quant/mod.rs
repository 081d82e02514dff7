//! GGML quantization formats: type ids and geometry, block structs, dequantization and the
//! quantizers (activations and weights).
pub mod blocks;
mod dequant;
mod quantize;
#[cfg(target_arch = "aarch64")]
mod quantize_neon;
mod types;

pub use dequant::dequantize_row;
pub use quantize::{
    quantize_row_q4_0, quantize_row_q4_1, quantize_row_q4_k_simple, quantize_row_q6_k_simple,
    quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k,
};
pub use types::GgmlType;
