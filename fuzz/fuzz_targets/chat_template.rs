//! The chat templates the project serves, rendered with hostile messages, each with its model's
//! tokenizer:
//! - the tiny Qwen3.5 fixture GGUF (compiled in): its tokenizer with the template the worker
//!   uses for it (`ChatTemplate::from_gguf`; the fixtures carry no template, so ChatML), and the
//!   same tokenizer with the Qwen3-style template of `gguf/tests/template_render.rs`
//!   (`fuzz/templates/qwen3_style.jinja`: tools, namespace, `</think>` stripping,
//!   `raise_exception`; no real Qwen3.5 template is in the repository);
//! - when the default model is present (`$TANDEM_MODEL`, else
//!   `~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf`), SmolLM2's own template.
//!
//! Each input goes through the worker's path, `device_worker::prompt::render_chat` (role
//! check, special-token escaping, render), and through one of the direct renders
//! (`ChatTemplate::render` with any role and raw contents, without or with the generation
//! prompt, or `render_with` `tools` and `enable_thinking`).
//!
//! Input: one selector byte (template: byte % number of templates, which are in the order
//! above: 0 ChatML, 1 Qwen3-style, 2 SmolLM2; raw-render variant: byte / 4 % 3), then UTF-8
//! text: messages separated by U+001E, each `role U+001F content` (no U+001F: role `user`).
//! Properties: no panic; an escaped content (`Tokenizer::escape_special`) tokenizes without
//! control tokens; `render_chat` refuses exactly the roles outside `CHAT_ROLES`; output
//! length is bounded by a constant plus a multiple of the input length.
#![no_main]

use std::sync::OnceLock;

use device_worker::error::WorkerError;
use device_worker::prompt::{render_chat, CHAT_ROLES};
use gguf::{ChatMessage, ChatTemplate, GgufFile, Tokenizer};
use libfuzzer_sys::fuzz_target;

static QWEN35_GGUF: &[u8] = include_bytes!("../../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf");
static QWEN3_STYLE: &str = include_str!("../templates/qwen3_style.jinja");
const SMOLLM2_DEFAULT: &str = ".cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn load(file: &GgufFile, what: &str) -> (Tokenizer, ChatTemplate) {
    let tok = Tokenizer::from_gguf(file).unwrap_or_else(|e| panic!("{what}: tokenizer: {e}"));
    let tmpl = ChatTemplate::from_gguf(file).unwrap_or_else(|e| panic!("{what}: template: {e}"));
    (tok, tmpl)
}

fn templates() -> &'static [(Tokenizer, ChatTemplate)] {
    static T: OnceLock<Vec<(Tokenizer, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let qwen = GgufFile::from_bytes(QWEN35_GGUF).expect("qwen35 fixture");
        let (tok, chatml) = load(&qwen, "qwen35 fixture");
        let qwen3_style = ChatTemplate::new(QWEN3_STYLE, "", "<|im_end|>").expect("qwen3-style template compiles");
        let mut out = vec![(tok, chatml), (Tokenizer::from_gguf(&qwen).expect("qwen35 tokenizer"), qwen3_style)];
        let smol = std::env::var_os("TANDEM_MODEL")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(SMOLLM2_DEFAULT)));
        match smol.filter(|p| p.exists()) {
            Some(p) => out.push(load(&GgufFile::open(&p).expect("default model"), "default model")),
            None => eprintln!("chat_template: default model not found ($TANDEM_MODEL); fuzzing the Qwen3.5 template only"),
        }
        out
    })
}

fn messages(text: &str) -> Vec<ChatMessage> {
    text.split('\u{1e}')
        .map(|m| match m.split_once('\u{1f}') {
            Some((role, content)) => ChatMessage::new(role, content),
            None => ChatMessage::new("user", m),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let all = templates();
    let (tok, tmpl) = &all[selector as usize % all.len()];
    let msgs = messages(text);
    let roles_ok = msgs.iter().all(|m| CHAT_ROLES.contains(&m.role.as_str()));
    // Templates add a fixed frame per message; escaping a special token's text grows it by a
    // few bytes.
    let bound = 4096 + 512 * msgs.len() + 8 * text.len();
    // The worker's escaping: a content, escaped, holds no control token when tokenized with
    // special tokens parsed (what the rendered prompt is), whatever special-token text it had.
    // (Checked when escaping changed the content, of at most 256 bytes: a content without
    // special-token text is left as is, and tokenizing is most of this target's time.)
    let first = msgs.first().map(|m| tok.escape_special(&m.content));
    if let Some(std::borrow::Cow::Owned(escaped)) = first.filter(|e| e.len() <= 256) {
        let ids = tok.encode(&escaped, true).expect("byte-level vocabularies encode any text");
        let bos = tok.bos().filter(|_| tok.add_bos());
        assert!(
            ids.iter().enumerate().all(|(i, &id)| !tok.is_control(id) || (i == 0 && Some(id) == bos)),
            "escaped content {escaped:?} tokenizes to a control token: {ids:?}"
        );
    }
    match render_chat(tok, tmpl, &msgs) {
        Ok(out) => {
            assert!(roles_ok, "render_chat accepted a role outside {CHAT_ROLES:?}");
            assert!(out.len() <= bound, "output {} bytes over {bound}", out.len());
        }
        Err(WorkerError::InvalidRequest(_)) => assert!(!roles_ok, "render_chat refused a valid role"),
        Err(WorkerError::Template(_)) => assert!(roles_ok),
        Err(e) => panic!("unexpected error: {e}"),
    }
    let raw = match selector / 4 % 3 {
        0 => tmpl.render(&msgs, false),
        1 => tmpl.render(&msgs, true),
        _ => tmpl.render_with(
            &msgs,
            true,
            minijinja::context! {
                tools => vec![serde_json::json!({"name": msgs[0].content})],
                enable_thinking => selector % 2 == 0,
            },
        ),
    };
    if let Ok(out) = raw {
        assert!(out.len() <= 2 * bound, "raw render: output {} bytes over {}", out.len(), 2 * bound);
    }
});
