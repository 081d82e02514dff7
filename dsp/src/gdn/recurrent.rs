//! The gated delta rule one token at a time: decode, and the last tokens of a rollback-aware
//! prefill, where the state after each token is kept as a snapshot so a rejected draft can be
//! rolled back. Follows Hugging Face `torch_recurrent_gated_delta_rule`
//! (`modeling_qwen3_next.py`) and llama.cpp `ggml_compute_forward_gated_delta_net`.

use super::heads::{run_heads, split_heads, HeadIo, Inputs};
use super::shape::{GdnInputs, GdnShape};
use crate::error::DspError;
use crate::pool::ThreadPool;

const OP: &str = "gdn_recurrent";

/// Runs the gated delta rule token by token over `n` tokens, updating `state` in place and
/// writing every token's output. Optionally stores the state after each of the last `m`
/// tokens into `snapshots`. With a `pool` (`&ThreadPool` or `Some`), the value heads are
/// spread over it (one task per head); with `None`, all run on the calling thread. Results
/// are bit-identical either way.
///
/// Shapes (layouts in [`super::shape`]; `H = n_v_heads`):
/// - `x` ([`GdnInputs`]): `q`, `k` `[n, n_k_heads·d_k]`, L2-normalised per head by the
///   caller; `v` `[n, H·d_v]`; `gate` (log decay, ≤ 0) and `beta` (post-sigmoid) `[n, H]`.
/// - `state`: `[H, d_k, d_v]`, the state before the first token on entry, after the last on
///   return.
/// - `out`: `[n, H·d_v]`, `o_t = Sᵀq_t / √d_k`.
/// - `snapshots`: `[m, H, d_k, d_v]` with `1 ≤ m ≤ n`; slot `i` receives the state after
///   token `n − m + i` (slot `m − 1` equals the final `state`). `m = n` keeps every token.
///
/// Per token and head: `S ← exp(gate)·S; δ = beta·(v − Sᵀk); S ← S + k⊗δ; o = Sᵀq·scale`
/// (module docs of [`super`]). The state is read twice per token: once to decay it and read
/// `Sᵀk`, once to write `k⊗δ` and read `Sᵀq`.
///
/// # Errors
/// `InvalidArgument` for a bad [`GdnShape`] or snapshots that are not 1..=n whole states;
/// `LengthMismatch` for any buffer whose length does not fit `n = gate.len() / H`.
pub fn gdn_recurrent<'p>(
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
    run_heads(pool.into(), heads, &|h, io| recurrent_head(&inp, h, io));
    Ok(())
}

/// Snapshots must be `m` whole states with `1 ≤ m ≤ n`.
fn check_snapshots(shape: GdnShape, n: usize, snaps: Option<&[f32]>) -> Result<(), DspError> {
    let Some(snaps) = snaps else { return Ok(()) };
    let len = shape.state_len();
    let m = snaps.len() / len;
    if !snaps.len().is_multiple_of(len) || m == 0 || m > n {
        return Err(DspError::InvalidArgument {
            op: OP,
            what: "snapshots",
            detail: format!(
                "length {} is not m·{len} (m·state_len) with 1 ≤ m ≤ n = {n}",
                snaps.len()
            ),
        });
    }
    Ok(())
}

/// All tokens of value head `h`.
fn recurrent_head(inp: &Inputs<'_>, h: usize, io: &mut HeadIo<'_>) {
    let _ftz = super::denormals::FlushDenormals::new();
    let shape = inp.x.shape;
    let kh = shape.k_head_of(h);
    let scale = shape.scale();
    let first_snap = inp.n - io.snaps.len();
    let mut delta = vec![0f32; shape.d_v];
    for t in 0..inp.n {
        step(
            io.state,
            inp.q(t, kh),
            inp.k(t, kh),
            inp.v(t, h),
            inp.gate(t, h).exp(),
            inp.beta(t, h),
            scale,
            &mut delta,
            io.out[t],
        );
        if t >= first_snap {
            io.snaps[t - first_snap].copy_from_slice(io.state);
        }
    }
}

/// One token on one head. `s`: `[d_k, d_v]`; `q`, `k`: `[d_k]`; `v`, `delta` (scratch),
/// `out`: `[d_v]`; `decay = exp(gate)`.
fn step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    delta: &mut [f32],
    out: &mut [f32],
) {
    let d_v = v.len();
    debug_assert_eq!(s.len(), k.len() * d_v);
    // Pass 1: decay, and read the memory for k: delta = Sᵀk (row i of S scaled by k[i]).
    delta.fill(0.0);
    for (row, &ki) in s.chunks_exact_mut(d_v).zip(k) {
        for (sv, d) in row.iter_mut().zip(delta.iter_mut()) {
            *sv *= decay;
            *d += ki * *sv;
        }
    }
    // δ = beta · (v − Sᵀk)
    for (d, &vv) in delta.iter_mut().zip(v) {
        *d = beta * (vv - *d);
    }
    // Pass 2: write k ⊗ δ, and read out = Sᵀq with the updated S.
    out.fill(0.0);
    for ((row, &ki), &qi) in s.chunks_exact_mut(d_v).zip(k).zip(q) {
        for ((sv, &d), o) in row.iter_mut().zip(delta.iter()).zip(out.iter_mut()) {
            *sv += ki * d;
            *o += qi * *sv;
        }
    }
    for o in out.iter_mut() {
        *o *= scale;
    }
}
