//! Shared setup of the dsp benchmarks: the test helpers' weight quantizer, a fixed-seed
//! generator and the per-column-count matrix product benchmark.
#![allow(dead_code)]

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Throughput};
use dsp::matmul::{matmul_with, QMatRef};
use dsp::quant::GgmlType;
use dsp::{KernelBackend, ThreadPool};

#[path = "../../tests/common/mod.rs"]
mod common;

/// `n` values in `[-0.5, 0.5)` from a linear congruential generator seeded with `seed`.
pub fn lcg(seed: u32, n: usize) -> Vec<f32> {
    let mut seed = seed;
    (0..n)
        .map(|_| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        })
        .collect()
}

/// The `[rows, cols]` matrix `w` quantized to `ty` with the crate's weight quantizers.
pub fn quantize(ty: GgmlType, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    common::quantize_matrix(ty, w, rows, cols).bytes().to_vec()
}

/// Benchmarks `y = w · x` on `be` for the `n` columns `x`, as `{backend}/{type}` at `n`, with
/// multiply-accumulates as the throughput.
pub fn bench_columns(
    group: &mut BenchmarkGroup<'_, WallTime>,
    be: &dyn KernelBackend,
    pool: &ThreadPool,
    w: &QMatRef<'_>,
    x: &[f32],
    n: usize,
) {
    let (rows, cols) = (w.rows, w.cols);
    let mut y = vec![0f32; n * rows];
    group.throughput(Throughput::Elements((rows * cols * n) as u64));
    group.bench_with_input(
        BenchmarkId::new(format!("{}/{}", be.name(), w.ty), n),
        &n,
        |b, &n| b.iter(|| matmul_with(be, pool, w, black_box(x), n, &mut y).expect("matmul")),
    );
}
