//! OpenAI chat-completion requests → worker `GenerateRequest`s, and worker results → OpenAI
//! response JSON.
//!
//! Request and response shapes follow the OpenAI API reference, "Create chat completion"
//! (`POST /v1/chat/completions`) and "The chat completion chunk object". Accepted fields:
//! `model` (omitted, or the id `GET /v1/models` lists: checked in [`super::chat`]),
//! `messages` (roles `system`/`developer`/`user`/`assistant`;
//! content a string or a list of `{"type":"text","text":...}` and `{"type":"image_url",
//! "image_url":{"url":"data:image/png;base64,..."}}` parts, media type image/png or image/jpeg;
//! remote image URLs are refused; errors name a part as `messages[i].content[j]`; `content`
//! is required, and may be null or absent only in an assistant message with a `refusal`, whose
//! text is then the turn's content; a message's other keys are checked as the request's are,
//! [`check_message_fields`]), `max_completion_tokens` or `max_tokens` (both only with the same
//! value), `temperature` (absent or 0: greedy), `top_p`, `top_k` (extension), `seed`,
//! `stop` (a string or up to 4 strings), `stream`, `stream_options.include_usage`,
//! `response_format` (`text`, `json_object`, `json_schema`), `user` (episode affinity), `n`
//! (only 1). Fields that do not change the answer are accepted and ignored
//! ([`IGNORED_FIELDS`]); a field the endpoint does not implement is refused naming it
//! (`unsupported_parameter`, [`check_fields`]) unless it has its neutral value (`logprobs:
//! false`, `frequency_penalty: 0`, `tools: []`, ...; `null` counts as absent), so a client
//! that relies on it never gets an answer computed without it.

use serde::Deserialize;
use serde_json::{json, Value};
use tandem_proto::step::v1 as spb;

