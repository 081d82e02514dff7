//! Attention tile throughput (`KernelBackend::attention_queries`), SmolLM2-135M shapes at
//! depth 1024, head_dim 64: `prefill8x3` is a prefill task (8 tokens × 3 query heads of one
//! KV head, 24 queries, seeing 1017..=1024 cached positions), `decode1x3` a decode task of
//! one KV head's 3 query heads and `decode1x1` one query head alone (the block of fewer
//! than 4 queries that reduces 4 keys at a time and accumulates 64 value columns per pass). Per backend, `pairs` is the per-pair
//! composition (`attention_queries_by_pairs`: one `vec_dot_f16` and one `axpy_f16` call per
//! position and query) and `tile` the backend's override (the same bits). Throughput is in
//! multiply-accumulates (Q·K and P·V).
//!
//! `cargo bench -p tandem-dsp --bench attention -- --quick`

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsp::backend::{self, attention_queries_by_pairs, AttnTile};
use half::f16;

fn bench_attention(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention_queries");
    for (shape, tokens, group_size) in [("prefill8x3", 8usize, 3usize), ("decode1x3", 1, 3), ("decode1x1", 1, 1)] {
        bench_shape(&mut group, shape, tokens, group_size);
    }
    group.finish();
}

/// `tokens` consecutive tokens × `group_size` query heads against one KV head of 1024
/// cached positions (the last token seeing all of them).
fn bench_shape(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    shape: &str,
    tokens: usize,
    group_size: usize,
) {
    let (hd, depth) = (64usize, 1024usize);
    let n_q = tokens * group_size;
    let n_ctx: Vec<usize> = (0..n_q)
        .map(|i| depth - tokens + 1 + i / group_size)
        .collect();
    let f16s = |seed, n| -> Vec<f16> {
        support::lcg(seed, n)
            .iter()
            .map(|&x| f16::from_f32(4.0 * x))
            .collect()
    };
    let (q16, k, v) = (f16s(1, n_q * hd), f16s(2, depth * hd), f16s(3, depth * hd));
    let tile = AttnTile {
        q16: &q16,
        n_ctx: &n_ctx,
        head_dim: hd,
        k: &k,
        v: &v,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let macs: usize = n_ctx.iter().map(|&n| 2 * n * hd).sum();
    let mut scores = vec![0f32; n_q * depth];
    let mut out = vec![0f32; n_q * hd];
    group.throughput(Throughput::Elements(macs as u64));
    for be in backend::available() {
        group.bench_function(BenchmarkId::new(be.name(), format!("{shape} pairs")), |b| {
            b.iter(|| attention_queries_by_pairs(be, black_box(&tile), &mut scores, &mut out))
        });
        group.bench_function(BenchmarkId::new(be.name(), format!("{shape} tile")), |b| {
            b.iter(|| be.attention_queries(black_box(&tile), &mut scores, &mut out))
        });
    }
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
