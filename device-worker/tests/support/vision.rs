//! The tiny Qwen3.5-VL fixture's files (`tests/fixtures/qwen35vl/`, README there), required
//! inputs like the rest (`TANDEM_REQUIRE_INPUTS`).

use std::path::{Path, PathBuf};

use device_worker::model::vision::decode::{decode, DecodeLimits, RgbImage};
use device_worker::model::vision::mmproj::{VisionConfig, TEMPORAL_PATCH};
use device_worker::model::vision::Preprocessed;
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

/// `img` as a baseline JPEG of `quality` (1–100), the image crate's encoder.
pub fn encode_jpeg(img: &RgbImage, quality: u8) -> Vec<u8> {
    test_support::images::encode_jpeg(img.width, img.height, &img.data, quality)
}

/// A real screenshot as JPEG: `llamatouch_evaluator/trace_18/2.png` of the corpus (1080×2400,
/// SOURCES.md there) re-encoded at quality 90 at test time.
pub fn corpus_jpeg() -> Vec<u8> {
    let p = test_support::corpus_dir().join("llamatouch_evaluator/trace_18/2.png");
    test_support::images::png_file_as_jpeg(&p, 90)
}

/// `img` as a PNG.
pub fn encode_png(img: &RgbImage) -> Vec<u8> {
    test_support::images::encode_png(img.width, img.height, &img.data)
}

/// The image behind [`Preprocessed::pixels`] (patch rows, see
/// `device_worker::model::vision::preprocess::patchify`) back in llama.cpp's layout: f32
/// `[height][width][3]`, RGB interleaved (`clip_image_f32`'s buffer). Panics unless the two
/// temporal frames of every patch are equal, as they are for a still image.
pub fn pixels_hwc(pre: &Preprocessed, cfg: &VisionConfig) -> Vec<f32> {
    let (w, h) = pre.size;
    let (p, m, t) = (cfg.patch_size, cfg.spatial_merge, TEMPORAL_PATCH);
    let row_len = cfg.patch_values();
    assert_eq!(pre.pixels.len(), (w / p) * (h / p) * row_len, "patch rows");
    let mut out = vec![0f32; w * h * 3];
    let patch_origins = (0..h / p / m).flat_map(|by| {
        (0..w / p / m).flat_map(move |bx| {
            (0..m).flat_map(move |iy| (0..m).map(move |ix| ((bx * m + ix) * p, (by * m + iy) * p)))
        })
    });
    for (row, (ox, oy)) in pre.pixels.chunks_exact(row_len).zip(patch_origins) {
        for c in 0..3 {
            for y in 0..p {
                for x in 0..p {
                    let frame = |f: usize| row[((c * t + f) * p + y) * p + x];
                    assert!(
                        (1..t).all(|f| frame(f).to_bits() == frame(0).to_bits()),
                        "frames differ"
                    );
                    out[((oy + y) * w + ox + x) * 3 + c] = frame(0);
                }
            }
        }
    }
    out
}
