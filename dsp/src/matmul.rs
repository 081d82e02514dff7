//! Matrix products of GGUF weights with f32 activations, with ggml's CPU numerics: the
//! activations are first converted to the weight type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, f16,
//! bf16 or f32), then every output is one row-by-row dot product of the backend
//! (`ggml_compute_forward_mul_mat` in `ggml/src/ggml-cpu/ggml-cpu.c`).
//!
//! Decode (`n == 1`) splits weight rows over the pool; prefill (`n > 1`) quantizes all `n`
//! token rows once, then each task takes a chunk of weight rows and runs the backend's tile
//! kernel over blocks of [`TOKEN_BLOCK`] tokens, so a weight row is read once per token block
//! and each unpacked weight block is applied to several tokens in registers. Results do not
//! depend on `n`, the thread count or the tiling: `matmul` of `n` tokens is bit-identical to
//! `n` separate matrix-vector products.

use std::sync::Mutex;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::backend::{select, DotTile, KernelBackend};
use crate::error::DspError;
use crate::pool::ThreadPool;
use crate::quant::blocks::{as_blocks_mut, block_align};
use crate::quant::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k, GgmlType};

/// Tokens per tile sweep in prefill: activations of one block stay in L2 while a task walks
/// its weight rows.
pub const TOKEN_BLOCK: usize = 64;

/// Multiply-accumulates below which a product runs on the calling thread alone (≈ 10 µs of
/// work: waking the pool costs a few µs; e.g. the 16 × 1024 GDN gate projections of a
/// 4-column verification pass stay on one thread).
const SERIAL_MACS: usize = 1 << 18;

/// Weights of a linear layer in GGUF order: `rows` output features, each a row of `cols` input
/// features stored as `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct QMatRef<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatRef<'a> {
    /// Checks and wraps raw weight bytes.
    ///
    /// # Errors
    /// `UnsupportedType` for activation-only types (Q8_1, Q8_K), `NotBlockMultiple` if `cols`
    /// is not a whole number of blocks, `LengthMismatch` unless
    /// `data.len() == rows * ty.row_bytes(cols)`, `Misaligned` if `data` is not aligned for
    /// its block struct (2 bytes; 4 for f32); GGUF tensor data is 32-byte aligned.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, DspError> {
        let m = QMatRef {
            ty,
            rows,
            cols,
            data,
        };
        m.validate()?;
        Ok(m)
    }

    /// An f32 matrix held in memory (`data`: `[rows, cols]` row-major), e.g. a weight built at
    /// load time from several tensors.
    ///
    /// # Errors
    /// `LengthMismatch` unless `data.len() == rows * cols`.
    pub fn from_f32(rows: usize, cols: usize, data: &'a [f32]) -> Result<Self, DspError> {
        DspError::check_len("QMatRef::from_f32", "data", rows * cols, data.len())?;
        // SAFETY: an f32 slice is a valid byte slice of 4× the length, 4-byte aligned (what
        // f32 weight rows need); the borrow keeps `data` alive and unchanged.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        Self::new(GgmlType::F32, rows, cols, bytes)
    }

    fn validate(&self) -> Result<(), DspError> {
        const OP: &str = "QMatRef";
        if !self.ty.is_weight_type() {
            return Err(DspError::UnsupportedType {
                op: OP,
                actual: self.ty,
                expected: "f32, f16, bf16, q4_0, q4_1, q8_0, q4_K, q6_K",
            });
        }
        let rb = self
            .ty
            .row_bytes(self.cols)
            .ok_or(DspError::NotBlockMultiple {
                op: OP,
                ty: self.ty,
                n: self.cols,
                block: self.ty.block_size(),
            })?;
        DspError::check_len(OP, "weight bytes", self.rows * rb, self.data.len())?;
        let align = block_align(self.ty);
        if !(self.data.as_ptr() as usize).is_multiple_of(align) {
            return Err(DspError::Misaligned {
                op: OP,
                ty: self.ty,
                addr: self.data.as_ptr() as usize,
                align,
            });
        }
        Ok(())
    }

    /// Bytes per weight row.
    pub fn row_bytes(&self) -> usize {
        self.data.len().checked_div(self.rows).unwrap_or(0)
    }

    /// Raw bytes of weight row `r` (panics if `r >= rows`).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// `n` activation rows converted to a weight type's `vec_dot_type`, stored 4-byte aligned.
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    pub ty: GgmlType,
    pub n: usize,
    pub row_bytes: usize,
    buf: Vec<u32>,
}

