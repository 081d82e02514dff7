//! A fixed Q4_K product on the `neon-dotprod` backend, for `tools/aarch64/insn_dynamic.sh`,
//! which runs it under `qemu-aarch64` with one instruction per translation block and counts
//! the instructions executed inside a kernel function.
//! Usage (aarch64 only): `neon_insn_driver single|tile4|tile4-i8mm SUPER_BLOCKS [ROWS [TYPE]]`
//! (TYPE `q4_k`, the default, or `q6_k`):
//! - `single`: one dot product (`vec_dot_q4_k_q8_k`, i.e. `neon_kquants::single_dot`);
//! - `tile4`: one `dot_tile` of 1 weight row × 4 tokens (`neon_kquants::tile_dot`, the
//!   multi-column verification tile) on `neon-dotprod`;
//! - `tile4-i8mm`: one `dot_tile` of `ROWS` (default 2) weight rows × 4 tokens on `neon-i8mm`
//!   (`neon_i8mm::dot_tile_kquant`, `smmla` tiles of 2 rows, Q4_K 4 rows while 4 are left;
//!   needs `QEMU_CPU=max`).
//!
//! The data are quantized pseudo-random values; the kernels have no data-dependent branches,
//! so the counts depend only on the shape.

#[cfg(target_arch = "aarch64")]
mod common;

#[cfg(target_arch = "aarch64")]
fn main() {
    use dsp::backend::neon::{Level, Neon};
    use dsp::backend::{DotTile, KernelBackend};
    use dsp::quant::blocks::{blocks_as_bytes, BlockQ4K, BlockQ6K};
    use dsp::quant::{quantize_row_q4_k_simple, quantize_row_q6_k_simple, GgmlType};
    use dsp::ThreadPool;
    use half::f16;

    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("single");
    let nb: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    let rows: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let ty = match args.get(4).map(String::as_str).unwrap_or("q4_k") {
        "q4_k" => GgmlType::Q4_K,
        "q6_k" => GgmlType::Q6_K,
        other => {
            eprintln!("neon_insn_driver: TYPE {other} is not q4_k or q6_k");
            std::process::exit(2)
        }
    };
    let (toks, rows, level) = match mode {
        "single" => (1, 1, Level::DotProd),
        "tile4" => (4, 1, Level::DotProd),
        "tile4-i8mm" => (4, rows, Level::I8mm),
        _ => {
            eprintln!("usage: neon_insn_driver single|tile4|tile4-i8mm SUPER_BLOCKS [ROWS [TYPE]]");
            std::process::exit(2)
        }
    };
    let be = Neon::at(level).unwrap_or_else(|| panic!("this CPU (QEMU_CPU) has no {level:?}"));
    let cols = 256 * nb;
    let mut lcg = common::Lcg(7);
    let mut rnd = |k: usize| lcg.vec(k);
    let wbytes: Vec<u8> = if ty == GgmlType::Q4_K {
        let z = BlockQ4K {
            d: f16::ZERO,
            dmin: f16::ZERO,
            scales: [0; 12],
            qs: [0; 128],
        };
        let mut w = vec![z; rows * nb];
        for row in w.chunks_exact_mut(nb) {
            quantize_row_q4_k_simple(&rnd(cols), row).expect("quantize");
        }
        blocks_as_bytes(&w).to_vec()
    } else {
        let z = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: f16::ZERO,
        };
        let mut w = vec![z; rows * nb];
        for row in w.chunks_exact_mut(nb) {
            quantize_row_q6_k_simple(&rnd(cols), row).expect("quantize");
        }
        blocks_as_bytes(&w).to_vec()
    };
    let pool = ThreadPool::new(1).expect("pool");
    let x = rnd(toks * cols);
    let acts = dsp::matmul::quantize_activations(&pool, GgmlType::Q8_K, &x, toks, cols)
        .expect("quantize activations");
    let wb = &wbytes[..];
    let sum: f32 = if toks == 1 {
        be.vec_dot_bytes(ty, wb, acts.bytes())
    } else {
        let tile = DotTile {
            ty,
            w: wb,
            w_row_bytes: wb.len() / rows,
            x: acts.bytes(),
            x_row_bytes: acts.row_bytes,
        };
        let mut out = vec![0f32; rows * toks];
        be.dot_tile(&tile, &mut out);
        out.iter().sum()
    };
    println!("{mode} nb={nb}: {sum}");
}

#[cfg(not(target_arch = "aarch64"))]
fn main() {
    eprintln!("neon_insn_driver: aarch64 only (run it under qemu-aarch64)");
}
