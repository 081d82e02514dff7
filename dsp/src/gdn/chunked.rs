//! The gated delta rule over chunks of tokens for prefill: per chunk, the recurrence is
//! unrolled into matrix products and one unit-lower-triangular solve (the WY / UT transform of
//! Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
//! Length", §3; as in Hugging Face `torch_chunk_gated_delta_rule`, `modeling_qwen3_next.py`).
//! Produces every token's output and the final state only.
//!
//! Derivation, per value head, for a chunk of `c` tokens with entry state `S₀`, cumulative
//! log decay `G_t = Σ_{s≤t} gate_s` (within the chunk) and `δ_t` the delta of token `t`:
//!
//! ```text
//! S_t = e^{G_t} S₀ + Σ_{s≤t} e^{G_t−G_s} k_s δ_sᵀ
//! δ_t = β_t (v_t − e^{G_t} S₀ᵀk_t) − Σ_{s<t} β_t e^{G_t−G_s} (k_t·k_s) δ_s      (1)
//! o_t = scale · (e^{G_t} S₀ᵀq_t + Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) δ_s)
//! S_c = e^{G_{c−1}} S₀ + Σ_s e^{G_{c−1}−G_s} k_s δ_sᵀ
//! ```
//!
//! (1) is `(I + A) Δ = B` with `A` strictly lower triangular. Hugging Face inverts `I + A`
//! explicitly (`attn`, then `value = attn @ v_beta`, `k_cumdecay = attn @ k_beta·e^G`), which
//! suits a GPU; on a CPU we solve it by forward substitution, which is the same linear algebra
//! at `c²·d_v/2` instead of `c³` operations. Every exponent is `≤ 0`, so nothing overflows.

use super::heads::{run_heads, split_heads, HeadIo, Inputs};
use super::shape::{GdnInputs, GdnShape};
use super::tile::gemm_acc_portable;
use crate::error::DspError;
use crate::pool::ThreadPool;

const OP: &str = "gdn_chunked";

/// The chunk length of Hugging Face `torch_chunk_gated_delta_rule` (and the fla kernels).
pub const DEFAULT_CHUNK: usize = 64;

/// Runs the gated delta rule over `n` tokens in chunks of `chunk` tokens (the last chunk may
/// be shorter), updating `state` in place and writing every token's output. Equals
/// [`super::gdn_recurrent`] up to rounding (see the tolerance in `dsp/tests/gdn.rs`). With a
/// `pool` (`&ThreadPool` or `Some`), the value heads are spread over it (one task per head);
/// with `None`, all run on the calling thread. Results are bit-identical either way.
///
/// Shapes and layouts as [`super::gdn_recurrent`] (without a log or pending tokens): `x.q`,
/// `x.k` `[n, n_k_heads·d_k]`; `x.v`, `out` `[n, n_v_heads·d_v]`; `x.gate`, `x.beta`
/// `[n, n_v_heads]`; `state` `[n_v_heads, d_k, d_v]` in/out. A rollback-aware prefill runs the
/// head of its batch here and the logged tail through [`super::gdn_recurrent`].
///
/// Scratch per head: `chunk·(1 + 4·d_k + 2·d_v + 3·chunk)` floats.
///
/// # Errors
/// `InvalidArgument` for a bad [`GdnShape`] or `chunk == 0`; `LengthMismatch` for any buffer
/// whose length does not fit `n = gate.len() / n_v_heads`.
pub fn gdn_chunked<'p>(
    pool: impl Into<Option<&'p ThreadPool>>,
    x: GdnInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    chunk: usize,
) -> Result<(), DspError> {
    let n = x.check_io(OP, state, out)?;
    let shape = x.shape;
    if chunk == 0 {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "chunk",
            detail: "chunk length must be at least 1".to_string(),
        });
    }
    let inp = Inputs { n, x, pending: None };
    let heads = split_heads(shape, state, out, None);
    run_heads(pool.into(), heads, &|h, io| chunked_head(&inp, h, io, chunk));
    Ok(())
}

