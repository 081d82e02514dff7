//! aarch64 backend. NEON kernels are not written yet: this backend delegates every kernel to
//! the scalar reference so that the aarch64 build and the per-backend conformance tests have
//! the same shape as on x86_64. Replace method by method (dotprod/i8mm detection at run time).

use half::{bf16, f16};

use super::scalar::Scalar;
use super::KernelBackend;
use crate::quant::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};

/// The aarch64 backend (currently the scalar kernels).
#[derive(Debug)]
pub struct Neon;

static NEON: Neon = Neon;

impl Neon {
    pub fn get() -> &'static Neon {
        &NEON
    }
}

impl KernelBackend for Neon {
    fn name(&self) -> &'static str {
        "neon"
    }
    fn vec_dot_q4_0_q8_0(&self, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        Scalar.vec_dot_q4_0_q8_0(w, x)
    }
    fn vec_dot_q4_1_q8_1(&self, w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
        Scalar.vec_dot_q4_1_q8_1(w, x)
    }
    fn vec_dot_q8_0_q8_0(&self, w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
        Scalar.vec_dot_q8_0_q8_0(w, x)
    }
    fn vec_dot_q4_k_q8_k(&self, w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
        Scalar.vec_dot_q4_k_q8_k(w, x)
    }
    fn vec_dot_q6_k_q8_k(&self, w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
        Scalar.vec_dot_q6_k_q8_k(w, x)
    }
    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32 {
        Scalar.vec_dot_f16(w, x)
    }
    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32 {
        Scalar.vec_dot_bf16(w, x)
    }
    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32 {
        Scalar.vec_dot_f32(w, x)
    }
    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        Scalar.rms_norm_row(x, w, eps, out)
    }
    fn add_inplace(&self, dst: &mut [f32], src: &[f32]) {
        Scalar.add_inplace(dst, src)
    }
    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]) {
        Scalar.axpy_f16(out, a, v)
    }
    fn silu_inplace(&self, x: &mut [f32]) {
        Scalar.silu_inplace(x)
    }
    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        Scalar.swiglu(gate, up, out)
    }
}
