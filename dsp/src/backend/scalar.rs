//! The scalar reference backend: readable, safe, no unrolling. Follows the generic (non-SIMD)
//! paths of ggml's `ggml_vec_dot_*` (`ggml/src/ggml-cpu/quants.c`, `vec.cpp`).

use half::{bf16, f16};

use super::KernelBackend;
use crate::quant::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};

/// The reference backend; every other backend is tested against it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Scalar;

impl KernelBackend for Scalar {
    fn name(&self) -> &'static str {
        "scalar"
    }

    fn vec_dot_q4_0_q8_0(&self, w: &[BlockQ4_0], x: &[BlockQ8_0]) -> f32 {
        sum_over_blocks(w, x, |bw, bx| {
            let mut sumi = 0i32;
            for j in 0..16 {
                let lo = (bw.qs[j] & 0x0F) as i32 - 8;
                let hi = (bw.qs[j] >> 4) as i32 - 8;
                sumi += lo * bx.qs[j] as i32 + hi * bx.qs[j + 16] as i32;
            }
            bw.d.to_f32() * bx.d.to_f32() * sumi as f32
        })
    }

    fn vec_dot_q4_1_q8_1(&self, w: &[BlockQ4_1], x: &[BlockQ8_1]) -> f32 {
        sum_over_blocks(w, x, |bw, bx| {
            let mut sumi = 0i32;
            for j in 0..16 {
                let lo = (bw.qs[j] & 0x0F) as i32;
                let hi = (bw.qs[j] >> 4) as i32;
                sumi += lo * bx.qs[j] as i32 + hi * bx.qs[j + 16] as i32;
            }
            bw.d.to_f32() * bx.d.to_f32() * sumi as f32 + bw.m.to_f32() * bx.s.to_f32()
        })
    }

    fn vec_dot_q8_0_q8_0(&self, w: &[BlockQ8_0], x: &[BlockQ8_0]) -> f32 {
        sum_over_blocks(w, x, |bw, bx| {
            let sumi: i32 = bw
                .qs
                .iter()
                .zip(&bx.qs)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
            bw.d.to_f32() * bx.d.to_f32() * sumi as f32
        })
    }

    fn vec_dot_q4_k_q8_k(&self, w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
        sum_over_blocks(w, x, |bw, bx| {
            let (sc, mn) = bw.scales_mins();
            let q = bw.unpack();
            let sumi = scaled_group_sums(&q, &bx.qs, 32, |k| sc[k] as i32);
            let mut summ = 0i32;
            for k in 0..8 {
                summ += mn[k] as i32 * (bx.bsums[2 * k] as i32 + bx.bsums[2 * k + 1] as i32);
            }
            let d = bx.d * bw.d.to_f32();
            let dmin = bx.d * bw.dmin.to_f32();
            d * sumi as f32 - dmin * summ as f32
        })
    }

    fn vec_dot_q6_k_q8_k(&self, w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
        sum_over_blocks(w, x, |bw, bx| {
            let q = bw.unpack();
            let sumi = scaled_group_sums(&q, &bx.qs, 16, |k| bw.scales[k] as i32);
            bx.d * bw.d.to_f32() * sumi as f32
        })
    }

    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32 {
        dot_summed_in_f64(w, x, f16::to_f32)
    }

    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32 {
        dot_summed_in_f64(w, x, bf16::to_f32)
    }

    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32 {
        dot_summed_in_f64(w, x, |v| v)
    }

    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        debug_assert!(x.len() == w.len() && x.len() == out.len());
        let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / x.len() as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = (v * scale) * g;
        }
    }

    fn add_inplace(&self, dst: &mut [f32], src: &[f32]) {
        debug_assert_eq!(dst.len(), src.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    }

    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]) {
        debug_assert_eq!(out.len(), v.len());
        for (o, &vv) in out.iter_mut().zip(v) {
            *o += a * vv.to_f32();
        }
    }

    fn silu_inplace(&self, x: &mut [f32]) {
        for v in x {
            *v /= 1.0 + (-*v).exp();
        }
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        debug_assert!(gate.len() == up.len() && gate.len() == out.len());
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// `Σ widen(w_i)·widen(x_i)`: f32 products summed in f64, in element order (ggml's
/// `ggml_vec_dot_f16` / `_bf16` / `_f32` reference loops).
fn dot_summed_in_f64<T: Copy>(w: &[T], x: &[T], widen: impl Fn(T) -> f32) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let sum: f64 = w
        .iter()
        .zip(x)
        .map(|(&a, &b)| (widen(a) * widen(b)) as f64)
        .sum();
    sum as f32
}

/// `Σ_b block(w_b, x_b)` over the pairs of blocks, summed in f32 in block order (ggml's
/// generic `ggml_vec_dot_*` loops).
fn sum_over_blocks<W, X>(w: &[W], x: &[X], block: impl Fn(&W, &X) -> f32) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut sum = 0f32;
    for (bw, bx) in w.iter().zip(x) {
        sum += block(bw, bx);
    }
    sum
}

/// `Σ_k scale(k) · Σ_{p in group k} q[p]·x[p]` over the groups of `group` quants (a K-quant
/// super-block's sub-blocks), exact in i32.
fn scaled_group_sums<Q: Copy + Into<i32>>(q: &[Q], x: &[i8], group: usize, scale: impl Fn(usize) -> i32) -> i32 {
    let dots = q.chunks(group).zip(x.chunks(group)).map(|(qk, xk)| {
        qk.iter().zip(xk).map(|(&a, &b)| a.into() * b as i32).sum::<i32>()
    });
    dots.enumerate().map(|(k, dot)| scale(k) * dot).sum()
}
