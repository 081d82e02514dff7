//! The screenshot path's foundation (issue 19): the mmproj loader on the converted tiny
//! fixture and corrupted variants, image decoding limits, the Pillow-compatible bicubic
//! against Pillow's own output, and preprocessing against the Hugging Face processor.
//! Fixtures: `tools/fixtures/make_qwen35vl_fixture.py` and `make_resize_reference.py`
//! (`tests/fixtures/qwen35vl/`, README there).

use std::sync::Arc;

use device_worker::model::vision::decode::{decode, DecodeLimits, RgbImage};
use device_worker::model::vision::mmproj::{require, Projector, VisionConfig};
use device_worker::model::vision::preprocess::{
    patchify, preprocess, preprocess_resized, preprocess_rgb, resize_for, smart_size, ImageBudget,
    PreprocessOptions,
};
use device_worker::model::vision::resize::{fit, pad_ceil_content, Fit};
use device_worker::model::vision::VisionError;
use device_worker::model::ModelError;
use gguf::writer::{write_with_additions, Additions, NewTensor};
use gguf::{GgufFile, MetaValue};
use serde_json::Value;
use sha2::{Digest, Sha256};
use test_support::{corpus_dir, max_abs_diff};

mod support;
use support::vision::{
    corpus_jpeg, encode_jpeg, encode_png, file, grid_thw, json, png, usizes,
};
use test_support::images::bomb_png;

/// Largest difference, in 8-bit levels, allowed between our bicubic (= Pillow's) and the
/// Hugging Face processor's default (torchvision) resize of the same image.
const HF_RESIZE_MAX_LSB: u8 = 1;

fn text_hidden() -> usize {
    let text = GgufFile::open(&file("tiny-qwen35vl-f32.gguf")).unwrap();
    text.get_u32("qwen35.embedding_length").unwrap() as usize
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn mmproj_fixtures_load_with_the_converter_hyperparameters() {
    let reference = json("reference.json");
    let vc = &reference["vision_config"];
    for ty in ["f32", "f16", "q8_0"] {
        let p = Projector::open(
            &file(&format!("mmproj-tiny-qwen35vl-{ty}.gguf")),
            text_hidden(),
        )
        .unwrap_or_else(|e| panic!("{ty}: {e}"));
        let c = &p.config;
        assert_eq!(c.patch_size, vc["patch_size"].as_u64().unwrap() as usize);
        assert_eq!(c.n_embd, vc["hidden_size"].as_u64().unwrap() as usize);
        assert_eq!(c.n_ff, vc["intermediate_size"].as_u64().unwrap() as usize);
        assert_eq!(c.n_layer, vc["depth"].as_u64().unwrap() as usize);
        assert_eq!(c.n_head, vc["num_heads"].as_u64().unwrap() as usize);
        assert_eq!(
            c.projection_dim,
            vc["out_hidden_size"].as_u64().unwrap() as usize
        );
        let side = c.n_position_side();
        assert_eq!(
            side * side,
            vc["num_position_embeddings"].as_u64().unwrap() as usize
        );
        assert_eq!(
            (c.spatial_merge, c.head_dim(), c.patch_values()),
            (2, 16, 1536)
        );
        assert_eq!((c.image_mean, c.image_std), ([0.5; 3], [0.5; 3]));
        assert!((c.layer_norm_eps - 1e-6).abs() < 1e-12);
        assert_eq!(p.blocks.len(), c.n_layer);
        assert_eq!(p.position_embd.len(), side * side * c.n_embd);
        let want = match ty {
            "f32" => dsp::GgmlType::F32,
            "f16" => dsp::GgmlType::F16,
            _ => dsp::GgmlType::Q8_0,
        };
        assert_eq!(p.blocks[0].qkv.weight.ty, want, "{ty}");
        assert_eq!(p.merger_fc2.weight.ty, want, "{ty}");
    }
}

#[test]
fn quantized_projectors_hold_the_f32_weights() {
    let f32p = Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), text_hidden()).unwrap();
    let f16p = Projector::open(&file("mmproj-tiny-qwen35vl-f16.gguf"), text_hidden()).unwrap();
    let d = max_abs_diff(&f32p.patch_embd[1], &f16p.patch_embd[1]);
    assert!(d < 1e-3, "F16 patch kernel differs by {d}");
    assert_eq!(
        f32p.merger_norm.weight, f16p.merger_norm.weight,
        "1-D tensors stay F32"
    );
}

