//! Image bytes → the encoder's input: decode ([`super::decode`]), choose the size
//! ([`smart_size`]), resample ([`super::resize`]), normalise and flatten into patches
//! ([`patchify`]).
//!
//! Sizing follows llama.cpp (`calc_size_preserved_ratio` in `tools/mtmd/mtmd-image.cpp`, the
//! `smart_resize` of Hugging Face's `qwen2_vl/image_processing_qwen2_vl.py` in f32): sides
//! rounded to multiples of 32 with C++ `std::round` (halves away from zero; Python rounds
//! halves to even, so a side ≡ 16 (mod 32) differs by 32 px between the two), then scaled
//! into `[min_tokens, max_tokens] · 32²` pixels. We follow llama.cpp because its token
//! count is what the peer and the paper's figures use.

use super::decode::{decode, DecodeLimits, RgbImage};
use super::mmproj::{VisionConfig, TEMPORAL_PATCH};
use super::resize::{fit, Fit};
use super::VisionError;

/// llama.cpp's default `--image-min-tokens` for Qwen-VL (`clip.cpp`,
/// `set_limit_image_tokens(8, 4096)` for `qwen3vl_merger`).
pub const DEFAULT_MIN_TOKENS: usize = 8;
/// llama.cpp's default `--image-max-tokens` for Qwen-VL.
pub const DEFAULT_MAX_TOKENS: usize = 4096;
/// Smallest side accepted, pixels (Hugging Face's `smart_resize` refuses sides under the
/// 32-px factor; llama.cpp would upscale a 1×1 image to 96×96).
pub const MIN_SIDE: u32 = 32;
/// Largest aspect ratio accepted (Hugging Face's `smart_resize`: 200).
pub const MAX_ASPECT: u32 = 200;

/// Bounds on the image tokens of one image (`--image-min-tokens`, `--image-max-tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageBudget {
    pub min_tokens: usize,
    pub max_tokens: usize,
}

