//! K-quant matrix products at Qwen3.5-0.8B's FFN shape (`ffn_up`: 3584 × 1024, Q4_K; `ffn_down`
//! 1024 × 3584, Q6_K) for 1, 2, 4, 5 columns (decode / verification of drafts) and 64 columns
//! (one prefill token block), 2 threads, every backend this CPU has.
//! Throughput is in elements = multiply-accumulates.
//!
//! `cargo bench -p tandem-dsp --bench matmul_k -- --quick`

mod support;

use criterion::{criterion_group, criterion_main, Criterion};
use dsp::matmul::QMatRef;
use dsp::quant::GgmlType;
use dsp::{backend, ThreadPool};

fn bench_matmul_k(c: &mut Criterion) {
    let pool = ThreadPool::new(2).expect("pool");
    let mut group = c.benchmark_group("matmul_k");
    for be in backend::available() {
        for (ty, rows, cols) in [(GgmlType::Q4_K, 3584, 1024), (GgmlType::Q6_K, 1024, 3584)] {
            let data = support::quantize(ty, &support::lcg(7, rows * cols), rows, cols);
            let w = QMatRef::new(ty, rows, cols, &data).expect("weights");
            for n in [1usize, 2, 4, 5, 64] {
                let x = support::lcg(7, n * cols);
                support::bench_columns(&mut group, be, &pool, &w, &x, n);
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matmul_k);
criterion_main!(benches);
