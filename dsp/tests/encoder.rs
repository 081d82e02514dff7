//! Encoder kernels (`dsp::encoder`) against their textbook definitions in f64: LayerNorm,
//! both GELU forms, NEOX rotation by given angles, bilinear grid resampling (both
//! conventions), full attention (and the selected backend against the scalar one); plus
//! shape errors.

mod common;

use common::Rng;
use dsp::encoder::{
    attention_full, gelu_erf, gelu_tanh, layer_norm, resize_bilinear, rope_neox_angles, Bilinear,
    Gelu,
};
use dsp::{ops, DspError};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use test_support::{assert_close, max_abs_diff};

/// f32 ops against f64 definitions: a few ulps of the magnitudes involved.
const OP_TOL: f32 = 1e-5;
/// Attention against its f64 definition: f32 dots over up to 64 dims and f32 value sums over
/// up to 100 positions of unit-scale data.
const ATTN_TOL: f32 = 2e-5;
/// The selected backend's attention against the scalar backend's: the SIMD dot products
/// sum in another order (f32 lanes instead of an f64 running sum).
const BACKEND_TOL: f32 = 1e-5;

fn gelu_tanh_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

fn gelu_erf_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn layer_norm_matches_definition(d in 1usize..96, rows in 1usize..4, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let (x, w, b) = (rng.vec(rows * d), rng.vec(d), rng.vec(d));
        let mut out = vec![0f32; rows * d];
        layer_norm(&x, &w, &b, 1e-6, &mut out).expect("layer_norm");
        for r in 0..rows {
            let xr = &x[r * d..(r + 1) * d];
            let mean = xr.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
            let var = xr.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / d as f64;
            for c in 0..d {
                let want = ((f64::from(xr[c]) - mean) / (var + 1e-6).sqrt() * f64::from(w[c])
                    + f64::from(b[c])) as f32;
                let got = out[r * d + c];
                prop_assert!((got - want).abs() <= OP_TOL * want.abs().max(1.0), "{got} vs {want}");
            }
        }
    }

    #[test]
    fn gelu_forms_match_definitions(x in -12f32..12f32) {
        let (t, e) = (gelu_tanh_f64(f64::from(x)) as f32, gelu_erf_f64(f64::from(x)) as f32);
        prop_assert!((gelu_tanh(x) - t).abs() <= OP_TOL * t.abs().max(1.0));
        prop_assert!((gelu_erf(x) - e).abs() <= OP_TOL * e.abs().max(1.0));
        prop_assert_eq!(Gelu::Tanh.apply(x), gelu_tanh(x));
        prop_assert_eq!(Gelu::Erf.apply(x), gelu_erf(x));
    }

    #[test]
    fn attention_matches_definition(n in 1usize..100, hd in 1usize..64, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let stride = hd + 3;
        let (q, k, v) = (rng.vec(n * stride), rng.vec(n * stride), rng.vec(n * stride));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut scores = vec![0f32; n];
        let mut out = vec![0f32; n * hd];
        attention_full(dsp::backend::scalar(), &q, &k, &v, (n, hd, stride), 0..n, scale, &mut scores, &mut out, hd)
            .expect("attention");
        let want = attention_f64(&q, &k, &v, n, hd, stride, scale);
        assert_close(&out, &want, ATTN_TOL, "attention vs f64");
        let mut fast = vec![0f32; n * hd];
        attention_full(dsp::select(), &q, &k, &v, (n, hd, stride), 0..n, scale, &mut scores, &mut fast, hd)
            .expect("attention");
        assert_close(&fast, &out, BACKEND_TOL, "selected backend vs scalar");
    }
}

fn attention_f64(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    hd: usize,
    stride: usize,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; n * hd];
    for i in 0..n {
        let s: Vec<f64> = (0..n)
            .map(|j| {
                (0..hd)
                    .map(|d| f64::from(q[i * stride + d]) * f64::from(k[j * stride + d]))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|&x| (x - max).exp()).collect();
        let z: f64 = e.iter().sum();
        for d in 0..hd {
            let acc: f64 = (0..n).map(|j| e[j] / z * f64::from(v[j * stride + d])).sum();
            out[i * hd + d] = acc as f32;
        }
    }
    out
}