use crate::error::ApiError;
use crate::json_kind;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// The fields of a chat-completion request the gateway reads.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<InMessage>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Not an OpenAI field: top-k filtering (0 or absent: off).
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Value>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub n: Option<u32>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` and no choices.
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields [`ChatCompletionRequest`] reads.
pub const READ_FIELDS: &[&str] = &[
    "model", "messages", "max_completion_tokens", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
    "stream_options", "response_format", "user", "n",
];

/// Fields accepted and ignored: they do not change the answer (bookkeeping, caching and
/// latency hints; `parallel_tool_calls` only matters with `tools`, which are refused).
pub const IGNORED_FIELDS: &[&str] =
    &["metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "prediction", "parallel_tool_calls", "cache_prompt"];

/// Why the endpoint cannot honour tool calling.
const NO_TOOLS: &str = "this server has no tool (function) calling: the model answers in text (response_format with a json_schema can constrain that text to JSON)";
/// Why it cannot honour log probabilities.
const NO_LOGPROBS: &str = "this server returns no log probabilities (logprobs: false or absent only)";
/// Why it cannot honour penalties.
const NO_PENALTIES: &str = "this server applies no repetition penalties (0 or absent only)";

/// Fields the endpoint does not implement, accepted only with their neutral value (the one
/// that asks for nothing): the field, that test (`None`: no value is neutral) and why any
/// other value is refused.
const NEUTRAL_ONLY: &[(&str, Option<fn(&Value) -> bool>, &str)] = &[
    ("tools", Some(is_empty_list), NO_TOOLS),
    ("functions", Some(is_empty_list), NO_TOOLS),
    ("tool_choice", Some(is_none_choice), NO_TOOLS),
    ("function_call", Some(is_none_choice), NO_TOOLS),
    ("logprobs", Some(is_false), NO_LOGPROBS),
    ("top_logprobs", Some(is_zero), NO_LOGPROBS),
    ("frequency_penalty", Some(is_zero), NO_PENALTIES),
    ("presence_penalty", Some(is_zero), NO_PENALTIES),
    ("repetition_penalty", Some(is_one), "this server applies no repetition penalty (1 or absent only)"),
    ("logit_bias", Some(is_empty_object), "this server applies no logit bias (an empty object or absent only)"),
    ("min_p", Some(is_zero), "this server samples with temperature, top_p and top_k only (min_p: 0 or absent only)"),
    ("modalities", Some(is_text_only), "this server answers in text only (modalities: [\"text\"] or absent only)"),
    ("audio", None, "this server answers in text only"),
    ("reasoning_effort", None, "the served model has no reasoning-effort setting"),
    ("verbosity", None, "the served model has no verbosity setting"),
    ("web_search_options", None, "this server has no web search"),
];

fn is_empty_list(v: &Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}
fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(serde_json::Map::is_empty)
}
fn is_none_choice(v: &Value) -> bool {
    v.as_str() == Some("none")
}
fn is_false(v: &Value) -> bool {
    v.as_bool() == Some(false)
}
fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
fn is_text_only(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")))
}

/// Refuses a request field the endpoint would otherwise ignore although it changes the answer:
/// `n` above 1, a [`NEUTRAL_ONLY`] field with another value than its neutral one, and any field
/// neither read ([`READ_FIELDS`]) nor known to be harmless ([`IGNORED_FIELDS`]). `null` counts
/// as absent.
///
/// Errors: [`ApiError::Unsupported`] naming the first such field (in key order).
pub fn check_fields(fields: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    for (key, v) in fields {
        if v.is_null() {
            continue;
        }
        let unsupported = |why: String| Err(ApiError::Unsupported { param: key.clone(), why });
        if key == "n" {
            if v.as_f64().is_some_and(|n| n > 1.0) {
                return unsupported(format!("this server returns one choice per request (n: 1 or absent only), found {}", brief(v)));
            }
            continue;
        }
        if READ_FIELDS.contains(&key.as_str()) || IGNORED_FIELDS.contains(&key.as_str()) {
            continue;
        }
        match NEUTRAL_ONLY.iter().find(|(name, _, _)| name == key) {
            Some((_, Some(neutral), _)) if neutral(v) => {}
            Some((_, _, why)) => return unsupported(format!("{why}, found {}", brief(v))),
            None => {
                return unsupported(format!(
                    "unknown parameter; this endpoint reads {} and ignores {}",
                    READ_FIELDS.join(", "),
                    IGNORED_FIELDS.join(", ")
                ))
            }
        }
    }
    Ok(())
}

/// The keys of a message the endpoint reads: `refusal` only in an assistant message (the
/// turn's text when its `content` is null).
pub const MESSAGE_READ_FIELDS: &[&str] = &["role", "content", "refusal"];

/// Message keys accepted and ignored: a participant's `name` (the chat template has no place
/// for it) and `annotations` (citations a client copies back with an earlier answer).
pub const MESSAGE_IGNORED_FIELDS: &[&str] = &["name", "annotations"];

/// Message keys the endpoint does not implement, accepted only with their neutral value, as
/// [`NEUTRAL_ONLY`] (an assistant message copied back from a response carries them as null or
/// `[]`).
const MESSAGE_NEUTRAL_ONLY: &[(&str, Option<fn(&Value) -> bool>, &str)] = &[
    ("tool_calls", Some(is_empty_list), NO_TOOLS),
    ("function_call", None, NO_TOOLS),
    ("tool_call_id", None, NO_TOOLS),
    ("audio", None, "this server takes no audio (an earlier answer's audio cannot be sent back)"),
];

/// What `content` must be, as error text.
const CONTENT_RULE: &str = "a string or a list of text and image_url parts (null or absent only in an assistant message with a refusal)";

/// Refuses a message key the endpoint would otherwise ignore (as [`check_fields`] does for
/// the request's): one neither read ([`MESSAGE_READ_FIELDS`]) nor harmless
/// ([`MESSAGE_IGNORED_FIELDS`]), a [`MESSAGE_NEUTRAL_ONLY`] key with a value that asks for
/// something, and `refusal` outside an assistant message; and a message without `content`
/// (or with a null one) unless it is an assistant's refusal. `null` counts as absent. A
/// message that is no object is left to deserialization ([`bad_field`]).
///
/// Errors: [`ApiError::Unsupported`] naming `messages[i].KEY`; [`ApiError::BadField`] naming
/// `messages[i].content` (or `messages[i].refusal` beside a content).
pub fn check_message_fields(messages: &[Value]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        let Some(fields) = m.as_object() else { continue };
        let assistant = fields.get("role").and_then(Value::as_str) == Some("assistant");
        for (key, v) in fields {
            if v.is_null() {
                continue;
            }
            let unsupported = |why: String| Err(ApiError::Unsupported { param: format!("messages[{i}].{key}"), why });
            if key == "refusal" && !assistant {
                return unsupported("only an assistant message has a refusal".into());
            }
            if MESSAGE_READ_FIELDS.contains(&key.as_str()) || MESSAGE_IGNORED_FIELDS.contains(&key.as_str()) {
                continue;
            }
            match MESSAGE_NEUTRAL_ONLY.iter().find(|(name, _, _)| name == key) {
                Some((_, Some(neutral), _)) if neutral(v) => {}
                Some((_, _, why)) => return unsupported(format!("{why}, found {}", brief(v))),
                None => {
                    return unsupported(format!(
                        "unknown message field; a message takes {} and ignores {}",
                        MESSAGE_READ_FIELDS.join(", "),
                        MESSAGE_IGNORED_FIELDS.join(", ")
                    ))
                }
            }
        }
        let content = fields.get("content").filter(|c| !c.is_null());
        let refusal = fields.get("refusal").filter(|r| !r.is_null());
        match (content, refusal) {
            (None, Some(_)) if assistant => {}
            (None, _) => {
                let found = if fields.contains_key("content") { "null" } else { "no content field" };
                return Err(ApiError::BadField { param: format!("messages[{i}].content"), expected: CONTENT_RULE, found: found.into() });
            }
            (Some(_), Some(r)) => {
                return Err(ApiError::BadField {
                    param: format!("messages[{i}].refusal"),
                    expected: "null or no refusal in a message with a content (a refusal stands for the content)",
                    found: brief(r),
                })
            }
            (Some(_), None) => {}
        }
    }
    Ok(())
}

/// What a request field takes, in the client's terms (for a value that does not deserialize).
fn expected_of(field: &str) -> &'static str {
    match field {
        "messages" => "a list of messages, each an object with a string role and a content",
        "max_tokens" | "max_completion_tokens" => "an integer from 1 to 4294967295",
        "temperature" => "a number from 0 to 2",
        "top_p" => "a number greater than 0 and at most 1",
        "top_k" => "an integer from 0 (off) to 4294967295",
        "seed" => "an integer from 0 to 18446744073709551615",
        "stream" => "true or false",
        "stream_options" => "an object such as {\"include_usage\": true}",
        "model" | "user" => "a string",
        "n" => "1",
        _ => "a value of another type",
    }
}

/// The field of a request object that does not deserialize, as [`ApiError::BadField`]:
/// `messages` when it is missing or one message is not a message (naming it
/// `messages[i]`), else the first field that fails alone beside an empty `messages` list.
fn bad_field(fields: &serde_json::Map<String, Value>) -> ApiError {
    let bad = |param: &str, found: String| ApiError::BadField { param: param.to_string(), expected: expected_of(param), found };
    let Some(messages) = fields.get("messages") else { return bad("messages", "no messages field".into()) };
    let fails = |key: &String, v: &Value| {
        let mut alone = serde_json::Map::from_iter([("messages".to_string(), json!([]))]);
        alone.insert(key.clone(), v.clone());
        serde_json::from_value::<ChatCompletionRequest>(Value::Object(alone)).is_err()
    };
    if let Some((k, v)) = fields.iter().find(|(k, v)| *k != "messages" && fails(k, v)) {
        return bad(k, brief(v));
    }
    match messages {
        Value::Array(list) => match list.iter().position(|m| InMessage::deserialize(m).is_err()) {
            Some(i) => bad("messages", format!("messages[{i}]: {}", brief(&list[i]))),
            None => bad("messages", brief(messages)),
        },
        other => bad("messages", brief(other)),
    }
}

/// One input message; `content` is a string, a list of content parts, or null (an assistant's
/// `refusal` then stands for it: [`check_message_fields`]).
#[derive(Debug, Clone, Deserialize)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    #[serde(default)]
    pub refusal: Option<String>,
}

impl ChatCompletionRequest {
    /// Parses a request body.
    ///
    /// Errors: [`ApiError::BadJson`] when the body is not JSON (a string with a lone UTF-16
    /// surrogate escape is named as such, [`json_syntax_error`]) or not a JSON object;
    /// [`ApiError::Unsupported`] for a field the endpoint does not implement ([`check_fields`],
    /// in a message [`check_message_fields`]); [`ApiError::BadField`] naming the field for
    /// valid JSON with a field of the wrong type or range (`"max_tokens": -5`, `"temperature":
    /// "hot"`), without `messages`, or a message without `content`.
    pub fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::BadJson(json_syntax_error(&e)))?;
        let Value::Object(fields) = &value else {
            return Err(ApiError::BadJson(format!("expected a JSON object, found {}", json_kind(&value))));
        };
        check_fields(fields)?;
        if let Some(Value::Array(messages)) = fields.get("messages") {
            check_message_fields(messages)?;
        }
        serde_json::from_value(value.clone()).map_err(|_| bad_field(fields))
    }

    /// Whether the client asked for server-sent events.
    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The model the request names (`None` when `model` is absent or empty: any served model).
    pub fn requested_model(&self) -> Option<&str> {
        self.model.as_deref().filter(|m| !m.is_empty())
    }

    /// The field that set the output budget, for errors about it: `max_completion_tokens` when
    /// given (a `max_tokens` beside it must be equal), else `max_tokens`.
    pub fn max_tokens_param(&self) -> &'static str {
        if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }

    /// The stop strings (empty strings dropped).
    ///
    /// Errors: [`ApiError::InvalidParam`] (`stop`) for a value that is not a string or a list of
    /// at most [`MAX_STOP_STRINGS`] strings.
    pub fn stop_strings(&self) -> Result<Vec<String>, ApiError> {
        let bad = |found: String| ApiError::InvalidParam { param: "stop", expected: "a string or a list of at most 4 strings", found };
        let stops = match &self.stop {
            None | Some(Value::Null) => vec![],
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => {
                if a.len() > MAX_STOP_STRINGS {
                    return Err(bad(format!("{} strings", a.len())));
                }
                a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(v.to_string()))).collect::<Result<_, _>>()?
            }
            Some(other) => return Err(bad(other.to_string())),
        };
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// The JSON schema (as JSON text) the output must match, from `response_format`: `""`
    /// for none or `text`, `{"type":"object"}` for `json_object`, the given schema for
    /// `json_schema` (`{"type":"json_schema","json_schema":{"name":..,"schema":{..}}}`).
    ///
    /// Errors: [`ApiError::InvalidParam`] (`response_format`) for an unknown type or a
    /// `json_schema` without an object `schema`.
    pub fn json_schema(&self) -> Result<String, ApiError> {
        let bad = |expected: &'static str, found: String| ApiError::InvalidParam { param: "response_format", expected, found };
        let Some(rf) = self.response_format.as_ref().filter(|v| !v.is_null()) else { return Ok(String::new()) };
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => Ok(String::new()),
            Some("json_object") => Ok(json!({"type": "object"}).to_string()),
            Some("json_schema") => match rf.pointer("/json_schema/schema") {
                Some(s @ Value::Object(_)) => Ok(s.to_string()),
                other => Err(bad("json_schema.schema to be a JSON object", other.map(|v| v.to_string()).unwrap_or_else(|| "none".into()))),
            },
            _ => Err(bad("type \"text\", \"json_object\" or \"json_schema\"", rf.to_string())),
        }
    }

    /// The chat messages for the worker (`developer` becomes `system`). A list of content
    /// parts keeps its order: the text before the first image is the message's `content`, the
    /// rest are `parts`; an `image_url` part must carry the image inline as a base64 `data:`
    /// URI (`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`): the
    /// gateway fetches nothing.
    ///
    /// Errors: [`ApiError::InvalidParam`] (`messages`) for no messages, an unsupported role
    /// (`tool`, `function`), a part that is neither text nor image, an http(s) or other
    /// non-`data:` image URL, or a `data:` URI that is not valid base64.
    pub fn chat_messages(&self) -> Result<Vec<spb::ChatMessage>, ApiError> {
        Ok(self.chat_messages_indexed()?.0)
    }

    /// [`ChatCompletionRequest::chat_messages`] with, per message, the OpenAI content index
    /// of each worker part ([`PartOrigins`]).
    ///
    /// Errors: as [`ChatCompletionRequest::chat_messages`].
    pub fn chat_messages_indexed(&self) -> Result<(Vec<spb::ChatMessage>, PartOrigins), ApiError> {
        let bad = |expected: &'static str, found: String| ApiError::InvalidParam { param: "messages", expected, found };
        if self.messages.is_empty() {
            return Err(bad("at least one message", "none".into()));
        }
        let mut origins = PartOrigins::default();
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => return Err(bad("role system, developer, user or assistant", format!("messages[{i}]: role {other:?}"))),
                };
                let (content, parts, from) = match &m.content {
                    // An assistant's refusal (check_message_fields refused a null content
                    // elsewhere; a request built in code gets an empty turn).
                    Value::Null => (m.refusal.clone().unwrap_or_default(), vec![], vec![]),
                    Value::String(s) => (s.clone(), vec![], vec![]),
                    Value::Array(list) => content_parts(i, list)?,
                    other => return Err(bad("content as a string or a list of text and image_url parts", format!("messages[{i}]: {}", brief(other)))),
                };
                origins.0.push(from);
                Ok(spb::ChatMessage { role: role.to_string(), content, parts })
            })
            .collect::<Result<_, _>>()?;
        Ok((messages, origins))
    }

    /// The sampling mode: greedy when `temperature` is absent or 0, else seeded sampling with
    /// `seed` (or `fallback_seed`), `top_p` (absent: 1, off) and `top_k` (absent: 0, off).
    ///
    /// Errors: [`ApiError::InvalidParam`] for `temperature` outside [0, 2] or `top_p` outside
    /// (0, 1] (absent means off here; the seeded parameters then pass the worker's own rule,
    /// [`tandem_proto::limits::check_seeded`], checked here with the same function).
    pub fn sampling(&self, fallback_seed: u64) -> Result<spb::Sampling, ApiError> {
        let t = self.temperature.unwrap_or(0.0);
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::InvalidParam { param: "temperature", expected: expected_of("temperature"), found: t.to_string() });
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::InvalidParam { param: "top_p", expected: expected_of("top_p"), found: top_p.to_string() });
        }
        let mode = if t == 0.0 {
            spb::sampling::Mode::Greedy(spb::Greedy {})
        } else {
            let seeded = spb::Seeded {
                seed: self.seed.unwrap_or(fallback_seed),
                temperature: t,
                top_p,
                top_k: self.top_k.unwrap_or(0),
            };
            tandem_proto::limits::check_seeded(&seeded)?;
            spb::sampling::Mode::Seeded(seeded)
        };
        Ok(spb::Sampling { mode: Some(mode) })
    }

    /// The worker request for this chat completion on session `session_id` (`""`: no slot
    /// affinity).
    ///
    /// Errors: [`ApiError::InvalidParam`] as the accessors above, and for `n` 0, a
    /// `max_tokens` / `max_completion_tokens` of 0 (named as the client sent it), or both
    /// given with different values (`max_tokens`: the older name of the same budget);
    /// [`ApiError::Unsupported`] for `n` above 1.
    pub fn to_generate_request(&self, session_id: &str, fallback_seed: u64) -> Result<spb::GenerateRequest, ApiError> {
        Ok(self.to_generate_request_indexed(session_id, fallback_seed)?.0)
    }

    /// [`ChatCompletionRequest::to_generate_request`] with the [`PartOrigins`] that turn the
    /// worker's `messages[i].parts[j]` in its errors back into this request's
    /// `messages[i].content[k]`.
    ///
    /// Errors: as [`ChatCompletionRequest::to_generate_request`].
    pub fn to_generate_request_indexed(&self, session_id: &str, fallback_seed: u64) -> Result<(spb::GenerateRequest, PartOrigins), ApiError> {
        match self.n {
            Some(0) => return Err(ApiError::InvalidParam { param: "n", expected: "1", found: "0".into() }),
            Some(n) if n > 1 => {
                return Err(ApiError::Unsupported { param: "n".into(), why: format!("this server returns one choice per request (n: 1 or absent only), found {n}") })
            }
            _ => {}
        }
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            return Err(ApiError::InvalidParam { param: self.max_tokens_param(), expected: expected_of("max_tokens"), found: "0".into() });
        }
        if let (Some(old), Some(new)) = (self.max_tokens, self.max_completion_tokens) {
            if old != new {
                return Err(ApiError::InvalidParam {
                    param: "max_tokens",
                    expected: "the same value as max_completion_tokens, or no max_tokens (the older name of the same budget)",
                    found: format!("{old} beside max_completion_tokens {new}"),
                });
            }
        }
        let (messages, origins) = self.chat_messages_indexed()?;
        let req = spb::GenerateRequest {
            session_id: session_id.to_string(),
            prompt: Some(spb::generate_request::Prompt::Chat(spb::ChatPrompt { messages })),
            // 0: the worker's default budget.
            max_tokens: max_tokens.unwrap_or(0),
            stop: self.stop_strings()?,
            sampling: Some(self.sampling(fallback_seed)?),
            json_schema: self.json_schema()?,
            // An explicit max_tokens past the context's end is refused, as OpenAI does.
            cut_max_tokens_at_context: false,
        };
        Ok((req, origins))
    }
}

