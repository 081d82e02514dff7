//! Splitting a GDN call into independent value heads: a read-only view of the inputs and,
//! per head, disjoint mutable views of the state, the output rows and the rollback log, so
//! the same per-head kernel runs serially or on the [`ThreadPool`] without `unsafe`.

use std::sync::{Mutex, PoisonError};

use super::shape::{GdnInputs, GdnShape};
use crate::pool::ThreadPool;

/// Read-only inputs of one call (layouts in [`super::shape`]).
pub(crate) struct Inputs<'a> {
    pub n: usize,
    pub x: GdnInputs<'a>,
    /// Tokens of a rollback to replay first, and their count (per-token form only).
    pub pending: Option<(super::replay::ReplayInputs<'a>, usize)>,
}

impl Inputs<'_> {
    /// `q` of token `t`, key head `kh`: `[d_k]`.
    #[inline]
    pub fn q(&self, t: usize, kh: usize) -> &[f32] {
        self.x.shape.k_row(self.x.q, t, kh)
    }
    /// `k` of token `t`, key head `kh`: `[d_k]`.
    #[inline]
    pub fn k(&self, t: usize, kh: usize) -> &[f32] {
        self.x.shape.k_row(self.x.k, t, kh)
    }
    /// `v` of token `t`, value head `h`: `[d_v]`.
    #[inline]
    pub fn v(&self, t: usize, h: usize) -> &[f32] {
        self.x.shape.v_row(self.x.v, t, h)
    }
    /// Log decay of token `t`, value head `h`.
    #[inline]
    pub fn gate(&self, t: usize, h: usize) -> f32 {
        self.x.shape.head_entry(self.x.gate, t, h)
    }
    /// Write strength of token `t`, value head `h`.
    #[inline]
    pub fn beta(&self, t: usize, h: usize) -> f32 {
        self.x.shape.head_entry(self.x.beta, t, h)
    }
}

/// The mutable buffers of one value head.
pub(crate) struct HeadIo<'a> {
    /// `S_h`: `[d_k, d_v]`, in/out.
    pub state: &'a mut [f32],
    /// Output rows: `out[t]` is `[d_v]`, one per token.
    pub out: Vec<&'a mut [f32]>,
    /// A rollback log is kept ([`super::recurrent::RollbackLog`]): `state` is left as the
    /// base, the last token's state is not stored.
    pub logged: bool,
    /// The rollback log's `δ` rows: `delta[t]` is `[d_v]`, one per token (empty without a
    /// log).
    pub delta: Vec<&'a mut [f32]>,
}

/// Cuts `state [H, d_k, d_v]`, `out [n, H·d_v]` and the log's `delta [n, H·d_v]` into one
/// [`HeadIo`] per value head.
pub(crate) fn split_heads<'a>(
    shape: GdnShape,
    state: &'a mut [f32],
    out: &'a mut [f32],
    log: Option<super::recurrent::RollbackLog<'a>>,
) -> Vec<HeadIo<'a>> {
    let h_n = shape.n_v_heads;
    let mut heads: Vec<HeadIo<'a>> = state
        .chunks_exact_mut(shape.head_state_len())
        .map(|state| HeadIo {
            state,
            out: Vec::new(),
            logged: false,
            delta: Vec::new(),
        })
        .collect();
    for (i, row) in out.chunks_exact_mut(shape.d_v).enumerate() {
        heads[i % h_n].out.push(row);
    }
    if let Some(log) = log {
        for head in &mut heads {
            head.logged = true;
        }
        for (i, row) in log.delta.chunks_exact_mut(shape.d_v).enumerate() {
            heads[i % h_n].delta.push(row);
        }
    }
    heads
}

/// Runs `kernel(h, io_h)` for every value head: on the calling thread (`pool` `None`) or as
/// one pool task each. Each head's buffers sit behind their own (uncontended) mutex, which
/// only hands the `&mut` to the one task. Every head runs the same code either way, so the
/// results are bit-identical.
pub(crate) fn run_heads<T: Send>(pool: Option<&ThreadPool>, mut heads: Vec<T>, kernel: &(dyn Fn(usize, &mut T) + Sync)) {
    let Some(pool) = pool else {
        for (h, io) in heads.iter_mut().enumerate() {
            kernel(h, io);
        }
        return;
    };
    let cells: Vec<Mutex<T>> = heads.into_iter().map(Mutex::new).collect();
    pool.run(cells.len(), &|h| {
        let mut io = cells[h].lock().unwrap_or_else(PoisonError::into_inner);
        kernel(h, &mut io);
    });
}
