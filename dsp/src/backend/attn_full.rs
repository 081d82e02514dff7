//! Register-blocked full (non-causal) attention ([`KernelBackend::full_attention`], the
//! vision tower's) for the SIMD backends, written once over a [`Vector`] of any width and
//! instantiated inside each backend's feature-enabled function.
//!
//! The scalar reference is [`super::full_attention_by_chains`]; every lane here holds one of
//! its fused multiply-add chains, so every query gets its exact bits at any vector width:
//! - scores: the keys are transposed (`kt`, key `j`'s element `d` at `d · kv_stride + j`), so
//!   one load takes element `d` of `WIDTH` consecutive keys; `QB` queries × 2 key vectors of
//!   accumulators stay in registers while `d` runs over the head (`acc ← fma(q_d, k_d, acc)`,
//!   the query element broadcast), then each lane is multiplied by `scale`; the keys go in
//!   blocks of [`KV_BLOCK`], every query of the tile on one block before the next. No horizontal
//!   sums, one FMA per multiply (the f16 tile [`super::attn`] spends about half its
//!   instructions on per-key reductions and stores).
//! - values: per 2 vectors of output columns, `QB` queries' accumulators stay in registers
//!   while `j` runs over the keys (`acc ← fma(p_ij, v_j, acc)`); the keys go in blocks of
//!   [`KV_BLOCK`] so that a block's values stay in L1 for every query of the tile (the
//!   accumulators are stored and reloaded between blocks, which keeps every chain exact).
//!
//! [`KernelBackend::full_attention`]: super::KernelBackend::full_attention

use super::attn::Vector;
use super::FullAttnTile;

/// Keys per block of the scores and of the value sums (a multiple of every `2 · WIDTH`: a
/// block of 64-wide f32 keys or values is 32 KiB).
const KV_BLOCK: usize = 128;

/// `$f::<V, N>(args)` for the query-block size `N = $n` (1 to 8; more is 8). A match, not a
/// closure: a closure would not be inlined into the feature-enabled caller, and every vector
/// operation would become a call.
macro_rules! with_queries {
    ($n:expr, $f:ident::<$v:ty>($($arg:expr),*)) => {
        match $n {
            1 => $f::<$v, 1>($($arg),*),
            2 => $f::<$v, 2>($($arg),*),
            3 => $f::<$v, 3>($($arg),*),
            4 => $f::<$v, 4>($($arg),*),
            5 => $f::<$v, 5>($($arg),*),
            6 => $f::<$v, 6>($($arg),*),
            7 => $f::<$v, 7>($($arg),*),
            _ => $f::<$v, 8>($($arg),*),
        }
    };
}

/// [`KernelBackend::full_attention`](super::KernelBackend::full_attention) with vectors `V`,
/// `QB` queries per register block, and the backend's own `softmax` (applied to each query's
/// `n_kv` scores).
///
/// # Safety
/// The CPU must have the features `V`'s methods use. Shapes are checked here
/// ([`FullAttnTile::assert_shapes`], panicking) before any raw access; `2 · V::WIDTH` must
/// divide [`super::FULL_ATTN_KV_ALIGN`].
#[inline(always)]
pub(super) unsafe fn full_attention_tile<V: Vector, const QB: usize>(
    tile: &FullAttnTile<'_>,
    scores: &mut [f32],
    out: &mut [f32],
    softmax: impl Fn(&mut [f32]),
) {
    tile.assert_shapes(scores.len(), out.len());
    debug_assert!(super::FULL_ATTN_KV_ALIGN % (2 * V::WIDTH) == 0 && (1..=8).contains(&QB));
    let (n_q, n_kv, st) = (tile.n_q(), tile.n_kv, tile.kv_stride);
    // Key blocks outer, so that a block of transposed keys stays in L1 for every query.
    let mut j0 = 0;
    while j0 < n_kv {
        let keys = j0..KV_BLOCK.min(n_kv - j0) + j0;
        let mut q0 = 0;
        while q0 < n_q {
            let n = QB.min(n_q - q0);
            with_queries!(n, scores_block::<V>(tile, q0, keys.clone(), scores));
            q0 += n;
        }
        j0 = keys.end;
    }
    for row in scores.chunks_exact_mut(st).take(n_q) {
        softmax(&mut row[..n_kv]);
    }
    let mut j0 = 0;
    while j0 < n_kv {
        let keys = j0..KV_BLOCK.min(n_kv - j0) + j0;
        let mut q0 = 0;
        while q0 < n_q {
            let n = QB.min(n_q - q0);
            with_queries!(n, values_block::<V>(tile, q0, keys.clone(), scores, out));
            q0 += n;
        }
        j0 = keys.end;
    }
}

