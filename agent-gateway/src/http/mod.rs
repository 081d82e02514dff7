//! The OpenAI-compatible HTTP endpoint (`agent-gateway serve --http-listen`).
//!
//! - `POST /v1/chat/completions`: chat messages pass straight to a worker's `Generate`
//!   (JSON or server-sent events; see [`openai`] for the accepted fields).
//! - `GET /v1/models`: the workers' models (`StepService.Status`), by the id a request's
//!   `model` names ([`models::model_id`]).
//! - `GET /health`: the workers' reachability.
//! - `GET /metrics`: Prometheus text exposition of the gateway's metrics
//!   ([`crate::metrics`]), when a recorder is installed.
//!
//! Episode affinity: requests with the same `X-Episode-Id` header (or, without it, the same
//! `user` field) go to the same worker ([`crate::worker::Router`]) with that id as the
//! worker's `session_id`, so the worker's slot keeps the KV cache of the shared prompt prefix;
//! `usage.prompt_tokens_details.cached_tokens` reports how many prompt tokens were reused.
//! Without either, each request gets a fresh routing key and no session (nothing reused on
//! purpose). Errors use OpenAI's error JSON ([`ApiError::to_json`]): the message says what the
//! client did wrong in its own terms, or whether a retry helps; the worker's address and gRPC
//! code go to the gateway's log only (`HTTP request failed`, WARN for 5xx).

pub mod chat;
pub mod models;
pub mod openai;
pub mod stop;

use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::error::{ApiError, GatewayError};
use crate::worker::Router;
pub use tandem_auth::https::HttpLimits;

/// Header naming the episode a request belongs to.
pub const EPISODE_HEADER: &str = "x-episode-id";

/// Largest request body accepted, in bytes: the path's one budget,
/// [`tandem_proto::MAX_MESSAGE_BYTES`] (screens with hundreds of controls fit easily; a
/// larger body would only fail at the gRPC hop to the worker). The `GenerateRequest` built
/// from a body is checked against the same budget before it is sent (see
/// [`chat::chat_completions`]); `deploy/README.md` tabulates the whole chain.
pub const MAX_BODY_BYTES: usize = tandem_proto::MAX_MESSAGE_BYTES;

