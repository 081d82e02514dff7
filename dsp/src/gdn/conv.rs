//! The short causal depthwise convolution in front of the GDN rule (kernel 4 in Qwen3.5),
//! followed by SiLU, in channel-major layout: tokens are rows of channels exactly as the QKV
//! projection's matmul writes them, so nothing is transposed. Follows llama.cpp
//! `ggml_compute_forward_ssm_conv_f32` + `ggml_silu` (and Hugging Face
//! `causal_conv1d_update` / `F.conv1d(..., groups=channels)` with `activation="silu"`).
//!
//! With `K` the kernel length, `x_ext = conv_state ++ x` (the last `K − 1` inputs before this
//! call, then the new rows):
//!
//! ```text
//! out[t][c] = silu( Σ_{j<K} w[c][j] · x_ext[t + j][c] )
//! ```
//!
//! so `w[c][K−1]` multiplies the current token and `w[c][0]` the oldest one.
//!
//! Layouts (row-major f32):
//! - `weight`: `[ch, K]`, `w[c][j]` at `c·K + j`. This is the GGUF `ssm_conv1d.weight` data as
//!   stored (ggml dims `ne = [K, ch]`, `ne[0] = K` fastest) and Hugging Face's
//!   `conv1d.weight [ch, 1, K]` squeezed.
//! - `conv_state`: `[K − 1, ch]`: row `r` is an input row, oldest first (row `K − 2` is the
//!   latest input). Zeros at the start of a sequence.
//! - `x`, `out`: `[n, ch]`.

use std::sync::{Mutex, PoisonError};

use crate::error::DspError;
use crate::ops::silu_inplace;
use crate::ThreadPool;

/// Kernel length from `weight [ch, K]`, and the conv-state length check when given.
fn kernel_len(
    op: &'static str,
    ch: usize,
    weight: &[f32],
    conv_state: Option<&[f32]>,
) -> Result<usize, DspError> {
    if ch == 0 || weight.is_empty() || !weight.len().is_multiple_of(ch) {
        return Err(DspError::InvalidArgument {
            op,
            what: "weight [ch, K]",
            detail: format!(
                "length {} is not a positive multiple of ch = {ch}",
                weight.len()
            ),
        });
    }
    let kernel = weight.len() / ch;
    if let Some(state) = conv_state {
        DspError::check_len(op, "conv_state [K-1, ch]", (kernel - 1) * ch, state.len())?;
    }
    Ok(kernel)
}

/// The taps of a depthwise convolution as rows, `[K, ch]` (tap `j` of every channel
/// contiguous), so the channel loop of [`conv1d_silu_taps`] reads both operands
/// contiguously. Built once from the GGUF layout `[ch, K]` (a model keeps it with its
/// weights: transposing per call cost more than the convolution of one token).
#[derive(Clone, Debug)]
pub struct ConvTaps {
    ch: usize,
    kernel: usize,
    taps: Vec<f32>,
}

impl ConvTaps {
    /// Transposes `weight` `[ch, K]` (module docs).
    ///
    /// # Errors
    /// `InvalidArgument` if `ch == 0` or `weight.len()` is not a positive multiple of `ch`.
    pub fn new(weight: &[f32], ch: usize) -> Result<Self, DspError> {
        let kernel = kernel_len("conv_taps", ch, weight, None)?;
        let mut taps = vec![0f32; kernel * ch];
        for (c, wc) in weight.chunks_exact(kernel).enumerate() {
            for (j, &wj) in wc.iter().enumerate() {
                taps[j * ch + c] = wj;
            }
        }
        Ok(Self { ch, kernel, taps })
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.ch
    }

    /// Kernel length `K`.
    pub fn kernel(&self) -> usize {
        self.kernel
    }

    /// Weights held (`K·ch`).
    pub fn len(&self) -> usize {
        self.taps.len()
    }

    /// Whether there are no weights (never, for a built one).
    pub fn is_empty(&self) -> bool {
        self.taps.is_empty()
    }
}

/// Below this many output elements (`n·ch`) a call runs on the calling thread: waking the
/// pool costs more than the convolution of one token of a small model (a verification pass
/// of the 0.8B shape, 4 × 6144, still splits: measured 1.32 ms inline against about 1.1 ms
/// pooled per pass).
const POOL_MIN_ELEMENTS: usize = 1 << 13;

/// Convolution + SiLU over a batch of `n` tokens (prefill); updates `conv_state` to the last
/// `K − 1` inputs of `conv_state ++ x`.
///
/// Shapes: `x`, `out`: `[n, ch]`; `weight`: `[ch, K]` (GGUF layout, see module docs);
/// `conv_state`: `[K − 1, ch]`, in/out. `K = weight.len() / ch`. Equals `n` calls of
/// [`conv1d_silu_step`] (bit-identical: the same sums in the same order). Transposes the
/// weights on every call: a caller that runs many calls keeps a [`ConvTaps`] and calls
/// [`conv1d_silu_taps`].
///
/// # Errors
/// `InvalidArgument` if `ch == 0` or `weight.len()` is not a positive multiple of `ch`;
/// `LengthMismatch` if `x`, `out` are not `n·ch` or `conv_state` is not `(K − 1)·ch`.
pub fn conv1d_silu<'p>(
    pool: impl Into<Option<&'p ThreadPool>>,
    x: &[f32],
    n: usize,
    ch: usize,
    weight: &[f32],
    conv_state: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    conv1d_silu_taps(pool, x, n, &ConvTaps::new(weight, ch)?, conv_state, out)
}

