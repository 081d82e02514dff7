//! The gated delta rule one token at a time: decode, and the last tokens of a rollback-aware
//! prefill, where the state after each token is kept as a snapshot so a rejected draft can be
//! rolled back. Follows Hugging Face `torch_recurrent_gated_delta_rule`
//! (`modeling_qwen3_next.py`) and llama.cpp `ggml_compute_forward_gated_delta_net`.

use super::heads::{run_heads, split_heads, HeadIo, Inputs};
use super::shape::{GdnInputs, GdnShape};
use crate::error::DspError;
use crate::KernelBackend;
use crate::pool::ThreadPool;

const OP: &str = "gdn_recurrent";

/// Runs the gated delta rule token by token over `n` tokens, updating `state` in place and
/// writing every token's output. Optionally stores the states after the `m` tokens before
/// the last into `snapshots` (the state after the last is `state` itself). With a `pool` (`&ThreadPool` or `Some`), the value heads are
/// spread over it (one task per head); with `None`, all run on the calling thread. Results
/// are bit-identical either way.
///
/// Shapes (layouts in [`super::shape`]; `H = n_v_heads`):
/// - `x` ([`GdnInputs`]): `q`, `k` `[n, n_k_heads·d_k]`, L2-normalised per head by the
///   caller; `v` `[n, H·d_v]`; `gate` (log decay, ≤ 0) and `beta` (post-sigmoid) `[n, H]`.
/// - `state`: `[H, d_k, d_v]`, the state before the first token on entry, after the last on
///   return.
/// - `out`: `[n, H·d_v]`, `o_t = Sᵀq_t / √d_k`.
/// - `snapshots`: `[m, H, d_k, d_v]` with `1 ≤ m < n`; slot `i` receives the state after
///   token `n − 1 − m + i`, so the slots and the final `state` are the states after the last
///   `m + 1` tokens (the final one is not copied: a rollback to the end is no rollback).
///   `m = n − 1` keeps every token.
///
/// Per token and head: `S ← exp(gate)·S; δ = beta·(v − Sᵀk); S ← S + k⊗δ; o = Sᵀq·scale`
/// (module docs of [`super`]), each element's operations in this order and each sum over
/// the rows in increasing order. The state is swept once per token: the write `k⊗δ` and the
/// read `Sᵀq` of token `t`, its snapshot, then the decay and the read `Sᵀk` of token `t + 1`
/// row by row (one more sweep before the first token).
///
/// # Errors
/// `InvalidArgument` for a bad [`GdnShape`] or snapshots that are not 1..n whole states;
/// `LengthMismatch` for any buffer whose length does not fit `n = gate.len() / H`.
pub fn gdn_recurrent<'p>(
    pool: impl Into<Option<&'p ThreadPool>>,
    x: GdnInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    snapshots: Option<&mut [f32]>,
) -> Result<(), DspError> {
    gdn_recurrent_with(crate::backend::select(), pool, x, state, out, snapshots)
}

/// [`gdn_recurrent`] with backend `be`'s build of the head loop
/// ([`KernelBackend::gdn_recurrent_head`]) in place of the installed one's (conformance
/// tests: every build must give the scalar backend's bits).
///
/// # Errors
/// As [`gdn_recurrent`].
pub fn gdn_recurrent_with<'p>(
    be: &dyn KernelBackend,
    pool: impl Into<Option<&'p ThreadPool>>,
    x: GdnInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    snapshots: Option<&mut [f32]>,
) -> Result<(), DspError> {
    let n = x.check_io(OP, state, out)?;
    let shape = x.shape;
    check_snapshots(shape, n, snapshots.as_deref())?;
    let inp = Inputs { n, x };
    let heads = split_heads(shape, state, out, snapshots);
    run_heads(pool.into(), heads, &|h, io| {
        let _ftz = super::denormals::FlushDenormals::new();
        be.gdn_recurrent_head(&mut RecurrentHead { inp: &inp, h, io })
    });
    Ok(())
}

/// Snapshots must be `m` whole states with `1 ≤ m < n`.
fn check_snapshots(shape: GdnShape, n: usize, snaps: Option<&[f32]>) -> Result<(), DspError> {
    let Some(snaps) = snaps else { return Ok(()) };
    let len = shape.state_len();
    let m = snaps.len() / len;
    if !snaps.len().is_multiple_of(len) || m == 0 || m >= n {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "snapshots",
            detail: format!(
                "length {} is not m·{len} (m·state_len) with 1 ≤ m < n = {n}",
                snaps.len()
            ),
        });
    }
    Ok(())
}

/// One value head's share of a per-token GDN call, for
/// [`crate::KernelBackend::gdn_recurrent_head`] (built only inside dsp).
pub struct RecurrentHead<'a, 'b> {
    inp: &'a Inputs<'a>,
    h: usize,
    io: &'a mut HeadIo<'b>,
}

/// The portable build of [`recurrent_head_body`] (the default of
/// [`crate::KernelBackend::gdn_recurrent_head`]).
pub(crate) fn head_portable(head: &mut RecurrentHead<'_, '_>) {
    recurrent_head_body(head)
}