/// Per-head scratch for chunks of up to `chunk` tokens.
struct Scratch {
    /// `G_t`: `[chunk]`.
    cum: Vec<f32>,
    /// The chunk's keys then queries, `[2·chunk, d_k]` (`c` key rows, then `c` query rows).
    kq: Vec<f32>,
    /// `Δ` then the output rows, `[2·chunk, d_v]` (`c` rows each).
    dout: Vec<f32>,
    /// Masked decays `e^{G_t−G_s}` (`s ≤ t`), then the intra-chunk scores
    /// `e^{G_t−G_s} (q_t·k_s)`: `[chunk, chunk]`.
    scores: Vec<f32>,
    /// Decayed keys transposed, `k_s[i]·e^{G_last−G_s}` at `[i, s]`: `[d_k, chunk]`.
    kwt: Vec<f32>,
    /// The chunk's keys transposed, `k_s[i]` at `[i, s]`: `[d_k, chunk]`.
    kt: Vec<f32>,
    /// Gram products `[K; Q] · Kᵀ`: `k_t·k_s` at `[t, s]`, then `q_t·k_s` at `[c + t, s]`:
    /// `[2·chunk, chunk]`.
    gram: Vec<f32>,
}

/// One value head's share of a chunked GDN call, for [`crate::KernelBackend::gdn_chunked_head`]
/// (built only inside dsp).
pub struct ChunkedHead<'a, 'b> {
    inp: &'a Inputs<'a>,
    h: usize,
    io: &'a mut HeadIo<'b>,
    chunk: usize,
}

/// All chunks of value head `h` with the installed backend's build of the chunk kernels, with
/// denormals flushed.
fn chunked_head(inp: &Inputs<'_>, h: usize, io: &mut HeadIo<'_>, chunk: usize) {
    let _ftz = super::denormals::FlushDenormals::new();
    crate::backend::select().gdn_chunked_head(&mut ChunkedHead { inp, h, io, chunk })
}

/// The portable build of the chunk kernels (the default of
/// [`crate::KernelBackend::gdn_chunked_head`]).
pub(crate) fn head_portable(head: &mut ChunkedHead<'_, '_>) {
    chunked_head_body(head, gemm_acc_portable)
}

/// [`chunked_head_body`] compiled with AVX2+FMA, its products by
/// [`super::tile::gemm_acc_avx2`]. The body's own loops use no fused multiply-adds and are
/// element-wise, so they compute exactly as the portable build (only the vector width
/// differs).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn head_avx2(head: &mut ChunkedHead<'_, '_>) {
    chunked_head_body(head, |y, a, x, m, p, nn| {
        // SAFETY: this function's own contract (AVX2 and FMA).
        unsafe { super::tile::gemm_acc_avx2(y, a, x, m, p, nn) }
    })
}

/// [`chunked_head_body`] with fused products ([`super::tile::gemm_acc_fused`]): the NEON
/// backends' build, equal to [`head_avx2`]'s arithmetic (the body's own loops are
/// element-wise and unfused in both).
#[cfg(target_arch = "aarch64")]
pub(crate) fn head_fused(head: &mut ChunkedHead<'_, '_>) {
    chunked_head_body(head, super::tile::gemm_acc_fused)
}

/// All chunks of value head `h` (inlined into each caller so it is compiled with the caller's
/// target features).
#[inline(always)]
fn chunked_head_body(
    head: &mut ChunkedHead<'_, '_>,
    gemm: impl Fn(&mut [f32], &[f32], &[f32], usize, usize, usize) + Copy,
) {
    let inp = head.inp;
    let chunk = head.chunk.min(inp.n.max(1));
    let GdnShape { d_k, d_v, .. } = inp.x.shape;
    let mut sc = Scratch {
        cum: vec![0f32; chunk],
        kq: vec![0f32; 2 * chunk * d_k],
        dout: vec![0f32; 2 * chunk * d_v],
        scores: vec![0f32; chunk * chunk],
        kwt: vec![0f32; d_k * chunk],
        kt: vec![0f32; d_k * chunk],
        gram: vec![0f32; 2 * chunk * chunk],
    };
    let mut t0 = 0;
    while t0 < inp.n {
        let c = chunk.min(inp.n - t0);
        chunk_step(head, t0, c, &mut sc, gemm);
        t0 += c;
    }
}