/// Where each worker content part came from: for message `i`, `0[i][j]` is the index in the
/// OpenAI message's `content` list of the worker's `parts[j]` (the text before the first
/// image becomes the worker message's `content`, so the two indices differ).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartOrigins(pub Vec<Vec<usize>>);

impl PartOrigins {
    /// `message` (a worker error text) with every `messages[i].parts[j]` written as the
    /// OpenAI request's `messages[i].content[k]`; a reference with no known origin is kept.
    pub fn to_openai(&self, message: &str) -> String {
        const HEAD: &str = "messages[";
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.find(HEAD) {
            out.push_str(&rest[..at]);
            let tail = &rest[at..];
            match self.parse_ref(&tail[HEAD.len()..]) {
                Some((i, k, used)) => {
                    out.push_str(&format!("messages[{i}].content[{k}]"));
                    rest = &tail[HEAD.len() + used..];
                }
                None => {
                    out.push_str(HEAD);
                    rest = &tail[HEAD.len()..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// From `s` = `I].parts[J]...`: the message, the OpenAI index and the bytes read.
    fn parse_ref(&self, s: &str) -> Option<(usize, usize, usize)> {
        let (i, after) = s.split_once("].parts[")?;
        let (j, _) = after.split_once(']')?;
        let (i, j): (usize, usize) = (i.parse().ok()?, j.parse().ok()?);
        let k = *self.0.get(i)?.get(j)?;
        Some((i, k, i.to_string().len() + "].parts[".len() + j.to_string().len() + 1))
    }
}

/// OpenAI's `finish_reason` for a worker finish reason: `length` for the token budget or a
/// full context, `stop` otherwise (end of generation, stop string, completed JSON schema).
pub fn finish_reason(reason: i32) -> &'static str {
    match spb::FinishReason::try_from(reason) {
        Ok(spb::FinishReason::Length) | Ok(spb::FinishReason::Context) => "length",
        _ => "stop",
    }
}

/// Where a request ran, for the response's `tandem` extension object.
#[derive(Debug, Clone, Default)]
pub struct RunInfo {
    pub worker: String,
    pub session_id: String,
    pub slot_id: u32,
    /// The worker's prefill figures (slot, image tokens, images encoded and found in the
    /// image cache, encoder time), once its `PrefillStats` event came.
    pub prefill: spb::PrefillStats,
}

impl RunInfo {
    /// Takes the worker's prefill event.
    pub fn on_prefill(&mut self, p: spb::PrefillStats) {
        self.slot_id = p.slot_id;
        self.prefill = p;
    }
}

/// OpenAI `usage` from the worker's final stats: `prompt_tokens`, `completion_tokens`,
/// `total_tokens`, and `prompt_tokens_details.cached_tokens` = prompt tokens whose KV cache was
/// reused from the slot.
pub fn usage_json(done: &spb::FinalStats) -> Value {
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.decode_tokens,
        "total_tokens": done.prompt_tokens + done.decode_tokens,
        "prompt_tokens_details": {"cached_tokens": done.reused_tokens},
    })
}

/// The `tandem` extension object: routing, the worker's timings (milliseconds) and its image
/// figures (`image_tokens` in the prompt; `images_encoded` and `image_cache_hits` past the
/// reused prefix; `encoder_ms`, the time encoding them, part of `prefill_ms`).
pub fn tandem_json(done: &spb::FinalStats, run: &RunInfo) -> Value {
    let p = &run.prefill;
    json!({
        "image_tokens": p.image_tokens,
        "images_encoded": p.images_encoded,
        "image_cache_hits": p.image_cache_hits,
        "encoder_ms": p.encoder_ms,
        "worker": run.worker,
        "session_id": run.session_id,
        "slot_id": run.slot_id,
        "reused_tokens": done.reused_tokens,
        "new_tokens": done.new_tokens,
        "kv_bound_tokens": done.kv_bound_tokens,
        "passes": done.passes,
        "queue_ms": done.queue_ms,
        "prefill_ms": done.prefill_ms,
        "decode_ms": done.decode_ms,
        "server_ms": done.server_ms,
        "ms_per_token": done.ms_per_token,
    })
}

/// A whole `chat.completion` object.
pub fn completion_json(id: &str, created: u64, model: &str, content: &str, done: &spb::FinalStats, run: &RunInfo) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": null,
            "finish_reason": finish_reason(done.finish_reason),
        }],
        "usage": usage_json(done),
        "tandem": tandem_json(done, run),
    })
}