/// Scores of queries `q0..q0 + N` against the keys `keys` (whole pairs of key vectors from
/// `keys.start`, a multiple of 2 · `WIDTH`, up to `kv_stride`),
/// `scores[i · kv_stride + j] = chain_ij · scale`.
///
/// # Safety
/// As [`full_attention_tile`], whose shape check covers every access here.
#[inline(always)]
unsafe fn scores_block<V: Vector, const N: usize>(
    tile: &FullAttnTile<'_>,
    q0: usize,
    keys: std::ops::Range<usize>,
    scores: &mut [f32],
) {
    let (hd, st, w) = (tile.head_dim, tile.kv_stride, V::WIDTH);
    let q = tile.q.as_ptr().add(q0 * hd);
    let s = scores.as_mut_ptr().add(q0 * st);
    let scale = V::splat(tile.scale);
    let kt = tile.kt.as_ptr();
    // Whole pairs of key vectors up to the last key (`kv_stride` is a multiple of 2 · WIDTH).
    let mut j = keys.start;
    while j < keys.end {
        let mut acc = [[V::zero(); 2]; N];
        let mut k = kt.add(j);
        for d in 0..hd {
            let kv = [V::load_f32(k), V::load_f32(k.add(w))];
            for (b, acc_b) in acc.iter_mut().enumerate() {
                let qd = V::splat(*q.add(b * hd + d));
                acc_b[0] = V::fma(acc_b[0], qd, kv[0]);
                acc_b[1] = V::fma(acc_b[1], qd, kv[1]);
            }
            k = k.add(st);
        }
        for (b, acc_b) in acc.iter().enumerate() {
            V::mul(acc_b[0], scale).store(s.add(b * st + j));
            V::mul(acc_b[1], scale).store(s.add(b * st + j + w));
        }
        j += 2 * w;
    }
}

/// The value sums of queries `q0..q0 + N` over the keys `keys`, continuing the chains in
/// `out` (from `+0.0` at the first key).
///
/// # Safety
/// As [`full_attention_tile`], whose shape check covers every access here.
#[inline(always)]
unsafe fn values_block<V: Vector, const N: usize>(
    tile: &FullAttnTile<'_>,
    q0: usize,
    keys: std::ops::Range<usize>,
    scores: &[f32],
    out: &mut [f32],
) {
    let (hd, st, w) = (tile.head_dim, tile.kv_stride, V::WIDTH);
    let p = scores.as_ptr().add(q0 * st);
    let o = out.as_mut_ptr().add(q0 * hd);
    let v = tile.v.as_ptr();
    let first = keys.start == 0;
    let mut c = 0;
    while c + 2 * w <= hd {
        let mut acc = [[V::zero(); 2]; N];
        if !first {
            for (b, acc_b) in acc.iter_mut().enumerate() {
                *acc_b = [V::load_f32(o.add(b * hd + c)), V::load_f32(o.add(b * hd + c + w))];
            }
        }
        for j in keys.clone() {
            let vj = v.add(j * hd + c);
            let vv = [V::load_f32(vj), V::load_f32(vj.add(w))];
            for (b, acc_b) in acc.iter_mut().enumerate() {
                let pj = V::splat(*p.add(b * st + j));
                acc_b[0] = V::fma(acc_b[0], pj, vv[0]);
                acc_b[1] = V::fma(acc_b[1], pj, vv[1]);
            }
        }
        for (b, acc_b) in acc.iter().enumerate() {
            acc_b[0].store(o.add(b * hd + c));
            acc_b[1].store(o.add(b * hd + c + w));
        }
        c += 2 * w;
    }
    // The last columns (fewer than two vectors): the same chains one element at a time
    // (`mul_add` is the fused operation on every target).
    for b in 0..N {
        for t in c..hd {
            let mut acc = if first { 0f32 } else { *o.add(b * hd + t) };
            for j in keys.clone() {
                acc = (*p.add(b * st + j)).mul_add(*v.add(j * hd + t), acc);
            }
            *o.add(b * hd + t) = acc;
        }
    }
}
