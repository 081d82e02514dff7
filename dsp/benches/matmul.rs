//! Matrix product throughput: Q4_1 and Q8_0 weights of SmolLM2-135M's MLP shape
//! (1536 × 576 up-projection) at decode (n = 1) and prefill (n = 128), and f16 / Q8_0 weights
//! of the 0.8B-shape vision tower's fc1 (3072 × 768) over 256 patches (`matmul_vision`), 2
//! threads.
//! Throughput is reported in elements = multiply-accumulates (GFLOP/s = 2 × Gelem/s).
//!
//! `cargo bench -p tandem-dsp -- --quick`

mod support;

use criterion::{criterion_group, criterion_main, Criterion};
use dsp::matmul::QMatRef;
use dsp::quant::GgmlType;
use dsp::{backend, ThreadPool};

fn bench_matmul(c: &mut Criterion) {
    let (rows, cols) = (1536, 576);
    let pool = ThreadPool::new(2).expect("pool");
    let mut group = c.benchmark_group("matmul");
    for be in backend::available() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let data = support::quantize(ty, &support::lcg(1, rows * cols), rows, cols);
            let w = QMatRef::new(ty, rows, cols, &data).expect("weights");
            for n in [1usize, 128] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                support::bench_columns(&mut group, be, &pool, &w, &x, n);
            }
        }
    }
    group.finish();
}

fn bench_matmul_vision(c: &mut Criterion) {
    let (rows, cols, n) = (3072, 768, 256);
    let pool = ThreadPool::new(2).expect("pool");
    let mut group = c.benchmark_group("matmul_vision");
    group.sample_size(10);
    let x: Vec<f32> = support::lcg(2, n * cols);
    for be in backend::available() {
        for ty in [GgmlType::F16, GgmlType::Q8_0] {
            let data = support::quantize(ty, &support::lcg(1, rows * cols), rows, cols);
            let w = QMatRef::new(ty, rows, cols, &data).expect("weights");
            support::bench_columns(&mut group, be, &pool, &w, &x, n);
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matmul, bench_matmul_vision);
criterion_main!(benches);