#[test]
fn projection_size_must_equal_the_text_hidden_size() {
    match Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), 128) {
        Err(VisionError::ProjectionMismatch {
            projection_dim: 64,
            text_hidden: 128,
        }) => {}
        other => panic!("expected ProjectionMismatch, got {:?}", other.err()),
    }
}

/// The F32 fixture rewritten with `kvs` replaced and `tensors` replaced.
fn corrupted(
    kvs: Vec<(&str, MetaValue)>,
    tensors: Vec<NewTensor<'_>>,
) -> (tempfile::TempDir, Arc<GgufFile>) {
    let src = GgufFile::open(&file("mmproj-tiny-qwen35vl-f32.gguf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bad.gguf");
    let add = Additions {
        kvs: kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        tensors,
        replace: true,
    };
    write_with_additions(&src, &out, &add).unwrap();
    let f = Arc::new(GgufFile::open(&out).unwrap());
    (tmp, f)
}

#[test]
fn unknown_projector_type_is_refused() {
    let (_t, f) = corrupted(
        vec![("clip.projector_type", MetaValue::String("mlp".into()))],
        vec![],
    );
    match Projector::bind(f, 64) {
        Err(VisionError::UnknownProjector { found, supported }) => {
            assert_eq!(found, "mlp");
            assert!(supported.contains("qwen3vl_merger"));
        }
        other => panic!("expected UnknownProjector, got {:?}", other.err()),
    }
}

#[test]
fn a_text_model_file_is_not_a_projector() {
    let f = Arc::new(GgufFile::open(&file("tiny-qwen35vl-f32.gguf")).unwrap());
    assert!(
        matches!(Projector::bind(f, 64), Err(VisionError::NotProjector { found }) if found == "qwen35")
    );
}

#[test]
fn odd_head_dim_is_refused() {
    // n_embd 32 over 16 heads: head dim 2, not a multiple of 4 (the 2-D rotary's quarters).
    let (_t, f) = corrupted(
        vec![("clip.vision.attention.head_count", MetaValue::U32(16))],
        vec![],
    );
    assert!(matches!(
        Projector::bind(f, 64),
        Err(VisionError::Hyperparameter {
            key: "clip.vision.attention.head_count",
            ..
        })
    ));
}

#[test]
fn wrong_tensor_shape_is_refused() {
    let zeros = vec![0u8; 64 * 64 * 4];
    let t = NewTensor {
        name: "mm.2.weight".into(),
        ty: dsp::GgmlType::F32,
        dims: vec![64, 64],
        chunks: vec![&zeros],
    };
    let (_t, f) = corrupted(vec![], vec![t]);
    match Projector::bind(f, 64) {
        Err(VisionError::Tensor(ModelError::TensorShape {
            name,
            expected,
            actual,
        })) => {
            assert_eq!(name, "mm.2.weight");
            assert_eq!((expected, actual), (vec![128, 64], vec![64, 64]));
        }
        other => panic!("expected TensorShape, got {:?}", other.err()),
    }
}

/// A synthetic `qwen3vl_merger` file (n_embd 8, 1 block, patch 16, 4×4 positions) with
/// every tensor but `skip`.
fn synthetic(skip: &str) -> tempfile::NamedTempFile {
    let mut b = test_support::projector_metadata(12);
    let mut tensors: Vec<(String, Vec<u64>)> = [
        ("v.patch_embd.weight", &[16, 16, 3, 8][..]),
        ("v.patch_embd.weight.1", &[16, 16, 3, 8]),
        ("v.patch_embd.bias", &[8]),
        ("v.position_embd.weight", &[8, 16]),
    ]
    .iter()
    .map(|(n, d)| (n.to_string(), d.to_vec()))
    .collect();
    // Norms and products with a bias: `{stem}.weight` of `dims`, `{stem}.bias` `[rows]`.
    let with_bias: &[(&str, &[u64], u64)] = &[
        ("v.blk.0.ln1", &[8], 8),
        ("v.blk.0.attn_qkv", &[8, 24], 24),
        ("v.blk.0.attn_out", &[8, 8], 8),
        ("v.blk.0.ln2", &[8], 8),
        ("v.blk.0.ffn_up", &[8, 16], 16),
        ("v.blk.0.ffn_down", &[16, 8], 8),
        ("v.post_ln", &[8], 8),
        ("mm.0", &[32, 32], 32),
        ("mm.2", &[32, 12], 12),
    ];
    for &(stem, dims, rows) in with_bias {
        tensors.push((format!("{stem}.weight"), dims.to_vec()));
        tensors.push((format!("{stem}.bias"), vec![rows]));
    }
    for (name, dims) in tensors.iter().filter(|(n, _)| n != skip) {
        b = b.f32_tensor(name, dims);
    }
    b.write_temp()
}

#[test]
fn synthetic_projector_binds_and_each_missing_tensor_is_named() {
    let full = synthetic("");
    let p = Projector::open(full.path(), 12).unwrap();
    assert_eq!(p.config, VisionConfig::from_gguf(&p.file).unwrap());
    assert_eq!((p.config.n_embd, p.config.n_position_side()), (8, 4));
    for missing in [
        "v.patch_embd.weight.1",
        "v.blk.0.attn_qkv.bias",
        "v.post_ln.weight",
        "mm.2.weight",
    ] {
        let f = synthetic(missing);
        match Projector::open(f.path(), 12) {
            Err(VisionError::Tensor(ModelError::MissingTensor { name })) => {
                assert_eq!(name, missing)
            }
            other => panic!("{missing}: expected MissingTensor, got {:?}", other.err()),
        }
    }
}

#[test]
fn an_unreadable_projector_file_is_named_as_the_mmproj() {
    // Not a GGUF (the tokenizer JSON), and a projector cut short: both errors name --mmproj
    // and the file, never the text model.
    let json = file("tokenizer.json");
    let e = Projector::open(&json, 64).unwrap_err();
    assert!(matches!(e, VisionError::Open { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("--mmproj ") && msg.contains("tokenizer.json"), "{msg}");
    let whole = std::fs::read(file("mmproj-tiny-qwen35vl-f32.gguf")).unwrap();
    let cut = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cut.path(), &whole[..2000]).unwrap();
    let msg = Projector::open(cut.path(), 64).unwrap_err().to_string();
    assert!(msg.starts_with("--mmproj ") && msg.contains("truncated"), "{msg}");
}

#[test]
fn images_without_a_projector_are_invalid_input() {
    let e = require(None).unwrap_err();
    assert!(matches!(e, VisionError::NoProjector));
    assert!(e.is_invalid_input());
    assert!(e.to_string().contains("--mmproj"));
}

#[test]
fn hostile_and_broken_images_give_typed_errors() {
    let lim = DecodeLimits::default();
    assert!(matches!(decode(&[], &lim), Err(VisionError::EmptyImage)));
    assert!(matches!(
        decode(b"this is not an image at all", &lim),
        Err(VisionError::UnsupportedFormat { format: None })
    ));
    match decode(&bomb_png(20000, 20000), &lim) {
        Err(VisionError::ImageTooLarge {
            width: 20000,
            height: 20000,
            ..
        }) => {}
        other => panic!("expected ImageTooLarge, got {other:?}"),
    }
    let good = std::fs::read(file("screenshot-270x600.png")).unwrap();
    let e = decode(&good[..good.len() / 2], &lim).unwrap_err();
    assert!(matches!(e, VisionError::Decode(_)), "truncated PNG: {e:?}");
    let cfg = Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), 64)
        .unwrap()
        .config;
    let one = encode_png(&RgbImage::filled(1, 1, [200, 10, 10]));
    assert_eq!(decode(&one, &lim).unwrap().pixel(0, 0), [200, 10, 10]);
    let e = preprocess(&one, &cfg, &PreprocessOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            VisionError::ImageTooSmall {
                width: 1,
                height: 1,
                min_side: 32
            }
        ),
        "{e:?}"
    );
    let thin = encode_png(&RgbImage::filled(32, 6400, [1, 2, 3]));
    let e = preprocess(&thin, &cfg, &PreprocessOptions::default()).unwrap_err();
    assert!(matches!(e, VisionError::AspectRatio { .. }), "{e:?}");
    for e in [VisionError::EmptyImage, VisionError::Decode(String::new())] {
        assert!(e.is_invalid_input());
    }
}

