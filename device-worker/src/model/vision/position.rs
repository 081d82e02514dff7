//! Where each patch sits, for the two position signals of the Qwen3-VL / Qwen3.5 vision
//! tower: the learned absolute embeddings resampled to the image's patch grid
//! ([`learned_positions`]) and the (row, column) of every patch for the 2-D rotary
//! ([`merge_order`], used by [`super::rope2d`]).
//!
//! Patches are in 2×2 merge-block order (block row, block column, row in block, column in
//! block), the order of [`super::preprocess::patchify`]'s rows and of the merger's groups of
//! four (Hugging Face `Qwen3VLVisionModel.rot_pos_emb` and `fast_pos_embed_interpolate`;
//! llama.cpp `tools/mtmd/models/qwen3vl.cpp`, the permutes after the patch convolution and
//! after `resize_position_embeddings`).

use dsp::encoder::{resize_bilinear, Bilinear};

use super::mmproj::Projector;
use super::VisionError;

/// `(row, column)` in patches of each of the `gh · gw` patches, in merge-block order for
/// merge size `m`. `gh` and `gw` are multiples of `m`.
pub fn merge_order(gh: usize, gw: usize, m: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(gh * gw);
    for by in 0..gh / m {
        for bx in 0..gw / m {
            for iy in 0..m {
                for ix in 0..m {
                    out.push((by * m + iy, bx * m + ix));
                }
            }
        }
    }
    out
}

/// The learned position embeddings (`v.position_embd.weight`, a square grid of
/// `n_position_side²` vectors) resampled to a `gh × gw` patch grid with `mode`, in merge-block
/// order: `[gh · gw, n_embd]` row-major, row `i` for patch `merge_order(gh, gw)[i]`.
/// [`Bilinear::AlignCorners`] is Hugging Face's `fast_pos_embed_interpolate` and llama.cpp's
/// `qwen3vl` graph (`resize_position_embeddings` with `GGML_SCALE_FLAG_ALIGN_CORNERS`);
/// [`Bilinear::Antialias`] is clip's default mode for other projectors; both leave a grid of
/// the table's own size unchanged.
///
/// Errors: [`VisionError::Encoder`] when the grid is empty.
pub fn learned_positions(
    p: &Projector,
    (gh, gw): (usize, usize),
    mode: Bilinear,
) -> Result<Vec<f32>, VisionError> {
    let (side, e) = (p.config.n_position_side(), p.config.n_embd);
    let mut grid = vec![0f32; gh * gw * e];
    resize_bilinear(&p.position_embd, (side, side), e, (gh, gw), mode, &mut grid)
        .map_err(|source| VisionError::kernel("position embedding resize", source))?;
    let mut out = Vec::with_capacity(gh * gw * e);
    for (r, c) in merge_order(gh, gw, p.config.spatial_merge) {
        out.extend_from_slice(&grid[(r * gw + c) * e..(r * gw + c + 1) * e]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_order_walks_two_by_two_blocks() {
        let o = merge_order(4, 6, 2);
        assert_eq!(&o[..6], &[(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]);
        assert_eq!(o[12], (2, 0));
        assert_eq!(o.len(), 24);
    }
}