/// Shared state of the HTTP handlers.
#[derive(Clone)]
pub struct HttpState {
    pub router: Router,
    /// The Prometheus recorder's handle; `None`: `/metrics` answers 404.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// The axum router serving the endpoints above.
pub fn app(state: HttpState) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models::list_models))
        .route("/health", get(models::health))
        .route("/metrics", get(prometheus_metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Paths that need no bearer token: the liveness probe and the Prometheus scrape (read-only
/// counters, no prompt or output text).
pub const OPEN_PATHS: &[&str] = &["/health", "/metrics"];

/// The HTTP endpoint's protections (as [`tandem_auth::GrpcSecurity`] for gRPC). The default:
/// no authentication, plaintext, default connection limits.
#[derive(Clone, Default)]
pub struct HttpSecurity {
    /// Bearer tokens required on every path but [`OPEN_PATHS`] (401 with an OpenAI error
    /// object otherwise); `None`: no authentication.
    pub auth: Option<tandem_auth::Authenticator>,
    /// TLS (HTTP/1.1, `https://`); with a client CA ([`tandem_auth::ServerTls::mutual`]) a
    /// client without an accepted certificate is refused in the handshake. `None`: plaintext.
    pub tls: Option<tandem_auth::ServerTls>,
    /// Header-read and idle timeouts, connection cap (`agent-gateway serve --http-*`).
    pub limits: HttpLimits,
}

/// Serves [`app`] on `listener` until `shutdown` resolves, without authentication (tests,
/// local development; see [`serve_secured`]).
///
/// Errors: [`GatewayError::Config`] when the server fails.
pub async fn serve(
    state: HttpState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), GatewayError> {
    serve_secured(state, listener, shutdown, HttpSecurity::default()).await
}

/// [`serve`] with `security`: bearer tokens, TLS and connection limits. Every answer, a 401
/// included, is counted in [`tandem_telemetry::metric_names::GATEWAY_HTTP_REQUESTS_TOTAL`].
///
/// Errors: as [`serve`].
pub async fn serve_secured(
    state: HttpState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    security: HttpSecurity,
) -> Result<(), GatewayError> {
    let HttpSecurity { auth, tls, limits } = security;
    let app = app(state)
        .layer(tandem_auth::AuthLayer::<axum::body::Body>::openai_http(auth, OPEN_PATHS))
        .layer(axum::middleware::from_fn(track_request));
    tandem_auth::https::serve_http(listener, tls.as_ref(), app, limits, shutdown)
        .await
        .map_err(|e| GatewayError::Config(format!("HTTP server: {e}")))
}

/// The served paths, the values of the `route` label (any other path counts as `"other"`).
pub const ROUTES: &[&str] = &["/v1/chat/completions", "/v1/models", "/health", "/metrics"];

/// The `route` label of `path`: one of [`ROUTES`], else `"other"` (so a scan of random paths
/// cannot grow the label set).
pub fn route_label(path: &str) -> &'static str {
    ROUTES.iter().copied().find(|r| *r == path).unwrap_or("other")
}

/// The request metrics middleware: the in-flight gauge while the request is handled (for a
/// server-sent event stream, until its body ends) and the request counter by route and status.
async fn track_request(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tokio_stream::StreamExt;
    let route = route_label(req.uri().path());
    let guard = crate::metrics::HttpInFlight::enter(route);
    let resp = next.run(req).await;
    crate::metrics::record_http_request(route, resp.status().as_u16());
    let streaming = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// `GET /metrics`: the Prometheus text format (404 when no recorder is installed).
async fn prometheus_metrics(axum::extract::State(state): axum::extract::State<HttpState>, method: Method, uri: Uri) -> Response {
    match &state.metrics {
        Some(h) => {
            let mut resp = crate::metrics::render(h).into_response();
            resp.headers_mut()
                .insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static(crate::metrics::CONTENT_TYPE));
            resp
        }
        None => not_found(method, uri).await,
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_string() }.into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::NotFound { method: method.to_string(), path: uri.path().to_string() }.into_response()
}

/// A JSON response with `status`.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "HTTP request failed");
        } else {
            tracing::info!(status = status.as_u16(), error = %self, "HTTP request failed");
        }
        let mut resp = json_response(status, &self.to_json());
        if let Some(s) = self.retry_after_s() {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A process-unique id `"{prefix}-{micros:x}-{n}"`.
pub(crate) fn unique_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    format!("{prefix}-{t:x}-{}", N.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn state() -> HttpState {
        HttpState { router: Router::new(&["http://127.0.0.1:1".to_string()]).unwrap(), metrics: None }
    }

    async fn json_of(resp: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        serde_json::from_slice(&bytes).expect("an OpenAI error object")
    }

    /// A body over the limit is refused before it is parsed, as OpenAI error JSON (axum's own
    /// rejection would be plain text).
    #[tokio::test]
    async fn an_oversized_body_is_a_413_with_openai_error_json() {
        let body = vec![b' '; MAX_BODY_BYTES + 1];
        let req = axum::http::Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let resp = app(state()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 413);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let v = json_of(resp).await;
        assert_eq!(v["error"]["code"], "request_too_large", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    /// A served path asked with the wrong method is a 405 with OpenAI error JSON (axum's own
    /// answer has an empty body).
    #[tokio::test]
    async fn a_wrong_method_is_a_405_with_openai_error_json() {
        let req = axum::http::Request::get("/v1/chat/completions").body(axum::body::Body::empty()).unwrap();
        let resp = app(state()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 405);
        let v = json_of(resp).await;
        assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
    }

    /// 429 and 503 tell the client when to retry; other errors do not.
    #[tokio::test]
    async fn retryable_errors_carry_retry_after() {
        let worker = |code| ApiError::Worker { worker: "w".into(), code, message: "m".into() };
        let busy = worker(tonic::Code::ResourceExhausted).into_response();
        assert_eq!((busy.status().as_u16(), &busy.headers()["retry-after"]), (429, &HeaderValue::from(1)));
        let down = ApiError::NoWorker("none".into()).into_response();
        assert_eq!((down.status().as_u16(), &down.headers()["retry-after"]), (503, &HeaderValue::from(5)));
        let bad = worker(tonic::Code::InvalidArgument).into_response();
        assert_eq!(bad.status(), 400);
        assert!(bad.headers().get("retry-after").is_none());
        assert_eq!(json_of(busy).await["error"]["type"], "rate_limit_error");
    }

    /// A worker's refusal of one content part (an image that does not decode) is a 400 with
    /// `param` `messages` (as the gateway's own part check) and code `invalid_value`; worker
    /// errors that name no content part have no `param`.
    #[tokio::test]
    async fn a_refused_content_part_is_the_param() {
        let e = ApiError::Worker {
            worker: "w".into(),
            code: tonic::Code::InvalidArgument,
            message: "messages[1].content[2]: image cannot be decoded: unexpected end of file".into(),
        };
        let v = json_of(e.into_response()).await;
        assert_eq!((v["error"]["param"].as_str(), v["error"]["code"].as_str()), (Some("messages"), Some("invalid_value")), "{v}");
        for message in ["messages[x].content[2] bad", "messages[1].parts[2]: bad", "no reference"] {
            let e = ApiError::Worker { worker: "w".into(), code: tonic::Code::InvalidArgument, message: message.into() };
            assert!(json_of(e.into_response()).await["error"]["param"].is_null(), "{message}");
        }
        let e = ApiError::Worker { worker: "w".into(), code: tonic::Code::Internal, message: "messages[0].content[0]".into() };
        let v = json_of(e.into_response()).await;
        assert_eq!((v["error"]["param"].is_null(), v["error"]["code"].as_str()), (true, Some("worker_error")), "{v}");
    }

    /// A worker's refusal of the schema names `response_format`, of an over-long or empty
    /// prompt `messages` (both were `param` null); the gateway's own over-budget request is
    /// `messages` too.
    #[tokio::test]
    async fn worker_refusals_name_the_param() {
        for (message, param) in [
            ("invalid JSON schema: not JSON: EOF while parsing", "response_format"),
            ("the prompt has 5000 tokens; the context holds 4096 (prompt + at least one output token)", "messages"),
            ("the prompt has at least 9000 tokens (counted in its first 100 of 900 bytes, where tokenizing stopped); the context holds 4096", "messages"),
            ("the prompt is empty", "messages"),
        ] {
            let e = ApiError::Worker { worker: "w".into(), code: tonic::Code::InvalidArgument, message: message.into() };
            let v = json_of(e.into_response()).await;
            assert_eq!((v["error"]["param"].as_str(), v["error"]["type"].as_str()), (Some(param), Some("invalid_request_error")), "{v}");
        }
        let v = json_of(ApiError::RequestTooLarge { bytes: 9, limit: 1 }.into_response()).await;
        assert_eq!(v["error"]["param"], "messages", "{v}");
    }

    /// tonic's own refusal of a message over the worker's decoding limit (OUT_OF_RANGE in
    /// tonic 0.14, RESOURCE_EXHAUSTED before) is a 413 with OpenAI error JSON and no
    /// Retry-After (a retry cannot cure it), not a 400 or a 429.
    #[tokio::test]
    async fn a_worker_message_limit_is_a_413() {
        let message = "Error, decoded message length too large: found 2097200 bytes, the limit is: 1048576 bytes";
        for code in [tonic::Code::OutOfRange, tonic::Code::ResourceExhausted] {
            let e = ApiError::Worker { worker: "w".into(), code, message: message.into() };
            let resp = e.into_response();
            assert_eq!(resp.status(), 413, "{code:?}");
            assert!(resp.headers().get("retry-after").is_none());
            let v = json_of(resp).await;
            assert_eq!((v["error"]["code"].as_str(), v["error"]["type"].as_str()), (Some("request_too_large"), Some("invalid_request_error")), "{v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("the limit is: 1048576 bytes"), "{v}");
        }
    }

    /// The client's message carries neither the worker's address nor the gRPC code (the log
    /// line, from `Display`, keeps both); a request over the context is
    /// `context_length_exceeded` whichever field it has to change.
    #[tokio::test]
    async fn worker_errors_tell_the_client_no_internals() {
        let addr = "http://127.0.0.1:50051";
        for code in [
            tonic::Code::InvalidArgument,
            tonic::Code::ResourceExhausted,
            tonic::Code::Unavailable,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Internal,
            tonic::Code::Unauthenticated,
        ] {
            let e = ApiError::Worker { worker: addr.into(), code, message: "the model is still loading at /models/x.gguf".into() };
            assert!(e.to_string().contains(addr) && e.to_string().contains(&format!("{code:?}")), "{e}");
            let v = json_of(e.clone().into_response()).await;
            let text = v.to_string();
            assert!(!text.contains("127.0.0.1:50051") && !text.contains(&format!("({code:?})")), "{code:?}: {text}");
        }
        let gone = json_of(ApiError::WorkerStreamEnded { worker: addr.into() }.into_response()).await;
        let none = json_of(ApiError::NoWorker(format!("{addr}: tcp connect error (Unavailable)")).into_response()).await;
        for v in [gone, none] {
            assert!(!v.to_string().contains("127.0.0.1:50051") && !v.to_string().contains("Unavailable"), "{v}");
        }
        for (message, param) in [
            ("the prompt has 5000 tokens; the context holds 4096 (prompt + at least one output token)", "messages"),
            ("max_completion_tokens 97 does not fit: the context holds 128 tokens, the request asks for 129 (32 prompt + 97 max_completion_tokens); expected max_completion_tokens at most 96", "max_completion_tokens"),
        ] {
            let e = ApiError::Worker { worker: addr.into(), code: tonic::Code::InvalidArgument, message: message.into() };
            let v = json_of(e.into_response()).await;
            assert_eq!((v["error"]["code"].as_str(), v["error"]["param"].as_str()), (Some("context_length_exceeded"), Some(param)), "{v}");
            assert_eq!(v["error"]["message"], message, "{v}");
        }
    }

    #[test]
    fn route_labels_are_the_served_paths_or_other() {
        assert_eq!(route_label("/v1/chat/completions"), "/v1/chat/completions");
        assert_eq!(route_label("/metrics"), "/metrics");
        assert_eq!(route_label("/v1/chat/completions/x"), "other");
        assert_eq!(route_label("/../etc/passwd"), "other");
    }
}
