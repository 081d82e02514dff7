//! Shared helpers for the dsp integration tests: a seeded PRNG, aligned byte buffers, random
//! blocks and quantized weight matrices.
#![allow(dead_code)]

use dsp::quant::blocks::{
    as_blocks_mut, blocks_as_bytes, Block, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1,
};
use dsp::DspError;
use dsp::quant::{self, GgmlType};
use half::{bf16, f16};

/// splitmix64: small, seedable, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Roughly normal (sum of 4 uniforms), unit variance.
    pub fn normal(&mut self) -> f32 {
        (self.unit() + self.unit() + self.unit() + self.unit()) * 0.866
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    /// A quant in -127..=127 (what ggml's quantizers produce).
    pub fn q8_sym(&mut self) -> i8 {
        ((self.next_u64() % 255) as i32 - 127) as i8
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
}

/// Bytes with 8-byte alignment (block views need 2 or 4).
pub struct Aligned {
    buf: Vec<u64>,
    len: usize,
}

impl Aligned {
    pub fn new(bytes: &[u8]) -> Self {
        let mut buf = vec![0u64; bytes.len().div_ceil(8)];
        for (i, &b) in bytes.iter().enumerate() {
            buf[i / 8] |= (b as u64) << (8 * (i % 8));
        }
        Aligned {
            buf,
            len: bytes.len(),
        }
    }
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Aligned {
            buf: vec![0u64; len.div_ceil(8)],
            len,
        }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `buf` is borrowed mutably for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), self.len) }
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `buf` holds `len` initialised bytes (little-endian packing above matches the
        // memory order on the little-endian targets we run on), u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len) }
    }
}

pub fn f16r(rng: &mut Rng, scale: f32) -> f16 {
    f16::from_f32(rng.unit() * scale)
}

/// `nb` blocks, each made by `block` from `rng`.
fn random_blocks<B>(rng: &mut Rng, nb: usize, mut block: impl FnMut(&mut Rng) -> B) -> Vec<B> {
    (0..nb).map(|_| block(rng)).collect()
}

pub fn rand_q4_0(rng: &mut Rng, nb: usize) -> Vec<BlockQ4_0> {
    random_blocks(rng, nb, |r| BlockQ4_0 {
        d: f16r(r, 0.1),
        qs: std::array::from_fn(|_| r.byte()),
    })
}
pub fn rand_q4_1(rng: &mut Rng, nb: usize) -> Vec<BlockQ4_1> {
    random_blocks(rng, nb, |r| BlockQ4_1 {
        d: f16r(r, 0.1),
        m: f16r(r, 0.5),
        qs: std::array::from_fn(|_| r.byte()),
    })
}
pub fn rand_q8_0(rng: &mut Rng, nb: usize) -> Vec<BlockQ8_0> {
    random_blocks(rng, nb, |r| BlockQ8_0 {
        d: f16r(r, 0.05),
        qs: std::array::from_fn(|_| r.q8_sym()),
    })
}
pub fn rand_q8_1(rng: &mut Rng, nb: usize) -> Vec<BlockQ8_1> {
    random_blocks(rng, nb, |r| {
        let d = f16r(r, 0.05);
        let qs: [i8; 32] = std::array::from_fn(|_| r.q8_sym());
        let s = f16::from_f32(d.to_f32() * qs.iter().map(|&q| q as i32).sum::<i32>() as f32);
        BlockQ8_1 { d, s, qs }
    })
}
pub fn rand_q4_k(rng: &mut Rng, nb: usize) -> Vec<BlockQ4K> {
    random_blocks(rng, nb, |r| BlockQ4K {
        d: f16r(r, 0.01),
        dmin: f16r(r, 0.01),
        scales: std::array::from_fn(|_| r.byte()),
        qs: std::array::from_fn(|_| r.byte()),
    })
}
pub fn rand_q6_k(rng: &mut Rng, nb: usize) -> Vec<BlockQ6K> {
    random_blocks(rng, nb, |r| BlockQ6K {
        ql: std::array::from_fn(|_| r.byte()),
        qh: std::array::from_fn(|_| r.byte()),
        scales: std::array::from_fn(|_| r.byte() as i8),
        d: f16r(r, 0.01),
    })
}
pub fn rand_q8_k(rng: &mut Rng, nb: usize) -> Vec<BlockQ8K> {
    random_blocks(rng, nb, |r| {
        let qs: [i8; 256] = std::array::from_fn(|_| r.q8_sym());
        let bsums =
            std::array::from_fn(|k| qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum());
        BlockQ8K {
            d: r.unit() * 0.01,
            qs,
            bsums,
        }
    })
}

