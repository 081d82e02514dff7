//! The gated delta rule one token at a time: decode, verification, and the last tokens of a
//! rollback-aware prefill, where the state before them is kept and each token's write logged
//! ([`RollbackLog`]) so a rejected draft can be rolled back by a replay ([`super::replay`]).
//! Follows Hugging Face `torch_recurrent_gated_delta_rule`
//! (`modeling_qwen3_next.py`) and llama.cpp `ggml_compute_forward_gated_delta_net`.

use super::heads::{run_heads, split_heads, HeadIo, Inputs};
use super::replay::ReplayInputs;
use super::shape::GdnInputs;
use crate::error::DspError;
use crate::KernelBackend;
use crate::pool::ThreadPool;

const OP: &str = "gdn_recurrent";

/// Where a pass that may be rolled back logs what [`super::gdn_replay`] needs: the input
/// `state` is left as the base (the state before the first token; after a `pending` replay,
/// which the pass stores back into it) and every token's write `δ` goes to `delta`. The state
/// after token `j` is the base with tokens `0..=j` replayed (element-wise, exact), the state
/// after the last token included: the pass writes no state of its own, so a rollback
/// anywhere in it, or none, is a replay of a prefix of the log (Tandem §3.3's rollback
/// states, without a copy of the state per token or for the pass's end).
pub struct RollbackLog<'a> {
    /// `[n, H·d_v]`: receives `δ_t = beta_t·(v_t − S_{t−1}ᵀk_t)` (after the decay) of every
    /// token, the write `k_t⊗δ_t` that [`super::gdn_replay`] adds.
    pub delta: &'a mut [f32],
}

/// Runs the gated delta rule token by token over `n` tokens, updating `state` in place and
/// writing every token's output; with a [`RollbackLog`], `state` is left as the state before
/// the first token and only the tokens' `δ` are written (the state after them is the base
/// with all of them replayed, [`super::gdn_replay`]). With
/// `pending` tokens (a rollback not yet replayed, [`super::gdn_replay`]'s inputs), `state`
/// is first advanced by them, fused into the first sweep (the same bits as a separate
/// [`super::gdn_replay`]; with a log, the advanced state is stored back into `state` as the
/// base). With a
/// `pool` (`&ThreadPool` or `Some`), the value heads are
/// spread over it (one task per head); with `None`, all run on the calling thread. Results
/// are bit-identical either way.
///
/// Shapes (layouts in [`super::shape`]; `H = n_v_heads`):
/// - `x` ([`GdnInputs`]): `q`, `k` `[n, n_k_heads·d_k]`, L2-normalised per head by the
///   caller; `v` `[n, H·d_v]`; `gate` (log decay, ≤ 0) and `beta` (post-sigmoid) `[n, H]`.
/// - `state`: `[H, d_k, d_v]`, the state before the first token on entry; on return the state
///   after the last (without a log) or the base (with one).
/// - `out`: `[n, H·d_v]`, `o_t = Sᵀq_t / √d_k`.
/// - `pending`: tokens to replay onto `state` first, of the same shape (more than
///   [`MAX_FUSED_PENDING`] are replayed by a separate sweep).
/// - `log`: see [`RollbackLog`].
///
/// Per token and head: `S ← exp(gate)·S; δ = beta·(v − Sᵀk); S ← S + k⊗δ; o = Sᵀq·scale`
/// (module docs of [`super`]), each element's operations in this order, `k⊗δ` added and
/// each sum over the rows (in increasing order) accumulated with fused multiply-adds
/// (`f32::mul_add`, one rounding: the same bits in every build). The state is swept once per
/// token: the write `k⊗δ` and the read `Sᵀq` of token `t`, then the decay and the read `Sᵀk`
/// of token `t + 1` row by row (one more sweep before the first token). With a log the last
/// token's sweep only reads (`Sᵀq` of the written rows, which are not stored), so a logged
/// pass moves no more state than a decode pass: one read, plus one write when a pending
/// replay changes the base.
///
/// # Errors
/// `InvalidArgument` for a bad [`super::GdnShape`] or `pending` of another shape;
/// `LengthMismatch` for any buffer whose length does not fit `n = gate.len() / H`.
pub fn gdn_recurrent<'p>(
    pool: impl Into<Option<&'p ThreadPool>>,
    x: GdnInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
    pending: Option<ReplayInputs<'_>>,
    log: Option<RollbackLog<'_>>,
) -> Result<(), DspError> {
    gdn_recurrent_with(crate::backend::select(), pool, x, state, out, pending, log)
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
    pending: Option<ReplayInputs<'_>>,
    log: Option<RollbackLog<'_>>,
) -> Result<(), DspError> {
    let n = x.check_io(OP, state, out)?;
    let shape = x.shape;
    if let Some(log) = &log {
        DspError::check_len(OP, "log.delta [n, H·d_v]", n * shape.n_v_heads * shape.d_v, log.delta.len())?;
    }
    let pool = pool.into();
    let pending = match pending {
        Some(p) if p.shape != shape => {
            return Err(DspError::InvalidArgument {
                op: OP,
                what: "pending",
                detail: format!("replay of shape {:?} for inputs of shape {shape:?}", p.shape),
            })
        }
        Some(p) if p.tokens(OP)? > MAX_FUSED_PENDING => {
            super::replay::gdn_replay_with(be, pool, p, state)?;
            None
        }
        Some(p) => Some((p, p.tokens(OP)?)).filter(|&(_, np)| np > 0),
        None => None,
    };
    let inp = Inputs { n, x, pending };
    let heads = split_heads(shape, state, out, log);
    run_heads(pool.into(), heads, &|h, io| {
        let _ftz = super::denormals::FlushDenormals::new();
        be.gdn_recurrent_head(&mut RecurrentHead { inp: &inp, h, io })
    });
    Ok(())
}