/// Tokens `t0..t0+c` of the value head of `head`.
#[inline(always)]
fn chunk_step(
    head: &mut ChunkedHead<'_, '_>,
    t0: usize,
    c: usize,
    sc: &mut Scratch,
    gemm: impl Fn(&mut [f32], &[f32], &[f32], usize, usize, usize),
) {
    let (inp, h, io) = (head.inp, head.h, &mut *head.io);
    let GdnShape { d_k, d_v, .. } = inp.x.shape;
    let kh = inp.x.shape.k_head_of(h);
    let s = &mut *io.state;
    debug_assert_eq!(s.len(), d_k * d_v);

    // G_t: cumulative log decay inside the chunk.
    let cum = &mut sc.cum[..c];
    let mut acc = 0.0f32;
    for (t, g) in cum.iter_mut().enumerate() {
        acc += inp.gate(t0 + t, h);
        *g = acc;
    }

    // Gather K and Q of the chunk: [2c, d_k].
    let kq = &mut sc.kq[..2 * c * d_k];
    for t in 0..c {
        kq[t * d_k..][..d_k].copy_from_slice(inp.k(t0 + t, kh));
        kq[(c + t) * d_k..][..d_k].copy_from_slice(inp.q(t0 + t, kh));
    }
    let kc = &kq[..c * d_k];
    // Every k_t·k_s and q_t·k_s of the chunk in one product: [K; Q] · Kᵀ.
    let kt = &mut sc.kt[..d_k * c];
    for s_ in 0..c {
        for (i, &ki) in kc[s_ * d_k..][..d_k].iter().enumerate() {
            kt[i * c + s_] = ki;
        }
    }
    let gram = &mut sc.gram[..2 * c * c];
    gram.fill(0.0);
    gemm(gram, kq, kt, 2 * c, d_k, c);
    let (kk, qk) = gram.split_at(c * c);

    // Inter-chunk terms, one product with the entry state: [K; Q] · S₀ = [S₀ᵀk_t; S₀ᵀq_t].
    let dout = &mut sc.dout[..2 * c * d_v];
    dout.fill(0.0);
    gemm(dout, kq, s, 2 * c, d_k, d_v);
    let (delta, out) = dout.split_at_mut(c * d_v);
    // B_t = β_t (v_t − e^{G_t} S₀ᵀk_t) into Δ; e^{G_t} S₀ᵀq_t into the output.
    for t in 0..c {
        let (e, b) = (cum[t].exp(), inp.beta(t0 + t, h));
        for (dj, &vj) in delta[t * d_v..][..d_v].iter_mut().zip(inp.v(t0 + t, h)) {
            *dj = b * (vj - e * *dj);
        }
        for oj in &mut out[t * d_v..][..d_v] {
            *oj *= e;
        }
    }

    // Decays e^{G_t−G_s} for s ≤ t (0 above the diagonal), shared by A and M below.
    let scores = &mut sc.scores[..c * c];
    for t in 0..c {
        for s_ in 0..c {
            scores[t * c + s_] = if s_ <= t {
                (cum[t] - cum[s_]).exp()
            } else {
                0.0
            };
        }
    }

    // (I + A) Δ = B by forward substitution, A[t][s] = β_t e^{G_t−G_s} (k_t·k_s), s < t.
    for t in 1..c {
        let b = inp.beta(t0 + t, h);
        let (prev, rest) = delta.split_at_mut(t * d_v);
        let d_t = &mut rest[..d_v];
        for s_ in 0..t {
            let a = b * scores[t * c + s_] * kk[t * c + s_];
            axpy(d_t, -a, &prev[s_ * d_v..][..d_v]);
        }
    }

    // Intra-chunk output: O += M Δ with M[t][s] = e^{G_t−G_s} (q_t·k_s) for s ≤ t, else 0.
    for t in 0..c {
        for s_ in 0..=t {
            scores[t * c + s_] *= qk[t * c + s_];
        }
    }
    gemm(out, scores, delta, c, c, d_v);
    let scale = inp.x.shape.scale();
    for t in 0..c {
        for (dst, &o) in io.out[t0 + t].iter_mut().zip(&out[t * d_v..][..d_v]) {
            *dst = o * scale;
        }
    }

    // Exit state: S = e^{G_last} S₀ + Σ_s (k_s e^{G_last−G_s}) ⊗ δ_s = e^{G_last} S₀ + Kwᵀ Δ.
    let last = cum[c - 1];
    let e_last = last.exp();
    for sv in s.iter_mut() {
        *sv *= e_last;
    }
    let kwt = &mut sc.kwt[..d_k * c];
    for s_ in 0..c {
        let w = (last - cum[s_]).exp();
        for (i, &ki) in kc[s_ * d_k..][..d_k].iter().enumerate() {
            kwt[i * c + s_] = ki * w;
        }
    }
    gemm(s, kwt, delta, d_k, c, d_v);
}

/// `y += a · x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}