/// A `chat.completion.chunk` object with one choice: `delta` (e.g. `{"content": "..."}`) and
/// `finish_reason` (null until the last chunk).
pub fn chunk_json(id: &str, created: u64, model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
}

/// The last chunk of a stream with `stream_options.include_usage`: no choices, `usage` set.
pub fn usage_chunk_json(id: &str, created: u64, model: &str, done: &spb::FinalStats, run: &RunInfo) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_json(done),
        "tandem": tandem_json(done, run),
    })
}

/// What an `image_url` part must hold, as error text.
pub const IMAGE_URL_RULE: &str =
    "an image inline as a base64 data: URI of media type image/png or image/jpeg (data:image/png;base64,...): the gateway fetches nothing";

/// What the bytes of an `image_url` data: URI must be, as error text.
const IMAGE_BYTES_RULE: &str = "the bytes of a PNG or JPEG image";

/// The media types an `image_url` data: URI may declare (`image/jpg` is a common misspelling
/// of `image/jpeg`, accepted as such); ASCII case does not matter.
pub const IMAGE_MEDIA_TYPES: [&str; 3] = ["image/png", "image/jpeg", "image/jpg"];

/// Message `i`'s content parts: the text before the first image as `content`, then text and
/// image parts in order, with each part's index in `list` (its [`PartOrigins`] row).
///
/// Errors: [`ApiError::InvalidParam`] (`messages`) as [`ChatCompletionRequest::chat_messages`].
fn content_parts(i: usize, list: &[Value]) -> Result<(String, Vec<spb::ContentPart>, Vec<usize>), ApiError> {
    use spb::content_part::Part;
    let bad = |expected: &'static str, found: String| ApiError::InvalidParam { param: "messages", expected, found };
    let (mut content, mut parts, mut from) = (String::new(), Vec::new(), Vec::new());
    for (j, p) in list.iter().enumerate() {
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = p.get("text").and_then(Value::as_str).ok_or_else(|| bad("a text part with a string text", format!("messages[{i}].content[{j}]: {}", brief(p))))?;
                if parts.is_empty() {
                    content.push_str(t);
                } else {
                    parts.push(spb::ContentPart { part: Some(Part::Text(t.to_string())) });
                    from.push(j);
                }
            }
            Some("image_url") => {
                let url = p.pointer("/image_url/url").or_else(|| p.get("image_url")).and_then(Value::as_str).unwrap_or("");
                let bytes = data_uri_bytes(url).map_err(|why| bad(IMAGE_URL_RULE, format!("messages[{i}].content[{j}]: {why}")))?;
                // The agent path's signature check, so bytes that are no image are refused here
                // (400 naming the part) rather than by the worker.
                crate::screenshot::sniff(&bytes).map_err(|why| bad(IMAGE_BYTES_RULE, format!("messages[{i}].content[{j}]: {why}")))?;
                parts.push(spb::ContentPart { part: Some(Part::Image(bytes)) });
                from.push(j);
            }
            _ => return Err(bad("text and image_url content parts only", format!("messages[{i}].content[{j}]: {}", brief(p)))),
        }
    }
    Ok((content, parts, from))
}