/// Pending tokens up to which [`gdn_recurrent`] fuses their replay into its first sweep (a
/// rollback replays at most `n_draft + 1`).
pub const MAX_FUSED_PENDING: usize = 16;

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

/// [`recurrent_head_body`] compiled with AVX2 and FMA (8 lanes). Its loops are element-wise
/// and its fused multiply-adds are `f32::mul_add` (one rounding, as the portable build's),
/// so it computes exactly as the portable build; only the vector width differs.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn head_avx2(head: &mut RecurrentHead<'_, '_>) {
    recurrent_head_body(head)
}

/// [`recurrent_head_body`] compiled with AVX-512F (16 lanes), the same bits as
/// [`head_portable`] (see [`head_avx2`]).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn head_avx512(head: &mut RecurrentHead<'_, '_>) {
    recurrent_head_body(head)
}

thread_local! {
    /// The column-block scratch of [`recurrent_head_body`] (`d_k × 128` floats, 64 KiB on
    /// the 0.8B shape), taken out and put back by each call.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// All tokens of one value head (inlined into each build so it is compiled with the caller's
/// target features), in blocks of columns: the recurrence is independent per column (a
/// column's `δ`, write and reads use only that column and the shared `k`, `q`), so each block
/// is copied out once into a contiguous scratch that every token sweeps in cache, with its
/// accumulators in registers (fixed widths: 128 (a whole row of the 0.8B shape), then 32,
/// then 1), and stored back by the last sweep.
#[inline(always)]
fn recurrent_head_body(head: &mut RecurrentHead<'_, '_>) {
    let RecurrentHead { inp, h, io } = head;
    let (inp, h) = (*inp, *h);
    let (d_k, d_v) = (inp.x.shape.d_k, inp.x.shape.d_v);
    // One scratch per thread, kept across calls: every block is written by its first sweep
    // before it is read, so it needs no zeroing.
    let mut scratch = SCRATCH.take();
    if scratch.len() < d_k * 128 {
        scratch.resize(d_k * 128, 0.0);
    }
    let mut j0 = 0;
    while j0 + 128 <= d_v {
        column_block::<128>(inp, h, j0, io, scratch[..d_k * 128].as_chunks_mut().0);
        j0 += 128;
    }
    while j0 + 32 <= d_v {
        column_block::<32>(inp, h, j0, io, scratch[..d_k * 32].as_chunks_mut().0);
        j0 += 32;
    }
    while j0 < d_v {
        column_block::<1>(inp, h, j0, io, scratch[..d_k].as_chunks_mut().0);
        j0 += 1;
    }
    SCRATCH.set(scratch);
}

/// Every token of columns `j0 .. j0 + W` of one head: `blk` (`[d_k][W]`) ← the decayed
/// columns of the state, then one sweep of `blk` per token (the write `k⊗δ` and the read
/// `Sᵀq` of token `t`, then the decay and the read `Sᵀk` of token `t + 1`), the last one
/// storing `blk` back into the state (without a log) or only reading it (with one).
#[inline(always)]
fn column_block<const W: usize>(inp: &Inputs<'_>, h: usize, j0: usize, io: &mut HeadIo<'_>, blk: &mut [[f32; W]]) {
    let shape = inp.x.shape;
    let (n, d_v) = (inp.n, shape.d_v);
    let kh = shape.k_head_of(h);
    let at = |i: usize| i * d_v + j0..i * d_v + j0 + W;
    // `delta` = Sᵀk of the token about to be written (after its decay), accumulated in the
    // sweep that decays the state for it.
    let mut delta = [0f32; W];
    let (k, decay) = (inp.k(0, kh), inp.gate(0, h).exp());
    match inp.pending {
        None => {
            for (i, row) in blk.iter_mut().enumerate() {
                let x = &io.state[at(i)];
                for c in 0..W {
                    row[c] = x[c] * decay;
                    delta[c] = k[i].mul_add(row[c], delta[c]);
                }
            }
        }
        Some((p, np)) => {
            // The replay's operations per element (`gdn_replay`), then the first decay.
            let mut p_decay = [0f32; MAX_FUSED_PENDING];
            for (t, d) in p_decay.iter_mut().enumerate().take(np) {
                *d = p.gate_at(t, h).exp();
            }
            let keep_base = io.logged;
            for (i, row) in blk.iter_mut().enumerate() {
                row.copy_from_slice(&io.state[at(i)]);
                for (t, &pd) in p_decay[..np].iter().enumerate() {
                    let (pk, pdelta) = (p.k_at(t, kh)[i], &p.delta_at(t, h)[j0..j0 + W]);
                    for c in 0..W {
                        row[c] = pk.mul_add(pdelta[c], row[c] * pd);
                    }
                }
                if keep_base {
                    io.state[at(i)].copy_from_slice(row);
                }
                for c in 0..W {
                    row[c] *= decay;
                    delta[c] = k[i].mul_add(row[c], delta[c]);
                }
            }
        }
    }
    for t in 0..n {
        // δ = beta · (v − Sᵀk)
        let (beta, v) = (inp.beta(t, h), &inp.v(t, h)[j0..j0 + W]);
        for c in 0..W {
            delta[c] = beta * (v[c] - delta[c]);
        }
        if let Some(logged) = io.delta.get_mut(t) {
            logged[j0..j0 + W].copy_from_slice(&delta);
        }
        let mut out = [0f32; W];
        let (k, q) = (inp.k(t, kh), inp.q(t, kh));
        if t + 1 < n {
            let mut next = [0f32; W];
            let (k1, decay1) = (inp.k(t + 1, kh), inp.gate(t + 1, h).exp());
            for (i, row) in blk.iter_mut().enumerate() {
                update_row(row, k[i], q[i], &delta, &mut out);
                for c in 0..W {
                    row[c] *= decay1;
                    next[c] = k1[i].mul_add(row[c], next[c]);
                }
            }
            delta = next;
        } else if io.logged {
            // The final state is the base with the log replayed: only its read `Sᵀq`.
            for (i, row) in blk.iter().enumerate() {
                let (ki, qi) = (k[i], q[i]);
                for c in 0..W {
                    out[c] = qi.mul_add(ki.mul_add(delta[c], row[c]), out[c]);
                }
            }
        } else {
            for (i, row) in blk.iter_mut().enumerate() {
                update_row(row, k[i], q[i], &delta, &mut out);
                io.state[at(i)].copy_from_slice(row);
            }
        }
        let o = &mut io.out[t][j0..j0 + W];
        for c in 0..W {
            o[c] = out[c] * shape.scale();
        }
    }
}

/// Row `i` of the write `S ← S + k ⊗ δ` and its term of `out = Sᵀq` (unscaled).
#[inline(always)]
fn update_row<const W: usize>(row: &mut [f32; W], ki: f32, qi: f32, delta: &[f32; W], out: &mut [f32; W]) {
    for c in 0..W {
        row[c] = ki.mul_add(delta[c], row[c]);
        out[c] = qi.mul_add(row[c], out[c]);
    }
}
