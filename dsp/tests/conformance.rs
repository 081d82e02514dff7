//! Conformance of every kernel backend against the scalar reference and of the matrix product
//! against an f32 reference, instantiated once per backend by `backend_conformance!` (after
//! sonos/tract's per-kernel test macro).

mod common;

use common::{
    assert_random_tile_equals_single_dots, dequantize_matrix, dot_tile_outputs, quantize_matrix, rand_q4_0, rand_q4_1, rand_q4_k, rand_q6_k, rand_q8_0,
    rand_q8_1, rand_q8_k, Aligned, Rng, WEIGHT_TYPES,
};
use dsp::backend::{self, KernelBackend};
use dsp::matmul::{matmul_with, QMatRef};
use dsp::ops;
use dsp::quant::blocks::blocks_as_bytes;
use dsp::quant::{dequantize_row, GgmlType};
use dsp::ThreadPool;
use half::{bf16, f16};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Backends may only reorder f32 sums: allowed error relative to `sum |w_i * x_i|`.
const SUM_ORDER_TOL: f32 = 2e-6;
/// Relative error (‖y − y_ref‖ / ‖y_ref‖) of a matmul against the f32 product of the
/// dequantized weights, per activation type: from rounding the activations (Q8: half a step
/// of amax/127 per element; f16: 2^-11; bf16: 2^-8), with ~2x margin.
const MATMUL_TOL_Q8: f64 = 0.02;
const MATMUL_TOL_F16: f64 = 2e-3;
const MATMUL_TOL_BF16: f64 = 1e-2;
const MATMUL_TOL_F32: f64 = 1e-5;

fn matmul_tol(ty: GgmlType) -> f64 {
    match ty.vec_dot_type() {
        GgmlType::F32 => MATMUL_TOL_F32,
        GgmlType::F16 => MATMUL_TOL_F16,
        GgmlType::BF16 => MATMUL_TOL_BF16,
        _ => MATMUL_TOL_Q8,
    }
}

fn deq<T: dsp::quant::blocks::Block>(ty: GgmlType, blocks: &[T]) -> Vec<f32> {
    let bytes = blocks_as_bytes(blocks);
    let n = bytes.len() / ty.type_size() * ty.block_size();
    let mut out = vec![0f32; n];
    dequantize_row(ty, bytes, &mut out).expect("dequantize");
    out
}

fn mass(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

fn assert_close_dot(name: &str, got: f32, want: f32, mass: f32) {
    let tol = SUM_ORDER_TOL * mass + 1e-6;
    assert!(
        (got - want).abs() <= tol,
        "{name}: got {got}, scalar {want}, tol {tol}"
    );
}

/// Random (weight row bytes, activation row bytes, dequantized w, dequantized x, extra
/// tolerance) of `nb` blocks for weight type `ty`. The extra tolerance covers Q8_1's `s`,
/// which is `d * sum(q)` rounded to f16, so `m * s` differs from the dequantized sum by up to
/// `|m * s| * 2^-11` per block.
fn random_pair(
    ty: GgmlType,
    nb: usize,
    rng: &mut Rng,
) -> (Aligned, Aligned, Vec<f32>, Vec<f32>, f32) {
    fn pack<A: dsp::quant::blocks::Block, B: dsp::quant::blocks::Block>(
        wt: GgmlType,
        w: Vec<A>,
        xt: GgmlType,
        x: Vec<B>,
    ) -> (Aligned, Aligned, Vec<f32>, Vec<f32>, f32) {
        let (dw, dx) = (deq(wt, &w), deq(xt, &x));
        (
            Aligned::new(blocks_as_bytes(&w)),
            Aligned::new(blocks_as_bytes(&x)),
            dw,
            dx,
            0.0,
        )
    }
    match ty {
        GgmlType::Q4_0 => pack(ty, rand_q4_0(rng, nb), GgmlType::Q8_0, rand_q8_0(rng, nb)),
        GgmlType::Q4_1 => {
            let (w, x) = (rand_q4_1(rng, nb), rand_q8_1(rng, nb));
            let extra: f32 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| (a.m.to_f32() * b.s.to_f32()).abs())
                .sum::<f32>()
                / 1024.0;
            let p = pack(ty, w, GgmlType::Q8_1, x);
            (p.0, p.1, p.2, p.3, extra)
        }
        GgmlType::Q8_0 => pack(ty, rand_q8_0(rng, nb), GgmlType::Q8_0, rand_q8_0(rng, nb)),
        GgmlType::Q4_K => pack(ty, rand_q4_k(rng, nb), GgmlType::Q8_K, rand_q8_k(rng, nb)),
        GgmlType::Q6_K => pack(ty, rand_q6_k(rng, nb), GgmlType::Q8_K, rand_q8_k(rng, nb)),
        // Float types: `nb` elements (edge lengths around the SIMD widths).
        GgmlType::F16 => {
            let w: Vec<f16> = (0..nb).map(|_| f16::from_f32(rng.normal())).collect();
            let x: Vec<f16> = (0..nb).map(|_| f16::from_f32(rng.normal())).collect();
            pack(ty, w, ty, x)
        }
        GgmlType::BF16 => {
            let w: Vec<bf16> = (0..nb).map(|_| bf16::from_f32(rng.normal())).collect();
            let x: Vec<bf16> = (0..nb).map(|_| bf16::from_f32(rng.normal())).collect();
            pack(ty, w, ty, x)
        }
        GgmlType::F32 => pack(ty, rng.vec(nb), ty, rng.vec(nb)),
        other => panic!("not a weight type: {other}"),
    }
}

