//! Error types of the gateway's pure-library modules: observation parsing
//! ([`ObservationError`]), action validation ([`ActionError`]) and corpus loading
//! ([`CorpusError`]). Each variant says what was expected and what was found.

use std::path::PathBuf;

/// An observation (uiautomator XML or AndroidWorld UI elements) could not be turned into a
/// [`crate::observation::Screen`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObservationError {
    /// The XML is not well-formed. `line` and `column` are 1-based and count from the start
    /// of the text the caller passed (including any junk stripped before `<?xml`).
    #[error("malformed uiautomator XML at line {line}, column {column}: {message}")]
    MalformedXml { line: u32, column: u32, message: String },
    /// No `<?xml` declaration and no `<hierarchy>` / element start was found in the text.
    #[error("not a uiautomator dump: expected `<?xml` or `<hierarchy`, found {found:?}")]
    NotXml { found: String },
    /// The UI-element text is not valid JSON (or not valid Python repr for the repr parser).
    #[error("malformed UI element list at line {line}, column {column}: {message}")]
    MalformedElements { line: u32, column: u32, message: String },
    /// The UI-element JSON parsed but has the wrong shape.
    #[error("UI element list: expected {expected}, found {found}")]
    UnexpectedShape { expected: &'static str, found: String },
    /// The observation holds no listable control (empty text, or nothing visible and
    /// interactive or labelled).
    #[error("observation holds no visible control")]
    Empty,
    /// No listable control, and the screenshot that could stand for the screen is not sent
    /// (`--screenshots never`): the message says so and what to do
    /// ([`crate::screenshot::unsent_screenshot_only`]).
    #[error("{0}")]
    ScreenshotNotSent(String),
}

/// A model output is not a valid AndroidWorld-style JSON action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The output is not exactly one JSON value (leading/trailing whitespace is allowed).
    #[error("action is not JSON at line {line}, column {column}: {message}")]
    NotJson { line: usize, column: usize, message: String },
    /// The JSON value is not an object.
    #[error("action: expected a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    /// The object has no `action_type` field (or it is null).
    #[error("action object has no \"action_type\" field")]
    MissingActionType,
    /// `action_type` is not one of the supported action types.
    #[error("unknown action_type {action_type:?}; expected one of {expected:?}")]
    UnknownActionType { action_type: String, expected: &'static [&'static str] },
    /// A field the action type requires is absent (or null).
    #[error("action {action_type:?} requires field {field:?}")]
    MissingField { action_type: &'static str, field: &'static str },
    /// A field that this action type does not take is present with a non-null value.
    #[error("action {action_type:?} does not take field {field:?}")]
    UnexpectedField { action_type: &'static str, field: String },
    /// A field has the wrong JSON type or range.
    #[error("field {field:?}: expected {expected}, found {found}")]
    WrongFieldType { field: &'static str, expected: &'static str, found: String },
    /// A string field holds a value outside its enumeration.
    #[error("field {field:?}: expected one of {expected:?}, found {found:?}")]
    InvalidValue { field: &'static str, expected: &'static [&'static str], found: String },
    /// `index` does not name a control of the current screen.
    #[error("index {index} out of range: the screen lists indices 0..{n_controls}")]
    IndexOutOfRange { index: u64, n_controls: u32 },
    /// `index` is below the bound but no listed control carries it (AndroidWorld screens keep
    /// the source element indices, so the listed indices may have gaps).
    #[error("index {index} names no listed control of this screen")]
    IndexNotListed { index: u32 },
    /// A pixel target (`x`, `y`) lies outside the `width` x `height` screen.
    #[error("point ({x}, {y}) is off the {width}x{height} screen")]
    PointOffScreen { x: u32, y: u32, width: u32, height: u32 },
}

/// A corpus episode could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// Reading a file or directory failed.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON episode log is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A file parsed but lacks something an episode needs.
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    /// A step's observation does not parse.
    #[error("{path}: step {step}: {source}")]
    Observation {
        path: PathBuf,
        step: usize,
        #[source]
        source: ObservationError,
    },
    /// No episode has this id.
    #[error("no episode with id {id:?} under {root}; known ids: {known:?}")]
    UnknownEpisode { id: String, root: PathBuf, known: Vec<String> },
    /// The corpus root is not a folder (a wrong `--corpus`, or the relative default
    /// `../shared/corpus/raw` from another working directory).
    #[error(
        "corpus {root} {why} (relative paths start at the current directory); pass --corpus PATH or set TANDEM_CORPUS to the corpus's raw/ folder"
    )]
    MissingRoot {
        root: PathBuf,
        /// "not found" or "is a file, not a folder".
        why: &'static str,
    },
    /// The corpus root holds no usable episode (`hint`: empty, or where the episodes may be,
    /// e.g. the root's own `raw/` subfolder).
    #[error("no usable episode under {root}{hint}")]
    NoEpisodes { root: PathBuf, hint: String },
}

