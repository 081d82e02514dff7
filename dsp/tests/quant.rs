//! GGML block formats: dequantization against fixtures from gguf-py (an independent
//! implementation), quantize → dequantize error budgets, and the quantizers' defining rules.

mod common;

use common::{quantize_matrix, Rng};
use dsp::quant::blocks::{as_blocks, BlockQ8K, BlockQ8_0, BlockQ8_1};
use dsp::quant::{
    dequantize_row, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k, GgmlType,
};
use dsp::DspError;
use half::f16;

/// Round-trip budgets: RMS error / RMS of Gaussian data. Uniform rounding error of a step
/// `s` has RMS `s / sqrt(12)`; 4-bit blocks have steps ~ 0.3σ (→ ~0.09), 6-bit ~ 0.07σ,
/// 8-bit ~ 0.02σ; budgets add ~30% margin (K-quants also round their scales).
const BUDGET_Q8: f64 = 0.01;
const BUDGET_Q6_K: f64 = 0.03;
const BUDGET_Q4: f64 = 0.12;
const BUDGET_Q4_K: f64 = 0.15;
const BUDGET_F16: f64 = 5e-4;
const BUDGET_BF16: f64 = 4e-3;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

#[test]
fn dequantize_matches_gguf_py_fixtures() {
    for (name, ty) in [
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q8_0", GgmlType::Q8_0),
        ("q4_k", GgmlType::Q4_K),
        ("q6_k", GgmlType::Q6_K),
        ("f16", GgmlType::F16),
        ("bf16", GgmlType::BF16),
    ] {
        let raw = common::Aligned::new(&fixture(&format!("{name}.blocks.bin")));
        let want: Vec<f32> = fixture(&format!("{name}.f32.bin"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, raw.bytes(), &mut got).expect("dequantize");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs gguf-py {w}");
        }
    }
}

#[test]
fn quantize_dequantize_round_trip_within_budget() {
    let mut rng = Rng(3);
    let cols = 1024;
    let rows = 8;
    let x = rng.vec(rows * cols);
    for (ty, budget) in [
        (GgmlType::Q8_0, BUDGET_Q8),
        (GgmlType::Q4_0, BUDGET_Q4),
        (GgmlType::Q4_1, BUDGET_Q4),
        (GgmlType::Q4_K, BUDGET_Q4_K),
        (GgmlType::Q6_K, BUDGET_Q6_K),
        (GgmlType::F16, BUDGET_F16),
        (GgmlType::BF16, BUDGET_BF16),
    ] {
        let q = quantize_matrix(ty, &x, rows, cols);
        let d = common::dequantize_matrix(ty, q.bytes(), rows, cols);
        let err: f64 = x
            .iter()
            .zip(&d)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>();
        let norm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum::<f64>();
        let rel = (err / norm).sqrt();
        assert!(rel <= budget, "{ty}: relative RMS error {rel} > {budget}");
        assert!(
            rel > 0.0 || ty == GgmlType::F32,
            "{ty}: lossless round trip is suspicious"
        );
    }
}

#[test]
fn activation_quantizers_round_trip_within_budget() {
    let mut rng = Rng(5);
    let x = rng.vec(1024);
    let mut q0 = vec![
        BlockQ8_0 {
            d: f16::ZERO,
            qs: [0; 32]
        };
        32
    ];
    let mut q1 = vec![
        BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32]
        };
        32
    ];
    let mut qk = vec![
        BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16]
        };
        4
    ];
    quantize_row_q8_0(&x, &mut q0).expect("q8_0");
    quantize_row_q8_1(&x, &mut q1).expect("q8_1");
    quantize_row_q8_k(&x, &mut qk).expect("q8_K");
    for (ty, bytes) in [
        (GgmlType::Q8_0, dsp::quant::blocks::blocks_as_bytes(&q0)),
        (GgmlType::Q8_1, dsp::quant::blocks::blocks_as_bytes(&q1)),
        (GgmlType::Q8_K, dsp::quant::blocks::blocks_as_bytes(&qk)),
    ] {
        let mut d = vec![0f32; 1024];
        dequantize_row(ty, bytes, &mut d).expect("dequantize");
        let err: f64 = x
            .iter()
            .zip(&d)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        assert!(
            (err / norm).sqrt() <= BUDGET_Q8,
            "{ty}: {}",
            (err / norm).sqrt()
        );
    }
    // Q8_1's s is d * sum(q) (with the unrounded f32 d, then stored as f16: two f16
    // roundings of slack); Q8_K's bsums are the sums of 16 quants.
    for b in &q1 {
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        let want = sum as f32 * b.d.to_f32();
        assert!(
            (b.s.to_f32() - want).abs() <= want.abs() / 512.0,
            "s {} vs {want}",
            b.s
        );
    }
    for b in &qk {
        for k in 0..16 {
            assert_eq!(
                b.bsums[k] as i32,
                b.qs[16 * k..16 * k + 16]
                    .iter()
                    .map(|&q| q as i32)
                    .sum::<i32>()
            );
        }
    }
}