/// Attention sees every position: permuting the keys and values together leaves each
/// query's output unchanged (up to summation order), and a query range computes the same
/// rows as the whole.
#[test]
fn attention_is_non_causal_and_query_ranges_agree() {
    let (n, hd) = (37, 16);
    let mut rng = Rng(7);
    let (q, k, v) = (rng.vec(n * hd), rng.vec(n * hd), rng.vec(n * hd));
    let be = dsp::backend::scalar();
    let mut scores = vec![0f32; n];
    let mut all = vec![0f32; n * hd];
    attention_full(be, &q, &k, &v, (n, hd, hd), 0..n, 0.25, &mut scores, &mut all, hd).unwrap();
    let perm: Vec<usize> = (0..n).rev().collect();
    let shuffle = |x: &[f32]| -> Vec<f32> {
        perm.iter()
            .flat_map(|&j| x[j * hd..(j + 1) * hd].to_vec())
            .collect()
    };
    let (kp, vp) = (shuffle(&k), shuffle(&v));
    let mut permuted = vec![0f32; n * hd];
    attention_full(be, &q, &kp, &vp, (n, hd, hd), 0..n, 0.25, &mut scores, &mut permuted, hd)
        .unwrap();
    assert_close(&permuted, &all, 1e-5, "keys permuted");
    // The first query's output depends on the last key: not causal.
    let mut k2 = k.clone();
    k2[(n - 1) * hd] += 5.0;
    let mut first = vec![0f32; hd];
    attention_full(be, &q, &k2, &v, (n, hd, hd), 0..1, 0.25, &mut scores, &mut first, hd).unwrap();
    assert!(max_abs_diff(&first, &all[..hd]) > 1e-4);
    let mut part = vec![0f32; 5 * hd];
    attention_full(be, &q, &k, &v, (n, hd, hd), 10..15, 0.25, &mut scores, &mut part, hd).unwrap();
    assert_close(&part, &all[10 * hd..15 * hd], 0.0, "rows 10..15");
}

#[test]
fn rope_by_angles_equals_rope_neox_with_its_angles() {
    let (heads, hd) = (3, 16);
    let mut rng = Rng(11);
    let x = rng.vec(heads * hd);
    let mut a = x.clone();
    ops::rope_neox(&mut a, heads, hd, hd, 41, 1e4).unwrap();
    let mut b = x;
    rope_neox_angles(&mut b, heads, hd, &ops::rope_angles(hd, 41, 1e4)).unwrap();
    assert_close(&b, &a, 0.0, "same angles, same rotation");
}

/// A `h × w` grid of `c` channels whose channel 0 is `f(row, col)` and channel 1 a constant.
fn grid(h: usize, w: usize, f: impl Fn(f32, f32) -> f32) -> Vec<f32> {
    (0..h * w)
        .flat_map(|i| [f((i / w) as f32, (i % w) as f32), 2.5])
        .collect()
}

#[test]
fn align_corners_reproduces_a_linear_ramp_and_its_corners() {
    let src = grid(8, 8, |r, c| 3.0 * r - c);
    let (oh, ow) = (38, 16);
    let mut out = vec![0f32; oh * ow * 2];
    resize_bilinear(&src, (8, 8), 2, (oh, ow), Bilinear::AlignCorners, &mut out).unwrap();
    for y in 0..oh {
        for x in 0..ow {
            let (r, c) = (y as f32 * 7.0 / 37.0, x as f32 * 7.0 / 15.0);
            let got = out[(y * ow + x) * 2];
            assert!((got - (3.0 * r - c)).abs() < 1e-4, "({y},{x}): {got}");
            assert!((out[(y * ow + x) * 2 + 1] - 2.5).abs() < 1e-6);
        }
    }
    assert_eq!(out[0], src[0]);
    assert_eq!(out[(oh * ow - 1) * 2], src[(64 - 1) * 2]);
}