/// Errors of the gateway's services and commands (configuration, workers, replay).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A setting is missing or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// A worker call failed (transport, or a status the worker returned).
    #[error("worker {worker}: {status}")]
    Worker { worker: String, status: Box<tonic::Status> },
    /// The gateway could not be reached or returned an error (replay client).
    #[error("gateway: {0}")]
    Gateway(String),
    /// A health check failed or the server is not serving.
    #[error("health: {0}")]
    Health(String),
    #[error(transparent)]
    Observation(#[from] ObservationError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The request field a worker's INVALID_ARGUMENT message is about: `messages` for a refused
/// content part (an image that does not decode, an image sent to a text-only model: the
/// message names the part, as the gateway's own check of the parts) and for a prompt over the
/// context or empty (`device_worker::error::WorkerError`'s prompt messages);
/// `response_format` for a JSON schema the worker cannot compile; `max_tokens` (or
/// `max_completion_tokens`, when the HTTP endpoint wrote the message in the request's terms)
/// for a budget past the context's end (`WorkerError::MaxTokensOverContext`).
fn worker_param(message: &str) -> Option<&'static str> {
    if message.contains("invalid JSON schema") {
        Some("response_format")
    } else if message.starts_with("max_tokens ") {
        Some("max_tokens")
    } else if message.starts_with("max_completion_tokens ") {
        Some("max_completion_tokens")
    } else if content_part_in(message).is_some() || message.contains("the prompt ") {
        Some("messages")
    } else {
        None
    }
}

/// Whether a worker's INVALID_ARGUMENT message says the request does not fit the context (a
/// prompt over it, or prompt + `max_tokens` past its end: both say "the context holds N"):
/// OpenAI's code `context_length_exceeded`.
fn is_over_context(message: &str) -> bool {
    message.contains("the context holds ")
}

/// The first `messages[I].content[K]` reference in a worker's error text (written in the
/// request's terms by `PartOrigins::to_openai`): such a message is about `messages`
/// ([`worker_param`]).
fn content_part_in(message: &str) -> Option<&str> {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let mut from = 0;
    while let Some(at) = message[from..].find("messages[") {
        let start = from + at;
        let rest = &message[start + "messages[".len()..];
        let i = digits(rest);
        if i > 0 {
            if let Some(after) = rest[i..].strip_prefix("].content[") {
                let k = digits(after);
                if k > 0 && after[k..].starts_with(']') {
                    let len = "messages[".len() + i + "].content[".len() + k + 1;
                    return Some(&message[start..start + len]);
                }
            }
        }
        from = start + "messages[".len();
    }
    None
}

/// Whether a worker status is tonic's refusal of a message over the decoding (or encoding)
/// limit: `"Error, decoded message length too large: found N bytes, the limit is: M bytes"`
/// (tonic `codec/decode.rs`; OUT_OF_RANGE in tonic 0.14, RESOURCE_EXHAUSTED before), as
/// opposed to bad input or a full queue.
fn is_message_too_large(message: &str) -> bool {
    message.contains("message length too large")
}