/// A JPEG cut short is refused (zune-jpeg, lenient in the image crate, would fill the
/// missing blocks with grey), with a one-line message; the whole file, and one with bytes
/// after its end-of-image marker, decode.
#[test]
fn a_truncated_jpeg_is_refused_and_decode_errors_are_one_line() {
    let lim = DecodeLimits::default();
    let jpg = corpus_jpeg();
    let whole = decode(&jpg, &lim).unwrap();
    assert_eq!((whole.width, whole.height), (1080, 2400));
    let mut trailing = jpg.clone();
    trailing.extend_from_slice(b"appended by a camera");
    assert_eq!(decode(&trailing, &lim).unwrap(), whole);
    for keep in [0.07, 0.5, 0.99] {
        let cut = &jpg[..(jpg.len() as f64 * keep) as usize];
        match decode(cut, &lim) {
            Err(VisionError::Decode(m)) => assert!(m.contains("truncated"), "{keep}: {m}"),
            other => panic!("{keep} of the JPEG: expected Decode, got {:?}", other.map(|i| (i.width, i.height))),
        }
    }
    // The header alone (cut inside a segment), and a broken PNG: every message is one line.
    for bad in [jpg[..300].to_vec(), bomb_png(64, 64)] {
        let e = decode(&bad, &lim).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e:?}");
    }
}

