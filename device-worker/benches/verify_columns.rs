//! Column-shared verification products on a real model's weights: one pass over every Q4_K
//! and Q6_K matrix of the 0.8B-shaped Qwen3.5 Q4_K_M GGUF (what a verification pass of the
//! target reads, output head included: ≈ 0.5 GB, beyond the caches) with 1, 2, 4 and 5 columns (the last
//! accepted token plus up to 4 drafts), against the stock approach: n separate
//! matrix-vector passes. Tandem §3.3/§4.3 target: 4 columns ≤ 1.3× one column.
//!
//! `TANDEM_BENCH_MODEL=path.gguf cargo bench -p device-worker --bench verify_columns`
//! (default: ~/.cache/tandem/models/qwen35-0.8b-shape-random-Q4_K_M.gguf, made by
//! tools/fixtures/make_qwen35_bench_model.sh; skipped with a message when missing).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gguf::reader::GgufFile;
use dsp::matmul::{matmul, QMatRef};
use dsp::quant::GgmlType;
use dsp::ThreadPool;

fn model_path() -> PathBuf {
    std::env::var_os("TANDEM_BENCH_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/tandem/models/qwen35-0.8b-shape-random-Q4_K_M.gguf")
    })
}

fn bench_verify(c: &mut Criterion) {
    let path = model_path();
    let Ok(file) = GgufFile::open(&path) else {
        eprintln!("verify_columns: {} not found; skipped", path.display());
        return;
    };
    // Every 2-D K-quant weight a verification pass multiplies by: all of them except the
    // embedding table, which only counts when it is also the output head (tied embeddings, no
    // `output.weight`: the 0.8B shape's 199 MiB Q6_K head, 40 % of a pass's bytes).
    let tied = file.tensors().all(|t| t.name != "output.weight");
    let mats: Vec<QMatRef<'_>> = file
        .tensors()
        .filter(|t| {
            matches!(t.ty, GgmlType::Q4_K | GgmlType::Q6_K)
                && t.dims.len() == 2
                && (tied || t.name != "token_embd.weight")
        })
        .filter_map(|t| {
            let v = file.tensor(&t.name).ok()?;
            QMatRef::new(v.ty, v.dims[1] as usize, v.dims[0] as usize, v.data).ok()
        })
        .collect();
    let bytes: usize = mats.iter().map(|m| m.data.len()).sum();
    eprintln!("verify_columns: {} matrices, {:.0} MiB of weights", mats.len(), bytes as f64 / (1 << 20) as f64);
    let pool = ThreadPool::new(2).expect("pool");
    let max_cols = mats.iter().map(|m| m.cols).max().unwrap_or(0);
    let max_rows = mats.iter().map(|m| m.rows).max().unwrap_or(0);
    let x: Vec<f32> = (0..5 * max_cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut y = vec![0f32; 5 * max_rows];
    let mut group = c.benchmark_group("verify_pass");
    group.sample_size(10);
    for n in [1usize, 2, 4, 5] {
        group.bench_with_input(BenchmarkId::new("column_shared", n), &n, |b, &n| {
            b.iter(|| {
                for m in &mats {
                    let (r, k) = (m.rows, m.cols);
                    matmul(&pool, m, &x[..n * k], n, &mut y[..n * r]).expect("matmul");
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("stock_n_matvecs", n), &n, |b, &n| {
            b.iter(|| {
                for t in 0..n {
                    for m in &mats {
                        let (r, k) = (m.rows, m.cols);
                        matmul(&pool, m, &x[t * k..(t + 1) * k], 1, &mut y[..r]).expect("matvec");
                    }
                }
            })
        });
    }
    group.finish();
    paired_ratios(&pool, &mats, &x, &mut y);
}

/// Column-shared passes of 1 column and of 2, 4, 5 columns run alternately (60 rounds), each
/// round's time divided by the 1-column time of the same round: on a shared, noisy machine the
/// median of these paired ratios is steadier than the ratio of two criterion estimates taken
/// seconds apart. Printed after criterion's groups.
fn paired_ratios(pool: &ThreadPool, mats: &[QMatRef<'_>], x: &[f32], y: &mut [f32]) {
    let pass = |n: usize, y: &mut [f32]| {
        let t = std::time::Instant::now();
        for m in mats {
            let (r, k) = (m.rows, m.cols);
            matmul(pool, m, &x[..n * k], n, &mut y[..n * r]).expect("matmul");
        }
        t.elapsed().as_secs_f64()
    };
    let cols = [2usize, 4, 5];
    let mut ratios = vec![Vec::new(); cols.len()];
    for _ in 0..60 {
        let one = pass(1, y);
        for (i, &n) in cols.iter().enumerate() {
            ratios[i].push(pass(n, y) / one);
        }
    }
    for (r, n) in ratios.iter_mut().zip(cols) {
        r.sort_by(f64::total_cmp);
        eprintln!(
            "verify_columns paired: {n} columns / 1 column = {:.3} (median of 60; quartiles {:.3}..{:.3})",
            r[r.len() / 2],
            r[r.len() / 4],
            r[3 * r.len() / 4]
        );
    }
}

criterion_group!(benches, bench_verify);
criterion_main!(benches);
