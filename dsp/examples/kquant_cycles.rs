//! Fixed-work K-quant matrix products for cycle counting on a busy machine, where wall-clock
//! benchmarks are unreliable: `perf stat -e cycles:u,instructions:u target/release/examples/kquant_cycles q4_K 64 200`
//! (type, columns, repetitions, optional weight rows (default 3584; 1024 columns), optional
//! threads (default 1): with ~250000 rows the weights stream from memory, as in a decode or
//! verification pass).
//! Prints multiply-accumulates performed (MAC/cycle = printed / perf's cycles) and the
//! minimum and median wall time of one product.

mod common;

use dsp::matmul::{matmul_with, QMatRef};
use dsp::quant::blocks::{blocks_as_bytes, BlockQ4K, BlockQ6K};
use dsp::quant::{quantize_row_q4_k_simple, quantize_row_q6_k_simple, GgmlType};
use dsp::{backend, ThreadPool};
use half::f16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ty = args.get(1).map(String::as_str).unwrap_or("q4_K");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let reps: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100);
    let rows: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3584);
    let threads: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(1);
    let cols = 1024;
    let mut lcg = common::Lcg(7);
    let mut rnd = |k: usize| lcg.vec(k);
    let wf = rnd(rows * cols);
    let (gty, data) = if ty == "q6_K" {
        let z = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO };
        let mut b = vec![z; rows * cols / 256];
        quantize_row_q6_k_simple(&wf, &mut b).expect("quantize");
        (GgmlType::Q6_K, blocks_as_bytes(&b).to_vec())
    } else {
        let z = BlockQ4K { d: f16::ZERO, dmin: f16::ZERO, scales: [0; 12], qs: [0; 128] };
        let mut b = vec![z; rows * cols / 256];
        quantize_row_q4_k_simple(&wf, &mut b).expect("quantize");
        (GgmlType::Q4_K, blocks_as_bytes(&b).to_vec())
    };
    let w = QMatRef::new(gty, rows, cols, &data).expect("weights");
    let x = rnd(n * cols);
    let mut y = vec![0f32; n * rows];
    let pool = ThreadPool::new(threads).expect("pool");
    let be = backend::select();
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        matmul_with(be, &pool, &w, &x, n, &mut y).expect("matmul");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let (min, median) = (ms.first().copied().unwrap_or(0.0), ms.get(reps / 2).copied().unwrap_or(0.0));
    println!(
        "{} MAC ({} {ty} n={n} x{reps}), per product: min {min:.3} ms, median {median:.3} ms, checksum {}",
        rows * cols * n * reps,
        be.name(),
        y.iter().sum::<f32>()
    );
}