/// Admission's order (decode, resize, drop the decoded image; patch later) gives the same
/// encoder input as preprocessing in one go, bit for bit, for a screenshot that needs
/// resizing and one that does not.
#[test]
fn resizing_first_and_patching_later_equals_preprocessing_in_one_go() {
    let cfg = Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), text_hidden())
        .unwrap()
        .config;
    let opts = PreprocessOptions {
        budget: ImageBudget::new(8, 256).unwrap(),
        ..Default::default()
    };
    let shot = png(&corpus_dir().join("llamatouch_evaluator/trace_18/0.png"));
    let aligned = RgbImage { width: 320, height: 736, data: shot.data[..320 * 736 * 3].to_vec() };
    for img in [shot, aligned] {
        let whole = preprocess_rgb(&img, &cfg, &opts).unwrap();
        let size = (img.width, img.height);
        let resized = resize_for(img, &cfg, &opts).unwrap();
        assert_eq!((resized.width, resized.height), whole.size);
        assert_eq!(preprocess_resized(&resized, size, &cfg), whole);
    }
}

#[test]
fn jpeg_decodes_close_to_the_png_it_was_made_from() {
    let img = png(&file("crop-256x384.png"));
    let jpg = encode_jpeg(&img, 95);
    let back = decode(&jpg, &DecodeLimits::default()).unwrap();
    assert_eq!((back.width, back.height), (256, 384));
    let mean: f64 = img
        .data
        .iter()
        .zip(&back.data)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .sum::<f64>()
        / img.data.len() as f64;
    assert!(mean < 3.0, "mean |png - jpeg| = {mean}");
}

#[test]
fn smart_size_follows_llama_cpp_rounding_and_budgets() {
    let d = ImageBudget::default();
    assert_eq!(smart_size(1080, 2400, 32, d), (1088, 2400)); // 34 × 75 = 2550 tokens
                                                             // 272 = 8.5 · 32: C++ std::round gives 9 blocks (Python's round would give 8).
    assert_eq!(smart_size(272, 608, 32, d), (288, 608));
    assert_eq!(smart_size(1, 1, 32, d), (96, 96)); // min 8 tokens → beta = sqrt(8192)
    let (w, h) = smart_size(1080, 2400, 32, ImageBudget::new(8, 256).unwrap());
    assert!((w / 32) * (h / 32) <= 256, "{w}x{h}");
    assert!(ImageBudget::new(0, 4).is_err() && ImageBudget::new(5, 4).is_err());
}

