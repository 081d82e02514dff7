//! Attention tile throughput (`KernelBackend::attention_queries`): a SmolLM2-135M prefill
//! task at depth, 8 tokens × 3 query heads of one KV head (24 queries), head_dim 64, the
//! tokens seeing 1017..=1024 cached positions. Per backend, `pairs` is the per-pair
//! composition (`attention_queries_by_pairs`: one `vec_dot_f16` and one `axpy_f16` call per
//! position and query) and `tile` the backend's override (the same bits). Throughput is in
//! multiply-accumulates (Q·K and P·V).
//!
//! `encoder_attention`: the vision encoder's non-causal tile (every query sees every patch)
//! at a screenshot's patch counts: `full` the kernel the encoder runs
//! (`KernelBackend::full_attention`, keys transposed, one FMA chain per lane), the f16
//! causal-capable tile (`attention_queries`) on the same inputs for comparison, and the
//! softmax of its rows alone.
//!
//! `cargo bench -p tandem-dsp --bench attention -- --quick`

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsp::backend::{self, attention_queries_by_pairs, AttnTile, FullAttnTile, FULL_ATTN_KV_ALIGN};
use half::f16;

fn bench_attention(c: &mut Criterion) {
    let (tokens, group_size, hd, depth) = (8usize, 3usize, 64usize, 1024usize);
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
    let mut group = c.benchmark_group("attention_queries");
    group.throughput(Throughput::Elements(macs as u64));
    for be in backend::available() {
        group.bench_function(BenchmarkId::new(be.name(), "pairs"), |b| {
            b.iter(|| attention_queries_by_pairs(be, black_box(&tile), &mut scores, &mut out))
        });
        group.bench_function(BenchmarkId::new(be.name(), "tile"), |b| {
            b.iter(|| be.attention_queries(black_box(&tile), &mut scores, &mut out))
        });
    }
    group.finish();
}

/// The vision encoder's full attention ([`AttnTile`] with every query seeing every patch):
/// one task's tile of 16 queries of one head (head_dim 64) over the patches of a 1080×2400
/// screenshot at 256 and at 1024 image tokens (1 056 and 3 948 patches).
fn bench_encoder_attention(c: &mut Criterion) {
    let (n_q, hd) = (16usize, 64usize);
    let mut group = c.benchmark_group("encoder_attention");
    for n in [1056usize, 3948] {
        let f16s = |seed, len| -> Vec<f16> {
            support::lcg(seed, len).iter().map(|&x| f16::from_f32(4.0 * x)).collect()
        };
        let (q16, k, v) = (f16s(1, n_q * hd), f16s(2, n * hd), f16s(3, n * hd));
        let n_ctx = vec![n; n_q];
        let tile = AttnTile { q16: &q16, n_ctx: &n_ctx, head_dim: hd, k: &k, v: &v, scale: 1.0 / (hd as f32).sqrt() };
        let mut scores = vec![0f32; n_q * n];
        let mut out = vec![0f32; n_q * hd];
        group.throughput(Throughput::Elements((2 * n_q * n * hd) as u64));
        // The same inputs for the encoder's kernel: f32 queries, keys transposed and padded.
        let st = n.div_ceil(FULL_ATTN_KV_ALIGN) * FULL_ATTN_KV_ALIGN;
        let qf: Vec<f32> = q16.iter().map(|x| x.to_f32()).collect();
        let mut kt = vec![0f32; hd * st];
        for j in 0..n {
            for d in 0..hd {
                kt[d * st + j] = k[j * hd + d].to_f32();
            }
        }
        let vf: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        let full = FullAttnTile { q: &qf, kt: &kt, v: &vf, n_kv: n, kv_stride: st, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        let mut full_scores = vec![0f32; n_q * st];
        for be in backend::available() {
            group.bench_function(BenchmarkId::new(format!("{}_full", be.name()), n), |b| {
                b.iter(|| be.full_attention(black_box(&full), &mut full_scores, &mut out))
            });
            group.bench_function(BenchmarkId::new(be.name(), n), |b| {
                b.iter(|| be.attention_queries(black_box(&tile), &mut scores, &mut out))
            });
            // The softmax alone, over the same rows (its share of the tile).
            group.bench_function(BenchmarkId::new(format!("{}_softmax", be.name()), n), |b| {
                b.iter(|| {
                    for row in scores.chunks_exact_mut(n) {
                        be.softmax_inplace(black_box(row));
                    }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_attention, bench_encoder_attention);
criterion_main!(benches);
