//! AVX-512 VNNI backend (x86_64), chosen at run time by `select` when the CPU has avx512f,
//! avx512bw, avx512dq, avx512vl and avx512vnni (besides avx2, fma, f16c).
//!
//! The K-quant products (Q4_K, Q6_K: the bulk of a Q4_K_M model) have their own kernels
//! ([`super::avx512_kquants`]: `vpdpbusd` + `vpackssdw` + `vpdpwssd` integer sums, a
//! row-at-a-time path for decode and verification and a register-blocked one for prefill);
//! their exact integer sums are spread over other lanes than the AVX2 kernel's, so results
//! differ from the AVX2 backend's in f32 rounding only. Q4_0, Q4_1 and Q8_0 tiles are the AVX2
//! kernels with one `vpdpbusd` in place of `maddubs` + `madd`, and float (f16, bf16, f32)
//! tiles are [`super::float_tile`]'s on 16 lanes (3 × 8 pieces, one 16-lane chain per pair in
//! place of two 8-lane ones), both bit-identical to the AVX2 backend's; SiLU, SwiGLU, GELU and softmax are the AVX2 backend's `exp` on 16 lanes
//! ([`super::avx512_math`], the same bits), full attention is [`super::attn_full`] on 16 lanes,
//! and every other kernel is the AVX2 backend's. Like every backend it is tested
//! against the scalar reference in `tests/conformance.rs`, and its tiles are bit-identical to
//! its single dot products (so a verification pass equals decode, and prefill batch splits
//! do not change results).

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::attn::{attention_blocks, By16, Vector};
use super::attn_full::full_attention_tile;
use super::float_tile::{self, ByLanes16, FloatElem, Lanes16};
use super::avx2::{dot_q_vnni, dot_tile_q_vnni, Avx2, AVX2};
use super::avx2_kquants::KQuant;
use super::avx512_kquants::{dot_kquant, dot_tile_kquant};
use super::{AttnTile, DotTile, FullAttnTile, KernelBackend};
use crate::quant::blocks::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::quant::GgmlType;

/// The AVX-512 VNNI backend. Only obtainable through [`Avx512::get`], which checks the CPU
/// features, so holding one proves they are available.
#[derive(Debug)]
pub struct Avx512 {
    avx2: &'static Avx2,
}

static AVX512: Avx512 = Avx512 { avx2: &AVX2 };

impl Avx512 {
    /// The backend if this CPU has avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx2, fma and f16c
    /// (checked at run time).
    pub fn get() -> Option<&'static Avx512> {
        (Avx2::get().is_some()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        .then_some(&AVX512)
    }
}

impl Avx512 {
    /// The single dot product of `nb` blocks of `ty` (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) with
    /// their activation blocks ([`quant_dot_methods`]).
    ///
    /// # Safety
    /// `w` and `x` point at `nb` aligned blocks each (the features are proven by `self`).
    #[inline(always)]
    unsafe fn dot_blocks(&self, ty: GgmlType, w: *const u8, x: *const u8, nb: usize) -> f32 {
        match ty {
            GgmlType::Q4_K => dot_kquant(KQuant::Q4K, w, x, nb),
            GgmlType::Q6_K => dot_kquant(KQuant::Q6K, w, x, nb),
            _ => dot_q_vnni(ty, w, x, nb),
        }
    }
}

// SAFETY (every `unsafe` block below): an `Avx512` exists only via `Avx512::get`, which checked
// the features its kernels enable; the kernels assert the tile geometry before raw access and
// the single dot products read `min(len)` blocks of the slices passed.
impl KernelBackend for Avx512 {
    fn name(&self) -> &'static str {
        "avx512-vnni"
    }

    fn gdn_chunked_head(&self, head: &mut crate::gdn::chunked::ChunkedHead<'_, '_>) {
        self.avx2.gdn_chunked_head(head)
    }

    fn gdn_recurrent_head(&self, head: &mut crate::gdn::recurrent::RecurrentHead<'_, '_>) {
        // SAFETY: the features are proven by `self` (avx512f, avx2 and fma among them).
        unsafe { crate::gdn::recurrent::head_avx512(head) }
    }

    fn gdn_replay_head(&self, head: &mut crate::gdn::replay::ReplayHead<'_, '_>) {
        // SAFETY: as gdn_recurrent_head (avx2 and fma among the features checked).
        unsafe { crate::gdn::replay::head_avx512(head) }
    }

    quant_dot_methods!();

    fn vec_dot_f16(&self, w: &[f16], x: &[f16]) -> f32 {
        self.avx2.vec_dot_f16(w, x)
    }

    fn vec_dot_bf16(&self, w: &[bf16], x: &[bf16]) -> f32 {
        self.avx2.vec_dot_bf16(w, x)
    }

    fn vec_dot_f32(&self, w: &[f32], x: &[f32]) -> f32 {
        self.avx2.vec_dot_f32(w, x)
    }

    fn dot_tile(&self, tile: &DotTile<'_>, out: &mut [f32]) {
        // SAFETY: see the impl comment; `dot_tile_kquant` asserts the tile geometry.
        unsafe {
            match tile.ty {
                GgmlType::Q4_K => dot_tile_kquant(KQuant::Q4K, tile, out),
                GgmlType::Q6_K => dot_tile_kquant(KQuant::Q6K, tile, out),
                GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => dot_tile_q_vnni(tile, out),
                GgmlType::F16 => dot_tile_float_x16::<f16>(tile, out),
                GgmlType::BF16 => dot_tile_float_x16::<bf16>(tile, out),
                GgmlType::F32 => dot_tile_float_x16::<f32>(tile, out),
                _ => self.avx2.dot_tile(tile, out),
            }
        }
    }

    fn rms_norm_row(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        self.avx2.rms_norm_row(x, w, eps, out)
    }

    fn add_inplace(&self, dst: &mut [f32], src: &[f32]) {
        self.avx2.add_inplace(dst, src)
    }

    fn axpy_f16(&self, out: &mut [f32], a: f32, v: &[f16]) {
        self.avx2.axpy_f16(out, a, v)
    }

    fn silu_inplace(&self, x: &mut [f32]) {
        // SAFETY: the features are proven by `self` (see `full_attention`).
        unsafe { super::avx512_math::silu_inplace(x) }
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        debug_assert!(gate.len() == up.len() && gate.len() == out.len());
        // SAFETY: the features are proven by `self` (see `full_attention`).
        unsafe { super::avx512_math::swiglu(gate, up, out) }
    }

    fn gelu_tanh_inplace(&self, x: &mut [f32]) {
        // SAFETY: the features are proven by `self` (see `full_attention`).
        unsafe { super::avx512_math::gelu_tanh_inplace(x) }
    }

    fn softmax_inplace(&self, x: &mut [f32]) {
        // SAFETY: the features are proven by `self` (see `full_attention`).
        unsafe { super::avx512_math::softmax_inplace(x) }
    }

    fn attention_queries(&self, tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: the features are proven by `self` (see `full_attention`); the kernel checks
        // the tile's shapes.
        unsafe { attention_queries(tile, scores, out) }
    }

    fn full_attention(&self, tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
        // SAFETY: an `Avx512` exists only via `Avx512::get`, which checked the features; the
        // kernel checks the tile's shapes.
        unsafe { full_attention(tile, scores, out) }
    }
}