/// Extreme aspect ratios: llama.cpp's sizing floors the short side to 0 blocks and clamps it
/// up to one, which overshot the budget (4000×32 gave 89 tokens for a 64-token maximum).
/// The long side is now shortened so the count stays within `[min, max]` where it can.
#[test]
fn smart_size_never_exceeds_max_tokens_for_extreme_aspect_ratios() {
    for (max, min) in [(64usize, 8usize), (4096, 8), (256, 8), (8, 8), (1, 1), (100, 50)] {
        let budget = ImageBudget::new(min, max).unwrap();
        for (sw, sh) in [
            (4000, 32),
            (32, 4000),
            (20000, 16),
            (16, 20000),
            (6400, 32),
            (1, 1),
            (1920, 1080),
            (1080, 2400),
        ] {
            let (w, h) = smart_size(sw, sh, 32, budget);
            assert!(w % 32 == 0 && h % 32 == 0 && w >= 32 && h >= 32, "{sw}x{sh} -> {w}x{h}");
            let tokens = (w / 32) * (h / 32);
            assert!(tokens <= max, "{sw}x{sh} max {max}: {w}x{h} = {tokens} tokens");
            // One block on the short side can hold `max` tokens, so min is reachable there
            // (ordinary images keep llama.cpp's flooring, which can land under a tight min).
            let extreme = sw.max(sh) / sw.min(sh) >= 100;
            assert!(!extreme || tokens >= min, "{sw}x{sh} min {min}: {w}x{h} = {tokens} tokens");
        }
    }
    // The trial's case: the short side stays one block, the long side becomes 64 blocks.
    assert_eq!(smart_size(4000, 32, 32, ImageBudget::new(8, 64).unwrap()), (2048, 32));
    assert_eq!(smart_size(32, 4000, 32, ImageBudget::new(8, 64).unwrap()), (32, 2048));
}

/// Our bicubic equals Pillow's bit for bit on corpus screenshots and fixture images, for
/// both fits, at the sizes llama.cpp's sizing picks (`pillow_resize.json`), in llama.cpp's
/// pass order (horizontal, then vertical: Pillow one-axis resizes); and equals Pillow's own
/// two-axis resize wherever Pillow runs the passes in that order too (`pillow_2d_equal`).
#[test]
fn bicubic_is_bit_identical_to_pillow() {
    let reference = json("pillow_resize.json");
    let corpus = corpus_dir();
    for case in reference["cases"].as_array().unwrap() {
        let rel = case["path"].as_str().unwrap();
        let src = match case["source"].as_str().unwrap() {
            "corpus" => png(&corpus.join(rel)),
            _ => png(&file(rel)),
        };
        let n = |v: &Value, i: usize| v[i].as_u64().unwrap() as usize;
        let budget = ImageBudget::new(
            case["min_tokens"].as_u64().unwrap() as usize,
            case["max_tokens"].as_u64().unwrap() as usize,
        )
        .unwrap();
        let (tw, th) = (n(&case["target"], 0), n(&case["target"], 1));
        assert_eq!(
            smart_size(src.width, src.height, 32, budget),
            (tw, th),
            "{rel} size"
        );
        let stretch = fit(&src, tw, th, Fit::Stretch);
        let ours = sha256_hex(&stretch.data);
        assert_eq!(
            ours,
            case["stretch_sha256"].as_str().unwrap(),
            "{rel} stretch {tw}x{th}"
        );
        let same_2d = ours == case["pillow_2d_sha256"].as_str().unwrap();
        assert_eq!(
            same_2d,
            case["pillow_2d_equal"].as_bool().unwrap(),
            "{rel} vs Pillow 2-D"
        );
        eprintln!(
            "{rel} {tw}x{th}: equal to Pillow's one-axis passes; to its 2-D resize: {same_2d}"
        );
        let content = (
            n(&case["pad_ceil_content"], 0),
            n(&case["pad_ceil_content"], 1),
        );
        assert_eq!(
            pad_ceil_content(src.width, src.height, tw, th),
            content,
            "{rel} content"
        );
        let padded = fit(&src, tw, th, Fit::PadCeil);
        assert_eq!(
            sha256_hex(&padded.data),
            case["pad_ceil_sha256"].as_str().unwrap(),
            "{rel} pad_ceil {tw}x{th}"
        );
    }
}

