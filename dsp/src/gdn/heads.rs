//! Splitting a GDN call into independent value heads: a read-only view of the inputs and,
//! per head, disjoint mutable views of the state, the output rows and the snapshot slots, so
//! the same per-head kernel runs serially or on the [`ThreadPool`] without `unsafe`.

use std::sync::{Mutex, PoisonError};

use super::shape::{GdnInputs, GdnShape};
use crate::pool::ThreadPool;

/// Read-only inputs of one call (layouts in [`super::shape`]).
pub(crate) struct Inputs<'a> {
    pub n: usize,
    pub x: GdnInputs<'a>,
}

impl Inputs<'_> {
    /// `q` of token `t`, key head `kh`: `[d_k]`.
    #[inline]
    pub fn q(&self, t: usize, kh: usize) -> &[f32] {
        let d = self.x.shape.d_k;
        &self.x.q[(t * self.x.shape.n_k_heads + kh) * d..][..d]
    }
    /// `k` of token `t`, key head `kh`: `[d_k]`.
    #[inline]
    pub fn k(&self, t: usize, kh: usize) -> &[f32] {
        let d = self.x.shape.d_k;
        &self.x.k[(t * self.x.shape.n_k_heads + kh) * d..][..d]
    }
    /// `v` of token `t`, value head `h`: `[d_v]`.
    #[inline]
    pub fn v(&self, t: usize, h: usize) -> &[f32] {
        let d = self.x.shape.d_v;
        &self.x.v[(t * self.x.shape.n_v_heads + h) * d..][..d]
    }
    /// Log decay of token `t`, value head `h`.
    #[inline]
    pub fn gate(&self, t: usize, h: usize) -> f32 {
        self.x.gate[t * self.x.shape.n_v_heads + h]
    }
    /// Write strength of token `t`, value head `h`.
    #[inline]
    pub fn beta(&self, t: usize, h: usize) -> f32 {
        self.x.beta[t * self.x.shape.n_v_heads + h]
    }
}

/// The mutable buffers of one value head.
pub(crate) struct HeadIo<'a> {
    /// `S_h`: `[d_k, d_v]`, in/out.
    pub state: &'a mut [f32],
    /// Output rows: `out[t]` is `[d_v]`, one per token.
    pub out: Vec<&'a mut [f32]>,
    /// Snapshot slots `[d_k, d_v]`: slot `i` receives the state after token
    /// `n − 1 − snaps.len() + i` (not the last token's: that is `state`). Empty when no
    /// snapshots were asked for.
    pub snaps: Vec<&'a mut [f32]>,
}

/// Cuts `state [H, d_k, d_v]`, `out [n, H·d_v]` and each snapshot slot `[H, d_k, d_v]` into
/// one [`HeadIo`] per value head.
pub(crate) fn split_heads<'a>(
    shape: GdnShape,
    state: &'a mut [f32],
    out: &'a mut [f32],
    snapshots: &'a mut [&mut [f32]],
) -> Vec<HeadIo<'a>> {
    let h_n = shape.n_v_heads;
    let mut heads: Vec<HeadIo<'a>> = state
        .chunks_exact_mut(shape.head_state_len())
        .map(|state| HeadIo {
            state,
            out: Vec::new(),
            snaps: Vec::new(),
        })
        .collect();
    for (i, row) in out.chunks_exact_mut(shape.d_v).enumerate() {
        heads[i % h_n].out.push(row);
    }
    for slot in snapshots.iter_mut() {
        for (h, part) in slot.chunks_exact_mut(shape.head_state_len()).enumerate() {
            heads[h].snaps.push(part);
        }
    }
    heads
}

/// Runs `kernel(h, io_h)` for every value head: on the calling thread (`pool` `None`) or as
/// one pool task each. Each head's buffers sit behind their own (uncontended) mutex, which
/// only hands the `&mut` to the one task. Every head runs the same code either way, so the
/// results are bit-identical.
pub(crate) fn run_heads(
    pool: Option<&ThreadPool>,
    mut heads: Vec<HeadIo<'_>>,
    kernel: &(dyn Fn(usize, &mut HeadIo<'_>) + Sync),
) {
    let Some(pool) = pool else {
        for (h, io) in heads.iter_mut().enumerate() {
            kernel(h, io);
        }
        return;
    };
    let cells: Vec<Mutex<HeadIo<'_>>> = heads.into_iter().map(Mutex::new).collect();
    pool.run(cells.len(), &|h| {
        let mut io = cells[h].lock().unwrap_or_else(PoisonError::into_inner);
        kernel(h, &mut io);
    });
}
