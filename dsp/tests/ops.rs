//! Row ops against their textbook definitions: RMS norm, RoPE (norm and neox layouts;
//! interleaved multimodal against neox per axis and Hugging Face's pair assignment),
//! softmax, SiLU / SwiGLU, add; plus shape errors.

mod common;

use common::Rng;
use dsp::ops;
use dsp::DspError;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// f32 ops against f64 definitions: a few ulps of the largest magnitude involved.
const OP_TOL: f32 = 1e-5;
/// RoPE angles are built by repeated f32 multiplication (as ggml): relative error grows with
/// the pair index, so compare rotated values against f64 within this absolute budget for
/// positions below 4096 and unit-scale inputs.
const ROPE_TOL: f32 = 2e-3;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn rms_norm_matches_definition(d in 1usize..96, rows in 1usize..4, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let (x, w) = (rng.vec(rows * d), rng.vec(d));
        let mut out = vec![0f32; rows * d];
        ops::rms_norm(&x, &w, 1e-5, &mut out).expect("rms_norm");
        for r in 0..rows {
            let xr = &x[r * d..(r + 1) * d];
            let ms: f64 = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let s = 1.0 / (ms + 1e-5).sqrt();
            for c in 0..d {
                let want = (xr[c] as f64 * s * w[c] as f64) as f32;
                prop_assert!((out[r * d + c] - want).abs() <= OP_TOL * want.abs().max(1.0));
            }
        }
    }

    #[test]
    fn softmax_is_a_distribution(len in 1usize..200, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let x: Vec<f32> = rng.vec(len).iter().map(|v| v * 10.0).collect();
        let mut p = x.clone();
        ops::softmax_inplace(&mut p);
        let mx = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = x.iter().map(|&v| (v as f64 - mx).exp()).sum();
        for (pi, &xi) in p.iter().zip(&x) {
            prop_assert!((*pi as f64 - (xi as f64 - mx).exp() / z).abs() <= 1e-6);
        }
    }

    #[test]
    fn swiglu_is_silu_gate_times_up(len in 0usize..50, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let (g, u) = (rng.vec(len), rng.vec(len));
        let mut out = vec![0f32; len];
        ops::swiglu(&g, &u, &mut out).expect("swiglu");
        for i in 0..len {
            let gd = g[i] as f64;
            let want = (gd / (1.0 + (-gd).exp()) * u[i] as f64) as f32;
            prop_assert!((out[i] - want).abs() <= OP_TOL * want.abs().max(1.0));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))), ..ProptestConfig::default() })]

    /// The lane-wise maximum is the sequential `f32::max` fold (NaNs ignored) whatever the
    /// length, NaNs and infinities included.
    #[test]
    fn lane_max_is_the_sequential_max(len in 0usize..100, seed in any::<u64>(), specials in 0usize..4) {
        let mut rng = Rng(seed);
        let mut x: Vec<f32> = rng.vec(len).iter().map(|v| v * 10.0).collect();
        for (k, special) in [f32::NAN, f32::NEG_INFINITY, f32::INFINITY].iter().take(specials).enumerate() {
            if len > 0 {
                x[(seed as usize + 7 * k) % len] = *special;
            }
        }
        let want = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        prop_assert_eq!(ops::max_f32(&x).to_bits(), want.to_bits());
    }

    /// The f64 sum by lanes: exactly the sequential sum up to 8 elements, within f64 rounding
    /// of it beyond (the lanes' order differs, not their precision).
    #[test]
    fn lane_sum_is_the_element_sum(len in 0usize..300, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let x: Vec<f32> = rng.vec(len).iter().map(|v| (v * 10.0).exp()).collect();
        let sequential = x.iter().fold(0f64, |a, &v| a + f64::from(v));
        let lanes = ops::sum_f64_by_lanes(&x);
        if len <= 8 {
            prop_assert_eq!(lanes.to_bits(), sequential.to_bits());
        } else {
            prop_assert!((lanes - sequential).abs() <= 1e-14 * sequential);
        }
    }
}

#[test]
fn softmax_masks_negative_infinity() {
    let mut x = vec![1.0, f32::NEG_INFINITY, 1.0];
    ops::softmax_inplace(&mut x);
    assert_eq!(x, vec![0.5, 0.0, 0.5]);
}