/// Preprocessing against the Hugging Face processor (`reference.json` images): the same
/// grid and token count, resized pixels within [`HF_RESIZE_MAX_LSB`] of the torchvision
/// processor's, and normalised patches equal to HF's `pixel_values` (checksums).
#[test]
fn preprocessing_matches_the_hf_processor() {
    let reference = json("reference.json");
    let cfg = Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), 64)
        .unwrap()
        .config;
    let opts = PreprocessOptions {
        fit: Fit::Stretch,
        ..PreprocessOptions::default()
    };
    for img_ref in reference["images"].as_array().unwrap() {
        let name = img_ref["image"].as_str().unwrap();
        let src = png(&file(name));
        let ours = preprocess_rgb(&src, &cfg, &opts).unwrap();
        assert_eq!(ours.grid_thw, grid_thw(img_ref), "{name}");
        assert_eq!(
            ours.n_tokens,
            img_ref["n_tokens"].as_u64().unwrap() as usize,
            "{name}"
        );
        let hf = png(&file(img_ref["hf_resized_png"].as_str().unwrap()));
        let resized = fit(&src, ours.size.0, ours.size.1, Fit::Stretch);
        let lsb = resized
            .data
            .iter()
            .zip(&hf.data)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        let n_diff = resized
            .data
            .iter()
            .zip(&hf.data)
            .filter(|(a, b)| a != b)
            .count();
        eprintln!(
            "{name}: max |ours - HF torchvision| = {lsb} LSB over {n_diff} of {} values",
            hf.data.len()
        );
        assert!(lsb <= HF_RESIZE_MAX_LSB, "{name}: {lsb} LSB");
        // HF's patches of its own resized pixels: our normalisation + layout must give them.
        let hf_patches = patchify(&hf, &cfg);
        let pv = &img_ref["pixel_values"];
        let shape = usizes(&pv["shape"]);
        assert_eq!(hf_patches.len(), shape[0] * shape[1]);
        assert_eq!(ours.pixels.len(), hf_patches.len());
        let bytes: Vec<u8> = hf_patches.iter().flat_map(|v| v.to_le_bytes()).collect();
        let sum: f64 = hf_patches.iter().map(|&v| f64::from(v)).sum();
        let sum_sq: f64 = hf_patches
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum();
        let exact = sha256_hex(&bytes) == pv["sha256_f32le"].as_str().unwrap();
        eprintln!(
            "{name}: patch bytes identical to HF: {exact}; sum {sum} vs {}",
            pv["sum"]
        );
        assert!(
            (sum - pv["sum"].as_f64().unwrap()).abs() < 1e-6 * hf_patches.len() as f64,
            "{name} sum"
        );
        assert!(
            (sum_sq - pv["sum_sq"].as_f64().unwrap()).abs() < 1e-6 * hf_patches.len() as f64,
            "{name} sum_sq"
        );
        let weighted: f64 = hf_patches
            .iter()
            .enumerate()
            .map(|(i, &v)| f64::from(v) * ((i % 1000) as f64 / 1000.0))
            .sum();
        let want = pv["weighted_sum"].as_f64().unwrap();
        assert!(
            (weighted - want).abs() < 1e-6 * hf_patches.len() as f64,
            "{name} layout: {weighted} vs {want}"
        );
    }
}

#[test]
fn mmproj_and_image_budget_options_become_settings() {
    use device_worker::config::EngineOptions;
    let mmproj = file("mmproj-tiny-qwen35vl-f32.gguf");
    let opts = EngineOptions {
        mmproj: Some(mmproj.clone()),
        image_max_tokens: 256,
        ..Default::default()
    };
    let v = opts.settings().unwrap().vision.expect("vision settings");
    assert_eq!(
        (v.mmproj, v.budget),
        (mmproj, ImageBudget::new(8, 256).unwrap())
    );
    assert!(
        EngineOptions::default()
            .settings()
            .unwrap()
            .vision
            .is_none(),
        "text-only by default"
    );
    let with_mmproj = |o: EngineOptions| EngineOptions { mmproj: Some(file("mmproj-tiny-qwen35vl-f32.gguf")), ..o };
    let bad = with_mmproj(EngineOptions { image_min_tokens: 300, image_max_tokens: 256, ..Default::default() });
    let e = bad.settings().unwrap_err();
    assert_eq!(e.option, "image-min-tokens");
    assert!(e.to_string().contains("must be at most --image-max-tokens"), "{e}");
    // A zero bound is named as the option that is zero.
    for (o, name) in [
        (EngineOptions { image_max_tokens: 0, ..Default::default() }, "image-max-tokens"),
        (EngineOptions { image_min_tokens: 0, ..Default::default() }, "image-min-tokens"),
    ] {
        let e = with_mmproj(o).settings().unwrap_err();
        assert_eq!((e.option, e.value.as_str(), e.reason), (name, "0", "must be at least 1"));
    }
    // An image option off its default without --mmproj is refused, naming the option; at
    // its default (given or not) it is accepted.
    let without = |o: EngineOptions| o.settings().map(|_| ()).map_err(|e| (e.option, e.to_string()));
    for (o, name) in [
        (EngineOptions { image_max_tokens: 256, ..Default::default() }, "image-max-tokens"),
        (EngineOptions { image_min_tokens: 16, ..Default::default() }, "image-min-tokens"),
        (EngineOptions { image_cache_mib: 0, ..Default::default() }, "image-cache-mib"),
        (EngineOptions { image_request_mpx: 8, ..Default::default() }, "image-request-mpx"),
        (EngineOptions { checkpoint_after_image: true, ..Default::default() }, "checkpoint-after-image"),
    ] {
        let (option, text) = without(o).unwrap_err();
        assert_eq!(option, name);
        assert!(text.contains("needs --mmproj"), "{text}");
    }
    assert!(without(EngineOptions { image_max_tokens: 4096, ..Default::default() }).is_ok());
    let request = EngineOptions { mmproj: Some(file("mmproj-tiny-qwen35vl-f32.gguf")), image_request_mpx: 8, ..Default::default() };
    assert_eq!(request.settings().unwrap().vision.unwrap().request_pixels, 8_000_000);
}