/// Checks `be.attention_queries` of `tile` gives the bits of the per-pair composition
/// (`backend::attention_queries_by_pairs`), in the outputs and in the scores, which start as
/// `scores` (the backend's, the composition's); `what` names the case.
fn assert_queries_equal_pairs(be: &dyn KernelBackend, tile: &backend::AttnTile, scores: (Vec<f32>, Vec<f32>), what: &str) {
    let (mut s_got, mut s_want) = scores;
    let n_out = tile.n_ctx.len() * tile.head_dim;
    let (mut o_got, mut o_want) = (vec![f32::NAN; n_out], vec![f32::NAN; n_out]);
    be.attention_queries(tile, &mut s_got, &mut o_got);
    backend::attention_queries_by_pairs(be, tile, &mut s_want, &mut o_want);
    test_support::compare::assert_close(&o_got, &o_want, 0.0, &format!("out: {what}"));
    test_support::compare::assert_close(&s_got, &s_want, 0.0, &format!("scores: {what}"));
}

fn pool2() -> ThreadPool {
    ThreadPool::new(2).expect("spawn pool")
}

/// Naive f64 reference of `y = x · Wᵀ` on the dequantized weights.
fn reference_matmul(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
    let mut y = vec![0f64; n * rows];
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = (0..cols)
                .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                .sum();
        }
    }
    y
}

/// Property tests: failures are saved to and replayed from the committed
/// `conformance.proptest-regressions` beside this file (proptest prints the failing input,
/// its `seed` included, and the saved `cc` line). A case costs microseconds: 256 of them.
fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