fn rope_reference(
    x: &[f32],
    head_dim: usize,
    n_rot: usize,
    pos: u32,
    base: f32,
    neox: bool,
) -> Vec<f32> {
    let mut y = x.to_vec();
    for h in 0..x.len() / head_dim {
        for i in 0..n_rot / 2 {
            let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let (a, b) = if neox {
                (i, i + n_rot / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (x[h * head_dim + a] as f64, x[h * head_dim + b] as f64);
            y[h * head_dim + a] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
            y[h * head_dim + b] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
        }
    }
    y
}

#[test]
fn rope_matches_definition_and_leaves_unrotated_dims() {
    let mut rng = Rng(23);
    for (n_heads, head_dim, n_rot) in [(3usize, 64usize, 64usize), (2, 128, 32), (1, 8, 0)] {
        for pos in [0u32, 1, 17, 1000, 4095] {
            for neox in [false, true] {
                let x = rng.vec(n_heads * head_dim);
                let mut y = x.clone();
                let f = if neox { ops::rope_neox } else { ops::rope_norm };
                f(&mut y, n_heads, head_dim, n_rot, pos, 10000.0).expect("rope");
                let want = rope_reference(&x, head_dim, n_rot, pos, 10000.0, neox);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= ROPE_TOL,
                        "neox {neox} pos {pos} [{i}]: {a} vs {b}"
                    );
                    if i % head_dim >= n_rot {
                        assert_eq!(a, &x[i], "dims past n_rot are untouched");
                    }
                }
            }
        }
    }
}

#[test]
fn rope_at_position_zero_is_identity() {
    let mut rng = Rng(29);
    let x = rng.vec(4 * 64);
    let mut y = x.clone();
    ops::rope_norm(&mut y, 4, 64, 64, 0, 10000.0).expect("rope");
    assert_eq!(x, y);
}

#[test]
fn neox_is_norm_on_interleaved_halves() {
    // neox pairs (i, i + n/2); norm pairs (2i, 2i+1): permuting halves into pairs maps one to
    // the other exactly (same angles, same arithmetic).
    let mut rng = Rng(31);
    let (hd, n_rot) = (64, 64);
    let x = rng.vec(hd);
    let perm = |v: &[f32]| -> Vec<f32> {
        (0..hd)
            .map(|j| {
                if j % 2 == 0 {
                    v[j / 2]
                } else {
                    v[j / 2 + hd / 2]
                }
            })
            .collect()
    };
    let mut a = x.clone();
    ops::rope_neox(&mut a, 1, hd, n_rot, 77, 1e6).expect("neox");
    let mut b = perm(&x);
    ops::rope_norm(&mut b, 1, hd, n_rot, 77, 1e6).expect("norm");
    assert_eq!(perm(&a), b);
}

/// The axis (0 = t, 1 = h, 2 = w) of each rotary pair as Hugging Face's
/// `apply_interleaved_mrope` assigns them: all t, then `freqs[..., 1:3·sec[1]:3]` from h and
/// `freqs[..., 2:3·sec[2]:3]` from w.
fn hf_interleaved_axes(n_pairs: usize, sec: [usize; 3]) -> Vec<usize> {
    let mut axis = vec![0; n_pairs];
    for (a, offset) in [(1, 1), (2, 2)] {
        for j in (offset..3 * sec[a]).step_by(3) {
            axis[j] = a;
        }
    }
    axis
}

#[test]
fn imrope_of_a_text_position_is_neox_bit_for_bit() {
    // Qwen3.5's text rotary (64 of 256 dims, sections [11, 11, 10]) and the tiny fixture's
    // (8 of 32, [2, 1, 1]).
    for (hd, n_rot, sec, base) in [(256, 64, [11, 11, 10], 1e7), (32, 8, [2, 1, 1], 1e7)] {
        let mut rng = Rng(hd as u64);
        let x = rng.vec(3 * hd);
        for p in [0u32, 1, 17, 4095, 250_000] {
            let mut a = x.clone();
            ops::rope_neox(&mut a, 3, hd, n_rot, p, base).expect("neox");
            let mut b = x.clone();
            ops::rope_imrope(&mut b, 3, hd, n_rot, [p, p, p], sec, base).expect("imrope");
            assert_eq!(a, b, "hd {hd} position {p}");
        }
    }
}

#[test]
fn imrope_rotates_each_pair_by_its_axis_position() {
    for (hd, n_rot, sec) in [(256, 64, [11, 11, 10]), (32, 8, [2, 1, 1])] {
        let mut rng = Rng(n_rot as u64);
        let x = rng.vec(hd);
        let pos = [40u32, 57, 83];
        let mut got = x.clone();
        ops::rope_imrope(&mut got, 1, hd, n_rot, pos, sec, 1e7).expect("imrope");
        let by_axis: Vec<Vec<f32>> = pos
            .iter()
            .map(|&p| {
                let mut v = x.clone();
                ops::rope_neox(&mut v, 1, hd, n_rot, p, 1e7).expect("neox");
                v
            })
            .collect();
        let half = n_rot / 2;
        for (i, &a) in hf_interleaved_axes(half, sec).iter().enumerate() {
            for j in [i, i + half] {
                assert_eq!(got[j], by_axis[a][j], "pair {i} (axis {a}), dim {j}");
            }
        }
        assert_eq!(got[n_rot..], x[n_rot..], "dims past n_rot are left alone");
        // Every axis is used: the triple is not one position.
        assert_ne!(got, by_axis[0]);
    }
}

