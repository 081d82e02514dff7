//! `#[repr(C)]` block structs of the GGML quantized formats, laid out byte for byte as in
//! ggml `ggml/src/ggml-common.h` (`block_q4_0`, `block_q4_1`, `block_q8_0`, `block_q8_1`,
//! `block_q4_K`, `block_q6_K`, `block_q8_K`), plus safe views of raw tensor bytes as blocks.
//!
//! Every struct is plain old data: no padding, every bit pattern valid. Compile-time asserts
//! pin each size to [`GgmlType::type_size`].

use std::mem::{align_of, size_of};

use half::f16;

use super::GgmlType;
use crate::error::DspError;

/// Elements per block of Q4_0, Q4_1, Q8_0 and Q8_1 (ggml `QK4_0` = `QK8_0` = 32).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants (ggml `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in a Q4_K block (ggml `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// 32 weights `w[j] = d * (q[j] - 8)`, 4-bit `q`. Byte `qs[j]` holds element `j` in its low
/// nibble and element `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// 32 weights `w[j] = d * q[j] + m`, 4-bit `q`, nibble order as [`BlockQ4_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// 32 values `x[j] = d * qs[j]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// 32 values `x[j] = d * qs[j]` with `s = d * sum(qs)` precomputed (the activation type of
/// Q4_1 weights).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// 256 weights in 8 sub-blocks of 32: `w = d * sc[k] * q - dmin * m[k]` with 4-bit `q` and
/// 6-bit `sc`, `m` packed in `scales` (see [`BlockQ4K::scales_mins`]). Bytes `qs[32g..32g+32]`
/// hold elements `64g..64g+32` in their low nibbles and `64g+32..64g+64` in their high ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 256 weights in 16 sub-blocks of 16: `w = d * scales[k] * (q - 32)` with 6-bit `q` split
/// into 4 low bits (`ql`) and 2 high bits (`qh`); see [`BlockQ6K::unpack`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// 256 activations `x = d * qs` (f32 scale) with `bsums[k]` = sum of `qs[16k..16k+16]`; the
/// activation type of the K-quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// A GGML block type that can be viewed from raw bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain no padding and no field with invalid bit patterns,
/// and `size_of::<Self>() == Self::TYPE.type_size()`.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    /// The GGML type whose block this is.
    const TYPE: GgmlType;
}

/// `unsafe impl Block` for each `block type => GgmlType variant`.
macro_rules! impl_block {
    ($($block:ty => $ty:ident),* $(,)?) => {
        $(
            unsafe impl Block for $block {
                const TYPE: GgmlType = GgmlType::$ty;
            }
        )*
    };
}

// SAFETY: all fields are integers or f16/f32 (every bit pattern valid), the sizes above equal
// the sums of the field sizes, so there is no padding.
impl_block!(
    BlockQ4_0 => Q4_0,
    BlockQ4_1 => Q4_1,
    BlockQ8_0 => Q8_0,
    BlockQ8_1 => Q8_1,
    BlockQ4K => Q4_K,
    BlockQ6K => Q6_K,
    BlockQ8K => Q8_K,
);
// SAFETY: scalar element types (block size 1), no padding, every bit pattern valid.
impl_block!(f32 => F32, f16 => F16, half::bf16 => BF16);

/// Alignment in bytes that raw data of type `ty` needs to be viewed as its block struct.
pub fn block_align(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::Q8_K => 4,
        _ => 2,
    }
}

/// Views `bytes` as blocks of `B`.
///
/// # Errors
/// `LengthMismatch` if the length is not a whole number of blocks, `Misaligned` if the start
/// is not aligned to `align_of::<B>()` (GGUF tensor data is 32-byte aligned, so mapped weights
/// always pass).
pub fn as_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], DspError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(DspError::LengthMismatch {
            op: "as_blocks",
            what: "bytes",
            expected: bytes.len() / size * size,
            actual: bytes.len(),
        });
    }
    if !(bytes.as_ptr() as usize).is_multiple_of(align_of::<B>()) {
        return Err(DspError::Misaligned {
            op: "as_blocks",
            ty: B::TYPE,
            addr: bytes.as_ptr() as usize,
            align: align_of::<B>(),
        });
    }
    // SAFETY: alignment and length checked above; `B: Block` guarantees every bit pattern is a
    // valid `B` and there is no padding. The lifetime is tied to `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Mutable twin of [`as_blocks`], with the same checks.