/// A request to the OpenAI-compatible HTTP endpoint ([`crate::http`]) failed. Rendered as
/// OpenAI's error JSON, `{"error": {"message", "type", "param", "code"}}`, with the HTTP status
/// of [`ApiError::http_status`] (shape: OpenAI API reference, "Error codes"). `Display` is the
/// whole story for the gateway's log (worker address, gRPC code); the client gets
/// [`ApiError::client_message`], in the request's own terms and without them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or not the shape of a chat-completion request (400).
    #[error("request body is not a valid chat completion request: {0}")]
    BadJson(String),
    /// Valid JSON whose field `param` does not deserialize (a wrong type or range, or
    /// `messages` missing; 400): what the field takes and what came.
    #[error("{param}: expected {expected}, found {found}")]
    BadField { param: String, expected: &'static str, found: String },
    /// A field has a value the endpoint does not accept (400); `param` names the field.
    #[error("{param}: expected {expected}, found {found}")]
    InvalidParam { param: &'static str, expected: &'static str, found: String },
    /// A field the endpoint does not implement, with a value that would change the answer
    /// (`tools`, `logprobs: true`, `n: 2`, an unknown field; 400, code
    /// `unsupported_parameter`): refused rather than silently ignored.
    #[error("{param}: unsupported: {why}")]
    Unsupported { param: String, why: String },
    /// The request's `model` is none of the ids the workers serve (404, code
    /// `model_not_found`, as vLLM answers).
    #[error("The model `{requested}` does not exist; this server serves {}", served.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", "))]
    ModelNotFound { requested: String, served: Vec<String> },
    /// A served path asked with another method (405).
    #[error("{method} is not served on {path}; served: POST /v1/chat/completions, GET /v1/models, GET /health")]
    MethodNotAllowed { method: String, path: String },
    /// The body is longer than [`crate::http::MAX_BODY_BYTES`] (413).
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// The worker request built from the body encodes to more than the gRPC message budget,
    /// [`tandem_proto::MAX_MESSAGE_BYTES`] (413; refused before it is sent).
    #[error("the worker request is {bytes} bytes, over the {limit}-byte message limit")]
    RequestTooLarge { bytes: usize, limit: usize },
    /// No route for this method and path (404).
    #[error("unknown endpoint {method} {path}; served: POST /v1/chat/completions, GET /v1/models, GET /health")]
    NotFound { method: String, path: String },
    /// The worker returned a gRPC status (mapped: INVALID_ARGUMENT and OUT_OF_RANGE 400,
    /// RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, others 502; but 413
    /// when tonic refused the message as over the worker's decoding limit, which no retry
    /// cures).
    #[error("worker {worker}: {message} ({code:?})")]
    Worker { worker: String, code: tonic::Code, message: String },
    /// The worker's stream ended before its final event (502).
    #[error("worker {worker}: stream ended without a final event")]
    WorkerStreamEnded { worker: String },
    /// No worker answered a status request (503); the text names the workers and why.
    #[error("no worker answered: {0}")]
    NoWorker(String),
}

impl From<tandem_proto::limits::FieldError> for ApiError {
    fn from(e: tandem_proto::limits::FieldError) -> Self {
        ApiError::InvalidParam { param: e.field, expected: e.expected, found: e.found }
    }
}

impl ApiError {
    /// The HTTP status code of this error.
    pub fn http_status(&self) -> u16 {
        match self {
            ApiError::BadJson(_) | ApiError::BadField { .. } | ApiError::InvalidParam { .. } | ApiError::Unsupported { .. } => 400,
            ApiError::NotFound { .. } | ApiError::ModelNotFound { .. } => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::BodyTooLarge { .. } | ApiError::RequestTooLarge { .. } => 413,
            ApiError::Worker { message, .. } if is_message_too_large(message) => 413,
            ApiError::Worker { code, .. } => match code {
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => 400,
                tonic::Code::ResourceExhausted => 429,
                tonic::Code::Unavailable => 503,
                tonic::Code::DeadlineExceeded => 504,
                _ => 502,
            },
            ApiError::WorkerStreamEnded { .. } => 502,
            ApiError::NoWorker(_) => 503,
        }
    }