/// The 16-lane vector of [`super::attn_full`] (callers must have avx512f).
impl Vector for __m512 {
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> Self {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        _mm512_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self {
        _mm512_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm512_mul_ps(a, b)
    }
}

/// [`KernelBackend::attention_queries`] with 16-lane tiles ([`super::attn::By16`], the
/// AVX2 tile's bits: its f16 dot and axpy are the AVX2 backend's and its softmax gives the
/// AVX2 one's bits, `avx512_math`).
///
/// # Safety
/// Needs avx512f, avx512vl, avx512dq, avx2, fma, f16c (shapes are checked inside).
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn attention_queries(tile: &AttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
    attention_blocks::<__m256, By16<__m512>>(tile, scores, out, |x| unsafe { super::avx512_math::softmax_inplace(x) })
}

/// [`KernelBackend::full_attention`] with 16-lane vectors, 8 queries × 32 keys (or output
/// columns) of accumulators in 16 of the 32 registers ([`super::attn_full`]; reference:
/// [`super::full_attention_by_chains`] with this backend's softmax).
///
/// # Safety
/// Needs avx512f, avx2, fma, f16c (shapes are checked inside).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn full_attention(tile: &FullAttnTile<'_>, scores: &mut [f32], out: &mut [f32]) {
    full_attention_tile::<__m512, 8>(tile, scores, out, |x| unsafe {
        super::avx512_math::softmax_inplace(x)
    })
}

/// The 16-lane vector of [`super::float_tile`]'s AVX-512 pieces (callers must have avx512f,
/// avx512vl, avx512dq, avx2, fma, f16c); its `Half` is the AVX2 backend's `__m256`, so the
/// folded chains reduce with the AVX2 `hsum`.
impl Lanes16 for __m512 {
    type Half = __m256;
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load16_f16(p: *const f16) -> Self {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn load16_bf16(p: *const bf16) -> Self {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()))))
    }
    #[inline(always)]
    unsafe fn load16_f32(p: *const f32) -> Self {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self {
        _mm512_fmadd_ps(w, x, acc)
    }
    #[inline(always)]
    unsafe fn fma_low(acc: Self, w: __m256, x: __m256) -> Self {
        // Masked-off lanes are taken from `acc` unchanged (the undefined high halves of the
        // widened operands are never computed with).
        _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(w), _mm512_castps256_ps512(x), acc, 0x00ff)
    }
    #[inline(always)]
    unsafe fn fold(self) -> __m256 {
        _mm256_add_ps(_mm512_castps512_ps256(self), _mm512_extractf32x8_ps::<1>(self))
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn store16(self, p: *mut f32) {
        _mm512_storeu_ps(p, self)
    }
}

/// A float [`DotTile`] in 3 × 8 pieces of 16-lane chains (24 accumulators, 3 widened weight
/// chunks and one activation chunk in the 32 registers), bit-identical to the AVX2 backend's
/// tiles and dots ([`super::float_tile`]: the same two chains, side by side in one vector).
///
/// # Safety
/// Needs avx512f, avx512vl, avx512dq, avx2, fma, f16c; the [`DotTile`] contract with the
/// tile's type `E`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512dq")]
unsafe fn dot_tile_float_x16<E: FloatElem>(tile: &DotTile<'_>, out: &mut [f32]) {
    float_tile::dot_tile_float::<ByLanes16<__m512>, E, 3, 8>(tile, out)
}
