//! Images in chat prompts on the real engine over loopback gRPC (issue 19, item 4): the tiny
//! Qwen3.5-VL fixture (`tests/fixtures/qwen35vl/`) with its projector and real corpus
//! screenshots (`corpus/raw/llamatouch_evaluator/trace_18`). Token counts come from the
//! response's `PrefillStats`; expected positions from tokenizing the ChatML text written out
//! here (the fixture has no template of its own: the worker falls back to ChatML).

use device_worker::config::EngineOptions;
use gguf::{GgufFile, Tokenizer};
use tandem_proto::step::v1 as pb;

mod common;
mod support;

use common::{generate, start_worker};
use device_worker::model::vision::RgbImage;
use support::vision::{corpus_jpeg, encode_png, file};
use test_support::images::bomb_png;

/// Rules long enough that the user message starts more than `--checkpoint-min-gap` (20)
/// tokens in.
const SYSTEM: &str = "You operate an Android phone for the user. Read the task, the history and \
the screenshot, then reply with exactly one JSON action such as {\"action\": \"tap\", \"index\": 3}.";
const TASK: &str =
    "Task: turn on Wi-Fi in the Settings app and then go back to the home screen.\nHistory:\n";
const AFTER: &str = "\nWhat is the next action?";

/// Image tokens of a 1080×2400 screenshot at `--image-max-tokens 256`: llama.cpp's
/// `calc_size_preserved_ratio` scales by √(1080·2400 / (256·32²)) = 3.144 and floors to
/// multiples of 32: 320×736 px, 10×23 merged patches.
const SCREENSHOT_TOKENS: u32 = 230;

fn options(image_cache_mib: usize) -> EngineOptions {
    EngineOptions {
        model: Some(file("tiny-qwen35vl-f32.gguf")),
        mmproj: Some(file("mmproj-tiny-qwen35vl-f32.gguf")),
        image_max_tokens: 256,
        image_cache_mib,
        threads: Some(2),
        ctx_size: 2048,
        slots: 2,
        micro_batch: 128,
        ..Default::default()
    }
}