/// [`recurrent_head_body`] compiled with AVX2 (8 lanes). Its loops are element-wise with a
/// separate multiply and add (Rust does not contract them into fused multiply-adds), so it
/// computes exactly as the portable build; only the vector width differs.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn head_avx2(head: &mut RecurrentHead<'_, '_>) {
    recurrent_head_body(head)
}

/// [`recurrent_head_body`] compiled with AVX-512F (16 lanes), the same bits as
/// [`head_portable`] (see [`head_avx2`]).
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn head_avx512(head: &mut RecurrentHead<'_, '_>) {
    recurrent_head_body(head)
}

/// All tokens of one value head (inlined into each build so it is compiled with the caller's
/// target features).
#[inline(always)]
fn recurrent_head_body(head: &mut RecurrentHead<'_, '_>) {
    let RecurrentHead { inp, h, io } = head;
    let (inp, h) = (*inp, *h);
    let shape = inp.x.shape;
    let (n, d_v) = (inp.n, shape.d_v);
    let kh = shape.k_head_of(h);
    let scale = shape.scale();
    // Slots hold the states after tokens `first_snap ..= n − 2`.
    let first_snap = n - 1 - io.snaps.len();
    let s = &mut *io.state;
    // `delta` = Sᵀk of the token about to be written (after its decay), `next` the next
    // token's, accumulated in the same sweep over the rows.
    let (mut delta, mut next) = (vec![0f32; d_v], vec![0f32; d_v]);
    decay_and_read(s, inp.k(0, kh), inp.gate(0, h).exp(), &mut delta);
    for t in 0..n {
        // δ = beta · (v − Sᵀk)
        let beta = inp.beta(t, h);
        for (d, &vv) in delta.iter_mut().zip(inp.v(t, h)) {
            *d = beta * (vv - *d);
        }
        let out = &mut *io.out[t];
        out.fill(0.0);
        let (k, q) = (inp.k(t, kh), inp.q(t, kh));
        let mut snap = (t >= first_snap && t + 1 < n).then(|| &mut *io.snaps[t - first_snap]);
        if t + 1 < n {
            // One sweep: write k ⊗ δ, read out = Sᵀq, keep the snapshot, then decay for token
            // t + 1 and read its Sᵀk.
            next.fill(0.0);
            let (k1, decay1) = (inp.k(t + 1, kh), inp.gate(t + 1, h).exp());
            for (i, row) in s.chunks_exact_mut(d_v).enumerate() {
                update_row(row, k[i], q[i], &delta, out);
                if let Some(snap) = snap.as_deref_mut() {
                    copy_snapshot(&mut snap[i * d_v..][..d_v], row);
                }
                for (sv, nx) in row.iter_mut().zip(next.iter_mut()) {
                    *sv *= decay1;
                    *nx += k1[i] * *sv;
                }
            }
            std::mem::swap(&mut delta, &mut next);
        } else {
            for (i, row) in s.chunks_exact_mut(d_v).enumerate() {
                update_row(row, k[i], q[i], &delta, out);
            }
        }
        for o in out.iter_mut() {
            *o *= scale;
        }
    }
    snapshot_fence();
}

/// Decays the state and reads the memory for `k`: `s ← decay · s`, `delta = Sᵀk` (row `i` of
/// `s` scaled by `k[i]`, rows in increasing order).
#[inline(always)]
fn decay_and_read(s: &mut [f32], k: &[f32], decay: f32, delta: &mut [f32]) {
    delta.fill(0.0);
    for (row, &ki) in s.chunks_exact_mut(delta.len()).zip(k) {
        for (sv, d) in row.iter_mut().zip(delta.iter_mut()) {
            *sv *= decay;
            *d += ki * *sv;
        }
    }
}

/// Row `i` of the write `S ← S + k ⊗ δ` and its term of `out = Sᵀq` (unscaled).
#[inline(always)]
fn update_row(row: &mut [f32], ki: f32, qi: f32, delta: &[f32], out: &mut [f32]) {
    for ((sv, &d), o) in row.iter_mut().zip(delta).zip(out.iter_mut()) {
        *sv += ki * d;
        *o += qi * *sv;
    }
}

/// `dst = src`, exactly. On x86_64 with non-temporal stores (`movntps`, SSE2, 16-byte
/// aligned after a scalar head): a snapshot is written once and read only by a rollback, so
/// its cache lines need not be fetched before they are overwritten, which halves the memory
/// traffic of the copies (3 snapshots of 1 MiB per layer in a 4-token verification pass of
/// the 0.8B shape). [`snapshot_fence`] must follow before the head's task ends.
#[inline(always)]
fn copy_snapshot(dst: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let n = dst.len().min(src.len());
        let head = dst.as_ptr().align_offset(16).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let mut i = head;
        while i + 4 <= n {
            // SAFETY: `i + 4 <= n` elements of both slices; `dst + i` is 16-byte aligned
            // (`head` aligned it, and `i − head` is a multiple of 4 floats). SSE2 is part of
            // x86_64.
            unsafe { _mm_stream_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(src.as_ptr().add(i))) };
            i += 4;
        }
        dst[i..n].copy_from_slice(&src[i..n]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Orders [`copy_snapshot`]'s streaming stores before any later store (the pool's hand-back
/// to the caller), so a rollback on another thread reads them.
#[inline(always)]
fn snapshot_fence() {
    // SAFETY: SSE2 is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