#[test]
fn q8_0_rounds_half_to_even_like_ggml_x86() {
    // amax = 127 gives d = 1 and id = 1 exactly, so x * id is x: halves show the rounding rule
    // (ggml's x86 quantizer uses _MM_ROUND_NEAREST: ties to even).
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    x[4] = 0.49;
    let mut y = [BlockQ8_0 {
        d: f16::ZERO,
        qs: [0; 32],
    }];
    quantize_row_q8_0(&x, &mut y).expect("q8_0");
    assert_eq!(y[0].d.to_f32(), 1.0);
    assert_eq!(&y[0].qs[..5], &[127, 2, -2, 4, 0]);
}

#[test]
fn q8_k_uses_the_signed_max_and_rounds_half_to_even() {
    // max = -127 (largest magnitude, negative): iscale = 1, d = 1; nearest_int rounds halves
    // to even; the largest-magnitude value maps to -127 and 127 is the cap.
    let mut x = [0f32; 256];
    x[0] = -127.0;
    x[1] = 2.5;
    x[2] = 3.5;
    x[3] = -0.5;
    let mut y = [BlockQ8K {
        d: 0.0,
        qs: [0; 256],
        bsums: [0; 16],
    }];
    quantize_row_q8_k(&x, &mut y).expect("q8_K");
    assert_eq!(y[0].d, 1.0);
    assert_eq!(&y[0].qs[..4], &[-127, 2, 4, 0]);
    assert_eq!(y[0].bsums[0], -127 + 2 + 4);
}

#[test]
fn all_zero_blocks_quantize_to_zero_scale() {
    let x = [0f32; 256];
    let mut y = [BlockQ8K {
        d: 1.0,
        qs: [1; 256],
        bsums: [1; 16],
    }];
    quantize_row_q8_k(&x, &mut y).expect("q8_K");
    assert_eq!((y[0].d, y[0].qs, y[0].bsums), (0.0, [0; 256], [0; 16]));
}

#[test]
fn bad_shapes_are_errors() {
    let mut y = [BlockQ8_0 {
        d: f16::ZERO,
        qs: [0; 32],
    }; 2];
    assert!(matches!(
        quantize_row_q8_0(&[0.0; 33], &mut y),
        Err(DspError::NotBlockMultiple {
            n: 33,
            block: 32,
            ..
        })
    ));
    assert!(matches!(
        quantize_row_q8_0(&[0.0; 32], &mut y),
        Err(DspError::LengthMismatch {
            expected: 1,
            actual: 2,
            ..
        })
    ));
    let mut out = [0f32; 32];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out),
        Err(DspError::LengthMismatch {
            expected: 18,
            actual: 17,
            ..
        })
    ));
    let buf = common::Aligned::new(&[0u8; 40]);
    assert!(matches!(
        dequantize_row(GgmlType::Q4_1, &buf.bytes()[1..21], &mut out),
        Err(DspError::Misaligned { align: 2, .. })
    ));
    assert!(as_blocks::<BlockQ8_0>(&buf.bytes()[..35]).is_err());
}

