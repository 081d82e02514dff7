//! The tiny Qwen3.5-VL fixture's files (`tests/fixtures/qwen35vl/`, README there), required
//! inputs like the rest (`TANDEM_REQUIRE_INPUTS`).

use std::path::{Path, PathBuf};

use device_worker::model::vision::decode::{decode, DecodeLimits, RgbImage};
use serde_json::Value;
use test_support::fixture;

/// How to make the fixture when it is missing.
pub const HOW: &str = "run tools/fixtures/make_qwen35vl_fixture.py (tools/fixtures/README.md)";

/// The fixture folder.
pub fn dir() -> PathBuf {
    fixture(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen35vl"), HOW)
}

/// One file of the fixture.
pub fn file(name: &str) -> PathBuf {
    fixture(dir().join(name), HOW)
}

/// One JSON file of the fixture, parsed.
pub fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(file(name)).unwrap()).unwrap()
}

/// A PNG decoded with the default limits.
pub fn png(path: &Path) -> RgbImage {
    decode(&std::fs::read(path).unwrap(), &DecodeLimits::default()).unwrap()
}

/// A JSON array of whole numbers (a shape, a grid) as `usize`s; panics on anything else.
pub fn usizes(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
}

/// An image entry's `grid_thw` in `reference.json`: (frames, rows, columns) of patches.
pub fn grid_thw(image: &Value) -> (usize, usize, usize) {
    let g = usizes(&image["grid_thw"]);
    (g[0], g[1], g[2])
}

/// Minimal CRC-32 (IEEE) for hand-made PNG chunks.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

pub fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
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
    chunk(&mut out, b"IHDR", &ihdr);
    // zlib header + a stored empty final block: not enough data, but never read that far.
    chunk(
        &mut out,
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
        ],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

pub fn encode_png(img: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    let enc = image::codecs::png::PngEncoder::new(&mut out);
    image::ImageEncoder::write_image(
        enc,
        &img.data,
        img.width as u32,
        img.height as u32,
        image::ExtendedColorType::Rgb8,
    )
    .unwrap();
    out
}
