//! GGML tensor types and their block geometry.
//!
//! Ids and block layouts follow ggml (`ggml/include/ggml.h`, `ggml/src/ggml-common.h`).

use std::fmt;

/// A GGML tensor element type. The discriminant is ggml's type id as stored in GGUF files.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 8,
    /// Activation type paired with Q4_1 weights (ggml's `vec_dot_type`).
    Q8_1 = 9,
    Q4_K = 12,
    Q6_K = 14,
    /// Activation type paired with K-quant weights.
    Q8_K = 15,
    BF16 = 30,
}

impl GgmlType {
    /// The type with ggml id `id`, or `None` for ids this crate does not implement.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            12 => Self::Q4_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name of the type (`"q4_K"`, `"f16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q8_0 => "q8_0",
            Self::Q8_1 => "q8_1",
            Self::Q4_K => "q4_K",
            Self::Q6_K => "q6_K",
            Self::Q8_K => "q8_K",
            Self::BF16 => "bf16",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q4_K | Self::Q6_K | Self::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 2 + 16,
            Self::Q4_1 => 2 + 2 + 16,
            Self::Q8_0 => 2 + 32,
            Self::Q8_1 => 2 + 2 + 32,
            Self::Q4_K => 2 + 2 + 12 + 128,
            Self::Q6_K => 128 + 64 + 16 + 2,
            Self::Q8_K => 4 + 256 + 32,
        }
    }

    /// Bytes of a row of `n` elements; `None` if `n` is not a multiple of the block size.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size())
            .then(|| n / self.block_size() * self.type_size())
    }

    /// The type ggml's CPU backend converts the activations to before taking dot products with
    /// weights of this type (`vec_dot_type` in ggml-cpu's type traits): Q4_0/Q8_0 → Q8_0,
    /// Q4_1 → Q8_1, Q4_K/Q6_K → Q8_K, float types → themselves. Activation types map to
    /// themselves.
    pub fn vec_dot_type(self) -> GgmlType {
        match self {
            Self::Q4_0 | Self::Q8_0 => Self::Q8_0,
            Self::Q4_1 => Self::Q8_1,
            Self::Q4_K | Self::Q6_K => Self::Q8_K,
            Self::F32 | Self::F16 | Self::BF16 | Self::Q8_1 | Self::Q8_K => self,
        }
    }

    /// Whether model weights of this type can be stored in a GGUF file we load.
    pub fn is_weight_type(self) -> bool {
        !matches!(self, Self::Q8_1 | Self::Q8_K)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_rejected() {
        for t in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q8_1,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q8_K,
            GgmlType::BF16,
        ] {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(6), None); // q5_0: not implemented
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn row_bytes_follow_block_geometry() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(2 * 144));
        assert_eq!(GgmlType::Q6_K.row_bytes(256), Some(210));
        assert_eq!(GgmlType::Q8_0.row_bytes(33), None);
    }
}