    /// OpenAI's `error.type`: `invalid_request_error` for 4xx caused by the request,
    /// `rate_limit_error` for 429, `server_error` otherwise.
    pub fn error_type(&self) -> &'static str {
        match self.http_status() {
            400 | 404 | 405 | 413 => "invalid_request_error",
            429 => "rate_limit_error",
            _ => "server_error",
        }
    }

    /// Seconds a client should wait before retrying (the `Retry-After` header): 1 for 429
    /// (the worker's queue is full: a slot frees within a step), 5 for 503 (a worker is
    /// restarting or reloading its model); `None` for errors a retry does not cure.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self.http_status() {
            429 => Some(1),
            503 => Some(5),
            _ => None,
        }
    }

    /// The message the client gets: what it did wrong in its own terms, or what failed and
    /// whether a retry helps. A worker's refusal of the request (400, 413) is the worker's
    /// text without its address and gRPC code; other worker failures and an unreachable worker
    /// are a fixed sentence (the details are in the gateway's log, from `Display`).
    pub fn client_message(&self) -> String {
        match self {
            ApiError::Worker { message, .. } => match self.http_status() {
                400 => message.clone(),
                413 => format!("the request is larger than the worker accepts: {}", message.trim_start_matches("Error, ")),
                429 => "the worker is busy (its request queue is full); retry in 1 s".into(),
                503 => "no worker can take the request now (unreachable, restarting or loading its model); retry in 5 s".into(),
                504 => "the worker did not answer in time".into(),
                _ => "the worker failed while answering this request (the gateway's log has the details)".into(),
            },
            ApiError::WorkerStreamEnded { .. } => "the worker's answer ended before it was complete (the gateway's log has the details)".into(),
            ApiError::NoWorker(_) => "no worker is available now; retry in 5 s (the gateway's log names the workers and why)".into(),
            _ => self.to_string(),
        }
    }

    /// OpenAI's error JSON for this error.
    pub fn to_json(&self) -> serde_json::Value {
        let param = match self {
            ApiError::InvalidParam { param, .. } => serde_json::Value::String(param.to_string()),
            ApiError::BadField { param, .. } | ApiError::Unsupported { param, .. } => serde_json::Value::String(param.clone()),
            ApiError::ModelNotFound { .. } => serde_json::Value::String("model".to_string()),
            // A request over the message budget is its messages (the rest is small).
            ApiError::RequestTooLarge { .. } => serde_json::Value::String("messages".to_string()),
            ApiError::Worker { message, .. } if self.http_status() == 400 => {
                worker_param(message).map_or(serde_json::Value::Null, |p| serde_json::Value::String(p.to_string()))
            }
            _ => serde_json::Value::Null,
        };
        let code = match self {
            ApiError::BadJson(_) => "invalid_json",
            ApiError::InvalidParam { .. } | ApiError::BadField { .. } => "invalid_value",
            ApiError::Unsupported { .. } => "unsupported_parameter",
            ApiError::ModelNotFound { .. } => "model_not_found",
            ApiError::NotFound { .. } => "unknown_url",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::BodyTooLarge { .. } | ApiError::RequestTooLarge { .. } => "request_too_large",
            ApiError::Worker { .. } if self.http_status() == 413 => "request_too_large",
            ApiError::Worker { .. } if self.http_status() == 429 => "worker_busy",
            ApiError::Worker { message, .. } if self.http_status() == 400 && is_over_context(message) => "context_length_exceeded",
            ApiError::Worker { .. } if self.http_status() == 400 => "invalid_value",
            ApiError::Worker { .. } | ApiError::WorkerStreamEnded { .. } => "worker_error",
            ApiError::NoWorker(_) => "no_worker",
        };
        serde_json::json!({"error": {"message": self.client_message(), "type": self.error_type(), "param": param, "code": code}})
    }
}
