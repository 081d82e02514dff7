//! Register-blocked attention tiles ([`KernelBackend::attention_queries`]) for the SIMD
//! backends, written once over an 8-lane f32 vector ([`Lanes`]: an AVX2 `__m256`, or a NEON
//! pair of `float32x4_t`) and instantiated inside each backend's feature-enabled function.
//!
//! The scalar reference is [`super::attention_queries_by_pairs`] (one `vec_dot_f16` and one
//! `axpy_f16` per (position, query)); these kernels give every query its exact bits:
//! - scores: per key row `j`, each 16-element K chunk is widened once and FMA'd into [`QB`]
//!   queries' two accumulators (`a0` even, `a1` odd 8-lane chunks, one more 8-element step
//!   into `a0`), reduced `hsum(a0 + a1)` (four queries at a time, [`Lanes::hsum4`]), the
//!   tail added in order, times `scale`: the backends' f16 dot ([`super::float_tile::dot_float`])
//!   lane for lane;
//! - values: per 16 output columns, [`QB`] queries' accumulators stay in registers while each
//!   V chunk is widened once per position and added as `acc + p·v` (multiply, then add) in
//!   increasing `j`: `axpy_f16`'s elementwise operations, in its order, from `+0.0`.
//!
//! [`KernelBackend::attention_queries`]: super::KernelBackend::attention_queries

use half::f16;

use super::float_tile::Lanes16;
use super::AttnTile;

/// Queries per register block (AVX2: 8 accumulators + 2 K or V chunks of 16 registers).
const QB: usize = 4;

/// An f32 vector of `WIDTH` lanes with the lane-wise operations every tile kernel uses
/// ([`Lanes`] here, [`super::attn_full`]). Every method is `#[inline(always)]` and must only
/// run where the backend's features are available.
pub(super) trait Vector: Copy {
    /// Lanes per vector.
    const WIDTH: usize;
    /// All lanes `+0.0`.
    unsafe fn zero() -> Self;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `WIDTH` f32 at `p` (unaligned).
    unsafe fn load_f32(p: *const f32) -> Self;
    /// Stores the lanes at `p` (unaligned).
    unsafe fn store(self, p: *mut f32);
    /// `acc + w·x`, fused (x86 `fmadd(w, x, acc)`, NEON `vfmaq(acc, w, x)`).
    unsafe fn fma(acc: Self, w: Self, x: Self) -> Self;
    /// `a + b` lane-wise.
    unsafe fn add(a: Self, b: Self) -> Self;
    /// `a · b` lane-wise.
    unsafe fn mul(a: Self, b: Self) -> Self;
}

/// An 8-lane f32 [`Vector`] with the widening loads and reductions of the backends' f16 dot
/// and axpy. Every method is `#[inline(always)]` and must only run where the backend's
/// features are available.
pub(super) trait Lanes: Vector {
    /// 8 f16 at `p` (unaligned) widened to f32, as the backend's `load_f16x8`.
    unsafe fn load_f16(p: *const f16) -> Self;
    /// 8 bf16 at `p` (unaligned) widened to f32 (a bf16 is the high half of an f32).
    unsafe fn load_bf16(p: *const half::bf16) -> Self;
    /// The backend's horizontal sum (`hsum_ps`: `(s0 + s2) + (s1 + s3)` of `s = lo + hi`).
    unsafe fn hsum(self) -> f32;
    /// `[v[0].hsum(), .., v[3].hsum()]`, bit for bit; a backend may reduce the four together
    /// (the same additions on the same operands, in transposed lanes).
    #[inline(always)]
    unsafe fn hsum4(v: [Self; 4]) -> [f32; 4] {
        [v[0].hsum(), v[1].hsum(), v[2].hsum(), v[3].hsum()]
    }
}