///
/// # Errors
/// As [`as_blocks`].
pub fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> Result<&mut [B], DspError> {
    let n = as_blocks::<B>(bytes)?.len();
    // SAFETY: `as_blocks` checked length and alignment; `B: Block` makes any bytes a valid `B`
    // and any `B` valid bytes, so writes through the view keep `bytes` initialised.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) })
}

/// Views blocks as their raw bytes (the inverse of [`as_blocks`]).
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `B: Block` has no padding, so every byte is initialised; u8 has alignment 1.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

// === impl BlockQ4K ===

impl BlockQ4K {
    /// The 8 sub-block scales and mins (6 bits each), unpacked from `scales` as ggml's
    /// `get_scale_min_k4`: sub-blocks 0..4 use the low 6 bits of bytes 0..4 (scales) and 4..8
    /// (mins); sub-blocks 4..8 combine a nibble of bytes 8..12 with the top 2 bits of bytes 0..8.
    ///
    /// Computed four bytes at a time on u32 words (as ggml's AVX2 `ggml_vec_dot_q4_K_q8_K`
    /// does with `kmask1..3`): the kernels unpack one super-block per row and column sweep, so
    /// this is on the decode path. Tested equal to the per-element formula.
    pub fn scales_mins(&self) -> ([u8; 8], [u8; 8]) {
        let q = &self.scales;
        let word =
            |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
        let (u0, u1, u2) = (word(0), word(1), word(2));
        const LOW6: u32 = 0x3f3f_3f3f;
        const LOW4: u32 = 0x0f0f_0f0f;
        const LOW2: u32 = 0x0303_0303;
        let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
        let mn_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
        let join = |lo: u32, hi: u32| {
            let (a, b) = (lo.to_le_bytes(), hi.to_le_bytes());
            [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
        };
        (join(u0 & LOW6, sc_hi), join(u1 & LOW6, mn_hi))
    }

    /// The 256 unsigned 4-bit quants in element order (sub-block `k` = elements `32k..32k+32`).
    pub fn unpack(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for g in 0..4 {
            for l in 0..32 {
                let byte = self.qs[32 * g + l];
                q[64 * g + l] = byte & 0x0F;
                q[64 * g + 32 + l] = byte >> 4;
            }
        }
        q
    }
}

// === impl BlockQ6K ===

impl BlockQ6K {
    /// The 256 signed quants `q - 32` (range -32..=31) in element order; element `p` uses
    /// `scales[p / 16]`. Per half `h` of 128 elements, element `h*128 + 32*g + l` takes the low
    /// (g = 0, 1) or high (g = 2, 3) nibble of `ql[h*64 + 32*(g%2) + l]` and bits `2g..2g+2` of
    /// `qh[h*32 + l]`, as ggml `dequantize_row_q6_K`.
    pub fn unpack(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            let ql = &self.ql[64 * h..64 * h + 64];
            let qh = &self.qh[32 * h..32 * h + 32];
            for g in 0..4 {
                for l in 0..32 {
                    let lo = ql[32 * (g % 2) + l];
                    let lo = if g < 2 { lo & 0x0F } else { lo >> 4 };
                    let hi = (qh[l] >> (2 * g)) & 3;
                    q[128 * h + 32 * g + l] = ((lo | (hi << 4)) as i8) - 32;
                }
            }
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `get_scale_min_k4`, one sub-block at a time (the definition).
    fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    }

    #[test]
    fn word_wise_scales_mins_equal_get_scale_min_k4() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let mut scales = [0u8; 12];
            for b in &mut scales {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                *b = (state >> 56) as u8;
            }
            let blk = BlockQ4K {
                d: half::f16::ZERO,
                dmin: half::f16::ZERO,
                scales,
                qs: [0; 128],
            };
            let (sc, mn) = blk.scales_mins();
            for j in 0..8 {
                assert_eq!(
                    (sc[j], mn[j]),
                    scale_min_k4(j, &scales),
                    "sub-block {j} of {scales:?}"
                );
            }
        }
    }
}