/// ggml's `quantize_row_q8_K_ref` written as the plain loop it is (first value of largest
/// magnitude wins; `>` skips NaN), against which the vectorised quantizer must agree bit for
/// bit.
fn q8_k_reference(xb: &[f32]) -> BlockQ8K {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut y = BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] };
    if amax == 0.0 {
        return y;
    }
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(xb) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, qs) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = qs.iter().map(|&q| q as i16).sum();
    }
    y.d = 1.0 / iscale;
    y
}

#[test]
fn q8_k_equals_the_reference_loop_bit_for_bit() {
    let mut rng = Rng(0x2545_f491);
    for case in 0..400 {
        let mut x: Vec<f32> = (0..512).map(|_| rng.unit() * 4.0).collect();
        match case % 5 {
            // Equal magnitudes of both signs: the first one sets the sign of the scale.
            1 => {
                x[17] = 9.0;
                x[3] = -9.0;
                x[300] = 9.0;
                x[260] = -9.0;
            }
            // NaN is never the maximum; infinities and subnormals pass through.
            2 => {
                x[5] = f32::NAN;
                x[6] = 1e-40;
                x[400] = f32::NAN;
            }
            3 => x[..256].fill(0.0),
            4 => x[100] = -f32::INFINITY,
            _ => {}
        }
        let mut y = vec![BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }; 2];
        quantize_row_q8_k(&x, &mut y).expect("q8_K");
        for (b, yb) in y.iter().enumerate() {
            let r = q8_k_reference(&x[256 * b..256 * (b + 1)]);
            assert_eq!(yb.d.to_bits(), r.d.to_bits(), "case {case} block {b}: d");
            assert_eq!((yb.qs, yb.bsums), (r.qs, r.bsums), "case {case} block {b}");
        }
    }
}

/// ggml's x86 Q8_0 / Q8_1 activation quantizer written as the plain loop it is (`amax` by
/// `f32::max`, which skips NaN; `id = 127 / amax`; ties to even; NaN → 0), against which the
/// vectorised quantizers must agree bit for bit: `(d, s, qs)` of one block.
fn q8_reference(xb: &[f32]) -> (f16, f16, [i8; 32]) {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (d, id) = (amax / 127.0, if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xb) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (f16::from_f32(d), f16::from_f32(sum as f32 * d), qs)
}

#[test]
fn q8_0_and_q8_1_equal_the_reference_loop_bit_for_bit() {
    let mut rng = Rng(0x9e37_79b9);
    for case in 0..600 {
        let mut x: Vec<f32> = (0..256).map(|_| rng.unit() * 4.0).collect();
        match case % 6 {
            // NaN is never the maximum (and quantizes to 0); subnormals pass through.
            1 => {
                x[5] = f32::NAN;
                x[6] = 1e-40;
                x[200] = -f32::NAN;
            }
            2 => x[..64].fill(0.0),
            3 => x[100] = -f32::INFINITY,
            // Exact halves: amax 127 makes id 1, so the ties reach the rounding as they are.
            4 => {
                for (i, v) in x[32..64].iter_mut().enumerate() {
                    *v = i as f32 - 15.5;
                }
                x[40] = -127.0;
            }
            5 => x[128..160].fill(-0.0),
            _ => {}
        }
        let mut y0 = vec![BlockQ8_0 { d: f16::ZERO, qs: [0; 32] }; 8];
        let mut y1 = vec![BlockQ8_1 { d: f16::ZERO, s: f16::ZERO, qs: [0; 32] }; 8];
        quantize_row_q8_0(&x, &mut y0).expect("q8_0");
        quantize_row_q8_1(&x, &mut y1).expect("q8_1");
        for b in 0..8 {
            let (d, s, qs) = q8_reference(&x[32 * b..32 * (b + 1)]);
            assert_eq!((y0[b].d.to_bits(), y0[b].qs), (d.to_bits(), qs), "q8_0 case {case} block {b}");
            assert_eq!(
                (y1[b].d.to_bits(), y1[b].s.to_bits(), y1[b].qs),
                (d.to_bits(), s.to_bits(), qs),
                "q8_1 case {case} block {b}"
            );
        }
    }
}
