//! Image bytes for the screenshot path's tests (issue 19): real PNG and JPEG encodings of
//! given pixels (the `image` crate's encoders), a corpus screenshot re-encoded as JPEG, and a
//! hand-made PNG decompression bomb.

use std::path::Path;

/// `rgb` (`width · height · 3` bytes, row-major RGB8) as a PNG.
///
/// Panics if `rgb` has another length.
pub fn encode_png(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let enc = image::codecs::png::PngEncoder::new(&mut out);
    image::ImageEncoder::write_image(enc, rgb, width as u32, height as u32, image::ExtendedColorType::Rgb8)
        .expect("PNG encoding of RGB8 pixels");
    out
}

/// `rgb` (as [`encode_png`]) as a baseline JPEG of `quality` (1–100).
///
/// Panics if `rgb` has another length.
pub fn encode_jpeg(width: usize, height: usize, rgb: &[u8], quality: u8) -> Vec<u8> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .encode(rgb, width as u32, height as u32, image::ExtendedColorType::Rgb8)
        .expect("JPEG encoding of RGB8 pixels");
    out
}

/// The PNG at `path` (a corpus screenshot: `corpus_dir().join("llamatouch_evaluator/trace_18/2.png")`,
/// provenance in the corpus's SOURCES.md) re-encoded as a JPEG of `quality`, at test time.
///
/// Panics if the file cannot be read or decoded.
pub fn png_file_as_jpeg(path: &Path, quality: u8) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rgb = image::load_from_memory(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display())).into_rgb8();
    encode_jpeg(rgb.width() as usize, rgb.height() as usize, rgb.as_raw(), quality)
}

/// CRC-32 (IEEE), as PNG chunks carry it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

/// Appends a PNG chunk (length, type, data, CRC) to `out`.
pub fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
}

/// A PNG whose header declares `w × h` RGB8 and whose data is a small zlib stream of zeros
/// (a decompression bomb: 1.2 GB of pixels for 20000×20000).
pub fn bomb_png(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    png_chunk(&mut out, b"IHDR", &ihdr);
    // zlib header + a stored empty final block: not enough data, but never read that far.
    png_chunk(&mut out, b"IDAT", &[0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01]);
    png_chunk(&mut out, b"IEND", &[]);
    out
}