fn screenshot(i: usize) -> Vec<u8> {
    let p = test_support::corpus_dir().join(format!("llamatouch_evaluator/trace_18/{i}.png"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn history_text(history: &[&str]) -> String {
    history.iter().map(|h| format!("- {h}\n")).collect()
}

/// One screenshot step: the rules, then the task, history, screenshot and question (the
/// shared system + user chat, with the image and the question as the user message's parts).
fn step(session: &str, history: &[&str], image: Vec<u8>) -> pb::GenerateRequest {
    let part = |p| pb::ContentPart { part: Some(p) };
    let mut req = common::chat(session, SYSTEM, &format!("{TASK}{}", history_text(history)), 6);
    let Some(pb::generate_request::Prompt::Chat(chat)) = req.prompt.as_mut() else {
        unreachable!("common::chat builds a chat prompt")
    };
    chat.messages[1].parts = vec![
        part(pb::content_part::Part::Image(image)),
        part(pb::content_part::Part::Text(AFTER.into())),
    ];
    req
}

/// Tokens of the ChatML text up to the user message (`head`) and up to the end of its
/// history (`head` + task + history).
fn text_positions(history: &[&str]) -> (u32, u32) {
    let f = GgufFile::open(&file("tiny-qwen35vl-f32.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let head = format!("<|im_start|>system\n{SYSTEM}<|im_end|>\n");
    let n = |t: &str| tok.encode(t, true).unwrap().len() as u32;
    let user = format!("{head}<|im_start|>user\n{TASK}{}", history_text(history));
    (n(&head), n(&user))
}

fn prefill(c: &common::Collected) -> pb::PrefillStats {
    c.prefill.clone().expect("prefill stats")
}

fn ids(c: &common::Collected) -> Vec<u32> {
    c.tokens.iter().map(|t| t.id).collect()
}

/// Step 2 of a screenshot episode restores the text checkpoint before the image, and an
/// unchanged screenshot is not encoded again; the outputs equal those of a fresh worker per
/// step with the image cache off (nothing reused, everything encoded and computed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshot_steps_restore_the_text_before_the_image_and_reuse_encodings() {
    let h1: &[&str] = &["opened the Settings app"];
    let h2: &[&str] = &["opened the Settings app", "tapped Network and internet"];
    let steps = [(h1, 0), (h2, 1), (h2, 0)];
    let mut on = start_worker(options(128)).await;
    let mut got = Vec::new();
    for (i, (history, shot)) in steps.iter().enumerate() {
        let a = generate(&mut on.client, step("episode", history, screenshot(*shot)))
            .await
            .unwrap();
        let mut off = start_worker(options(0)).await;
        let b = generate(&mut off.client, step("episode", history, screenshot(*shot)))
            .await
            .unwrap();
        assert!(!ids(&a).is_empty(), "step {i}: no output");
        assert_eq!(
            ids(&a),
            ids(&b),
            "step {i}: output with reuse differs from a full recompute"
        );
        let (pa, pb_) = (prefill(&a), prefill(&b));
        assert_eq!(
            (pa.image_tokens, pb_.image_tokens),
            (SCREENSHOT_TOKENS, SCREENSHOT_TOKENS),
            "step {i}"
        );
        assert_eq!(pa.prompt_tokens, pb_.prompt_tokens, "step {i}");
        // A fresh worker computes the whole prompt and encodes the screenshot.
        assert_eq!(
            (pb_.reused_tokens, pb_.images_encoded, pb_.image_cache_hits),
            (0, 1, 0),
            "step {i}"
        );
        got.push(pa);
    }
    let (user_start, _) = text_positions(h1);
    let (_, d2) = text_positions(&h2[..1]);
    // Step 1: cold; its one checkpoint goes to the user message's start.
    assert_eq!(
        (
            got[0].reused_tokens,
            got[0].images_encoded,
            got[0].image_cache_hits
        ),
        (0, 1, 0)
    );
    assert!(got[0].encoder_ms > 0.0, "an encode takes time");
    // Step 2: the history grew by a line, then a new screenshot: resumes at the user
    // message's start; new = text after it + image + text after the image. Saves at the
    // divergence point (the new history line), before the image.
    assert_eq!(got[1].reused_tokens, user_start);
    assert_eq!(got[1].new_tokens, got[1].prompt_tokens - user_start);
    assert_eq!((got[1].images_encoded, got[1].image_cache_hits), (1, 0));
    // Step 3: same text, the first screenshot again: resumes at step 2's text checkpoint
    // (the start of the line that step 2 added), before the image; the screenshot comes from
    // the image cache.
    assert_eq!(
        got[2].reused_tokens, d2,
        "resumes at the text checkpoint before the image"
    );
    assert!(got[2].new_tokens > SCREENSHOT_TOKENS);
    assert_eq!(got[2].new_tokens, got[2].prompt_tokens - d2);
    assert_eq!(
        (got[2].images_encoded, got[2].image_cache_hits),
        (0, 1),
        "not encoded again"
    );
    // encoder_ms times encodes only: a cache hit adds nothing.
    assert_eq!(got[2].encoder_ms, 0.0, "a cache hit is no encode");
}

fn message(role: &str, content: &str, parts: Vec<pb::content_part::Part>) -> pb::ChatMessage {
    pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        parts: parts.into_iter().map(|p| pb::ContentPart { part: Some(p) }).collect(),
    }
}

/// A fresh slot whose first prompt has its screenshot in an earlier user message (the last
/// user message is text) saves the text checkpoint before that image (at the start of its
/// line), so the next turn resumes with the rules and task and processes only the image and
/// what follows it; its output equals a full recompute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_slot_saves_the_text_before_an_image_in_an_earlier_message() {
    use pb::content_part::Part;
    let first = vec![
        message("system", SYSTEM, vec![]),
        message("user", TASK, vec![Part::Image(screenshot(0)), Part::Text(AFTER.into())]),
        message("assistant", "{\"action\": \"wait\"}", vec![]),
        message("user", "The screen did not change. What is the next action?", vec![]),
    ];
    let mut second = first.clone();
    second.push(message("assistant", "{\"action\": \"navigate_home\"}", vec![]));
    second.push(message("user", "What is the next action now?", vec![]));
    let req = |messages: Vec<pb::ChatMessage>| pb::GenerateRequest {
        session_id: "episode".into(),
        prompt: Some(pb::generate_request::Prompt::Chat(pb::ChatPrompt { messages })),
        max_tokens: 6,
        ..Default::default()
    };
    let mut w = start_worker(options(128)).await;
    let a1 = generate(&mut w.client, req(first)).await.unwrap();
    assert_eq!(prefill(&a1).reused_tokens, 0, "a fresh slot");
    let a2 = generate(&mut w.client, req(second.clone())).await.unwrap();
    // The image's line starts right after "<|im_start|>user\n" + the task text.
    let (_, image_line) = text_positions(&[]);
    let p2 = prefill(&a2);
    assert_eq!(p2.reused_tokens, image_line, "resumes at the text before the image");
    assert_eq!(p2.new_tokens, p2.prompt_tokens - image_line);
    assert_eq!((p2.images_encoded, p2.image_cache_hits), (0, 1));
    let mut fresh = start_worker(options(0)).await;
    let b2 = generate(&mut fresh.client, req(second)).await.unwrap();
    assert_eq!(ids(&a2), ids(&b2), "output differs from a full recompute");
}

/// `--image-request-mpx`: the decoded pixels of a request's images together are bounded,
/// checked from the headers; over the budget the request is INVALID_ARGUMENT naming the
/// image that crossed it and the option, and the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_its_pixel_budget_is_refused() {
    use pb::content_part::Part;
    // A 1080×2400 screenshot is 2.59 Mpx: one fits in 5 Mpx, two do not.
    let mut w = start_worker(EngineOptions { image_request_mpx: 5, ..options(16) }).await;
    let mut two = step("s", &["x"], screenshot(0));
    let Some(pb::generate_request::Prompt::Chat(chat)) = two.prompt.as_mut() else { unreachable!() };
    chat.messages[1].parts.push(pb::ContentPart { part: Some(Part::Image(screenshot(1))) });
    let e = generate(&mut w.client, two).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    for says in ["messages[1].parts[2]", "5184000 pixels", "limit is 5000000", "--image-request-mpx"] {
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }
    let ok = generate(&mut w.client, step("s", &["x"], screenshot(0))).await.unwrap();
    assert_eq!(prefill(&ok).image_tokens, SCREENSHOT_TOKENS);
}

/// `--checkpoint-after-image`: the state after the image is saved and serves the next prompt
/// with the same text and the same image, but not one with another image of the same size
/// (image tokens stand for the image's content), and outputs stay those of a full recompute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_after_an_image_serves_only_the_same_image() {
    let h: &[&str] = &["opened the Settings app"];
    let mut w = start_worker(EngineOptions { checkpoint_after_image: true, ..options(128) }).await;
    let (_, text) = text_positions(h);
    // Text, <|vision_start|>, then the image's tokens.
    let image_end = text + 1 + SCREENSHOT_TOKENS;
    let mut got = Vec::new();
    for shot in [1, 0, 0] {
        let a = generate(&mut w.client, step("episode", h, screenshot(shot))).await.unwrap();
        let mut fresh = start_worker(options(0)).await;
        let b = generate(&mut fresh.client, step("episode", h, screenshot(shot))).await.unwrap();
        assert_eq!(ids(&a), ids(&b), "screenshot {shot}: output differs from a full recompute");
        got.push(prefill(&a));
    }
    // Another screenshot of the same size after the same text: not resumed past the image.
    assert!(got[1].reused_tokens < text, "resumed at {} past the text", got[1].reused_tokens);
    assert_eq!((got[1].images_encoded, got[1].image_cache_hits), (1, 0));
    // The same screenshot again: resumed right after it; nothing to encode or look up.
    assert_eq!(got[2].reused_tokens, image_end);
    assert_eq!(got[2].new_tokens, got[2].prompt_tokens - image_end);
    assert_eq!((got[2].images_encoded, got[2].image_cache_hits), (0, 0));
}