impl QuantizedActs {
    /// All rows' bytes (`n * row_bytes`).
    pub fn bytes(&self) -> &[u8] {
        let len = self.n * self.row_bytes;
        // SAFETY: `buf` holds at least `len` initialised bytes (sized in `new`); u8 has
        // alignment 1 and the lifetime is tied to `self`.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.n * self.row_bytes;
        // SAFETY: as in `bytes`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// Converts `x` (`[n, cols]` row-major f32) row by row to `ty` (an activation type: Q8_0,
/// Q8_1, Q8_K, F16, BF16 or F32) with ggml's reference quantizers, rows spread over `pool`.
///
/// # Errors
/// `LengthMismatch` if `x.len() != n * cols`, `NotBlockMultiple` if `cols` is not a whole
/// number of `ty` blocks, `UnsupportedType` for weight-only types.
pub fn quantize_activations(
    pool: &ThreadPool,
    ty: GgmlType,
    x: &[f32],
    n: usize,
    cols: usize,
) -> Result<QuantizedActs, DspError> {
    const OP: &str = "quantize_activations";
    DspError::check_len(OP, "x", n * cols, x.len())?;
    if ty != ty.vec_dot_type() {
        return Err(DspError::UnsupportedType {
            op: OP,
            actual: ty,
            expected: "q8_0, q8_1, q8_K, f16, bf16, f32",
        });
    }
    let row_bytes = ty.row_bytes(cols).ok_or(DspError::NotBlockMultiple {
        op: OP,
        ty,
        n: cols,
        block: ty.block_size(),
    })?;
    let mut acts = QuantizedActs {
        ty,
        n,
        row_bytes,
        buf: vec![0u32; (n * row_bytes).div_ceil(4)],
    };
    if n == 0 || cols == 0 {
        return Ok(acts);
    }
    let rows_per_task = n.div_ceil(pool.n_threads()).max(1);
    let jobs: Vec<Mutex<(&[f32], &mut [u8])>> = x
        .chunks(rows_per_task * cols)
        .zip(acts.bytes_mut().chunks_mut(rows_per_task * row_bytes))
        .map(Mutex::new)
        .collect();
    let first_err: Mutex<Option<DspError>> = Mutex::new(None);
    pool.run(jobs.len(), &|i| {
        let mut guard = jobs[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (xs, out) = &mut *guard;
        for (xr, or) in xs.chunks_exact(cols).zip(out.chunks_exact_mut(row_bytes)) {
            if let Err(e) = quantize_row(ty, xr, or) {
                first_err
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert(e);
                return;
            }
        }
    });
    drop(jobs);
    match first_err
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        Some(e) => Err(e),
        None => Ok(acts),
    }
}

fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), DspError> {
    match ty {
        GgmlType::Q8_0 => quantize_row_q8_0(x, as_blocks_mut(out)?),
        GgmlType::Q8_1 => quantize_row_q8_1(x, as_blocks_mut(out)?),
        GgmlType::Q8_K => quantize_row_q8_k(x, as_blocks_mut(out)?),
        // `half`'s slice conversions: F16C / fp16 vector instructions where the CPU has them,
        // rounding to nearest-even as `f16::from_f32` (exactly).
        GgmlType::F16 => {
            as_blocks_mut::<f16>(out)?.convert_from_f32_slice(x);
            Ok(())
        }
        GgmlType::BF16 => {
            as_blocks_mut::<bf16>(out)?.convert_from_f32_slice(x);
            Ok(())
        }
        GgmlType::F32 => {
            as_blocks_mut::<f32>(out)?.copy_from_slice(x);
            Ok(())
        }
        other => Err(DspError::UnsupportedType {
            op: "quantize_activations",
            actual: other,
            expected: "q8_0, q8_1, q8_K, f16, bf16, f32",
        }),
    }
}

/// `y[t*rows + r] = sum_c W[r][c] * x[t*cols + c]` for `t in 0..n`, with the selected backend
/// ([`select`]). `x`: `[n, cols]` row-major f32; `y`: `[n, rows]` row-major f32.
///
/// # Errors
/// As [`matmul_with`].
pub fn matmul(
    pool: &ThreadPool,
    w: &QMatRef<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), DspError> {
    matmul_with(select(), pool, w, x, n, y)
}

/// [`matmul`] with an explicit backend (tests, ablations).
///
/// # Errors
/// The [`QMatRef::new`] checks, and `LengthMismatch` unless `x.len() == n * cols` and
/// `y.len() == n * rows`.
pub fn matmul_with(
    be: &dyn KernelBackend,
    pool: &ThreadPool,
    w: &QMatRef<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), DspError> {
    w.validate()?;
    DspError::check_len("matmul", "x", n * w.cols, x.len())?;
    DspError::check_len("matmul", "y", n * w.rows, y.len())?;
    if n == 0 || w.rows == 0 {
        return Ok(());
    }
    let acts = quantize_activations(pool, w.ty.vec_dot_type(), x, n, w.cols)?;
    matmul_quantized(be, pool, w, &acts, y)
}

/// The product of [`matmul_with`] on activations already converted by
/// [`quantize_activations`] (reuse them for several weights sharing one input, e.g. q/k/v or
/// gate/up; [`matmul_quantized_many`] runs those in one pool run).
///
/// # Errors
/// `UnsupportedType` if `acts.ty != w.ty.vec_dot_type()`, `LengthMismatch` on wrong row sizes
/// or `y.len() != acts.n * w.rows`.
pub fn matmul_quantized(
    be: &dyn KernelBackend,
    pool: &ThreadPool,
    w: &QMatRef<'_>,
    acts: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), DspError> {
    matmul_quantized_many(be, pool, acts, &mut [(*w, y)])
}

/// Several products of the same converted activations, `ys[i] = W_i x` (each `ys[i]` `[n,
/// W_i.rows]`), in **one** pool run: the weight rows of all products are split into tasks
/// together, so a decode step pays one wake-up and one join for q/k/v or gate/up instead of
/// one per weight, and small weights (k/v of GQA) no longer run alone on the calling thread.
/// Every output is bit-identical to [`matmul_quantized`] of its weight alone (the tile kernel
/// gives the same value for a (row, token) pair whatever the tiling).
///
/// # Errors
/// As [`matmul_quantized`], for each product; nothing is computed when one fails.
pub fn matmul_quantized_many(
    be: &dyn KernelBackend,
    pool: &ThreadPool,
    acts: &QuantizedActs,
    products: &mut [(QMatRef<'_>, &mut [f32])],
) -> Result<(), DspError> {
    const OP: &str = "matmul_quantized";
    let n = acts.n;
    for (w, y) in products.iter() {
        w.validate()?;
        if acts.ty != w.ty.vec_dot_type() {
            return Err(DspError::UnsupportedType {
                op: OP,
                actual: acts.ty,
                expected: w.ty.vec_dot_type().name(),
            });
        }
        let x_rb = acts.ty.row_bytes(w.cols).unwrap_or(usize::MAX);
        DspError::check_len(OP, "activation row bytes", x_rb, acts.row_bytes)?;
        DspError::check_len(OP, "y", n * w.rows, y.len())?;
    }
    let macs: usize = products.iter().map(|(w, _)| w.rows * w.cols * n).sum();
    let all_rows: usize = products.iter().map(|(w, _)| w.rows).sum();
    if n == 0 || all_rows == 0 {
        return Ok(());
    }
    let target_tasks = if macs < SERIAL_MACS {
        1
    } else {
        pool.n_threads() * 4
    };
    // (product, first row, end row) of every task; each product's rows in chunks of a
    // multiple of 4 rows, about `target_tasks` chunks over all products.
    let mut tasks: Vec<(usize, usize, usize)> = Vec::with_capacity(target_tasks + products.len());
    for (i, (w, _)) in products.iter().enumerate() {
        let share = (target_tasks * w.rows)
            .div_ceil(all_rows)
            .clamp(1, w.rows.max(1));
        let chunk = w
            .rows
            .div_ceil(share)
            .next_multiple_of(4)
            .min(w.rows)
            .max(1);
        tasks.extend(
            (0..w.rows)
                .step_by(chunk)
                .map(|r0| (i, r0, (r0 + chunk).min(w.rows))),
        );
    }
    let outs: Vec<(QMatRef<'_>, OutPtr)> = products
        .iter_mut()
        .map(|(w, y)| (*w, OutPtr(y.as_mut_ptr())))
        .collect();
    let xb = acts.bytes();
    let x_rb = acts.row_bytes;
    let task = |k: usize| {
        let (i, r0, r1) = tasks[k];
        let (w, y_out) = &outs[i];
        let (rows, w_rb, n_r) = (w.rows, w.row_bytes(), r1 - r0);
        let mut buf = vec![0f32; n_r * TOKEN_BLOCK.min(n)];
        for t0 in (0..n).step_by(TOKEN_BLOCK) {
            let t1 = (t0 + TOKEN_BLOCK).min(n);
            let tile = DotTile {
                ty: w.ty,
                w: &w.data[r0 * w_rb..r1 * w_rb],
                w_row_bytes: w_rb,
                x: &xb[t0 * x_rb..t1 * x_rb],
                x_row_bytes: x_rb,
            };
            let out = &mut buf[..n_r * (t1 - t0)];
            be.dot_tile(&tile, out);
            for (dt, row) in out.chunks_exact(n_r).enumerate() {
                // SAFETY: task `k` owns rows r0..r1 of every token of product `i`, so the
                // writes of different tasks are disjoint; (t0+dt)*rows + r1 <= n*rows, the
                // length of that product's output (checked above); the outputs outlive the
                // run (pool.run returns only after every task has finished).
                unsafe { y_out.write_row((t0 + dt) * rows + r0, row) };
            }
        }
    };
    pool.run(tasks.len(), &task);
    Ok(())
}

/// Raw output pointer shared by matmul tasks that write disjoint ranges.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks only write disjoint index ranges through it (see `matmul_quantized_many`).
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `offset + src.len()` must be within the pointed-to buffer and no other thread may access
    /// that range concurrently.
    unsafe fn write_row(&self, offset: usize, src: &[f32]) {
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.0.add(offset), src.len());
    }
}