/// The bytes of a base64 `data:` URI (`data:<media type>[;params];base64,<data>`, RFC 2397)
/// whose media type is one of [`IMAGE_MEDIA_TYPES`] (the worker reads the format from the
/// bytes; the declared type must still say it is an image it takes).
///
/// Errors: why the URL is refused: a remote (http, https) or other URL, a `data:` URI without
/// `;base64`, another media type (or none), invalid base64.
pub fn data_uri_bytes(url: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("data") => {}
        Some("http" | "https") => return Err(format!("a remote URL ({})", brief_str(url))),
        _ => return Err(format!("not a data: URI ({})", brief_str(url))),
    }
    let (head, data) = url["data:".len()..].split_once(',').ok_or_else(|| "a data: URI without a comma".to_string())?;
    if !head.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err("a data: URI that is not base64 (;base64 missing)".into());
    }
    let media = head.split(';').next().unwrap_or("").trim();
    if !IMAGE_MEDIA_TYPES.iter().any(|t| media.eq_ignore_ascii_case(t)) {
        return Err(format!("a data: URI of media type {}", brief_str(media)));
    }
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("invalid base64 in the data: URI: {e}"))
}

/// The text of a body that is not JSON: serde_json's, except for a lone UTF-16 surrogate
/// escape (`"\ud800"`), which it calls "unexpected end of hex escape" or "lone leading
/// surrogate" (for a trailing one) although the escape is complete.
pub fn json_syntax_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.starts_with("unexpected end of hex escape") || text.starts_with("lone leading surrogate") {
        return format!(
            "a JSON string holds an invalid unicode escape at line {} column {}: a \\uD800-\\uDFFF escape (a UTF-16 surrogate) must be a high one directly followed by a low one",
            e.line(),
            e.column()
        );
    }
    text
}

