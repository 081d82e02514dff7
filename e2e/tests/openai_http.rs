//! What an OpenAI client gets from the gateway's endpoint when it asks for what the endpoint
//! does not do, over real HTTP and gRPC on loopback to a real worker on the default model
//! (with a small context, [`N_CTX`]):
//!
//! - a field the endpoint does not implement and that would change the answer (`tools`,
//!   `tool_choice`, `functions`, `function_call`, `logprobs: true`, `top_logprobs`, `n` > 1,
//!   penalties, `logit_bias`, an unknown field) is a 400 `unsupported_parameter` naming it,
//!   not silently ignored; neutral values (`logprobs: false`, `n: 1`, `tools: []`) and
//!   fields that change nothing (`user`, `metadata`, `store`) are served;
//! - `GET /v1/models` lists one id, a token without spaces (the GGUF file stem); a request
//!   naming it or no model is served with that id as `model` (JSON and server-sent events);
//!   another model is a 404 `model_not_found` naming the served id;
//! - errors speak the request's terms: a wrong type says what the field takes (not serde's
//!   "expected u32"), a budget sent as `max_completion_tokens` is named so, a request over the
//!   context is `context_length_exceeded`; no error carries the worker's address or a gRPC
//!   code, also when the only worker is unreachable (503);
//! - messages are checked as the request is: an unknown or unimplemented message key is a 400
//!   `unsupported_parameter` naming `messages[i].KEY`, a missing or null `content` a 400 naming
//!   `messages[i].content` (but an assistant's `refusal` stands for its content), `max_tokens`
//!   beside a different `max_completion_tokens` a 400, a lone surrogate escape a 400 saying so.
//!
//! After each refused request the next valid one is served.

mod common;

use serde_json::{json, Value};

/// Context of the worker here: small, so a prompt over it is short.
const N_CTX: usize = 256;

fn worker_options() -> device_worker::config::EngineOptions {
    device_worker::config::EngineOptions { ctx_size: N_CTX, slots: 1, ..common::engine_options(common::model_path()) }
}

/// `POST /v1/chat/completions` with `body`; the status and the raw body.
async fn post_raw(http: &str, body: &Value) -> (u16, String) {
    common::http_post(http, "/v1/chat/completions", &body.to_string()).await
}

/// `POST /v1/chat/completions` with `body`; the status and the body as JSON.
async fn post(http: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_raw(http, body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// One user message.
fn ask(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 2})
}

/// `ask("Say hi.")` with `field` set to `value`.
fn with(field: &str, value: Value) -> Value {
    let mut body = ask("Say hi.");
    body[field] = value;
    body
}