/// `$label` is the backend's name (`KernelBackend::name`, the names `TANDEM_REQUIRE_KERNELS`
/// lists); a backend this CPU lacks is reported `UNTESTED` unless it is required
/// (`test_support::kernel_backend`).
macro_rules! backend_conformance {
    ($name:ident, $label:literal, $get:expr) => {
        mod $name {
            use super::*;

            fn be() -> Option<&'static dyn KernelBackend> {
                let be = test_support::kernel_backend($label, $get);
                if let Some(b) = be {
                    assert_eq!(b.name(), $label);
                }
                be
            }

            proptest! {
                #![proptest_config(proptest_config())]

                #[test]
                fn vec_dot_matches_scalar(ti in 0usize..8, nb in 0usize..6, float_len in 0usize..70, seed in any::<u64>()) {
                    let Some(be) = be() else { return Ok(()) };
                    let ty = WEIGHT_TYPES[ti];
                    let n = if ty.block_size() == 1 { float_len } else { nb };
                    let mut rng = Rng(seed);
                    let (w, x, dw, dx, extra) = random_pair(ty, n, &mut rng);
                    let got = be.vec_dot_bytes(ty, w.bytes(), x.bytes());
                    let want = backend::scalar().vec_dot_bytes(ty, w.bytes(), x.bytes());
                    assert_close_dot(ty.name(), got, want, mass(&dw, &dx));
                    // And both equal the dot of the dequantized rows (the block formulas).
                    let exact: f64 = dw.iter().zip(&dx).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let diff = (want - exact as f32).abs();
                    let tol = 4.0 * SUM_ORDER_TOL * mass(&dw, &dx) + extra + 1e-6;
                    prop_assert!(diff <= tol, "{}: scalar {} vs dequantized dot {} (tol {})", ty.name(), want, exact, tol);
                }

                #[test]
                fn rms_norm_matches_scalar(len in 1usize..100, seed in any::<u64>()) {
                    let Some(be) = be() else { return Ok(()) };
                    let mut rng = Rng(seed);
                    let (x, w) = (rng.vec(len), rng.vec(len));
                    let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
                    be.rms_norm_row(&x, &w, 1e-6, &mut a);
                    backend::scalar().rms_norm_row(&x, &w, 1e-6, &mut b);
                    for (p, q) in a.iter().zip(&b) {
                        prop_assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0), "{p} vs {q}");
                    }
                }

                #[test]
                fn add_and_axpy_equal_scalar_bitwise(len in 0usize..80, a in -2.0f32..2.0, seed in any::<u64>()) {
                    let Some(be) = be() else { return Ok(()) };
                    let mut rng = Rng(seed);
                    let (x, src) = (rng.vec(len), rng.vec(len));
                    let v: Vec<f16> = rng.vec(len).iter().map(|&f| f16::from_f32(f)).collect();
                    let (mut p, mut q) = (x.clone(), x.clone());
                    be.add_inplace(&mut p, &src);
                    backend::scalar().add_inplace(&mut q, &src);
                    prop_assert_eq!(&p, &q);
                    be.axpy_f16(&mut p, a, &v);
                    backend::scalar().axpy_f16(&mut q, a, &v);
                    prop_assert_eq!(&p, &q);
                }

                #[test]
                fn activations_match_scalar_and_ignore_position(len in 1usize..70, scale in 0.1f32..120.0, seed in any::<u64>()) {
                    let Some(be) = be() else { return Ok(()) };
                    let mut rng = Rng(seed);
                    let x: Vec<f32> = rng.vec(len).iter().map(|v| v * scale).collect();
                    let up = rng.vec(len);
                    let (mut p, mut q) = (x.clone(), x.clone());
                    be.silu_inplace(&mut p);
                    backend::scalar().silu_inplace(&mut q);
                    for (a, b) in p.iter().zip(&q) {
                        // exp within 1 ulp, then one division: a few ulp of the result, or denormal-small.
                        prop_assert!((a - b).abs() <= 4e-7 * b.abs() + 1e-30, "silu {a} vs {b}");
                    }
                    // GELU (tanh form): the scalar f32 operations with the backend's exp.
                    let (mut gp, mut gq) = (x.clone(), x.clone());
                    be.gelu_tanh_inplace(&mut gp);
                    backend::scalar().gelu_tanh_inplace(&mut gq);
                    for ((a, b), xi) in gp.iter().zip(&gq).zip(&x) {
                        prop_assert!((a - b).abs() <= 4e-7 * b.abs() + 1e-30, "gelu_tanh({xi}) {a} vs {b}");
                    }
                    let (mut sp, mut sq) = (vec![0f32; len], vec![0f32; len]);
                    be.swiglu(&x, &up, &mut sp);
                    backend::scalar().swiglu(&x, &up, &mut sq);
                    for (a, b) in sp.iter().zip(&sq) {
                        prop_assert!((a - b).abs() <= 6e-7 * b.abs() + 1e-30, "swiglu {a} vs {b}");
                    }
                    // Softmax (with a masked entry) against the scalar reference.
                    let mut sm: Vec<f32> = x.iter().map(|v| v * 0.3).collect();
                    let masked = seed as usize % len;
                    if len > 1 {
                        sm[masked] = f32::NEG_INFINITY;
                    }
                    let mut sr = sm.clone();
                    be.softmax_inplace(&mut sm);
                    backend::scalar().softmax_inplace(&mut sr);
                    for (a, b) in sm.iter().zip(&sr) {
                        prop_assert!((a - b).abs() <= 1e-6 * b.abs() + 1e-30, "softmax {a} vs {b}");
                    }
                    if len > 1 {
                        prop_assert_eq!(sm[masked], 0.0);
                    }
                    // Every element alone gives the bits it got inside the slice.
                    for (i, &xi) in x.iter().enumerate() {
                        let mut one = [xi];
                        be.silu_inplace(&mut one);
                        prop_assert_eq!(one[0].to_bits(), p[i].to_bits());
                        let mut one = [xi];
                        be.gelu_tanh_inplace(&mut one);
                        prop_assert_eq!(one[0].to_bits(), gp[i].to_bits());
                        let mut o = [0f32];
                        be.swiglu(&[xi], &[up[i]], &mut o);
                        prop_assert_eq!(o[0].to_bits(), sp[i].to_bits());
                    }
                }
            }

            proptest! {
                #![proptest_config(proptest_config())]

                /// The backend's attention tile gives every query (and every score it writes)
                /// the bits of the per-pair composition, for SmolLM2-like GQA tiles with
                /// causal spans and for random ragged spans, whole and tail head sizes, short
                /// and long (past 1000 keys, as an image's patches).
                #[test]
                fn attention_queries_equal_pairs_bitwise(hdi in 0usize..8, n_q in 1usize..=30, base in 0usize..70, ragged in any::<bool>(), long in proptest::bool::weighted(0.1), seed in any::<u64>()) {
                    let Some(be) = be() else { return Ok(()) };
                    let hd = [64usize, 128, 256, 8, 24, 37, 72, 80][hdi];
                    let mut rng = Rng(seed);
                    // Causal prefill: tokens of `group` query heads, token t seeing base + t + 1.
                    let group = if n_q % 3 == 0 { 3 } else { 1 };
                    let n_ctx: Vec<usize> = (0..n_q)
                        .map(|i| match (ragged, long) {
                            (true, false) => 1 + (rng.next_u64() % 90) as usize,
                            // Long spans (over 1000 keys, as an image's patches).
                            (true, true) => 1 + (rng.next_u64() % 1200) as usize,
                            (false, false) => base + i / group + 1,
                            (false, true) => 500 + 8 * base + i / group + 1,
                        })
                        .collect();
                    let max_ctx = *n_ctx.iter().max().expect("n_q > 0");
                    let f16s = |rng: &mut Rng, n: usize| -> Vec<f16> { rng.vec(n).iter().map(|&x| f16::from_f32(x)).collect() };
                    let (q16, k, v) = (f16s(&mut rng, n_q * hd), f16s(&mut rng, max_ctx * hd), f16s(&mut rng, max_ctx * hd));
                    let q16: Vec<f16> = q16.iter().map(|x| f16::from_f32(x.to_f32() * 3.0)).collect();
                    let tile = backend::AttnTile { q16: &q16, n_ctx: &n_ctx, head_dim: hd, k: &k, v: &v, scale: 1.0 / (hd as f32).sqrt() };
                    // Entries a query does not see keep the initial garbage in both.
                    let garbage: Vec<f32> = rng.vec(n_q * max_ctx + 3);
                    let what = format!("{} hd {hd} n_q {n_q} n_ctx {n_ctx:?}", be.name());
                    assert_queries_equal_pairs(be, &tile, (garbage.clone(), garbage), &what);
                }
            }

            /// Full non-causal attention (the vision tower's): every query sees all `n` keys,
            /// with `n` and the tile's query count not multiples of the register block (4
            /// queries) or of a 16-element chunk, over the tower's head sizes; `n` up to
            /// 1100 keys, as an image's thousands of patches.
            #[test]
            fn full_attention_tiles_equal_pairs_bitwise() {
                let Some(be) = be() else { return };
                let mut rng = Rng(19);
                for hd in [16usize, 64, 72, 24] {
                    for (n_q, n) in [(16, 37), (5, 201), (7, 7), (13, 16), (1, 3), (6, 1100), (16, 1024)] {
                        let n_ctx = vec![n; n_q];
                        let f16s = |rng: &mut Rng, len: usize| -> Vec<f16> { rng.vec(len).iter().map(|&x| f16::from_f32(x * 2.0)).collect() };
                        let (q16, k, v) = (f16s(&mut rng, n_q * hd), f16s(&mut rng, n * hd), f16s(&mut rng, n * hd));
                        let tile = backend::AttnTile { q16: &q16, n_ctx: &n_ctx, head_dim: hd, k: &k, v: &v, scale: 1.0 / (hd as f32).sqrt() };
                        let what = format!("{} full attention hd {hd} n_q {n_q} n {n}", be.name());
                        assert_queries_equal_pairs(be, &tile, (vec![f32::NAN; n_q * n], vec![0f32; n_q * n]), &what);
                    }
                }
            }

            /// Full attention with transposed keys (the vision tower's kernel): every query's
            /// scores and outputs are the bits of the scalar chains
            /// (`backend::full_attention_by_chains`), for query counts around the register
            /// blocks (4 and 8), key counts around the vector widths and the key block of the
            /// value sums (128), and head sizes with and without a column tail.
            #[test]
            fn full_attention_equals_chains_bitwise() {
                let Some(be) = be() else { return };
                let mut rng = Rng(23);
                for hd in [64usize, 16, 72, 24, 40, 8, 37] {
                    for (n_q, n_kv) in [(16usize, 37usize), (5, 201), (7, 7), (13, 16), (1, 3), (9, 1100), (16, 1024), (3, 129), (8, 32), (17, 33)] {
                        let st = n_kv.div_ceil(backend::FULL_ATTN_KV_ALIGN) * backend::FULL_ATTN_KV_ALIGN;
                        let q: Vec<f32> = rng.vec(n_q * hd).iter().map(|x| x * 2.0).collect();
                        // Padding keys hold garbage: their scores are unspecified and unused.
                        let kt = rng.vec(hd * st);
                        let v = rng.vec(n_kv * hd);
                        let tile = backend::FullAttnTile { q: &q, kt: &kt, v: &v, n_kv, kv_stride: st, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
                        let (mut s_got, mut s_want) = (vec![f32::NAN; n_q * st], vec![0f32; n_q * st]);
                        let (mut o_got, mut o_want) = (vec![f32::NAN; n_q * hd], vec![f32::NAN; n_q * hd]);
                        be.full_attention(&tile, &mut s_got, &mut o_got);
                        backend::full_attention_by_chains(be, &tile, &mut s_want, &mut o_want);
                        let what = format!("{} full attention hd {hd} n_q {n_q} n_kv {n_kv}", be.name());
                        test_support::compare::assert_close(&o_got, &o_want, 0.0, &format!("out: {what}"));
                        let seen = |s: &[f32]| -> Vec<f32> { s.chunks_exact(st).flat_map(|r| r[..n_kv].to_vec()).collect() };
                        test_support::compare::assert_close(&seen(&s_got), &seen(&s_want), 0.0, &format!("scores: {what}"));
                    }
                }
            }

            /// Rows of 1 block and of odd block counts (the one-block tail of the 2-block
            /// NEON single dots) and of 2 and 4 blocks, for every quantized type, fixed rather
            /// than drawn: the single dot matches the scalar reference (the proptest's
            /// tolerance) and equals the tile kernel's result bit for bit (the tiles take one
            /// block at a time).
            #[test]
            fn one_and_odd_block_counts_match_scalar_and_tiles() {
                let Some(be) = be() else { return };
                let mut rng = Rng(11);
                for ty in WEIGHT_TYPES.into_iter().filter(|t| t.block_size() > 1) {
                    for nb in [1usize, 2, 3, 4, 5, 7] {
                        let (w, x, dw, dx, _) = random_pair(ty, nb, &mut rng);
                        let got = be.vec_dot_bytes(ty, w.bytes(), x.bytes());
                        let want = backend::scalar().vec_dot_bytes(ty, w.bytes(), x.bytes());
                        assert_close_dot(&format!("{ty} nb={nb}"), got, want, mass(&dw, &dx));

                        let cols = nb * ty.block_size();
                        let (rows, toks) = (5, 3);
                        assert_random_tile_equals_single_dots(be, ty, &mut rng, (rows, toks, cols), &format!("{ty} nb={nb}"));
                    }
                }
            }

            #[test]
            fn dot_tile_is_bit_identical_to_single_dots() {
                let Some(be) = be() else { return };
                let mut rng = Rng(7);
                for ty in WEIGHT_TYPES {
                    // Six super-blocks: more than one chunk of the AVX-512 K-quant prefill
                    // kernel; token counts cover its few-column path (1..=8), whole and
                    // partial 4-token groups, and more than one 64-token block.
                    let cols = 1536;
                    for (rows, toks) in [(1, 1), (3, 2), (4, 2), (5, 3), (9, 5), (2, 8), (3, 11), (5, 9), (6, 70)] {
                        assert_random_tile_equals_single_dots(be, ty, &mut rng, (rows, toks, cols), &format!("{ty}"));
                    }
                }
            }

            /// Float tiles (f16, bf16, f32) have no blocks: every row length is legal, and
            /// the 16- and 8-element vector steps and the scalar tail must each give a tile
            /// the single dot's bits, on tile shapes that exercise every piece and edge of
            /// the backends' float tiles (AVX2 2 × 3, AVX-512 3 × 8 of 16 lanes, NEON 2 × 2).
            #[test]
            fn float_tiles_of_any_length_equal_single_dots() {
                let Some(be) = be() else { return };
                let mut rng = Rng(29);
                for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
                    for cols in [1usize, 7, 8, 9, 15, 16, 17, 24, 31, 40, 769] {
                        for (rows, toks) in [(1, 1), (2, 3), (4, 3), (5, 7), (9, 4), (3, 8), (7, 17)] {
                            assert_random_tile_equals_single_dots(be, ty, &mut rng, (rows, toks, cols), &format!("{ty} cols={cols}"));
                        }
                    }
                }
            }

            /// The per-token gated delta rule with this backend's build of the head loop
            /// gives the scalar build's bits: outputs, the replayed base, the final state
            /// and the logged writes of a pass with a pending replay and a rollback log, and
            /// a separate replay (the loops are element-wise with `f32::mul_add` in every
            /// build), and the same pass without a log (its final state stored). Shapes with `d_v` not a
            /// multiple of 16 reach the vector loops' tails.
            #[test]
            fn gdn_recurrent_equals_scalar_bitwise() {
                use dsp::gdn::{gdn_recurrent_with, gdn_replay_with, GdnInputs, GdnShape, ReplayInputs, RollbackLog};
                let Some(be) = be() else { return };
                let pool = pool2();
                let mut rng = Rng(41);
                for (n_k_heads, n_v_heads, d_k, d_v, n, m) in [(2, 4, 128, 128, 4, 3), (1, 2, 24, 40, 6, 2), (2, 2, 16, 17, 2, 1)] {
                    let shape = GdnShape { n_k_heads, n_v_heads, d_k, d_v };
                    let mut vec = |len: usize, f: &dyn Fn(f32) -> f32| -> Vec<f32> { (0..len).map(|_| f(rng.unit())).collect() };
                    let (q, k) = (vec(n * n_k_heads * d_k, &|x| 0.2 * x), vec(n * n_k_heads * d_k, &|x| 0.2 * x));
                    let v = vec(n * n_v_heads * d_v, &|x| x);
                    let (gate, beta) = (vec(n * n_v_heads, &|x| -0.5 * (x + 1.0)), vec(n * n_v_heads, &|x| 0.5 * (x + 1.0)));
                    let state0 = vec(n_v_heads * d_k * d_v, &|x| 0.1 * x);
                    let x = GdnInputs { shape, q: &q, k: &k, v: &v, gate: &gate, beta: &beta };
                    // `m` tokens of another pass pending (its inputs reused, its writes random).
                    let p_delta = vec(m * n_v_heads * d_v, &|x| 0.3 * x);
                    let kd = n_k_heads * d_k;
                    let pending = ReplayInputs { shape, k: &k[..m * kd], gate: &gate[..m * n_v_heads], delta: &p_delta };
                    let run = |b: &dyn KernelBackend| {
                        let mut state = state0.clone();
                        let mut out = vec![0f32; n * n_v_heads * d_v];
                        let mut delta = vec![0f32; out.len()];
                        let log = RollbackLog { delta: &mut delta };
                        gdn_recurrent_with(b, &pool, x, &mut state, &mut out, Some(pending), Some(log)).expect("gdn_recurrent");
                        let mut replayed = state0.clone();
                        gdn_replay_with(b, &pool, pending, &mut replayed).expect("gdn_replay");
                        // Without a log: the final state is stored.
                        let (mut fin, mut out_plain) = (state0.clone(), vec![0f32; out.len()]);
                        gdn_recurrent_with(b, &pool, x, &mut fin, &mut out_plain, Some(pending), None).expect("gdn_recurrent");
                        [out, state, fin, delta, replayed, out_plain].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>())
                    };
                    let (got, want) = (run(be), run(backend::scalar()));
                    let parts = ["out", "base", "final state", "writes", "replay", "out without a log"];
                    for (part, (g, w)) in parts.iter().zip(got.iter().zip(&want)) {
                        assert!(g == w, "{part} differs from the scalar build (d_k {d_k}, d_v {d_v}, n {n}, m {m})");
                    }
                }
            }

            #[test]
            fn matmul_matches_f32_reference() {
                let Some(be) = be() else { return };
                let pool = pool2();
                let mut rng = Rng(11);
                for ty in WEIGHT_TYPES {
                    let (rows, cols, n) = (37, 512, 5);
                    let wf = rng.vec(rows * cols);
                    let w = quantize_matrix(ty, &wf, rows, cols);
                    let wd = dequantize_matrix(ty, w.bytes(), rows, cols);
                    let x = rng.vec(n * cols);
                    let m = QMatRef::new(ty, rows, cols, w.bytes()).expect("weights");
                    let mut y = vec![0f32; n * rows];
                    matmul_with(be, &pool, &m, &x, n, &mut y).expect("matmul");
                    let y_ref = reference_matmul(&wd, rows, cols, &x, n);
                    let err: f64 = y.iter().zip(&y_ref).map(|(a, b)| (*a as f64 - b).powi(2)).sum::<f64>().sqrt();
                    let norm: f64 = y_ref.iter().map(|b| b * b).sum::<f64>().sqrt();
                    assert!(err / norm <= matmul_tol(ty), "{ty}: relative error {} > {}", err / norm, matmul_tol(ty));
                }
            }

            #[test]
            fn matmul_of_n_tokens_equals_n_matvecs_bitwise() {
                let Some(be) = be() else { return };
                let pool = pool2();
                let mut rng = Rng(13);
                for ty in WEIGHT_TYPES {
                    let (rows, cols) = (45, 256);
                    let w = quantize_matrix(ty, &rng.vec(rows * cols), rows, cols);
                    let m = QMatRef::new(ty, rows, cols, w.bytes()).expect("weights");
                    for n in [1usize, 2, 3, 5, 17, 64, 70] {
                        let x = rng.vec(n * cols);
                        let mut y = vec![0f32; n * rows];
                        matmul_with(be, &pool, &m, &x, n, &mut y).expect("matmul");
                        for t in 0..n {
                            let mut yt = vec![0f32; rows];
                            matmul_with(be, &pool, &m, &x[t * cols..(t + 1) * cols], 1, &mut yt).expect("matvec");
                            let got: Vec<u32> = y[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                            let want: Vec<u32> = yt.iter().map(|v| v.to_bits()).collect();
                            assert_eq!(got, want, "{ty} n={n} t={t}");
                        }
                    }
                }
            }

            #[test]
            fn matmul_is_independent_of_thread_count() {
                let Some(be) = be() else { return };
                let mut rng = Rng(17);
                let (ty, rows, cols, n) = (GgmlType::Q4_1, 300, 256, 9);
                let w = quantize_matrix(ty, &rng.vec(rows * cols), rows, cols);
                let m = QMatRef::new(ty, rows, cols, w.bytes()).expect("weights");
                let x = rng.vec(n * cols);
                let mut ys = Vec::new();
                for threads in [1, 2, 3] {
                    let pool = ThreadPool::new(threads).expect("pool");
                    let mut y = vec![0f32; n * rows];
                    matmul_with(be, &pool, &m, &x, n, &mut y).expect("matmul");
                    ys.push(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
                assert_eq!(ys[0], ys[1]);
                assert_eq!(ys[0], ys[2]);
            }

            #[test]
            fn products_in_one_run_equal_each_product_alone() {
                // q/k/v-like shapes (rows 0, 1 and not a multiple of 4 included), decode and
                // prefill widths, 1 and 2 threads, above and below the serial threshold.
                let Some(be) = be() else { return };
                let mut rng = Rng(23);
                let (ty, cols) = (GgmlType::Q4_1, 256);
                let shapes = [300usize, 100, 1, 0, 37];
                let ws: Vec<_> = shapes
                    .iter()
                    .map(|&rows| quantize_matrix(ty, &rng.vec(rows * cols), rows, cols))
                    .collect();
                let mats: Vec<_> = shapes
                    .iter()
                    .zip(&ws)
                    .map(|(&rows, w)| QMatRef::new(ty, rows, cols, w.bytes()).expect("weights"))
                    .collect();
                for (threads, n) in [(1, 1), (2, 1), (2, 9), (2, 70)] {
                    let pool = ThreadPool::new(threads).expect("pool");
                    let x = rng.vec(n * cols);
                    let acts = dsp::matmul::quantize_activations(&pool, ty.vec_dot_type(), &x, n, cols)
                        .expect("quantize");
                    let mut alone: Vec<Vec<f32>> = shapes.iter().map(|&r| vec![0f32; n * r]).collect();
                    for (m, y) in mats.iter().zip(alone.iter_mut()) {
                        dsp::matmul::matmul_quantized(be, &pool, m, &acts, y).expect("alone");
                    }
                    let mut together: Vec<Vec<f32>> = shapes.iter().map(|&r| vec![f32::NAN; n * r]).collect();
                    let mut products: Vec<_> =
                        mats.iter().copied().zip(together.iter_mut().map(|y| &mut y[..])).collect();
                    dsp::matmul::matmul_quantized_many(be, &pool, &acts, &mut products).expect("together");
                    for (a, t) in alone.iter().zip(&together) {
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(a), bits(t), "threads {threads}, n {n}");
                    }
                }
            }

            #[test]
            fn attention_matches_f64_reference() {
                let Some(be) = be() else { return };
                let mut rng = Rng(19);
                for (n_ctx, hd) in [(1usize, 64usize), (7, 64), (33, 80), (0, 16)] {
                    let q = rng.vec(hd);
                    let k: Vec<f16> = rng.vec(n_ctx * hd).iter().map(|&v| f16::from_f32(v)).collect();
                    let v: Vec<f16> = rng.vec(n_ctx * hd).iter().map(|&v| f16::from_f32(v)).collect();
                    let scale = 1.0 / (hd as f32).sqrt();
                    let mut scores = vec![0f32; n_ctx];
                    let mut out = vec![f32::NAN; hd];
                    ops::attention_head_strided(be, &q, &k, &v, n_ctx, hd, scale, &mut scores, &mut out).expect("attn");
                    // Reference in f64 on the f16-rounded query.
                    let q16: Vec<f64> = q.iter().map(|&x| f16::from_f32(x).to_f64()).collect();
                    let s: Vec<f64> = (0..n_ctx)
                        .map(|j| (0..hd).map(|i| k[j * hd + i].to_f64() * q16[i]).sum::<f64>() * scale as f64)
                        .collect();
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for i in 0..hd {
                        let want: f64 = (0..n_ctx).map(|j| e[j] / z * v[j * hd + i].to_f64()).sum();
                        assert!((out[i] as f64 - want).abs() < 1e-4, "n_ctx {n_ctx} dim {i}: {} vs {want}", out[i]);
                    }
                }
            }
        }
    };
}

