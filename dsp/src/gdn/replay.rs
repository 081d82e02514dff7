//! Rollback of the per-token gated delta rule by replay: the state after token `j` of a pass
//! logged by [`super::gdn_recurrent`] ([`super::RollbackLog`]) rebuilt from the state before
//! the pass and the logged writes `δ` of tokens `0..=j`. Each element gets exactly the
//! operations the recurrence gave it (`S ← S·exp(gate)`, then `S ← k·δ + S` fused), so the
//! rebuilt state is the recurrence's bit for bit: only the reads `Sᵀk` and `Sᵀq`, which need
//! sums over the rows, are not repeated.

use super::heads::run_heads;
use super::shape::GdnShape;
use crate::error::DspError;
use crate::pool::ThreadPool;
use crate::KernelBackend;

const OP: &str = "gdn_replay";

/// The logged tokens of a pass (layouts of [`super::shape`], `H = n_v_heads`): `k`
/// `[n, n_k_heads·d_k]` (as the pass read it, L2-normalised), `gate` `[n, H]` (log decay),
/// `delta` `[n, H·d_v]` ([`super::RollbackLog::delta`]).
#[derive(Debug, Clone, Copy)]
pub struct ReplayInputs<'a> {
    pub shape: GdnShape,
    pub k: &'a [f32],
    pub gate: &'a [f32],
    pub delta: &'a [f32],
}

impl ReplayInputs<'_> {
    /// Validates the shape and lengths; returns the token count `n = gate.len() / H`.
    pub(crate) fn tokens(&self, op: &'static str) -> Result<usize, DspError> {
        let shape = self.shape;
        shape.validate(op)?;
        let hv = shape.n_v_heads;
        let n = self.gate.len() / hv;
        DspError::check_len(op, "pending gate [n, H]", n * hv, self.gate.len())?;
        DspError::check_len(op, "pending k [n, n_k_heads·d_k]", n * shape.n_k_heads * shape.d_k, self.k.len())?;
        DspError::check_len(op, "pending delta [n, H·d_v]", n * hv * shape.d_v, self.delta.len())?;
        Ok(n)
    }

    /// `k` of token `t`, key head `kh`: `[d_k]`.
    #[inline]
    pub(crate) fn k_at(&self, t: usize, kh: usize) -> &[f32] {
        self.shape.k_row(self.k, t, kh)
    }

    /// Log decay of token `t`, value head `h`.
    #[inline]
    pub(crate) fn gate_at(&self, t: usize, h: usize) -> f32 {
        self.shape.head_entry(self.gate, t, h)
    }

    /// `δ` of token `t`, value head `h`: `[d_v]`.
    #[inline]
    pub(crate) fn delta_at(&self, t: usize, h: usize) -> &[f32] {
        self.shape.v_row(self.delta, t, h)
    }
}

/// Advances `state` (`[H, d_k, d_v]`, the state before the first logged token) over every
/// token of `x`: per token and head `S ← exp(gate)·S; S ← S + k⊗δ` with the logged `δ`, in
/// place, the same bits as [`super::gdn_recurrent`]'s state after those tokens. With a `pool`
/// the value heads are spread over it; bit-identical either way. Cost: one read and write of
/// the state and two operations per element and token (a 0.8B-shape verification pass: 18 MiB).
///
/// # Errors
/// `InvalidArgument` for a bad [`GdnShape`]; `LengthMismatch` when `state`, `k` or `delta`
/// does not fit `n = gate.len() / H`.
pub fn gdn_replay<'p>(pool: impl Into<Option<&'p ThreadPool>>, x: ReplayInputs<'_>, state: &mut [f32]) -> Result<(), DspError> {
    gdn_replay_with(crate::backend::select(), pool, x, state)
}

/// [`gdn_replay`] with backend `be`'s build of the head loop
/// ([`KernelBackend::gdn_replay_head`]) (conformance tests).
///
/// # Errors
/// As [`gdn_replay`].
pub fn gdn_replay_with<'p>(
    be: &dyn KernelBackend,
    pool: impl Into<Option<&'p ThreadPool>>,
    x: ReplayInputs<'_>,
    state: &mut [f32],
) -> Result<(), DspError> {
    let shape = x.shape;
    let n = x.tokens(OP)?;
    DspError::check_len(OP, "state [H, d_k, d_v]", shape.state_len(), state.len())?;
    let heads: Vec<&mut [f32]> = state.chunks_exact_mut(shape.head_state_len()).collect();
    run_heads(pool.into(), heads, &|h, s| {
        let _ftz = super::denormals::FlushDenormals::new();
        be.gdn_replay_head(&mut ReplayHead { x: &x, n, h, state: s })
    });
    Ok(())
}

/// One value head of a [`gdn_replay`] call, for [`KernelBackend::gdn_replay_head`] (built
/// only inside dsp).
pub struct ReplayHead<'a, 'b> {
    x: &'a ReplayInputs<'a>,
    n: usize,
    h: usize,
    state: &'a mut &'b mut [f32],
}

/// The portable build of [`replay_head_body`] (the default of
/// [`KernelBackend::gdn_replay_head`]).
pub(crate) fn head_portable(head: &mut ReplayHead<'_, '_>) {
    replay_head_body(head)
}

/// [`replay_head_body`] compiled with AVX2 and FMA: element-wise with `f32::mul_add`, the
/// portable build's bits.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn head_avx2(head: &mut ReplayHead<'_, '_>) {
    replay_head_body(head)
}

/// [`replay_head_body`] compiled with AVX-512F, the portable build's bits.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn head_avx512(head: &mut ReplayHead<'_, '_>) {
    replay_head_body(head)
}

/// Every logged token on one head, row by row (a row stays in registers or L1 while all
/// tokens are applied to it).
#[inline(always)]
fn replay_head_body(head: &mut ReplayHead<'_, '_>) {
    let ReplayHead { x, n, h, state } = head;
    let (x, n, h) = (*x, *n, *h);
    let kh = x.shape.k_head_of(h);
    let decay: Vec<f32> = (0..n).map(|t| x.gate_at(t, h).exp()).collect();
    for (i, row) in state.chunks_exact_mut(x.shape.d_v).enumerate() {
        for (t, &decay) in decay.iter().enumerate() {
            let (ki, delta) = (x.k_at(t, kh)[i], x.delta_at(t, h));
            for (s, &d) in row.iter_mut().zip(delta) {
                *s = ki.mul_add(d, *s * decay);
            }
        }
    }
}
