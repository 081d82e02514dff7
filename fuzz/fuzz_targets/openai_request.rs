//! OpenAI chat-completion request bodies -> the worker's `GenerateRequest`, the path of
//! `POST /v1/chat/completions` (`ChatCompletionRequest::from_body`, then
//! `to_generate_request`). Properties: no panic; an accepted request has at least one message,
//! roles system/user/assistant only, at most 4 non-empty stop strings, and a JSON schema that
//! is empty or a JSON object.
#![no_main]

use agent_gateway::http::openai::{ChatCompletionRequest, MAX_STOP_STRINGS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = ChatCompletionRequest::from_body(data) else { return };
    let _ = (req.streaming(), req.requested_model(), req.max_tokens_param());
    let Ok(gen) = req.to_generate_request("fuzz-session", 7) else { return };
    let Some(prompt) = gen.prompt else { panic!("no prompt") };
    let tandem_proto::step::v1::generate_request::Prompt::Chat(chat) = prompt else {
        panic!("not a chat prompt")
    };
    assert!(!chat.messages.is_empty());
    assert!(chat.messages.iter().all(|m| ["system", "user", "assistant"].contains(&m.role.as_str())));
    assert!(gen.stop.len() <= MAX_STOP_STRINGS && gen.stop.iter().all(|s| !s.is_empty()));
    if !gen.json_schema.is_empty() {
        let v: serde_json::Value = serde_json::from_str(&gen.json_schema).expect("schema is JSON");
        assert!(v.is_object());
    }
    assert!(gen.sampling.is_some());
});