/// How a backend computes the scores and the outputs of a block of `N ≤ Self::QB` queries
/// ([`By8`]: two 8-lane chains per 16 elements; [`By16`]: one 16-lane vector holding both).
pub(super) trait AttnBlocks {
    /// Queries per register block.
    const QB: usize;
    /// [`scores_block`]'s contract.
    ///
    /// # Safety
    /// As [`scores_block`].
    unsafe fn scores<const N: usize>(tile: &AttnTile<'_>, qf: &[f32], q0: usize, scores: &mut [f32]);
    /// [`values_block`]'s contract.
    ///
    /// # Safety
    /// As [`values_block`].
    unsafe fn values<const N: usize>(tile: &AttnTile<'_>, scores: &[f32], q0: usize, out: &mut [f32]);
}

/// Blocks of [`QB`] queries with 8-lane vectors `L` (AVX2, NEON).
pub(super) struct By8<L>(std::marker::PhantomData<L>);

impl<L: Lanes> AttnBlocks for By8<L> {
    const QB: usize = QB;
    #[inline(always)]
    unsafe fn scores<const N: usize>(tile: &AttnTile<'_>, qf: &[f32], q0: usize, scores: &mut [f32]) {
        scores_block::<L, N>(tile, qf, q0, scores)
    }
    #[inline(always)]
    unsafe fn values<const N: usize>(tile: &AttnTile<'_>, scores: &[f32], q0: usize, out: &mut [f32]) {
        values_block::<L, N>(tile, scores, q0, out)
    }
}

/// Blocks of 8 queries with 16-lane vectors `V` (AVX-512): each 16-element chunk of a dot is
/// one fused multiply-add whose low lanes are [`By8`]'s `a0` chain and high lanes its `a1`
/// chain, folded `a0 + a1` before the same 8-lane `hsum`; each 16 output columns one
/// accumulator. The same bits as [`By8`] with `V::Half`, half the instructions, and twice
/// the queries per K or V read.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
pub(super) struct By16<V>(std::marker::PhantomData<V>);

impl<V: Lanes16> AttnBlocks for By16<V> {
    const QB: usize = 8;
    #[inline(always)]
    unsafe fn scores<const N: usize>(tile: &AttnTile<'_>, qf: &[f32], q0: usize, scores: &mut [f32]) {
        scores_block16::<V, N>(tile, qf, q0, scores)
    }
    #[inline(always)]
    unsafe fn values<const N: usize>(tile: &AttnTile<'_>, scores: &[f32], q0: usize, out: &mut [f32]) {
        values_block16::<V, N>(tile, scores, q0, out)
    }
}

/// [`KernelBackend::attention_queries`](super::KernelBackend::attention_queries) with 8-lane
/// vectors `L` ([`By8`]) and the backend's own `softmax` (applied to each query's visible
/// scores).
///
/// # Safety
/// The CPU must have the features `L`'s methods use. Shapes are checked here
/// ([`AttnTile::assert_shapes`], panicking) before any raw access.
#[inline(always)]
pub(super) unsafe fn attention_tile<L: Lanes>(
    tile: &AttnTile<'_>,
    scores: &mut [f32],
    out: &mut [f32],
    softmax: impl Fn(&mut [f32]),
) {
    attention_blocks::<L, By8<L>>(tile, scores, out, softmax)
}

/// The attention tile with the blocks of `B` (queries widened with `L`, the backend's 8-lane
/// vector): scores, the backend's `softmax` per query, outputs.
///
/// # Safety
/// As [`attention_tile`], for `B`'s vectors too.
#[inline(always)]
pub(super) unsafe fn attention_blocks<L: Lanes, B: AttnBlocks>(
    tile: &AttnTile<'_>,
    scores: &mut [f32],
    out: &mut [f32],
    softmax: impl Fn(&mut [f32]),
) {
    tile.assert_shapes(scores.len(), out.len());
    let (n_q, hd, max_ctx) = (tile.n_q(), tile.head_dim, tile.max_ctx());
    if n_q == 0 {
        return;
    }
    // The queries widened once (exact), vector part as the dot's `load_f16` does.
    let mut qf = vec![0f32; n_q * hd];
    for (qr, q16) in qf.chunks_exact_mut(hd).zip(tile.q16.chunks_exact(hd)) {
        let mut c = 0;
        while c + 8 <= hd {
            L::load_f16(q16.as_ptr().add(c)).store(qr.as_mut_ptr().add(c));
            c += 8;
        }
        for t in c..hd {
            qr[t] = q16[t].to_f32();
        }
    }
    let scores = &mut scores[..n_q * max_ctx];
    for q0 in (0..n_q).step_by(B::QB) {
        with_block_len!(B::QB, n_q - q0, N => B::scores::<N>(tile, &qf, q0, scores));
    }
    for (row, &n) in scores.chunks_exact_mut(max_ctx).zip(tile.n_ctx) {
        softmax(&mut row[..n]);
    }
    for q0 in (0..n_q).step_by(B::QB) {
        with_block_len!(B::QB, n_q - q0, N => B::values::<N>(tile, scores, q0, out));
    }
}

/// Runs `$body` with the const `$n` = `min($left, $qb)` (1 ..= 8).
macro_rules! with_block_len {
    ($qb:expr, $left:expr, $n:ident => $body:expr) => {
        match $left.min($qb) {
            1 => { const $n: usize = 1; $body }
            2 => { const $n: usize = 2; $body }
            3 => { const $n: usize = 3; $body }
            4 => { const $n: usize = 4; $body }
            5 => { const $n: usize = 5; $body }
            6 => { const $n: usize = 6; $body }
            7 => { const $n: usize = 7; $body }
            _ => { const $n: usize = 8; $body }
        }
    };
}
use with_block_len;

/// Scores of queries `q0..q0 + N`: `scores[i * max_ctx + j] = dot(k_j, q_i) * scale` for
/// `j < n_ctx[i]`, each K row read once for the `N` queries.
///
/// # Safety
/// As [`attention_tile`], whose shape check covers every access here.
#[inline(always)]
unsafe fn scores_block<L: Lanes, const N: usize>(
    tile: &AttnTile<'_>,
    qf: &[f32],
    q0: usize,
    scores: &mut [f32],
) {
    let (hd, max_ctx) = (tile.head_dim, tile.max_ctx());
    let n_ctx = &tile.n_ctx[q0..q0 + N];
    let span = n_ctx.iter().copied().max().unwrap_or(0);
    let mut q = [qf.as_ptr(); N];
    for (b, qb) in q.iter_mut().enumerate() {
        *qb = qb.add((q0 + b) * hd);
    }
    let mut s = [scores.as_mut_ptr(); N];
    for (b, sb) in s.iter_mut().enumerate() {
        *sb = sb.add((q0 + b) * max_ctx);
    }
    let all = n_ctx.iter().copied().min().unwrap_or(0);
    for j in 0..span {
        let dots = dots::<L, N>(tile.k.get_unchecked(j * hd..(j + 1) * hd), q);
        for b in 0..N {
            if j < all || j < n_ctx[b] {
                *s[b].add(j) = dots[b] * tile.scale;
            }
        }
    }
}

/// `k · q_b` for `N` widened query rows of `k.len()` elements, each the backends'
/// `dot_widened(k, q16_b)` exactly (see the module docs); `k` is widened once for all `N`.
///
/// # Safety
/// Each `q[b]` points at `k.len()` readable f32.
#[inline(always)]
unsafe fn dots<L: Lanes, const N: usize>(k: &[f16], q: [*const f32; N]) -> [f32; N] {
    let (n, pk) = (k.len(), k.as_ptr());
    let mut a0 = [L::zero(); N];
    let mut a1 = [L::zero(); N];
    let mut i = 0;
    while i + 16 <= n {
        let (k0, k1) = (L::load_f16(pk.add(i)), L::load_f16(pk.add(i + 8)));
        for b in 0..N {
            a0[b] = L::fma(a0[b], k0, L::load_f32(q[b].add(i)));
            a1[b] = L::fma(a1[b], k1, L::load_f32(q[b].add(i + 8)));
        }
        i += 16;
    }
    if i + 8 <= n {
        let k0 = L::load_f16(pk.add(i));
        for b in 0..N {
            a0[b] = L::fma(a0[b], k0, L::load_f32(q[b].add(i)));
        }
        i += 8;
    }
    // (Loops, not closures, here and below: a closure would not be inlined into the
    // feature-enabled caller, and every vector operation would become a call.)
    let mut sums = [0f32; N];
    let mut b = 0;
    while b + 4 <= N {
        let r = L::hsum4([
            L::add(a0[b], a1[b]),
            L::add(a0[b + 1], a1[b + 1]),
            L::add(a0[b + 2], a1[b + 2]),
            L::add(a0[b + 3], a1[b + 3]),
        ]);
        sums[b..b + 4].copy_from_slice(&r);
        b += 4;
    }
    for b in b..N {
        sums[b] = L::add(a0[b], a1[b]).hsum();
    }
    for b in 0..N {
        for t in i..n {
            sums[b] += k[t].to_f32() * *q[b].add(t);
        }
    }
    sums
}

/// Outputs of queries `q0..q0 + N`: `out_i = Σ_{j < n_ctx[i]} p_ij · v_j` from `+0.0`, one
/// multiply and one add per element and position in increasing `j` (as `axpy_f16`), each V
/// chunk widened once for the `N` queries.
///
/// # Safety
/// As [`attention_tile`], whose shape check covers every access here.
#[inline(always)]
unsafe fn values_block<L: Lanes, const N: usize>(
    tile: &AttnTile<'_>,
    scores: &[f32],
    q0: usize,
    out: &mut [f32],
) {
    let (hd, max_ctx) = (tile.head_dim, tile.max_ctx());
    let n_ctx = &tile.n_ctx[q0..q0 + N];
    let (all, span) = (n_ctx.iter().min(), n_ctx.iter().max());
    let (all, span) = (all.copied().unwrap_or(0), span.copied().unwrap_or(0));
    let (mut p, mut o) = ([scores.as_ptr(); N], [out.as_mut_ptr(); N]);
    for b in 0..N {
        p[b] = p[b].add((q0 + b) * max_ctx);
        o[b] = o[b].add((q0 + b) * hd);
    }
    let pv = tile.v.as_ptr();
    let mut c = 0;
    while c + 16 <= hd {
        let mut acc = [[L::zero(); 2]; N];
        for j in 0..all {
            value_step::<L, N>(&mut acc, pv.add(j * hd + c), p, j, None);
        }
        for j in all..span {
            value_step::<L, N>(&mut acc, pv.add(j * hd + c), p, j, Some(n_ctx));
        }
        for b in 0..N {
            acc[b][0].store(o[b].add(c));
            acc[b][1].store(o[b].add(c + 8));
        }
        c += 16;
    }
    // The last columns (fewer than 16): elementwise `out += p · v`, as `axpy_f16`'s tail.
    for b in 0..N {
        for t in c..hd {
            let mut acc = 0f32;
            for j in 0..n_ctx[b] {
                acc += *p[b].add(j) * (*pv.add(j * hd + t)).to_f32();
            }
            *o[b].add(t) = acc;
        }
    }
}

/// `acc_b += p_b[j] · v[0..16]` (multiply, then add) for the `N` queries, or only for those
/// with `j < n_ctx[b]` when `n_ctx` is given (the ragged end of a causal tile).
///
/// # Safety
/// `v` points at 16 readable f16 and each `p[b]` at `j + 1` readable f32.
#[inline(always)]
unsafe fn value_step<L: Lanes, const N: usize>(
    acc: &mut [[L; 2]; N],
    v: *const f16,
    p: [*const f32; N],
    j: usize,
    n_ctx: Option<&[usize]>,
) {
    let vj = [L::load_f16(v), L::load_f16(v.add(8))];
    for b in 0..N {
        if n_ctx.is_none_or(|n| j < n[b]) {
            let pj = L::splat(*p[b].add(j));
            acc[b][0] = L::add(acc[b][0], L::mul(pj, vj[0]));
            acc[b][1] = L::add(acc[b][1], L::mul(pj, vj[1]));
        }
    }
}

/// [`scores_block`] with 16-lane vectors ([`By16`]): the same bits.
///
/// # Safety
/// As [`attention_tile`], whose shape check covers every access here.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
#[inline(always)]
unsafe fn scores_block16<V: Lanes16, const N: usize>(tile: &AttnTile<'_>, qf: &[f32], q0: usize, scores: &mut [f32]) {
    let (hd, max_ctx) = (tile.head_dim, tile.max_ctx());
    let n_ctx = &tile.n_ctx[q0..q0 + N];
    let span = n_ctx.iter().copied().max().unwrap_or(0);
    let all = n_ctx.iter().copied().min().unwrap_or(0);
    let q: [*const f32; N] = std::array::from_fn(|b| qf.as_ptr().add((q0 + b) * hd));
    let s: [*mut f32; N] = std::array::from_fn(|b| scores.as_mut_ptr().add((q0 + b) * max_ctx));
    for j in 0..span {
        let dots = dots16::<V, N>(tile.k.get_unchecked(j * hd..(j + 1) * hd), q);
        for b in 0..N {
            if j < all || j < n_ctx[b] {
                *s[b].add(j) = dots[b] * tile.scale;
            }
        }
    }
}

/// [`dots`] with one 16-lane chain per query: low lanes `a0`, high lanes `a1` (the 8-element
/// step into the low lanes), folded `a0 + a1` before `V::Half`'s `hsum`: the same bits.
///
/// # Safety
/// Each `q[b]` points at `k.len()` readable f32.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
#[inline(always)]
unsafe fn dots16<V: Lanes16, const N: usize>(k: &[f16], q: [*const f32; N]) -> [f32; N] {
    let (n, pk) = (k.len(), k.as_ptr());
    let mut a = [V::zero(); N];
    let mut i = 0;
    while i + 16 <= n {
        let kk = V::load16_f16(pk.add(i));
        for b in 0..N {
            a[b] = V::fma(a[b], kk, V::load16_f32(q[b].add(i)));
        }
        i += 16;
    }
    if i + 8 <= n {
        let k0 = <V::Half as Lanes>::load_f16(pk.add(i));
        for b in 0..N {
            a[b] = V::fma_low(a[b], k0, <V::Half as Vector>::load_f32(q[b].add(i)));
        }
        i += 8;
    }
    let mut sums = [0f32; N];
    let mut b = 0;
    while b + 4 <= N {
        let r = <V::Half as Lanes>::hsum4([a[b].fold(), a[b + 1].fold(), a[b + 2].fold(), a[b + 3].fold()]);
        sums[b..b + 4].copy_from_slice(&r);
        b += 4;
    }
    for b in b..N {
        sums[b] = a[b].fold().hsum();
    }
    for b in 0..N {
        for t in i..n {
            sums[b] += k[t].to_f32() * *q[b].add(t);
        }
    }
    sums
}

/// [`values_block`] with one 16-lane accumulator per query and 16 columns: the same bits.
///
/// # Safety
/// As [`attention_tile`], whose shape check covers every access here.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // 16 lanes: AVX-512 only
#[inline(always)]
unsafe fn values_block16<V: Lanes16, const N: usize>(tile: &AttnTile<'_>, scores: &[f32], q0: usize, out: &mut [f32]) {
    let (hd, max_ctx) = (tile.head_dim, tile.max_ctx());
    let n_ctx = &tile.n_ctx[q0..q0 + N];
    let all = n_ctx.iter().copied().min().unwrap_or(0);
    let span = n_ctx.iter().copied().max().unwrap_or(0);
    let p: [*const f32; N] = std::array::from_fn(|b| scores.as_ptr().add((q0 + b) * max_ctx));
    let o: [*mut f32; N] = std::array::from_fn(|b| out.as_mut_ptr().add((q0 + b) * hd));
    let pv = tile.v.as_ptr();
    let mut c = 0;
    while c + 16 <= hd {
        let mut acc = [V::zero(); N];
        for j in 0..span {
            let vj = V::load16_f16(pv.add(j * hd + c));
            for b in 0..N {
                if j < all || j < n_ctx[b] {
                    acc[b] = V::add(acc[b], V::mul(V::splat(*p[b].add(j)), vj));
                }
            }
        }
        for b in 0..N {
            acc[b].store16(o[b].add(c));
        }
        c += 16;
    }
    // The last columns (fewer than 16): elementwise `out += p · v`, as `axpy_f16`'s tail.
    for b in 0..N {
        for t in c..hd {
            let mut acc = 0f32;
            for j in 0..n_ctx[b] {
                acc += *p[b].add(j) * (*pv.add(j * hd + t)).to_f32();
            }
            *o[b].add(t) = acc;
        }
    }
}