/// One row quantized into blocks of `B` by `quantize`, as bytes.
fn quantize_blocks<B: Block>(
    row: &[f32],
    quantize: fn(&[f32], &mut [B]) -> Result<(), DspError>,
) -> Vec<u8> {
    let mut buf = Aligned::zeroed(B::TYPE.row_bytes(row.len()).expect("block multiple"));
    quantize(row, as_blocks_mut(buf.bytes_mut()).expect("block view")).expect("shape");
    buf.bytes().to_vec()
}

/// Quantizes a `[rows, cols]` f32 matrix to `ty` with the crate's weight quantizers.
pub fn quantize_matrix(ty: GgmlType, w: &[f32], rows: usize, cols: usize) -> Aligned {
    let mut out = Vec::new();
    for r in w.chunks_exact(cols).take(rows) {
        match ty {
            GgmlType::F32 => out.extend_from_slice(blocks_as_bytes(r)),
            GgmlType::F16 => {
                let v: Vec<f16> = r.iter().map(|&x| f16::from_f32(x)).collect();
                out.extend_from_slice(blocks_as_bytes(&v));
            }
            GgmlType::BF16 => {
                let v: Vec<bf16> = r.iter().map(|&x| bf16::from_f32(x)).collect();
                out.extend_from_slice(blocks_as_bytes(&v));
            }
            GgmlType::Q4_0 => out.extend(quantize_blocks(r, quant::quantize_row_q4_0)),
            GgmlType::Q4_1 => out.extend(quantize_blocks(r, quant::quantize_row_q4_1)),
            GgmlType::Q8_0 => out.extend(quantize_blocks(r, quant::quantize_row_q8_0)),
            GgmlType::Q4_K => out.extend(quantize_blocks(r, quant::quantize_row_q4_k_simple)),
            GgmlType::Q6_K => out.extend(quantize_blocks(r, quant::quantize_row_q6_k_simple)),
            other => panic!("not a weight type: {other}"),
        }
    }
    Aligned::new(&out)
}

/// Dequantizes a whole `[rows, cols]` matrix.
pub fn dequantize_matrix(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let rb = ty.row_bytes(cols).expect("block multiple");
    let mut w = vec![0f32; rows * cols];
    for (r, out) in w.chunks_exact_mut(cols).enumerate() {
        quant::dequantize_row(ty, &data[r * rb..(r + 1) * rb], out).expect("dequantize");
    }
    w
}

pub const WEIGHT_TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// `be.dot_tile` of `rows` weight rows `w` (row-major bytes of type `ty`, `cols` columns) by
/// `toks` tokens `x` (`toks × cols` f32, quantized here to `ty.vec_dot_type()` on one thread).
/// Returns the outputs, token-major (`out[t * rows + r]`), and the quantized activations.
pub fn dot_tile_outputs(
    be: &dyn dsp::backend::KernelBackend,
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    (rows, toks, cols): (usize, usize, usize),
) -> (Vec<f32>, dsp::matmul::QuantizedActs) {
    let pool = dsp::ThreadPool::new(1).expect("pool");
    let acts = dsp::matmul::quantize_activations(&pool, ty.vec_dot_type(), x, toks, cols).expect("quantize");
    let tile = dsp::backend::DotTile {
        ty,
        w,
        w_row_bytes: ty.row_bytes(cols).expect("rb"),
        x: acts.bytes(),
        x_row_bytes: acts.row_bytes,
    };
    let mut out = vec![0f32; rows * toks];
    be.dot_tile(&tile, &mut out);
    (out, acts)
}

/// Draws a random tile (weights `rows × cols` of type `ty`, then `toks × cols` activations,
/// from `rng` in that order) and checks every output of [`dot_tile_outputs`] is bit-identical
/// to `be`'s single dot product (`vec_dot_bytes`) of its weight row and token; `label` names
/// the case in a failure.
pub fn assert_random_tile_equals_single_dots(
    be: &dyn dsp::backend::KernelBackend,
    ty: GgmlType,
    rng: &mut Rng,
    (rows, toks, cols): (usize, usize, usize),
    label: &str,
) {
    let w = quantize_matrix(ty, &rng.vec(rows * cols), rows, cols);
    let x = rng.vec(toks * cols);
    let (out, acts) = dot_tile_outputs(be, ty, w.bytes(), &x, (rows, toks, cols));
    let (w_row_bytes, x_row_bytes) = (ty.row_bytes(cols).expect("rb"), acts.row_bytes);
    for t in 0..toks {
        for r in 0..rows {
            let single = be.vec_dot_bytes(
                ty,
                &w.bytes()[r * w_row_bytes..(r + 1) * w_row_bytes],
                &acts.bytes()[t * x_row_bytes..(t + 1) * x_row_bytes],
            );
            assert_eq!(out[t * rows + r].to_bits(), single.to_bits(), "{label} r{r} t{t}");
        }
    }
}
