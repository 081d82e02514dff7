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
    /// Largest sum of width · height over the images of one request
    /// (`--image-request-mpx`, in 10⁶ px), checked from each header before it is decoded.
    pub max_request_pixels: u64,
}

/// Default [`DecodeLimits::max_request_pixels`] in megapixels (10⁶ px): two images at the
/// per-image limit, or 24 1080×2400 screenshots.
pub const DEFAULT_REQUEST_MPX: u64 = 64;

impl Default for DecodeLimits {
    /// 8192 px per side, 32 Mpx (a 1440×3200 phone screen is 4.6 Mpx), 256 MiB, 64 Mpx
    /// per request ([`DEFAULT_REQUEST_MPX`]).
    fn default() -> Self {
        Self {
            max_side: 8192,
            max_pixels: 32 << 20,
            max_alloc: 256 << 20,
            max_request_pixels: DEFAULT_REQUEST_MPX * 1_000_000,
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

/// An image's format and size, read from its header (no pixel buffer allocated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
}

impl Probed {
    /// `width · height`.
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Reads the format and size of PNG or JPEG `bytes` from the header and checks them against
/// `limits`, before any pixel is decoded.
///
/// Errors: [`VisionError::EmptyImage`] (0 bytes), [`VisionError::UnsupportedFormat`] (no PNG
/// or JPEG signature), [`VisionError::ImageTooLarge`] (header dimensions over `limits`),
/// [`VisionError::Decode`] (an unreadable header).
pub fn probe(bytes: &[u8], limits: &DecodeLimits) -> Result<Probed, VisionError> {
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
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(decode_error)?;
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
    Ok(Probed {
        format,
        width,
        height,
    })
}

/// Decodes PNG or JPEG `bytes` into RGB8 within `limits`.
///
/// Errors: those of [`probe`]; [`VisionError::Decode`] for truncated or corrupt data (a JPEG
/// whose entropy-coded data does not reach its end-of-image marker included:
/// [`jpeg_reaches_eoi`]; the decoder would fill the missing blocks with grey).
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage, VisionError> {
    let probed = probe(bytes, limits)?;
    if probed.format == ImageFormat::Jpeg {
        jpeg_reaches_eoi(bytes)?;
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), probed.format);
    reader.limits(limits.image_limits());
    let rgb = reader.decode().map_err(decode_error)?.into_rgb8();
    Ok(RgbImage {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        data: rgb.into_raw(),
    })
}

/// A decoder's error as one line.
fn decode_error(e: image::ImageError) -> VisionError {
    VisionError::Decode(one_line(&e.to_string()))
}

/// A decoder's message as one plain line: zune-jpeg (0.5) prints its own messages with
/// `Debug`, so they arrive quoted with escaped line breaks (`"… mismatch\n expected …"`);
/// escapes become spaces, the quotes go, and runs of whitespace become one space.
fn one_line(text: &str) -> String {
    let unescaped = text
        .replace("\\n", " ")
        .replace("\\t", " ")
        .replace("\\\"", "'")
        .replace('"', "");
    unescaped.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks that a JPEG's segments and entropy-coded data run, marker by marker, to an
/// end-of-image marker (`FF D9`; ITU T.81 B.1.1: `FF 00` is a stuffed byte, `FF D0`–`FF D7`
/// restart markers and `FF FF` fill inside entropy-coded data; every other marker but SOI,
/// EOI and TEM has a 2-byte big-endian length that counts itself). Bytes after EOI are
/// allowed (some cameras append data). zune-jpeg, which the image crate runs in its lenient
/// mode, decodes a file cut short as grey blocks; this refuses it.
///
/// Errors: [`VisionError::Decode`] naming where the data ends.
pub fn jpeg_reaches_eoi(bytes: &[u8]) -> Result<(), VisionError> {
    let truncated = |at: usize| {
        VisionError::Decode(format!(
            "JPEG data ends at byte {at} of {} without an end-of-image marker (truncated)",
            bytes.len()
        ))
    };
    let mut i = 2; // past SOI (FF D8, checked by the format guess)
    while i + 1 < bytes.len() {
        if bytes[i] != 0xFF {
            i += 1; // entropy-coded data
            continue;
        }
        match bytes[i + 1] {
            0xD9 => return Ok(()),
            // Stuffed zero, fill byte, restart markers, TEM, SOI: no length.
            0x00 | 0xD0..=0xD7 | 0x01 | 0xD8 => i += 2,
            0xFF => i += 1,
            _ => {
                let len = bytes
                    .get(i + 2..i + 4)
                    .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
                    .ok_or_else(|| truncated(bytes.len()))?;
                if len < 2 || i + 2 + len > bytes.len() {
                    return Err(truncated(bytes.len()));
                }
                i += 2 + len;
            }
        }
    }
    Err(truncated(bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::one_line;

    /// zune-jpeg's `Debug`-printed message, as the image crate passes it on.
    #[test]
    fn decoder_messages_become_one_plain_line() {
        let raw = "Format error decoding Jpeg: \"Marker SOF found\\n  after SOS\\tsegment \\\"x\\\"\"";
        assert_eq!(
            one_line(raw),
            "Format error decoding Jpeg: Marker SOF found after SOS segment 'x'"
        );
        assert_eq!(one_line("plain\nline  two"), "plain line two");
    }
}
