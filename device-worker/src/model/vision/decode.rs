//! PNG and JPEG bytes → RGB8 pixels, with limits checked from the header before any pixel
//! buffer is allocated, so a hostile file (a decompression bomb, absurd dimensions) cannot
//! exhaust memory. Decoding is the `image` crate's (PNG: `png`, JPEG: `zune-jpeg`).
//!
//! Channel conversion follows llama.cpp (`stbi_load_from_memory(…, 3)` in
//! `tools/mtmd/mtmd-helper.cpp`): alpha is dropped (not composited on white as Hugging Face's
//! `convert_to_rgb` does), grey is replicated. PNG pixels are exact; JPEG decoders may differ
//! from stb_image by rounding in the IDCT and chroma upsampling.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};

use super::VisionError;

/// An RGB8 image, row-major, 3 bytes per pixel (`data.len() == width · height · 3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl RgbImage {
    /// A `width × height` image of one colour.
    pub fn filled(width: usize, height: usize, rgb: [u8; 3]) -> Self {
        let data = rgb
            .iter()
            .copied()
            .cycle()
            .take(width * height * 3)
            .collect();
        Self {
            width,
            height,
            data,
        }
    }

    /// Pixel (x, y) as `[r, g, b]`.
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }
}

/// Bounds on an image before it is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest width or height, pixels.
    pub max_side: u32,
    /// Largest width · height.
    pub max_pixels: u64,
    /// Largest allocation the decoder may make, bytes (`image::Limits::max_alloc`).
    pub max_alloc: u64,
}

impl Default for DecodeLimits {
    /// 8192 px per side, 32 Mpx (a 1440×3200 phone screen is 4.6 Mpx), 256 MiB.
    fn default() -> Self {
        Self {
            max_side: 8192,
            max_pixels: 32 << 20,
            max_alloc: 256 << 20,
        }
    }
}

impl DecodeLimits {
    fn image_limits(&self) -> Limits {
        let mut l = Limits::default();
        l.max_image_width = Some(self.max_side);
        l.max_image_height = Some(self.max_side);
        l.max_alloc = Some(self.max_alloc);
        l
    }
}

/// Decodes PNG or JPEG `bytes` into RGB8 within `limits`.
///
/// Errors: [`VisionError::EmptyImage`] (0 bytes), [`VisionError::UnsupportedFormat`] (no PNG
/// or JPEG signature), [`VisionError::ImageTooLarge`] (header dimensions over `limits`),
/// [`VisionError::Decode`] (truncated or corrupt data).
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage, VisionError> {
    if bytes.is_empty() {
        return Err(VisionError::EmptyImage);
    }
    let format = match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg)) => f,
        Ok(other) => {
            return Err(VisionError::UnsupportedFormat {
                format: Some(format!("{other:?}")),
            })
        }
        Err(_) => return Err(VisionError::UnsupportedFormat { format: None }),
    };
    let reader = || {
        let mut r = ImageReader::with_format(Cursor::new(bytes), format);
        r.limits(limits.image_limits());
        r
    };
    // Header only: no pixel buffer yet. Dimension-limit errors come back as our own error.
    let (width, height) =
        match ImageReader::with_format(Cursor::new(bytes), format).into_dimensions() {
            Ok(d) => d,
            Err(e) => return Err(VisionError::Decode(e.to_string())),
        };
    let too_large = width > limits.max_side
        || height > limits.max_side
        || u64::from(width) * u64::from(height) > limits.max_pixels;
    if too_large {
        return Err(VisionError::ImageTooLarge {
            width,
            height,
            max_side: limits.max_side,
            max_pixels: limits.max_pixels,
        });
    }
    let img = reader()
        .decode()
        .map_err(|e| VisionError::Decode(e.to_string()))?;
    let rgb = img.into_rgb8();
    Ok(RgbImage {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        data: rgb.into_raw(),
    })
}
