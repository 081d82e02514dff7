//! Dequantization of GGML rows to f32, as ggml's `dequantize_row_*` (`ggml/src/ggml-quants.c`)
//! and `ggml_fp16_to_fp32_row` / `ggml_bf16_to_fp32_row`. Used for embedding lookup
//! (`get_rows`) and as the reference in tests.

use half::{bf16, f16};

use super::blocks::{
    as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use super::GgmlType;
use crate::error::DspError;

/// Dequantizes one row of `dst.len()` elements of type `ty` from its raw bytes `src`.
///
/// Shapes: `src.len() == ty.row_bytes(dst.len())`. Numerics follow ggml: Q4_0 `d*(q-8)`,
/// Q4_1 `d*q + m`, Q8_0 `d*q`, Q4_K `(d*sc)*q - dmin*m`, Q6_K `(d*sc)*(q-32)`; f16/bf16 are
/// widened exactly.
///
/// # Errors
/// `NotBlockMultiple` if `dst.len()` is not a whole number of blocks, `LengthMismatch` if
/// `src` has the wrong size, `Misaligned` if block data is not 2-byte (Q8_K: 4-byte) aligned.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DspError> {
    const OP: &str = "dequantize_row";
    let n = dst.len();
    let bytes = ty.row_bytes(n).ok_or(DspError::NotBlockMultiple {
        op: OP,
        ty,
        n,
        block: ty.block_size(),
    })?;
    DspError::check_len(OP, "src bytes", bytes, src.len())?;
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (b, o) in as_blocks::<BlockQ4_0>(src)?
                .iter()
                .zip(dst.chunks_exact_mut(32))
            {
                let d = b.d.to_f32();
                for j in 0..16 {
                    o[j] = ((b.qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    o[j + 16] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, o) in as_blocks::<BlockQ4_1>(src)?
                .iter()
                .zip(dst.chunks_exact_mut(32))
            {
                let (d, m) = (b.d.to_f32(), b.m.to_f32());
                for j in 0..16 {
                    o[j] = (b.qs[j] & 0x0F) as f32 * d + m;
                    o[j + 16] = (b.qs[j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            let blocks = as_blocks::<BlockQ8_0>(src)?;
            dequant_q8(blocks.iter().map(|b| (b.d, &b.qs)), dst);
        }
        GgmlType::Q8_1 => {
            let blocks = as_blocks::<BlockQ8_1>(src)?;
            dequant_q8(blocks.iter().map(|b| (b.d, &b.qs)), dst);
        }
        GgmlType::Q4_K => {
            for (b, o) in as_blocks::<BlockQ4K>(src)?
                .iter()
                .zip(dst.chunks_exact_mut(256))
            {
                let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
                let (sc, mn) = b.scales_mins();
                let q = b.unpack();
                for (k, (o, q)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                    let d1 = d * sc[k] as f32;
                    let m1 = dmin * mn[k] as f32;
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = d1 * q as f32 - m1;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, o) in as_blocks::<BlockQ6K>(src)?
                .iter()
                .zip(dst.chunks_exact_mut(256))
            {
                let d = b.d.to_f32();
                let q = b.unpack();
                for (p, (o, &q)) in o.iter_mut().zip(q.iter()).enumerate() {
                    *o = d * b.scales[p / 16] as f32 * q as f32;
                }
            }
        }
        GgmlType::Q8_K => {
            for (b, o) in as_blocks::<BlockQ8K>(src)?
                .iter()
                .zip(dst.chunks_exact_mut(256))
            {
                for (o, &q) in o.iter_mut().zip(&b.qs) {
                    *o = b.d * q as f32;
                }
            }
        }
    }
    Ok(())
}

/// `q · d` for the 32 quants `q` and the scale `d` of each 8-bit block (`Q8_0`, `Q8_1`).
fn dequant_q8<'a>(blocks: impl Iterator<Item = (f16, &'a [i8; 32])>, dst: &mut [f32]) {
    for ((d, qs), o) in blocks.zip(dst.chunks_exact_mut(32)) {
        let d = d.to_f32();
        for (o, &q) in o.iter_mut().zip(qs) {
            *o = q as f32 * d;
        }
    }
}