#[test]
fn image_errors_are_invalid_argument_at_the_grpc_boundary() {
    use device_worker::error::{ErrorClass, WorkerError};
    assert_eq!(
        WorkerError::from(VisionError::NoProjector).grpc_class(),
        ErrorClass::InvalidArgument
    );
    assert_eq!(
        WorkerError::from(VisionError::EmptyImage).grpc_class(),
        ErrorClass::InvalidArgument
    );
    let load = VisionError::ProjectionMismatch {
        projection_dim: 64,
        text_hidden: 576,
    };
    assert_eq!(WorkerError::from(load).grpc_class(), ErrorClass::Internal);
}

/// The patch layout on a synthetic 64×32 image whose red is x and green is y: rows walk the
/// 2×2 merge blocks (block row, block column, row in block, column in block), each row is
/// (channel, frame, y, x) with both frames equal.
#[test]
fn patch_rows_follow_the_hf_merge_block_order() {
    let cfg = Projector::open(&file("mmproj-tiny-qwen35vl-f32.gguf"), 64)
        .unwrap()
        .config;
    let mut img = RgbImage::filled(64, 32, [0, 0, 7]);
    for y in 0..32 {
        for x in 0..64 {
            let i = (y * 64 + x) * 3;
            img.data[i] = x as u8;
            img.data[i + 1] = y as u8;
        }
    }
    let px = patchify(&img, &cfg);
    let row = cfg.patch_values();
    assert_eq!(px.len(), 8 * row);
    let norm = |v: u8| (f32::from(v) / 255.0 - 0.5) / 0.5;
    let at = |r: usize, c: usize, t: usize, y: usize, x: usize| {
        px[r * row + ((c * 2 + t) * 16 + y) * 16 + x]
    };
    // (row, patch origin x, y): block 0 = patches (0,0) (16,0) (0,16) (16,16), block 1 from x 32.
    for (r, ox, oy) in [
        (0, 0, 0),
        (1, 16, 0),
        (2, 0, 16),
        (3, 16, 16),
        (4, 32, 0),
        (7, 48, 16),
    ] {
        for t in 0..2 {
            assert_eq!(at(r, 0, t, 3, 5), norm((ox + 5) as u8), "row {r} red");
            assert_eq!(at(r, 1, t, 3, 5), norm((oy + 3) as u8), "row {r} green");
            assert_eq!(at(r, 2, t, 9, 1), norm(7), "row {r} blue");
        }
    }
}

#[test]
fn hf_embedding_references_have_their_declared_shapes() {
    let reference = json("reference.json");
    for img in reference["images"].as_array().unwrap() {
        let bytes = std::fs::read(file(img["embeddings_bin"].as_str().unwrap())).unwrap();
        let shape = usizes(&img["embeddings_shape"]);
        assert_eq!(shape, vec![img["n_tokens"].as_u64().unwrap() as usize, 64]);
        assert_eq!(bytes.len(), shape[0] * shape[1] * 4);
        let vals: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(vals.iter().all(|v| v.is_finite()) && vals.iter().any(|v| *v != 0.0));
    }
}