backend_conformance!(scalar, "scalar", Some(backend::scalar()));
#[cfg(target_arch = "x86_64")]
backend_conformance!(
    avx2,
    "avx2",
    backend::avx2::Avx2::get().map(|b| b as &'static dyn KernelBackend)
);
#[cfg(target_arch = "x86_64")]
backend_conformance!(
    avx512,
    "avx512-vnni",
    backend::avx512::Avx512::get().map(|b| b as &'static dyn KernelBackend)
);
#[cfg(target_arch = "aarch64")]
backend_conformance!(
    neon,
    "neon",
    Some(backend::neon::Neon::get() as &'static dyn KernelBackend)
);
#[cfg(target_arch = "aarch64")]
backend_conformance!(
    neon_dotprod,
    "neon-dotprod",
    backend::neon::Neon::at(backend::neon::Level::DotProd).map(|b| b as &'static dyn KernelBackend)
);
#[cfg(target_arch = "aarch64")]
backend_conformance!(
    neon_i8mm,
    "neon-i8mm",
    backend::neon::Neon::at(backend::neon::Level::I8mm).map(|b| b as &'static dyn KernelBackend)
);

#[test]
fn qmatref_rejects_bad_weights() {
    use dsp::DspError;
    let buf = Aligned::new(&[0u8; 64]);
    assert!(matches!(
        QMatRef::new(GgmlType::Q8_K, 1, 256, buf.bytes()),
        Err(DspError::UnsupportedType { .. })
    ));
    assert!(matches!(
        QMatRef::new(GgmlType::Q4_1, 2, 32, &buf.bytes()[..39]),
        Err(DspError::LengthMismatch {
            expected: 40,
            actual: 39,
            ..
        })
    ));
    assert!(matches!(
        QMatRef::new(GgmlType::Q4_1, 1, 33, buf.bytes()),
        Err(DspError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        QMatRef::new(GgmlType::Q4_1, 1, 32, &buf.bytes()[1..21]),
        Err(DspError::Misaligned { .. })
    ));
    let m = QMatRef::new(GgmlType::Q4_1, 1, 32, &buf.bytes()[..20]).expect("valid");
    let pool = pool2();
    let mut y = vec![0f32; 2];
    assert!(matches!(
        dsp::matmul(&pool, &m, &[0.0; 32], 1, &mut y),
        Err(DspError::LengthMismatch {
            what: "y",
            expected: 1,
            actual: 2,
            ..
        })
    ));
}

/// The AVX-512 VNNI kernels for Q4_0/Q4_1/Q8_0 produce exactly the AVX2 kernels' integer
/// lanes (`vpdpbusd` for `maddubs` + `madd`), and float tiles the same 8-lane chains in more
/// registers, so the two backends agree bit for bit on those types and every tile shape. (The AVX-512 K-quant kernels spread their exact integer sums
/// over other lanes and differ from AVX2 in f32 rounding only; both are checked against the
/// reference above.)
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_q4_0_q4_1_q8_0_and_float_products_equal_avx2_bitwise() {
    let (Some(a2), Some(a5)) = (
        test_support::kernel_backend("avx2", backend::avx2::Avx2::get()),
        test_support::kernel_backend("avx512-vnni", backend::avx512::Avx512::get()),
    ) else {
        return;
    };
    let mut rng = Rng(19);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        let cols = 1024;
        for (rows, toks) in [(1, 1), (3, 2), (4, 4), (5, 5), (9, 8), (4, 9), (7, 70)] {
            // Large-magnitude inputs push the quants to their extremes (|q_x| = 127/128).
            let w: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 40.0).collect();
            let w = quantize_matrix(ty, &w, rows, cols);
            let x = rng.vec(toks * cols);
            let (o2, acts) = dot_tile_outputs(a2, ty, w.bytes(), &x, (rows, toks, cols));
            let (o5, _) = dot_tile_outputs(a5, ty, w.bytes(), &x, (rows, toks, cols));
            for (i, (p, q)) in o2.iter().zip(&o5).enumerate() {
                assert_eq!(
                    p.to_bits(),
                    q.to_bits(),
                    "{ty} {rows}x{toks} output {i}: {p} vs {q}"
                );
            }
            let w_row_bytes = ty.row_bytes(cols).expect("rb");
            let single = a5.vec_dot_bytes(ty, &w.bytes()[..w_row_bytes], &acts.bytes()[..acts.row_bytes]);
            assert_eq!(single.to_bits(), o2[0].to_bits(), "{ty} single dot");
        }
    }
}

/// Q4_K and Q6_K have the scalar reference's numerics on every backend that promises them
/// (AVX2 and every NEON level: per super-block the exact integer totals combined in f32 as the
/// scalar backend does, whatever the integer lanes; the cross-arch golden file pins AVX2 to
/// the other backends). Single dots and every tile shape (2-row × 4-token `smmla` tiles and
/// their odd-row and odd-token edges on `neon-i8mm`) equal the scalar dot bit for bit, on
/// random blocks with full-range scales, mins and quants and on quantized matrices.
#[test]
fn kquant_products_equal_scalar_bitwise() {
    let backends: Vec<_> = backend::available()
        .into_iter()
        .filter(|b| b.name() == "avx2" || b.name().starts_with("neon"))
        .collect();
    let mut rng = Rng(31);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for nb in [1usize, 2, 5] {
            let cols = 256 * nb;
            for (rows, toks) in [(1, 1), (2, 1), (1, 2), (3, 4), (4, 4), (5, 3), (6, 5), (2, 9), (4, 10), (5, 11), (3, 67)] {
                let random = rng.next_u64().is_multiple_of(2);
                let w = if random {
                    let blocks = rows * nb;
                    match ty {
                        GgmlType::Q4_K => Aligned::new(blocks_as_bytes(&rand_q4_k(&mut rng, blocks))),
                        _ => Aligned::new(blocks_as_bytes(&rand_q6_k(&mut rng, blocks))),
                    }
                } else {
                    let w: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 3.0).collect();
                    quantize_matrix(ty, &w, rows, cols)
                };
                let x = Aligned::new(blocks_as_bytes(&rand_q8_k(&mut rng, toks * nb)));
                let (wrb, xrb) = (ty.row_bytes(cols).expect("rb"), GgmlType::Q8_K.row_bytes(cols).expect("rb"));
                let tile = backend::DotTile { ty, w: w.bytes(), w_row_bytes: wrb, x: x.bytes(), x_row_bytes: xrb };
                for be in &backends {
                    let mut out = vec![f32::NAN; rows * toks];
                    be.dot_tile(&tile, &mut out);
                    for t in 0..toks {
                        for r in 0..rows {
                            let (wr, xr) = (&w.bytes()[r * wrb..(r + 1) * wrb], &x.bytes()[t * xrb..(t + 1) * xrb]);
                            let want = backend::scalar().vec_dot_bytes(ty, wr, xr);
                            let what = format!("{} {ty} nb={nb} {rows}x{toks} r{r} t{t} (random blocks: {random})", be.name());
                            assert_eq!(be.vec_dot_bytes(ty, wr, xr).to_bits(), want.to_bits(), "single dot, {what}");
                            assert_eq!(out[t * rows + r].to_bits(), want.to_bits(), "tile, {what}: {} vs {want}", out[t * rows + r]);
                        }
                    }
                }
            }
        }
    }
}

/// `TANDEM_REQUIRE_KERNELS=neon,neon-dotprod` (comma-separated backend names): every backend
/// named must be available on this CPU, so a CI run on the wrong machine (or an emulator at
/// the wrong CPU level) fails instead of silently skipping the per-backend tests above.
#[test]
fn required_backends_are_available() {
    let Ok(required) = std::env::var("TANDEM_REQUIRE_KERNELS") else {
        return;
    };
    let names: Vec<_> = backend::available().iter().map(|b| b.name()).collect();
    let missing: Vec<_> = required
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && !names.iter().any(|a| a.eq_ignore_ascii_case(n)))
        .collect();
    assert!(
        missing.is_empty(),
        "TANDEM_REQUIRE_KERNELS={required}: {missing:?} not available on this CPU (it has {names:?})"
    );
}

/// Every NEON level computes the same bits (dotprod's `sdot` builds the same exact i32 lanes
/// as the NEON-only `vmull` + pairwise adds; the K-quants' `smmla` tiles of `neon-i8mm` the
/// same integer totals), on every tile shape.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_levels_are_bit_identical() {
    let levels = backend::neon::Neon::all();
    let mut rng = Rng(23);
    for ty in WEIGHT_TYPES {
        let cols = 1024;
        for (rows, toks) in [(1, 1), (5, 3), (4, 9)] {
            let w: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 40.0).collect();
            let w = quantize_matrix(ty, &w, rows, cols);
            let x = rng.vec(toks * cols);
            let outs: Vec<Vec<u32>> = levels
                .iter()
                .map(|b| {
                    let (o, _) = dot_tile_outputs(*b, ty, w.bytes(), &x, (rows, toks, cols));
                    o.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for (b, o) in levels.iter().zip(&outs) {
                assert_eq!(o, &outs[0], "{ty} {rows}x{toks}: {} vs neon", b.name());
            }
        }
    }
}

/// The scalar full attention with transposed keys is attention: its outputs equal an f64
/// softmax-weighted sum of the values to f32 rounding, and a tile with too few scores is
/// refused (a panic before any access).
#[test]
fn full_attention_chains_compute_attention() {
    let be = backend::scalar();
    let mut rng = Rng(29);
    let (n_q, n_kv, hd) = (5usize, 70usize, 24usize);
    let st = n_kv.div_ceil(backend::FULL_ATTN_KV_ALIGN) * backend::FULL_ATTN_KV_ALIGN;
    let (q, k, v) = (rng.vec(n_q * hd), rng.vec(n_kv * hd), rng.vec(n_kv * hd));
    let mut kt = vec![f32::NAN; hd * st];
    for j in 0..n_kv {
        for d in 0..hd {
            kt[d * st + j] = k[j * hd + d];
        }
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let tile = backend::FullAttnTile { q: &q, kt: &kt, v: &v, n_kv, kv_stride: st, head_dim: hd, scale };
    let (mut scores, mut out) = (vec![0f32; n_q * st], vec![0f32; n_q * hd]);
    backend::full_attention_by_chains(be, &tile, &mut scores, &mut out);
    for i in 0..n_q {
        let s: Vec<f64> = (0..n_kv)
            .map(|j| (0..hd).map(|d| q[i * hd + d] as f64 * k[j * hd + d] as f64).sum::<f64>() * scale as f64)
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for c in 0..hd {
            let want: f64 = (0..n_kv).map(|j| e[j] / z * v[j * hd + c] as f64).sum();
            let got = out[i * hd + c] as f64;
            assert!((got - want).abs() <= 1e-5, "query {i} column {c}: {got} vs {want}");
        }
    }
    let short = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (mut s, mut o) = (vec![0f32; n_q * st - 1], vec![0f32; n_q * hd]);
        backend::full_attention_by_chains(be, &tile, &mut s, &mut o);
    }));
    assert!(short.is_err(), "a scores buffer one entry short must be refused");
}