/// The first 64 characters of `s` for an error message.
fn brief_str(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
        None => format!("{s:?}"),
    }
}

/// `v` as compact JSON, cut to its first 120 characters (an error names the offending value
/// without echoing a multi-megabyte image or document back into the reply and the log).
fn brief(v: &Value) -> String {
    const MAX_CHARS: usize = 120;
    let s = v.to_string();
    match s.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn brief_cuts_long_values_and_keeps_short_ones() {
        let long = serde_json::json!({"type": "image_url", "image_url": {"url": "x".repeat(1_000_000)}});
        let b = super::brief(&long);
        assert!(b.chars().count() < 160, "{} chars", b.chars().count());
        assert!(b.starts_with(r#"{"image_url":"#) || b.starts_with(r#"{"type":"#), "{b}");
        assert!(b.ends_with(" bytes)"), "{b}");
        let short = serde_json::json!({"type": "audio"});
        assert_eq!(super::brief(&short), short.to_string());
    }

    use super::*;

    fn req(v: Value) -> Result<ChatCompletionRequest, ApiError> {
        ChatCompletionRequest::from_body(v.to_string().as_bytes())
    }

    #[test]
    fn a_full_request_maps_to_the_worker_request() {
        let r = req(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
            ],
            "max_completion_tokens": 12, "max_tokens": 12,
            "temperature": 0.7, "top_p": 0.9, "seed": 5,
            "stop": ["\n", "END"],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
            "frequency_penalty": 0.0
        }))
        .unwrap();
        let g = r.to_generate_request("ep-1", 1).unwrap();
        assert_eq!(g.session_id, "ep-1");
        assert_eq!(g.max_tokens, 12, "max_tokens equal to max_completion_tokens is accepted");
        assert_eq!(g.stop, vec!["\n".to_string(), "END".to_string()]);
        let Some(spb::generate_request::Prompt::Chat(chat)) = g.prompt else { panic!("chat prompt") };
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(chat.messages[1].content, "hi there");
        let schema: Value = serde_json::from_str(&g.json_schema).unwrap();
        assert_eq!(schema["properties"]["x"]["type"], "integer");
        match g.sampling.unwrap().mode.unwrap() {
            spb::sampling::Mode::Seeded(s) => {
                assert_eq!((s.seed, s.top_k), (5, 0));
                assert!((s.temperature - 0.7).abs() < 1e-6 && (s.top_p - 0.9).abs() < 1e-6);
            }
            m => panic!("expected seeded sampling, got {m:?}"),
        }
    }

    #[test]
    fn temperature_zero_or_absent_is_greedy_and_defaults_are_empty() {
        for t in [json!(0), Value::Null] {
            let r = req(json!({"messages": [{"role": "user", "content": "x"}], "temperature": t, "stop": "zz"})).unwrap();
            let g = r.to_generate_request("", 9).unwrap();
            assert!(matches!(g.sampling.unwrap().mode, Some(spb::sampling::Mode::Greedy(_))));
            assert_eq!((g.max_tokens, g.json_schema.as_str(), g.stop.len()), (0, "", 1));
        }
        let r = req(json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})).unwrap();
        assert_eq!(r.json_schema().unwrap(), r#"{"type":"object"}"#);
        assert_eq!(r.requested_model(), None);
        let r = req(json!({"model": "", "messages": [], "max_completion_tokens": 3})).unwrap();
        assert_eq!((r.requested_model(), r.max_tokens_param()), (None, "max_completion_tokens"));
    }

    #[test]
    fn image_url_parts_with_data_uris_become_image_parts_in_order() {
        // The PNG signature and the JPEG one (ff d8 ff) in base64.
        let r = req(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Screen: "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": " then "},
            {"type": "image_url", "image_url": {"url": "DATA:image/jpeg;charset=x;BASE64,/9j/"}},
        ]}]}))
        .unwrap();
        let m = r.chat_messages().unwrap();
        use spb::content_part::Part;
        let parts: Vec<Part> = m[0].parts.iter().map(|p| p.part.clone().unwrap()).collect();
        assert_eq!(m[0].content, "Screen: ");
        assert_eq!(
            parts,
            vec![Part::Image(b"\x89PNG\r\n\x1a\n".to_vec()), Part::Text(" then ".into()), Part::Image(b"\xff\xd8\xff".to_vec())]
        );
    }

    #[test]
    fn remote_and_malformed_image_urls_are_refused() {
        for (url, says) in [
            ("http://example.com/a.png", "a remote URL"),
            ("https://example.com/a.png", "a remote URL"),
            ("file:///etc/passwd", "not a data: URI"),
            ("data:image/png,rawbytes", "not base64"),
            ("data:image/png;base64,@@@", "invalid base64"),
            // PNG bytes ("\x89PNG") under a media type that is no image the worker takes.
            ("data:text/plain;base64,iVBORw==", "media type \"text/plain\""),
            ("data:;base64,iVBORw==", "media type \"\""),
            ("data:image/gif;base64,R0lGOA==", "media type \"image/gif\""),
        ] {
            let r = req(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]}]})).unwrap();
            let e = r.chat_messages().unwrap_err();
            assert_eq!(e.http_status(), 400, "{url}");
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(text.contains("messages[0].content[1]"), "{url}: {text}");
            assert_eq!(text.matches("fetches nothing").count(), 1, "said once: {text}");
        }
        for ok in ["data:image/png;base64,iVBORw0KGgo=", "data:IMAGE/JPEG;base64,/9j/", "data:image/jpg;base64,/9j/"] {
            let r = req(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ok}}]}]})).unwrap();
            assert!(r.chat_messages().is_ok(), "{ok}");
        }
    }

    /// The agent path's signature check (`screenshot::sniff`) runs here too: a data: URI that
    /// declares an image but holds no PNG or JPEG is refused by the gateway, naming the part.
    #[test]
    fn image_bytes_that_are_no_png_or_jpeg_are_refused() {
        for (url, says) in [
            ("data:image/png;base64,UE5HIQ==", "messages[0].content[1]: not a PNG or JPEG image (4 bytes starting 50 4e 47 21"),
            ("data:image/jpeg;base64,R0lGOA==", "messages[0].content[1]: not a PNG or JPEG image (4 bytes starting 47 49 46 38"),
            ("data:image/png;base64,", "messages[0].content[1]: empty"),
        ] {
            let r = req(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]}]})).unwrap();
            let e = r.chat_messages().unwrap_err();
            let body = e.to_json();
            assert_eq!(e.http_status(), 400, "{url}");
            assert_eq!(body["error"]["type"], "invalid_request_error", "{url}");
            assert_eq!(body["error"]["param"], "messages", "{url}");
            let text = e.to_string();
            assert!(text.contains(says), "{url}: {text}");
            assert!(text.contains("expected the bytes of a PNG or JPEG image"), "{url}: {text}");
        }
    }

    #[test]
    fn worker_part_indices_are_named_as_the_openai_content_index() {
        // Text first (the worker message's content), then image, text, image: the worker's
        // parts 0, 1, 2 are the OpenAI content items 1, 2, 3.
        let img = "data:image/png;base64,iVBORw0KGgo=";
        let r = req(json!({"messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [
                {"type": "text", "text": "Screen: "},
                {"type": "image_url", "image_url": {"url": img}},
                {"type": "text", "text": " and "},
                {"type": "image_url", "image_url": {"url": img}},
            ]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}}]},
        ]}))
        .unwrap();
        let (_, origins) = r.to_generate_request_indexed("", 0).unwrap();
        assert_eq!(origins, PartOrigins(vec![vec![], vec![1, 2, 3], vec![0]]));
        assert_eq!(
            origins.to_openai("messages[1].parts[2]: image is empty (0 bytes)"),
            "messages[1].content[3]: image is empty (0 bytes)"
        );
        assert_eq!(origins.to_openai("x messages[2].parts[0]: y"), "x messages[2].content[0]: y");
        // Unknown references and other text are kept as they are.
        for kept in ["messages[1].parts[9]: z", "messages[7].parts[0]", "messages[", "no reference"] {
            assert_eq!(origins.to_openai(kept), kept);
        }
    }

    #[test]
    fn the_tandem_block_carries_the_image_figures() {
        let mut run = RunInfo::default();
        run.on_prefill(spb::PrefillStats { slot_id: 1, image_tokens: 230, images_encoded: 1, image_cache_hits: 2, encoder_ms: 12.5, ..Default::default() });
        let t = tandem_json(&spb::FinalStats::default(), &run);
        assert_eq!((t["slot_id"].as_u64(), t["image_tokens"].as_u64()), (Some(1), Some(230)));
        assert_eq!((t["images_encoded"].as_u64(), t["image_cache_hits"].as_u64()), (Some(1), Some(2)));
        assert_eq!(t["encoder_ms"].as_f64(), Some(12.5));
    }

    #[test]
    fn bad_fields_name_the_parameter() {
        let cases = [
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "tool", "content": "x"}]}), "messages"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}), "messages"),
            (json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}), "temperature"),
            (json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}), "top_p"),
            (json!({"messages": [{"role": "user", "content": "x"}], "n": 0}), "n"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), "max_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}), "max_completion_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0, "max_tokens": 5}), "max_completion_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7, "max_tokens": 5}), "max_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"messages": [{"role": "user", "content": "x"}], "stop": 3}), "stop"),
            (json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}), "response_format"),
            (json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}), "response_format"),
        ];
        for (body, param) in cases {
            let err = req(body.clone()).unwrap().to_generate_request("", 0).unwrap_err();
            assert_eq!(err.http_status(), 400, "{body}");
            assert_eq!(err.to_json()["error"]["param"], param, "{body}: {err}");
            assert_eq!(err.to_json()["error"]["type"], "invalid_request_error");
        }
        let err = req(json!({"model": "m"})).unwrap_err();
        assert_eq!(err.to_json()["error"]["param"], "messages", "{err}");
    }

    /// Valid JSON with a field of the wrong type or range is a bad parameter named by
    /// `param` (was `invalid_json` with `param` null), its message in the client's terms (what
    /// the field takes, the value sent; not serde's "expected u32"); a body that is no JSON
    /// object says so.
    #[test]
    fn fields_that_do_not_deserialize_are_named() {
        let user = json!([{"role": "user", "content": "x"}]);
        for (body, param, says) in [
            (json!({"messages": user, "max_tokens": -5}), "max_tokens", "max_tokens: expected an integer from 1 to 4294967295, found -5"),
            (json!({"messages": user, "max_completion_tokens": 2.5}), "max_completion_tokens", "max_completion_tokens: expected an integer from 1 to 4294967295, found 2.5"),
            (json!({"messages": user, "temperature": "hot"}), "temperature", "temperature: expected a number from 0 to 2, found \"hot\""),
            (json!({"messages": "hi"}), "messages", "found \"hi\""),
            (json!({"messages": [{"role": "user", "content": "x"}, {"content": "no role"}]}), "messages", "found messages[1]: {\"content\":\"no role\"}"),
            (json!({"model": "m"}), "messages", "found no messages field"),
        ] {
            let e = req(body.clone()).unwrap_err().to_json();
            assert_eq!((e["error"]["type"].as_str(), e["error"]["param"].as_str()), (Some("invalid_request_error"), Some(param)), "{body}: {e}");
            assert_eq!(e["error"]["code"], "invalid_value", "{e}");
            let message = e["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{body}: {message}");
            for serde_word in ["u32", "invalid type", "missing field"] {
                assert!(!message.contains(serde_word), "{body}: {message}");
            }
        }
        let e = ChatCompletionRequest::from_body(b"[1, 2]").unwrap_err();
        assert!(e.to_string().contains("expected a JSON object, found an array"), "{e}");
        let e = ChatCompletionRequest::from_body(b"{").unwrap_err().to_json();
        assert_eq!(e["error"]["code"], "invalid_json", "{e}");
    }

    /// Fields that would change the answer and are not implemented are refused naming them
    /// (`unsupported_parameter`); their neutral values, `null`, and fields that change nothing
    /// are accepted.
    #[test]
    fn unimplemented_fields_are_refused_unless_neutral() {
        let with = |field: &str, v: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            body[field] = v;
            req(body)
        };
        for (field, v) in [
            ("tools", json!([{"type": "function", "function": {"name": "tap"}}])),
            ("tool_choice", json!("auto")),
            ("functions", json!([{"name": "tap"}])),
            ("function_call", json!({"name": "tap"})),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(3)),
            ("n", json!(2)),
            ("frequency_penalty", json!(0.5)),
            ("presence_penalty", json!(-1)),
            ("logit_bias", json!({"50256": -100})),
            ("modalities", json!(["text", "audio"])),
            ("audio", json!({"voice": "alloy"})),
            ("reasoning_effort", json!("low")),
            ("min_p", json!(0.1)),
            ("frobnicate", json!(1)),
        ] {
            let e = with(field, v.clone()).expect_err(field);
            assert_eq!(e.http_status(), 400, "{field}");
            let j = e.to_json();
            assert_eq!((j["error"]["code"].as_str(), j["error"]["param"].as_str()), (Some("unsupported_parameter"), Some(field)), "{j}");
            assert_eq!(j["error"]["type"], "invalid_request_error");
            assert!(j["error"]["message"].as_str().unwrap().starts_with(&format!("{field}: unsupported: ")), "{j}");
        }
        for (field, v) in [
            ("logprobs", json!(false)),
            ("top_logprobs", json!(0)),
            ("n", json!(1)),
            ("tools", json!([])),
            ("tool_choice", json!("none")),
            ("frequency_penalty", json!(0)),
            ("logit_bias", json!({})),
            ("modalities", json!(["text"])),
            ("tools", Value::Null),
            ("frobnicate", Value::Null),
            ("metadata", json!({"run": "7"})),
            ("store", json!(false)),
            ("user", json!("ep-1")),
            ("parallel_tool_calls", json!(true)),
        ] {
            let r = with(field, v.clone()).unwrap_or_else(|e| panic!("{field}: {v}: {e}"));
            r.to_generate_request("", 0).unwrap_or_else(|e| panic!("{field}: {v}: {e}"));
        }
    }

    /// Inside a message as at the top level: an unknown key or one that asks for something
    /// the endpoint does not do is `unsupported_parameter` naming `messages[i].KEY`; a missing
    /// or null `content` is a bad `messages[i].content`, except in an assistant message with a
    /// `refusal`, whose text becomes the turn's content. `name`, `annotations` and the null or
    /// empty keys of an assistant message copied back from a response are accepted.
    #[test]
    fn message_keys_and_missing_content_are_checked() {
        let user = json!({"role": "user", "content": "hi"});
        for (message, param, code) in [
            (json!({"role": "user", "content": "x", "tool_call_id": "c1"}), "messages[1].tool_call_id", "unsupported_parameter"),
            (json!({"role": "user", "content": "x", "frobnicate": 1}), "messages[1].frobnicate", "unsupported_parameter"),
            (json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "c1"}]}), "messages[1].tool_calls", "unsupported_parameter"),
            (json!({"role": "user", "content": "x", "refusal": "no"}), "messages[1].refusal", "unsupported_parameter"),
            (json!({"role": "user"}), "messages[1].content", "invalid_value"),
            (json!({"role": "user", "content": null}), "messages[1].content", "invalid_value"),
            (json!({"role": "system", "content": null, "name": "a"}), "messages[1].content", "invalid_value"),
            (json!({"role": "assistant", "content": null}), "messages[1].content", "invalid_value"),
            (json!({"role": "assistant", "content": "x", "refusal": "no"}), "messages[1].refusal", "invalid_value"),
        ] {
            let e = req(json!({"messages": [user, message]})).expect_err(&message.to_string());
            let j = e.to_json();
            assert_eq!(e.http_status(), 400, "{message}");
            assert_eq!((j["error"]["param"].as_str(), j["error"]["code"].as_str()), (Some(param), Some(code)), "{message}: {j}");
            assert_eq!(j["error"]["type"], "invalid_request_error");
            assert!(j["error"]["message"].as_str().unwrap().starts_with(&format!("{param}: ")), "{j}");
        }
        let copied_back = json!({"role": "assistant", "content": "ok", "refusal": null, "tool_calls": [], "function_call": null,
            "audio": null, "annotations": [], "name": "bot"});
        let r = req(json!({"messages": [user, copied_back, {"role": "user", "content": "x", "name": "me"}]})).unwrap();
        assert_eq!(r.chat_messages().unwrap()[1].content, "ok");
        let r = req(json!({"messages": [user, {"role": "assistant", "content": null, "refusal": "I can't help with that."}]})).unwrap();
        let m = r.chat_messages().unwrap();
        assert_eq!((m[1].role.as_str(), m[1].content.as_str()), ("assistant", "I can't help with that."));
    }

    /// A lone UTF-16 surrogate escape is named as an invalid unicode escape with its place
    /// (serde_json says "unexpected end of hex escape" or "lone leading surrogate").
    #[test]
    fn a_lone_surrogate_is_an_invalid_unicode_escape() {
        for body in [r#"{"messages": [{"role": "user", "content": "a\ud800"}]}"#, r#"{"messages": [{"role": "user", "content": "\udc00"}]}"#] {
            let e = ChatCompletionRequest::from_body(body.as_bytes()).unwrap_err().to_json();
            let message = e["error"]["message"].as_str().unwrap();
            assert!(message.contains("a JSON string holds an invalid unicode escape at line 1 column "), "{body}: {message}");
            assert!(!message.contains("end of hex escape") && !message.contains("leading"), "{body}: {message}");
            assert_eq!(e["error"]["code"], "invalid_json");
        }
        let r = ChatCompletionRequest::from_body(r#"{"messages": [{"role": "user", "content": "\ud83d\ude00"}]}"#.as_bytes()).unwrap();
        assert_eq!(r.chat_messages().unwrap()[0].content, "\u{1F600}");
    }

    #[test]
    fn usage_reports_reused_prompt_tokens_as_cached_tokens() {
        let done = spb::FinalStats {
            finish_reason: spb::FinishReason::Length as i32,
            prompt_tokens: 120,
            reused_tokens: 100,
            decode_tokens: 7,
            ..Default::default()
        };
        let v = completion_json("c1", 3, "m", "hello", &done, &RunInfo::default());
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 100);
        assert_eq!(v["usage"]["total_tokens"], 127);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["message"]["content"], "hello");
        assert_eq!(finish_reason(spb::FinishReason::Grammar as i32), "stop");
    }
}