#[test]
fn antialias_upsampling_is_pixel_centre_bilinear_inside_and_keeps_constants() {
    let src = grid(8, 8, |r, c| r + 2.0 * c);
    let (oh, ow) = (24, 16);
    let mut out = vec![0f32; oh * ow * 2];
    resize_bilinear(&src, (8, 8), 2, (oh, ow), Bilinear::Antialias, &mut out).unwrap();
    for y in 0..oh {
        for x in 0..ow {
            let (r, c) = ((y as f32 + 0.5) * 8.0 / 24.0 - 0.5, (x as f32 + 0.5) * 0.5 - 0.5);
            let at = (y * ow + x) * 2;
            assert!((out[at + 1] - 2.5).abs() < 1e-6, "constant channel");
            if (0.0..=7.0).contains(&r) && (0.0..=7.0).contains(&c) {
                assert!((out[at] - (r + 2.0 * c)).abs() < 1e-4, "({y},{x}): {}", out[at]);
            }
        }
    }
}

#[test]
fn antialias_downsampling_by_two_is_the_widened_triangle() {
    // 1-D along x: output i averages inputs 2i-1..=2i+2 with weights 1/8, 3/8, 3/8, 1/8
    // (renormalised at the edges).
    let src: Vec<f32> = (0..8).map(|i| (i * i) as f32).collect();
    let mut out = vec![0f32; 4];
    resize_bilinear(&src, (1, 8), 1, (1, 4), Bilinear::Antialias, &mut out).unwrap();
    let at = |i: i64| src[i as usize];
    let inner = |i: i64| (at(2 * i - 1) + 3.0 * at(2 * i) + 3.0 * at(2 * i + 1) + at(2 * i + 2)) / 8.0;
    assert!((out[1] - inner(1)).abs() < 1e-5 && (out[2] - inner(2)).abs() < 1e-5);
    let edge0 = (3.0 * at(0) + 3.0 * at(1) + at(2)) / 7.0;
    assert!((out[0] - edge0).abs() < 1e-5, "{} vs {edge0}", out[0]);
}

#[test]
fn both_modes_leave_a_grid_of_the_same_size_unchanged() {
    let mut rng = Rng(3);
    let src = rng.vec(6 * 5 * 3);
    for mode in [Bilinear::AlignCorners, Bilinear::Antialias] {
        let mut out = vec![0f32; src.len()];
        resize_bilinear(&src, (6, 5), 3, (6, 5), mode, &mut out).unwrap();
        assert_close(&out, &src, 0.0, "same size");
    }
}

#[test]
fn shape_errors_are_typed() {
    let mut out = vec![0f32; 4];
    assert!(matches!(
        layer_norm(&[1.0; 4], &[1.0; 2], &[0.0; 3], 1e-6, &mut out),
        Err(DspError::LengthMismatch { what: "b", .. })
    ));
    assert!(matches!(
        resize_bilinear(&[0.0; 4], (0, 4), 1, (2, 2), Bilinear::Antialias, &mut out),
        Err(DspError::InvalidArgument { .. })
    ));
    assert!(matches!(
        resize_bilinear(&[0.0; 3], (2, 2), 1, (2, 2), Bilinear::Antialias, &mut out),
        Err(DspError::LengthMismatch { what: "src", .. })
    ));
    let mut s = vec![0f32; 2];
    assert!(matches!(
        attention_full(dsp::backend::scalar(), &[0.0; 4], &[0.0; 4], &[0.0; 3], (2, 2, 2), 0..2, 1.0, &mut s, &mut out, 2),
        Err(DspError::LengthMismatch { what: "v", .. })
    ));
    assert!(matches!(
        rope_neox_angles(&mut [0.0; 6], 1, 6, &[(1.0, 0.0); 2]),
        Err(DspError::LengthMismatch { what: "cs", .. })
    ));
}