/// The AVX-512 backend's SiLU, GELU (tanh), SwiGLU and softmax are the AVX2 backend's `exp`
/// and f32 operations on 16 lanes: the same bits for every element, over lengths around both
/// vector widths, inputs across the clamped range of `exp` (±110), ±0, ±inf, NaN and masked
/// (`−inf`) softmax entries.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_elementwise_equals_avx2_bitwise() {
    let (Some(a2), Some(a5)) = (
        test_support::kernel_backend("avx2", backend::avx2::Avx2::get().map(|b| b as &'static dyn KernelBackend)),
        test_support::kernel_backend("avx512-vnni", backend::avx512::Avx512::get().map(|b| b as &'static dyn KernelBackend)),
    ) else {
        return;
    };
    let mut rng = Rng(31);
    let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.7, -103.9, 120.0, -120.0, 1e-30];
    for len in [1usize, 7, 8, 15, 16, 17, 31, 33, 100, 1056] {
        for scale in [1.0f32, 12.0, 110.0] {
            let mut x: Vec<f32> = rng.vec(len).iter().map(|v| v * scale).collect();
            for (i, s) in specials.iter().enumerate().filter(|(i, _)| i * 3 < len) {
                x[i * 3] = *s;
            }
            let up = rng.vec(len);
            let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|f| f.to_bits()).collect() };
            let run = |be: &dyn KernelBackend| {
                let (mut s, mut g, mut w) = (x.clone(), x.clone(), vec![0f32; len]);
                be.silu_inplace(&mut s);
                be.gelu_tanh_inplace(&mut g);
                be.swiglu(&x, &up, &mut w);
                // Softmax of finite logits with a masked entry (NaN-free: a NaN row is all NaN).
                let mut sm: Vec<f32> = x.iter().map(|v| if v.is_finite() { v * 0.3 } else { f32::NEG_INFINITY }).collect();
                if len > 2 {
                    sm[len / 2] = 5.0;
                }
                be.softmax_inplace(&mut sm);
                [bits(&s), bits(&g), bits(&w), bits(&sm)]
            };
            let (want, got) = (run(a2), run(a5));
            for (k, name) in ["silu", "gelu_tanh", "swiglu", "softmax"].iter().enumerate() {
                assert_eq!(got[k], want[k], "{name}: len {len} scale {scale}");
            }
        }
    }
}