fn tiny_png(w: usize, h: usize) -> Vec<u8> {
    encode_png(&RgbImage::filled(w, h, [30, 120, 200]))
}

/// Each bad image is INVALID_ARGUMENT naming its part, and the worker keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_are_invalid_argument_and_the_worker_keeps_serving() {
    let mut w = start_worker(options(16)).await;
    let good = screenshot(2);
    let bad: [(&str, Vec<u8>, &str); 6] = [
        (
            "truncated PNG",
            good[..good.len() / 2].to_vec(),
            "cannot be decoded",
        ),
        ("zero bytes", vec![], "empty"),
        ("1x1 image", tiny_png(1, 1), "at least 32 pixels"),
        (
            "20000x20000 PNG bomb",
            bomb_png(20000, 20000),
            "20000x20000",
        ),
        (
            "JPEG cut to 7 % of its bytes",
            {
                let jpg = corpus_jpeg();
                jpg[..jpg.len() * 7 / 100].to_vec()
            },
            "truncated",
        ),
        (
            "bytes that are no image",
            b"just some text, no image at all".to_vec(),
            "not supported",
        ),
    ];
    for (what, bytes, says) in bad {
        let e = generate(&mut w.client, step(what, &["x"], bytes))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(
            e.message().contains("messages[1].parts[0]"),
            "{what}: {}",
            e.message()
        );
        assert!(e.message().contains(says), "{what}: {}", e.message());
        let ok = generate(&mut w.client, step("after", &["x"], good.clone()))
            .await
            .unwrap();
        assert_eq!(prefill(&ok).image_tokens, SCREENSHOT_TOKENS, "after {what}");
    }
    // A worker without --mmproj refuses images, then serves text.
    let mut text = start_worker(EngineOptions {
        mmproj: None,
        image_max_tokens: EngineOptions::default().image_max_tokens,
        image_cache_mib: EngineOptions::default().image_cache_mib,
        ..options(16)
    })
    .await;
    let e = generate(&mut text.client, step("t", &["x"], good))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("--mmproj"), "{}", e.message());
    let ok = generate(&mut text.client, common::chat("t", SYSTEM, "What now?", 4))
        .await
        .unwrap();
    assert_eq!(prefill(&ok).image_tokens, 0);
}