impl Default for ImageBudget {
    fn default() -> Self {
        Self {
            min_tokens: DEFAULT_MIN_TOKENS,
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

impl ImageBudget {
    /// Checks `1 <= min_tokens <= max_tokens`.
    ///
    /// Errors: [`VisionError::Budget`].
    pub fn new(min_tokens: usize, max_tokens: usize) -> Result<Self, VisionError> {
        if min_tokens == 0 || min_tokens > max_tokens {
            return Err(VisionError::Budget(format!(
                "need 1 <= --image-min-tokens ({min_tokens}) <= --image-max-tokens ({max_tokens})"
            )));
        }
        Ok(Self {
            min_tokens,
            max_tokens,
        })
    }
}

/// The resized `(width, height)` of a `width × height` image: multiples of `block` (32)
/// whose product lies in the budget's pixel range when it can (llama.cpp
/// `calc_size_preserved_ratio`, f32 arithmetic as the C++).
pub fn smart_size(
    width: usize,
    height: usize,
    block: usize,
    budget: ImageBudget,
) -> (usize, usize) {
    let f = block as f32;
    let (w, h) = (width as f32, height as f32);
    let min_px = budget.min_tokens * block * block;
    let max_px = budget.max_tokens * block * block;
    let round_by = |x: f32| (x / f).round() as usize * block;
    let floor_by = |x: f32| (x / f).floor() as usize * block;
    let ceil_by = |x: f32| (x / f).ceil() as usize * block;
    let mut wb = round_by(w).max(block);
    let mut hb = round_by(h).max(block);
    if hb * wb > max_px {
        let beta = (h * w / max_px as f32).sqrt();
        hb = floor_by(h / beta).max(block);
        wb = floor_by(w / beta).max(block);
    } else if hb * wb < min_px {
        let beta = (min_px as f32 / (h * w)).sqrt();
        hb = ceil_by(h * beta);
        wb = ceil_by(w * beta);
    }
    // An extreme aspect ratio (4000×32) floors its short side to 0 and is clamped up to one
    // block, which puts the product over the budget: keep the short side and shorten the
    // long one so the token count never exceeds `max_tokens` (llama.cpp overshoots here).
    // Never reached for ordinary images, whose sizes stay those of llama.cpp.
    if hb * wb > max_px {
        let max_blocks = budget.max_tokens.max(1);
        if wb >= hb {
            wb = (max_blocks / (hb / block)).max(1) * block;
        } else {
            hb = (max_blocks / (wb / block)).max(1) * block;
        }
        if hb * wb > max_px {
            // Both sides at least one block and still over: only when max_tokens < 1.
            (wb, hb) = (block, block);
        }
    }
    (wb, hb)
}

/// Refuses images too small or too elongated to patch (see [`MIN_SIDE`], [`MAX_ASPECT`]).
///
/// Errors: [`VisionError::ImageTooSmall`], [`VisionError::AspectRatio`].
pub fn check_shape(width: usize, height: usize) -> Result<(), VisionError> {
    let (w, h) = (width as u32, height as u32);
    if w < MIN_SIDE || h < MIN_SIDE {
        return Err(VisionError::ImageTooSmall {
            width: w,
            height: h,
            min_side: MIN_SIDE,
        });
    }
    if w.max(h) / w.min(h) >= MAX_ASPECT {
        return Err(VisionError::AspectRatio {
            width: w,
            height: h,
            max_ratio: MAX_ASPECT,
        });
    }
    Ok(())
}

/// Normalises `img` (sides multiples of `patch · merge`) into the encoder's patch rows, the
/// layout of Hugging Face's `pixel_values` for one still image: `[gh · gw, 3 · 2 · p · p]`
/// with patches in 2×2 merge-block order (block row, block column, row in block, column in
/// block) and each row ordered (channel, frame, y, x); both frames are the image. Values are
/// `(u8 / 255 − mean[c]) / std[c]` in f32 (llama.cpp `clip_image_f32::normalize`).
///
/// Panics if a side is not a multiple of `patch · merge`.
pub fn patchify(img: &RgbImage, cfg: &VisionConfig) -> Vec<f32> {
    let (p, m) = (cfg.patch_size, cfg.spatial_merge);
    assert!(
        img.width % (p * m) == 0 && img.height % (p * m) == 0,
        "image not block-aligned"
    );
    let (gh, gw) = (img.height / p, img.width / p);
    let row_len = cfg.patch_values();
    let lut: Vec<[f32; 3]> = (0..=255u8)
        .map(|v| {
            std::array::from_fn(|c| (f32::from(v) / 255.0 - cfg.image_mean[c]) / cfg.image_std[c])
        })
        .collect();
    let mut out = vec![0f32; gh * gw * row_len];
    let mut row = 0;
    for by in 0..gh / m {
        for bx in 0..gw / m {
            for (iy, ix) in (0..m).flat_map(|iy| (0..m).map(move |ix| (iy, ix))) {
                let (py, px) = ((by * m + iy) * p, (bx * m + ix) * p);
                let dst = &mut out[row * row_len..(row + 1) * row_len];
                for y in 0..p {
                    for x in 0..p {
                        let rgb = img.pixel(px + x, py + y);
                        for c in 0..3 {
                            let val = lut[usize::from(rgb[c])][c];
                            for t in 0..TEMPORAL_PATCH {
                                dst[((c * TEMPORAL_PATCH + t) * p + y) * p + x] = val;
                            }
                        }
                    }
                }
                row += 1;
            }
        }
    }
    out
}

/// How screenshots are prepared: decoding limits, token budget, fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreprocessOptions {
    pub limits: DecodeLimits,
    pub budget: ImageBudget,
    /// [`Fit::PadCeil`] (llama.cpp, the default) or [`Fit::Stretch`] (Hugging Face).
    pub fit: Fit,
}

impl Default for PreprocessOptions {
    fn default() -> Self {
        Self {
            limits: DecodeLimits::default(),
            budget: ImageBudget::default(),
            fit: Fit::PadCeil,
        }
    }
}

/// One image ready for the encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Preprocessed {
    /// The decoded image's size, pixels.
    pub source_size: (usize, usize),
    /// The resized `(width, height)`, multiples of 32.
    pub size: (usize, usize),
    /// Patch grid `(t, h, w)` as HF's `image_grid_thw` (t = 1 for a still image).
    pub grid_thw: (usize, usize, usize),
    /// Image tokens (`h · w / merge²`).
    pub n_tokens: usize,
    /// [`patchify`]'s rows: `[h · w, 3 · 2 · patch²]`.
    pub pixels: Vec<f32>,
}

/// Decodes, sizes, resamples and patches `bytes` for the projector `cfg`.
///
/// Errors: those of [`decode`] and [`check_shape`].
pub fn preprocess(
    bytes: &[u8],
    cfg: &VisionConfig,
    opts: &PreprocessOptions,
) -> Result<Preprocessed, VisionError> {
    let img = decode(bytes, &opts.limits)?;
    preprocess_rgb(&img, cfg, opts)
}

/// [`preprocess`] of an already decoded image: [`resize_for`], then [`preprocess_resized`].
///
/// Errors: [`check_shape`]'s.
pub fn preprocess_rgb(
    img: &RgbImage,
    cfg: &VisionConfig,
    opts: &PreprocessOptions,
) -> Result<Preprocessed, VisionError> {
    check_shape(img.width, img.height)?;
    let (w, h) = smart_size(img.width, img.height, cfg.block_side(), opts.budget);
    let resized = fit(img, w, h, opts.fit);
    Ok(preprocess_resized(&resized, (img.width, img.height), cfg))
}

/// `img` resized to the size the encoder takes it at ([`smart_size`] within the budget,
/// resampled with the options' [`Fit`]); `img` itself when it has that size already. Taking
/// the decoded image by value lets admission free it as soon as the (usually much smaller)
/// resized one exists, one image at a time.
///
/// Errors: [`check_shape`]'s.
pub fn resize_for(
    img: RgbImage,
    cfg: &VisionConfig,
    opts: &PreprocessOptions,
) -> Result<RgbImage, VisionError> {
    check_shape(img.width, img.height)?;
    let (w, h) = smart_size(img.width, img.height, cfg.block_side(), opts.budget);
    if (img.width, img.height) == (w, h) {
        return Ok(img);
    }
    Ok(fit(&img, w, h, opts.fit))
}

/// The encoder's input from an image [`resize_for`] made (sides multiples of
/// `patch · merge`): [`patchify`]'s rows and the grid. `source_size` is the decoded image's
/// `(width, height)`, for [`Preprocessed::source_size`].
///
/// Panics if a side of `resized` is not a multiple of `patch · merge`.
pub fn preprocess_resized(
    resized: &RgbImage,
    source_size: (usize, usize),
    cfg: &VisionConfig,
) -> Preprocessed {
    let (w, h) = (resized.width, resized.height);
    let (gh, gw) = (h / cfg.patch_size, w / cfg.patch_size);
    Preprocessed {
        source_size,
        size: (w, h),
        grid_thw: (1, gh, gw),
        n_tokens: gh * gw / (cfg.spatial_merge * cfg.spatial_merge),
        pixels: patchify(resized, cfg),
    }
}
