//! K-quant matrix products at Qwen3.5-0.8B's FFN shape (`ffn_up`: 3584 × 1024, Q4_K; `ffn_down`
//! 1024 × 3584, Q6_K) for 1, 2, 4, 5 columns (decode / verification of drafts) and 64 columns
//! (one prefill token block), 2 threads, every backend this CPU has.
//! Throughput is in elements = multiply-accumulates.
//!
//! `cargo bench -p tandem-dsp --bench matmul_k -- --quick`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsp::matmul::{matmul_with, QMatRef};
use dsp::quant::blocks::{blocks_as_bytes, BlockQ4K, BlockQ6K};
use dsp::quant::{quantize_row_q4_k_simple, quantize_row_q6_k_simple, GgmlType};
use dsp::{backend, ThreadPool};
use half::f16;

fn random(n: usize) -> Vec<f32> {
    let mut seed = 7u32;
    (0..n)
        .map(|_| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        })
        .collect()
}

fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let w = random(rows * cols);
    match ty {
        GgmlType::Q4_K => {
            let mut b = vec![
                BlockQ4K {
                    d: f16::ZERO,
                    dmin: f16::ZERO,
                    scales: [0; 12],
                    qs: [0; 128]
                };
                rows * cols / 256
            ];
            quantize_row_q4_k_simple(&w, &mut b).expect("quantize");
            blocks_as_bytes(&b).to_vec()
        }
        _ => {
            let mut b = vec![
                BlockQ6K {
                    ql: [0; 128],
                    qh: [0; 64],
                    scales: [0; 16],
                    d: f16::ZERO
                };
                rows * cols / 256
            ];
            quantize_row_q6_k_simple(&w, &mut b).expect("quantize");
            blocks_as_bytes(&b).to_vec()
        }
    }
}

fn bench_matmul_k(c: &mut Criterion) {
    let pool = ThreadPool::new(2).expect("pool");
    let mut group = c.benchmark_group("matmul_k");
    for be in backend::available() {
        for (ty, rows, cols) in [(GgmlType::Q4_K, 3584, 1024), (GgmlType::Q6_K, 1024, 3584)] {
            let data = weights(ty, rows, cols);
            let w = QMatRef::new(ty, rows, cols, &data).expect("weights");
            for n in [1usize, 2, 4, 5, 64] {
                let x = random(n * cols);
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

criterion_group!(benches, bench_matmul_k);
criterion_main!(benches);
