//! Matrix product throughput: Q4_1 and Q8_0 weights of SmolLM2-135M's MLP shape
//! (1536 × 576 up-projection) at decode (n = 1) and prefill (n = 128), 2 threads.
//! Throughput is reported in elements = multiply-accumulates (GFLOP/s = 2 × Gelem/s).
//!
//! `cargo bench -p tandem-dsp -- --quick`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsp::matmul::{matmul_with, QMatRef};
use dsp::quant::blocks::{blocks_as_bytes, BlockQ4_1, BlockQ8_0};
use dsp::quant::{quantize_row_q4_1, quantize_row_q8_0, GgmlType};
use dsp::{backend, ThreadPool};
use half::f16;

fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut seed = 1u32;
    let mut next = move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
    };
    let w: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
    match ty {
        GgmlType::Q4_1 => {
            let mut b = vec![
                BlockQ4_1 {
                    d: f16::ZERO,
                    m: f16::ZERO,
                    qs: [0; 16]
                };
                rows * cols / 32
            ];
            quantize_row_q4_1(&w, &mut b).expect("quantize");
            blocks_as_bytes(&b).to_vec()
        }
        _ => {
            let mut b = vec![
                BlockQ8_0 {
                    d: f16::ZERO,
                    qs: [0; 32]
                };
                rows * cols / 32
            ];
            quantize_row_q8_0(&w, &mut b).expect("quantize");
            blocks_as_bytes(&b).to_vec()
        }
    }
}

fn bench_matmul(c: &mut Criterion) {
    let (rows, cols) = (1536, 576);
    let pool = ThreadPool::new(2).expect("pool");
    let mut group = c.benchmark_group("matmul");
    for be in backend::available() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let data = weights(ty, rows, cols);
            let w = QMatRef::new(ty, rows, cols, &data).expect("weights");
            for n in [1usize, 128] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; n * rows];
                group.throughput(Throughput::Elements((rows * cols * n) as u64));
                group.bench_with_input(
                    BenchmarkId::new(format!("{}/{}", be.name(), ty), n),
                    &n,
                    |b, &n| {
                        b.iter(|| {
                            matmul_with(be, &pool, &w, black_box(&x), n, &mut y).expect("matmul")
                        })
                    },
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