/// [`conv1d_silu`] with the taps already as rows ([`ConvTaps`]); the same bits.
///
/// With a `pool` (`&ThreadPool` or `Some`) and at least [`POOL_MIN_ELEMENTS`] outputs, the
/// tokens are spread over it (contiguous ranges of output rows, one per thread); otherwise
/// they run on the calling thread. Bit-identical either way: every row is computed by the
/// same loop. The convolution was single-threaded and ~6 % of a Qwen3.5 prefill's wall time
/// on 2 threads.
///
/// # Errors
/// `LengthMismatch` if `x`, `out` are not `n·ch` or `conv_state` is not `(K − 1)·ch`.
pub fn conv1d_silu_taps<'p>(
    pool: impl Into<Option<&'p ThreadPool>>,
    x: &[f32],
    n: usize,
    taps: &ConvTaps,
    conv_state: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    let pool = pool.into().filter(|_| n * taps.ch >= POOL_MIN_ELEMENTS);
    const OP: &str = "conv1d_silu";
    let (ch, kernel) = (taps.ch, taps.kernel);
    DspError::check_len(OP, "conv_state [K-1, ch]", (kernel - 1) * ch, conv_state.len())?;
    DspError::check_len(OP, "x [n, ch]", n * ch, x.len())?;
    DspError::check_len(OP, "out [n, ch]", n * ch, out.len())?;
    let hist = kernel - 1;
    let taps = &taps.taps;
    {
        let state: &[f32] = conv_state;
        // Row r of x_ext = conv_state ++ x.
        let ext = |r: usize| -> &[f32] {
            if r < hist {
                &state[r * ch..][..ch]
            } else {
                &x[(r - hist) * ch..][..ch]
            }
        };
        // Output rows `t0..`, one token at a time.
        let rows = |t0: usize, o_rows: &mut [f32]| {
            for (i, o) in o_rows.chunks_exact_mut(ch).enumerate() {
                o.fill(0.0);
                for (j, tap) in taps.chunks_exact(ch).enumerate() {
                    for ((oc, &xc), &wc) in o.iter_mut().zip(ext(t0 + i + j)).zip(tap) {
                        *oc += wc * xc;
                    }
                }
                silu_inplace(o);
            }
        };
        let tasks = pool.map_or(1, |p| p.n_threads()).min(n).max(1);
        match pool.filter(|_| tasks > 1) {
            Some(pool) => {
                let per = n.div_ceil(tasks);
                let cells: Vec<Mutex<&mut [f32]>> = out.chunks_mut(per * ch).map(Mutex::new).collect();
                pool.run(cells.len(), &|i| {
                    let mut o = cells[i].lock().unwrap_or_else(PoisonError::into_inner);
                    rows(i * per, &mut o);
                });
            }
            None => rows(0, out),
        }
    }
    // New state: the last `hist` rows of x_ext.
    if n >= hist {
        conv_state.copy_from_slice(&x[(n - hist) * ch..]);
    } else {
        conv_state.copy_within(n * ch.., 0);
        conv_state[(hist - n) * ch..].copy_from_slice(x);
    }
    Ok(())
}

/// Convolution + SiLU of one token (decode): a rolling window over `conv_state`, which then
/// drops its oldest row and appends `x`.
///
/// Shapes: `x`, `out`: `[ch]`; `weight`: `[ch, K]`; `conv_state`: `[K − 1, ch]`, in/out.
///
/// # Errors
/// `InvalidArgument` if `x` is empty or `weight.len()` is not a positive multiple of
/// `ch = x.len()`; `LengthMismatch` if `out` is not `ch` or `conv_state` is not `(K − 1)·ch`.
pub fn conv1d_silu_step(
    x: &[f32],
    weight: &[f32],
    conv_state: &mut [f32],
    out: &mut [f32],
) -> Result<(), DspError> {
    const OP: &str = "conv1d_silu_step";
    let ch = x.len();
    let kernel = kernel_len(OP, ch, weight, Some(conv_state))?;
    DspError::check_len(OP, "out [ch]", ch, out.len())?;
    let hist = kernel - 1;
    for (c, o) in out.iter_mut().enumerate() {
        let w = &weight[c * kernel..][..kernel];
        let mut acc = 0.0f32;
        for (j, &wj) in w[..hist].iter().enumerate() {
            acc += wj * conv_state[j * ch + c];
        }
        acc += w[hist] * x[c];
        *o = acc;
    }
    silu_inplace(out);
    if hist > 0 {
        conv_state.copy_within(ch.., 0);
        conv_state[(hist - 1) * ch..].copy_from_slice(x);
    }
    Ok(())
}