#[test]
fn imrope_refuses_sections_that_do_not_cover_the_rotary_pairs() {
    let mut x = vec![0f32; 32];
    assert!(matches!(
        ops::rope_imrope(&mut x, 1, 32, 8, [0, 0, 0], [2, 1, 0], 1e4),
        Err(DspError::InvalidArgument { what: "sections", .. })
    ));
}

#[test]
fn op_shape_errors() {
    let mut x = vec![0f32; 10];
    assert!(matches!(
        ops::rope_norm(&mut x, 2, 4, 4, 0, 1e4),
        Err(DspError::LengthMismatch {
            expected: 8,
            actual: 10,
            ..
        })
    ));
    let mut x = vec![0f32; 8];
    assert!(matches!(
        ops::rope_neox(&mut x, 2, 4, 3, 0, 1e4),
        Err(DspError::InvalidArgument { .. })
    ));
    let mut out = vec![0f32; 6];
    assert!(ops::rms_norm(&[0.0; 6], &[1.0; 4], 1e-6, &mut out).is_err());
    assert!(ops::swiglu(&[0.0; 3], &[0.0; 2], &mut [0.0; 3]).is_err());
    assert!(ops::add_inplace(&mut [0.0; 3], &[0.0; 4]).is_err());
    let k = vec![half::f16::ZERO; 8];
    let mut scores = vec![0f32; 1];
    let mut o = vec![0f32; 4];
    assert!(matches!(
        ops::attention_head(&[0.0; 4], &k, &k, 2, 1.0, &mut scores, &mut o),
        Err(DspError::LengthMismatch {
            what: "scores_scratch",
            ..
        })
    ));
}

#[test]
fn add_inplace_adds() {
    let mut a = vec![1.0f32; 19];
    let b: Vec<f32> = (0..19).map(|i| i as f32).collect();
    ops::add_inplace(&mut a, &b).expect("add");
    assert_eq!(a, (0..19).map(|i| 1.0 + i as f32).collect::<Vec<_>>());
}

/// A tile of queries (several tokens × the query heads of one KV head, each with its own
/// causal prefix) gives every query exactly the bits of a lone `attention_head_strided`, on
/// every backend; and a query that sees no position is an error.
#[test]
fn attention_queries_equal_single_heads_bitwise() {
    use half::f16;
    let mut rng = Rng(23);
    for be in dsp::backend::available() {
        for (hd, n_q, ctx0) in [(64, 1, 1), (64, 12, 5), (256, 8, 40), (32, 3, 17)] {
            let n_ctx: Vec<usize> = (0..n_q).map(|i| ctx0 + i / 2).collect();
            let max_ctx = *n_ctx.iter().max().expect("n_q > 0");
            let k: Vec<f16> = rng
                .vec(max_ctx * hd)
                .iter()
                .map(|&x| f16::from_f32(x))
                .collect();
            let v: Vec<f16> = rng
                .vec(max_ctx * hd)
                .iter()
                .map(|&x| f16::from_f32(x))
                .collect();
            let qs: Vec<f32> = rng.vec(n_q * hd).iter().map(|x| x * 3.0).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let mut scores = vec![0f32; n_q * max_ctx];
            let mut out = vec![0f32; n_q * hd];
            ops::attention_queries(be, &qs, &n_ctx, hd, &k, &v, scale, &mut scores, &mut out)
                .expect("shapes");
            for i in 0..n_q {
                let mut s1 = vec![0f32; n_ctx[i]];
                let mut o1 = vec![0f32; hd];
                ops::attention_head_strided(
                    be,
                    &qs[i * hd..(i + 1) * hd],
                    &k,
                    &v,
                    n_ctx[i],
                    hd,
                    scale,
                    &mut s1,
                    &mut o1,
                )
                .expect("shapes");
                for (d, (a, b)) in out[i * hd..(i + 1) * hd].iter().zip(&o1).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} hd {hd} query {i} dim {d}",
                        be.name()
                    );
                }
            }
        }
    }
    let k = vec![half::f16::ZERO; 8];
    let err = ops::attention_queries(
        dsp::backend::scalar(),
        &[0.0; 8],
        &[0],
        8,
        &k,
        &k,
        1.0,
        &mut [0.0; 8],
        &mut [0.0; 8],
    );
    assert!(
        matches!(err, Err(DspError::InvalidArgument { .. })),
        "{err:?}"
    );
}