/// The endpoint still serves a valid request.
async fn assert_serves(http: &str, after: &str) {
    let (status, v) = post(http, &ask("Say hi.")).await;
    assert_eq!(status, 200, "after {after}: {v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "after {after}: {v}");
}

/// `body` is refused with `status`, `code` and `param`, in OpenAI's error shape, without the
/// worker's address or a gRPC code in it; the next valid request is served. Returns the
/// message.
async fn assert_refused(http: &str, worker: &str, body: &Value, status: u16, code: &str, param: Option<&str>) -> String {
    let (got, text) = post_raw(http, body).await;
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(got, status, "{body}: {text}");
    let e = &v["error"];
    assert_eq!((e["code"].as_str(), e["param"].as_str()), (Some(code), param), "{body}: {text}");
    assert_eq!(e["type"], "invalid_request_error", "{text}");
    let message = e["message"].as_str().expect("error.message").to_string();
    assert_no_internals(&text, worker);
    assert_serves(http, &body.to_string()).await;
    message
}

/// `text` (an error body) names no worker address and no gRPC code.
fn assert_no_internals(text: &str, worker: &str) {
    let host_port = worker.trim_start_matches("http://");
    assert!(!text.contains(host_port), "the worker's address leaked: {text}");
    for internal in ["InvalidArgument", "Unavailable", "OutOfRange", "Internal", "transport error", "http://"] {
        assert!(!text.contains(internal), "{internal:?} leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_fields_are_400_unsupported_parameter_naming_them() {
    let mut servers = common::start_with(worker_options()).await;
    let http = common::start_http(&mut servers).await;
    let tool = json!([{"type": "function", "function": {"name": "tap", "parameters": {"type": "object"}}}]);
    for (field, value) in [
        ("tools", tool),
        ("tool_choice", json!("required")),
        ("functions", json!([{"name": "tap", "parameters": {"type": "object"}}])),
        ("function_call", json!("auto")),
        ("logprobs", json!(true)),
        ("top_logprobs", json!(2)),
        ("n", json!(2)),
        ("frequency_penalty", json!(0.5)),
        ("presence_penalty", json!(1)),
        ("logit_bias", json!({"1000": 100})),
        ("response_mode", json!("fast")),
    ] {
        let message = assert_refused(&http, &servers.worker, &with(field, value.clone()), 400, "unsupported_parameter", Some(field)).await;
        assert!(message.starts_with(&format!("{field}: unsupported: ")), "{field}: {message}");
    }
    // Neutral values and fields that change nothing are served.
    for (field, value) in [
        ("logprobs", json!(false)),
        ("n", json!(1)),
        ("tools", json!([])),
        ("tool_choice", json!("none")),
        ("frequency_penalty", json!(0)),
        ("tools", Value::Null),
        ("user", json!("ep-7")),
        ("metadata", json!({"run": "42"})),
        ("store", json!(false)),
    ] {
        let (status, v) = post(&http, &with(field, value.clone())).await;
        assert_eq!(status, 200, "{field}: {value}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_is_the_served_id_and_another_is_404() {
    let mut servers = common::start_with(worker_options()).await;
    let http = common::start_http(&mut servers).await;
    let (status, text) = common::http_get(&http, "/v1/models").await;
    assert_eq!(status, 200, "{text}");
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    let stem = common::model_path().file_stem().unwrap().to_string_lossy().into_owned();
    assert_eq!(ids, [stem.as_str()], "{text}");
    let id = ids[0];
    assert!(!id.contains(char::is_whitespace), "{id:?}");

    // Named or omitted: served, and the response's model is the id.
    for body in [json!({"model": id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}), ask("Say hi.")] {
        let (status, v) = post(&http, &body).await;
        assert_eq!(status, 200, "{body}: {v}");
        assert_eq!(v["model"], id, "{v}");
    }
    let mut stream = with("stream", json!(true));
    stream["model"] = json!(id);
    let (status, events) = post_raw(&http, &stream).await;
    assert_eq!(status, 200, "{events}");
    let chunks: Vec<Value> = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.len() >= 2 && chunks.iter().all(|c| c["model"] == id), "{events}");

    // Another model: 404 naming both.
    for other in ["tandem", "gpt-4o", "SmolLM2 135M Instruct"] {
        let mut body = ask("Say hi.");
        body["model"] = json!(other);
        let message = assert_refused(&http, &servers.worker, &body, 404, "model_not_found", Some("model")).await;
        assert_eq!(message, format!("The model `{other}` does not exist; this server serves `{id}`"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_clients_fields_and_no_internals() {
    let mut servers = common::start_with(worker_options()).await;
    let http = common::start_http(&mut servers).await;
    let worker = servers.worker.clone();

    // Wrong types and ranges: what the field takes, in the field's own name.
    for (field, value, says) in [
        ("max_completion_tokens", json!(-5), "max_completion_tokens: expected an integer from 1 to 4294967295, found -5"),
        ("max_completion_tokens", json!(0), "max_completion_tokens: expected an integer from 1 to 4294967295, found 0"),
        ("max_tokens", json!("ten"), "max_tokens: expected an integer from 1 to 4294967295, found \"ten\""),
        ("temperature", json!("hot"), "temperature: expected a number from 0 to 2, found \"hot\""),
    ] {
        let message = assert_refused(&http, &worker, &with(field, value), 400, "invalid_value", Some(field)).await;
        assert_eq!(message, says);
    }

    // A budget past the context's end, sent as max_completion_tokens: named so throughout.
    let mut body = ask("Say hi.");
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(N_CTX);
    let message = assert_refused(&http, &worker, &body, 400, "context_length_exceeded", Some("max_completion_tokens")).await;
    assert!(message.starts_with(&format!("max_completion_tokens {N_CTX} does not fit: the context holds {N_CTX} tokens")), "{message}");
    assert!(!message.contains("max_tokens"), "{message}");
    // Sent as max_tokens: named max_tokens.
    let message = assert_refused(&http, &worker, &with("max_tokens", json!(N_CTX)), 400, "context_length_exceeded", Some("max_tokens")).await;
    assert!(message.starts_with(&format!("max_tokens {N_CTX} does not fit")), "{message}");

    // A prompt over the context, plain and streamed.
    let long = ask(&"the ".repeat(2 * N_CTX));
    let message = assert_refused(&http, &worker, &long, 400, "context_length_exceeded", Some("messages")).await;
    assert!(message.starts_with("the prompt has") && message.contains(&format!("the context holds {N_CTX}")), "{message}");
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    assert_refused(&http, &worker, &streamed, 400, "context_length_exceeded", Some("messages")).await;

    // The only worker unreachable: 503 for chat and /v1/models, naming neither its address nor
    // the transport error.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let (down, _stop) = common::serve_http_over(agent_gateway::worker::Router::new(std::slice::from_ref(&dead)).unwrap()).await;
    let (status, text) = post_raw(&down, &ask("Say hi.")).await;
    assert_eq!(status, 503, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "server_error", "{text}");
    assert_no_internals(&text, &dead);
    let (status, text) = common::http_get(&down, "/v1/models").await;
    assert_eq!(status, 503, "{text}");
    assert_no_internals(&text, &dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_checked_as_the_request_is() {
    let mut servers = common::start_with(worker_options()).await;
    let http = common::start_http(&mut servers).await;
    let worker = servers.worker.clone();
    let user = json!({"role": "user", "content": "Say hi."});
    let two = |second: Value| json!({"messages": [user, second], "max_tokens": 2});

    // No content, or a null one: named, not served as an empty turn.
    for (body, param) in [
        (json!({"messages": [{"role": "user"}], "max_tokens": 2}), "messages[0].content"),
        (json!({"messages": [{"role": "user", "content": null}], "max_tokens": 2}), "messages[0].content"),
        (two(json!({"role": "assistant", "content": null})), "messages[1].content"),
    ] {
        let message = assert_refused(&http, &worker, &body, 400, "invalid_value", Some(param)).await;
        assert!(message.starts_with(&format!("{param}: expected a string or a list of text and image_url parts")), "{message}");
    }
    // Unknown or unimplemented message keys: unsupported, named as messages[i].KEY.
    for (body, param) in [
        (two(json!({"role": "user", "content": "x", "frobnicate": 1})), "messages[1].frobnicate"),
        (two(json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "c1", "type": "function"}]})), "messages[1].tool_calls"),
        (two(json!({"role": "user", "content": "x", "tool_call_id": "c1"})), "messages[1].tool_call_id"),
    ] {
        let message = assert_refused(&http, &worker, &body, 400, "unsupported_parameter", Some(param)).await;
        assert!(message.starts_with(&format!("{param}: unsupported: ")), "{message}");
    }
    // Both budgets, different: refused; equal: served.
    let mut both = ask("Say hi.");
    both["max_completion_tokens"] = json!(3);
    let message = assert_refused(&http, &worker, &both, 400, "invalid_value", Some("max_tokens")).await;
    assert_eq!(message, "max_tokens: expected the same value as max_completion_tokens, or no max_tokens (the older name of the same budget), found 2 beside max_completion_tokens 3");
    both["max_completion_tokens"] = json!(2);
    // Served: equal budgets, `name`, an assistant message copied back from a response (null
    // and empty keys), and an assistant's refusal in place of its content.
    for body in [
        both,
        json!({"messages": [{"role": "user", "content": "Say hi.", "name": "ana"}], "max_tokens": 2}),
        two(json!({"role": "assistant", "content": "Hi.", "refusal": null, "tool_calls": [], "function_call": null, "audio": null, "annotations": []})),
        two(json!({"role": "assistant", "content": null, "refusal": "I can't help with that."})),
    ] {
        let (status, v) = post(&http, &body).await;
        assert_eq!(status, 200, "{body}: {v}");
    }
    // A lone surrogate escape: said so, with its place.
    let (status, text) = common::http_post(&http, "/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "a\ud800"}]}"#).await;
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "invalid_json", "{text}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("a JSON string holds an invalid unicode escape at line 1 column "), "{message}");
    assert_serves(&http, "a lone surrogate").await;
}
