//! Screenshots through the gateway's OpenAI endpoint (issue 19), over real HTTP and gRPC on
//! loopback to a real worker with the tiny Qwen3.5-VL fixture and its projector
//! (`device-worker/tests/fixtures/qwen35vl/`) and real corpus screenshots
//! (`llamatouch_evaluator/trace_18`). Every bad image of the list is HTTP 400 naming
//! the OpenAI content index (`messages[1].content[1]`), and the next request is served with
//! the image figures in the response's `tandem` block.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::{http_post, start_http, start_with};
use device_worker::config::EngineOptions;
use serde_json::{json, Value};
use test_support::images::{bomb_png, encode_png, png_file_as_jpeg};

/// Image tokens of a 1080×2400 screenshot at `--image-max-tokens 256` (320×736 px).
const SCREENSHOT_TOKENS: u64 = 230;

fn fixture(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../device-worker/tests/fixtures/qwen35vl");
    test_support::fixture(dir.join(name), "run tools/fixtures/make_qwen35vl_fixture.py (tools/fixtures/README.md)")
}

fn screenshot_path(i: usize) -> PathBuf {
    test_support::corpus_dir().join(format!("llamatouch_evaluator/trace_18/{i}.png"))
}

fn screenshot(i: usize) -> Vec<u8> {
    let p = screenshot_path(i);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The tiny VL worker: with the projector (256 image tokens at most) or text-only.
fn options(with_projector: bool) -> EngineOptions {
    let mut o = EngineOptions {
        model: Some(fixture("tiny-qwen35vl-f32.gguf")),
        threads: Some(2),
        ctx_size: 2048,
        slots: 2,
        ..Default::default()
    };
    if with_projector {
        o.mmproj = Some(fixture("mmproj-tiny-qwen35vl-f32.gguf"));
        o.image_max_tokens = 256;
    }
    o
}

fn data_uri(media_type: &str, bytes: &[u8]) -> String {
    format!("data:{media_type};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A chat completion whose user message is a text, then the image at `url` (content index 1).
fn body(episode: &str, url: &str) -> String {
    json!({
        "user": episode,
        "max_tokens": 4,
        "messages": [
            {"role": "system", "content": "You operate an Android phone. Reply with one JSON action."},
            {"role": "user", "content": [
                {"type": "text", "text": "Task: open the Settings app. Screen: "},
                {"type": "image_url", "image_url": {"url": url}},
            ]},
        ],
    })
    .to_string()
}

async fn post(addr: &str, body: &str) -> (u16, Value) {
    let (status, text) = http_post(addr, "/v1/chat/completions", body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_are_http_400_naming_the_content_index_and_the_next_request_is_served() {
    let mut servers = start_with(options(true)).await;
    let http = start_http(&mut servers).await;
    let png = screenshot(2);
    let jpg = png_file_as_jpeg(&screenshot_path(2), 90);
    let grey = vec![128u8; 3];
    let bad: Vec<(&str, String, &str)> = vec![
        ("truncated PNG", data_uri("image/png", &png[..png.len() / 2]), "cannot be decoded"),
        ("JPEG cut to 7 %", data_uri("image/jpeg", &jpg[..jpg.len() * 7 / 100]), "truncated"),
        ("zero bytes", data_uri("image/png", &[]), "empty"),
        ("1x1 image", data_uri("image/png", &encode_png(1, 1, &grey)), "at least 32 pixels"),
        ("20000x20000 PNG bomb", data_uri("image/png", &bomb_png(20000, 20000)), "20000x20000"),
        // Zero bytes and these: refused by the gateway's signature check, as on the agent path.
        ("bytes that are no image", data_uri("image/png", b"just some text, no image at all"), "not a PNG or JPEG image"),
        ("http:// URL", "http://example.com/screen.png".into(), "a remote URL"),
        ("PNG bytes as text/plain", data_uri("text/plain", &png), "media type \"text/plain\""),
    ];
    for (i, (what, url, says)) in bad.iter().enumerate() {
        let (status, v) = post(&http, &body(&format!("bad-{i}"), url)).await;
        assert_eq!(status, 400, "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("messages[1].content[1]"), "{what}: {message}");
        assert!(!message.contains("parts["), "{what}: the worker's index leaked: {message}");
        assert!(message.contains(says), "{what}: {message}");
        // The gateway's own refusals (before the worker) say which field; the worker's refusals
        // come back as worker_error without one.
        if ["zero bytes", "bytes that are no image", "http:// URL", "PNG bytes as text/plain"].contains(what) {
            assert_eq!(v["error"]["param"], "messages", "{what}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
        }
        // The server keeps serving: the real screenshot (PNG, then JPEG) right after.
        let uri = if i % 2 == 0 { data_uri("image/png", &png) } else { data_uri("image/jpg", &jpg) };
        let (status, ok) = post(&http, &body(&format!("ok-{i}"), &uri)).await;
        assert_eq!(status, 200, "after {what}: {ok}");
        let t = &ok["tandem"];
        assert_eq!(t["image_tokens"].as_u64(), Some(SCREENSHOT_TOKENS), "after {what}: {t}");
        let (enc, hits) = (t["images_encoded"].as_u64().unwrap(), t["image_cache_hits"].as_u64().unwrap());
        assert_eq!(enc + hits, 1, "after {what}: {t}");
        // encoder_ms is the time of actual encodes: 0 for a cache hit.
        assert_eq!(t["encoder_ms"].as_f64().unwrap() > 0.0, enc > 0, "after {what}: {t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_to_a_text_only_model_is_http_400_and_text_is_served() {
    let mut servers = start_with(options(false)).await;
    let http = start_http(&mut servers).await;
    let (status, v) = post(&http, &body("img", &data_uri("image/png", &screenshot(0)))).await;
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("messages[1].content[1]") && message.contains("--mmproj"), "{message}");
    let text = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "What now?"}]}).to_string();
    let (status, ok) = post(&http, &text).await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["tandem"]["image_tokens"].as_u64(), Some(0), "{ok}");
}
