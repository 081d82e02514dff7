//! The chat templates the project serves, rendered with hostile messages: the Qwen3.5 template
//! (from the tiny Qwen3.5 fixture GGUF, compiled in) and, when the default model is present
//! (`$TANDEM_MODEL`, else `~/.cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf`), the
//! SmolLM2 template, each with its own tokenizer. Each input goes through the worker's path,
//! `device_worker::prompt::render_chat` (role check, special-token escaping, render), and
//! through `ChatTemplate::render` directly (any role, raw contents, with and without the
//! generation prompt).
//!
//! Input: UTF-8 text; messages separated by U+001E, each `role U+001F content` (no U+001F:
//! role `user`). Properties: no panic; `render_chat` refuses exactly the roles outside
//! `CHAT_ROLES`; output length is bounded by a constant plus a multiple of the input length.
#![no_main]

use std::sync::OnceLock;

use device_worker::error::WorkerError;
use device_worker::prompt::{render_chat, CHAT_ROLES};
use gguf::{ChatMessage, ChatTemplate, GgufFile, Tokenizer};
use libfuzzer_sys::fuzz_target;

static QWEN35_GGUF: &[u8] = include_bytes!("../../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf");
const SMOLLM2_DEFAULT: &str = ".cache/tandem/models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn load(file: &GgufFile, what: &str) -> (Tokenizer, ChatTemplate) {
    let tok = Tokenizer::from_gguf(file).unwrap_or_else(|e| panic!("{what}: tokenizer: {e}"));
    let tmpl = ChatTemplate::from_gguf(file).unwrap_or_else(|e| panic!("{what}: template: {e}"));
    assert!(!tmpl.is_fallback(), "{what} has no chat template");
    (tok, tmpl)
}

fn templates() -> &'static [(Tokenizer, ChatTemplate)] {
    static T: OnceLock<Vec<(Tokenizer, ChatTemplate)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut out = vec![load(&GgufFile::from_bytes(QWEN35_GGUF).expect("qwen35 fixture"), "qwen35 fixture")];
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
    let Ok(text) = std::str::from_utf8(data) else { return };
    let msgs = messages(text);
    let roles_ok = msgs.iter().all(|m| CHAT_ROLES.contains(&m.role.as_str()));
    // Templates add a fixed frame per message; escaping a special token's text grows it by a
    // few bytes.
    let bound = 4096 + 512 * msgs.len() + 8 * text.len();
    for (tok, tmpl) in templates() {
        match render_chat(tok, tmpl, &msgs) {
            Ok(out) => {
                assert!(roles_ok, "render_chat accepted a role outside {CHAT_ROLES:?}");
                assert!(out.len() <= bound, "output {} bytes over {bound}", out.len());
            }
            Err(WorkerError::InvalidRequest(_)) => assert!(!roles_ok, "render_chat refused a valid role"),
            Err(WorkerError::Template(_)) => assert!(roles_ok),
            Err(e) => panic!("unexpected error: {e}"),
        }
        for gen in [false, true] {
            if let Ok(out) = tmpl.render(&msgs, gen) {
                assert!(out.len() <= bound, "raw render: output {} bytes over {bound}", out.len());
            }
        }
    }
});
