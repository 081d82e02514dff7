//! The NEON backends compute the AVX2 backend's bits: a fixed set of kernel outputs (tiles of
//! every weight type, float dots, RMS norm, SiLU, SwiGLU, softmax, axpy) recorded from the
//! x86_64 `avx2` backend in `tests/fixtures/avx2_golden.txt` must come out bit for bit from
//! every backend that promises the AVX2 numerics (`avx2` itself and `neon*`), so that an
//! aarch64 build decodes the same greedy tokens as an x86_64 one. (Q4_K and Q6_K have the
//! scalar reference's numerics on all of them, per super-block exact integer totals combined
//! in f32 as `backend::scalar` does; `conformance.rs::kquant_products_equal_scalar_bitwise`
//! checks that on each CPU, this file across them.)
//!
//! Regenerate on an x86_64 machine with AVX2 (after a deliberate change of the numerics):
//! `TANDEM_WRITE_GOLDEN=1 cargo test -p tandem-dsp --test cross_arch`.

mod common;

use common::{dot_tile_outputs, quantize_matrix, Rng, WEIGHT_TYPES};
use dsp::backend::{self, KernelBackend};
use half::{bf16, f16};

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/avx2_golden.txt"
);

/// `label bits` lines of every recorded output.
fn outputs(be: &dyn KernelBackend) -> Vec<String> {
    let mut lines = Vec::new();
    let mut put = |label: String, v: &[f32]| {
        for (i, x) in v.iter().enumerate() {
            lines.push(format!("{label}[{i}] {:08x}", x.to_bits()));
        }
    };
    let mut rng = Rng(2026);
    for ty in WEIGHT_TYPES {
        let cols = 1536;
        for (rows, toks) in [(1, 1), (5, 3)] {
            let w: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 3.0).collect();
            let w = quantize_matrix(ty, &w, rows, cols);
            let x = rng.vec(toks * cols);
            let (out, _) = dot_tile_outputs(be, ty, w.bytes(), &x, (rows, toks, cols));
            put(format!("tile_{ty}_{rows}x{toks}"), &out);
        }
    }
    for len in [7, 64, 101] {
        let a = rng.vec(len);
        let b = rng.vec(len);
        let (ah, bh): (Vec<f16>, Vec<f16>) = (
            a.iter().map(|&v| f16::from_f32(v)).collect(),
            b.iter().map(|&v| f16::from_f32(v)).collect(),
        );
        let (ab, bb): (Vec<bf16>, Vec<bf16>) = (
            a.iter().map(|&v| bf16::from_f32(v)).collect(),
            b.iter().map(|&v| bf16::from_f32(v)).collect(),
        );
        put(
            format!("dots_{len}"),
            &[
                be.vec_dot_f32(&a, &b),
                be.vec_dot_f16(&ah, &bh),
                be.vec_dot_bf16(&ab, &bb),
            ],
        );
        let g: Vec<f32> = rng.vec(len).iter().map(|v| v * 1.5 + 1.0).collect();
        let mut o = vec![0f32; len];
        be.rms_norm_row(&a, &g, 1e-6, &mut o);
        put(format!("rms_{len}"), &o);
        let x: Vec<f32> = a.iter().map(|v| v * 9.0).collect();
        let mut s = x.clone();
        be.silu_inplace(&mut s);
        put(format!("silu_{len}"), &s);
        be.swiglu(&x, &b, &mut o);
        put(format!("swiglu_{len}"), &o);
        let mut sm = x.clone();
        sm[len / 2] = f32::NEG_INFINITY;
        be.softmax_inplace(&mut sm);
        put(format!("softmax_{len}"), &sm);
        let mut acc = b.clone();
        be.axpy_f16(&mut acc, 0.37, &ah);
        be.add_inplace(&mut acc, &a);
        put(format!("axpy_add_{len}"), &acc);
    }
    lines
}

#[test]
fn avx2_numerics_backends_match_the_recorded_avx2_outputs() {
    if std::env::var_os("TANDEM_WRITE_GOLDEN").is_some() {
        let be = backend::available()
            .into_iter()
            .find(|b| b.name() == "avx2")
            .expect("TANDEM_WRITE_GOLDEN needs an x86_64 CPU with AVX2");
        std::fs::write(GOLDEN, outputs(be).join("\n") + "\n").expect("write golden");
        return;
    }
    let golden = std::fs::read_to_string(GOLDEN).expect("golden fixture");
    let want: Vec<&str> = golden.lines().collect();
    let mut checked = 0;
    for be in backend::available() {
        if !(be.name() == "avx2" || be.name().starts_with("neon")) {
            continue;
        }
        let got = outputs(be);
        assert_eq!(got.len(), want.len(), "{}: output count", be.name());
        let diffs: Vec<_> = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g != w)
            .map(|(g, w)| format!("got {g}, avx2 {w}"))
            .collect();
        assert!(
            diffs.is_empty(),
            "{}: {} of {} differ from avx2: {:#?}",
            be.name(),
            diffs.len(),
            want.len(),
            &diffs[..diffs.len().min(12)]
        );
        checked += 1;
    }
    if checked == 0 {
        eprintln!("skipped: no backend with the AVX2 numerics on this CPU");
    }
}
