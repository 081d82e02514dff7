//! `POST /v1/chat/completions`: one worker `Generate` per request, answered as one
//! `chat.completion` object or as server-sent `chat.completion.chunk` events ending in
//! `data: [DONE]` (a token's text is sent as soon as the worker produces it, less any text held
//! back by a pending stop string).

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_proto::step::v1 as spb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use super::openai::{chunk_json, completion_json, usage_chunk_json, ChatCompletionRequest, PartOrigins, RunInfo};
use super::stop::{truncate_at_stop, StopFilter};
use super::{json_response, unique_id, unix_now, HttpState, EPISODE_HEADER};
use crate::error::ApiError;

type WorkerStream = tonic::Streaming<spb::GenerateEvent>;

/// The handler. Errors before the first byte are OpenAI error JSON with a 4xx/5xx status;
/// errors during a stream are one `data: {"error": {...}}` event, after which the stream ends
/// without `[DONE]`.
pub async fn chat_completions(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // Over the body limit: OpenAI error JSON (axum's own rejection is plain text).
    let body = match body {
        Ok(b) => b,
        Err(r) if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError::BodyTooLarge { limit: super::MAX_BODY_BYTES }.into_response()
        }
        Err(r) => return ApiError::BadJson(r.body_text()).into_response(),
    };
    match run(state, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The episode a request belongs to: the `X-Episode-Id` header, else the `user` field (each
/// trimmed; empty: none). A header that is empty after trimming counts as absent, so a
/// client's blank header does not hide its `user`. The header's value is UTF-8: non-ASCII ids
/// (e.g. `épisode-7`) are kept as they are, as `user` would keep them.
///
/// Errors: [`ApiError::InvalidParam`] (`X-Episode-Id` or `user`) for an id outside
/// [`tandem_proto::limits::check_id`]'s rule (too long, control characters), and
/// (`X-Episode-Id`) for a header value that is not UTF-8.
pub fn episode_of(headers: &HeaderMap, user: Option<&str>) -> Result<Option<String>, ApiError> {
    let header = match headers.get(EPISODE_HEADER) {
        None => None,
        Some(v) => Some(std::str::from_utf8(v.as_bytes()).map_err(|_| ApiError::InvalidParam {
            param: "X-Episode-Id",
            expected: "UTF-8 text",
            found: format!("{} bytes that are not UTF-8", v.as_bytes().len()),
        })?),
    };
    let (param, id) = match header.map(str::trim).filter(|h| !h.is_empty()) {
        Some(h) => ("X-Episode-Id", h),
        None => ("user", user.unwrap_or("").trim()),
    };
    tandem_proto::limits::check_id(param, id)?;
    Ok(Some(id.to_string()).filter(|s| !s.is_empty()))
}

/// How a worker's error text is put in the request's terms: its `messages[i].parts[j]` as the
/// request's `messages[i].content[k]` ([`PartOrigins::to_openai`]) and `max_tokens` as the
/// field the client set the budget with ([`ChatCompletionRequest::max_tokens_param`]).
struct Terms {
    origins: PartOrigins,
    max_tokens_param: &'static str,
}

/// A worker status as the endpoint's error, its text in the request's terms ([`Terms`]). A
/// broken connection (the worker died mid-request) counts as UNAVAILABLE, as an unreachable
/// worker does ([`crate::step::effective_code`]): 503 with `Retry-After`.
fn worker_error(worker: &str, s: tonic::Status, terms: &Terms) -> ApiError {
    let mut message = terms.origins.to_openai(s.message());
    if terms.max_tokens_param != "max_tokens" {
        message = message.replace("max_tokens", terms.max_tokens_param);
    }
    ApiError::Worker { worker: worker.to_string(), code: crate::step::effective_code(&s), message }
}

struct Reply {
    id: String,
    created: u64,
    model: String,
    run: RunInfo,
    terms: Terms,
}

async fn run(state: HttpState, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let req = ChatCompletionRequest::from_body(&body)?;
    let episode = episode_of(&headers, req.user.as_deref())?;
    // Without an episode: a fresh routing key and no session (no slot affinity).
    let (route_key, session_id) = match episode {
        Some(e) => (e.clone(), e),
        None => (unique_id("http"), String::new()),
    };
    let fallback_seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let (generate, origins) = req.to_generate_request_indexed(&session_id, fallback_seed)?;
    // The body fit the HTTP limit; its protobuf form must fit the worker's (same budget).
    let bytes = prost::Message::encoded_len(&generate);
    if bytes > tandem_proto::MAX_MESSAGE_BYTES {
        return Err(ApiError::RequestTooLarge { bytes, limit: tandem_proto::MAX_MESSAGE_BYTES });
    }
    if let Some(model) = req.requested_model() {
        super::models::check_model(&state.router, model).await?;
    }
    let terms = Terms { origins, max_tokens_param: req.max_tokens_param() };
    let stops = generate.stop.clone();
    let mut worker = state.router.route(&route_key).clone();
    let mut stream = match worker.client.clone().generate(generate.clone()).await {
        Ok(s) => s.into_inner(),
        // An unreachable or restarting worker: route around it and try once more.
        Err(s) if crate::step::effective_code(&s) == tonic::Code::Unavailable => {
            state.router.mark_down(&worker.addr);
            worker = state.router.route(&route_key).clone();
            worker.client.clone().generate(generate).await.map_err(|s| worker_error(&worker.addr, s, &terms))?.into_inner()
        }
        Err(s) => return Err(worker_error(&worker.addr, s, &terms)),
    };
    // The id `GET /v1/models` lists for this worker (what the request named, if it named one).
    let model = match worker.model(false).await.as_ref().and_then(super::models::model_id) {
        Some(id) => id,
        None => req.requested_model().unwrap_or("tandem").to_string(),
    };
    let mut reply = Reply {
        id: unique_id("chatcmpl"),
        created: unix_now(),
        model,
        run: RunInfo { worker: worker.addr.clone(), session_id, ..Default::default() },
        terms,
    };
    if !req.streaming() {
        let done = collect(&mut stream, &mut reply.run, &reply.terms).await?;
        log_done(&reply.run, &done);
        let content = truncate_at_stop(&done.text, &stops);
        return Ok(json_response(StatusCode::OK, &completion_json(&reply.id, reply.created, &reply.model, &content, &done, &reply.run)));
    }
    // Wait for the first event so that a request the worker rejects gets an HTTP error status.
    let first = match stream.next().await {
        Some(Ok(ev)) => ev,
        Some(Err(s)) => return Err(worker_error(&reply.run.worker, s, &reply.terms)),
        None => return Err(ApiError::WorkerStreamEnded { worker: reply.run.worker }),
    };
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let mut filter = StopFilter::new(&stops);
        // A closed channel (client gone) ends the task, dropping the worker stream, which
        // cancels the request on the worker.
        let _ = forward(first, stream, &mut reply, &mut filter, include_usage, &tx).await;
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response())
}

/// Reads the worker stream to its final event.
async fn collect(stream: &mut WorkerStream, run: &mut RunInfo, terms: &Terms) -> Result<spb::FinalStats, ApiError> {
    while let Some(ev) = stream.next().await {
        match ev.map_err(|s| worker_error(&run.worker, s, terms))?.event {
            Some(spb::generate_event::Event::Prefill(p)) => run.on_prefill(p),
            Some(spb::generate_event::Event::Done(d)) => return Ok(d),
            _ => {}
        }
    }
    Err(ApiError::WorkerStreamEnded { worker: run.worker.clone() })
}

fn log_done(run: &RunInfo, d: &spb::FinalStats) {
    tracing::info!(
        worker = %run.worker, session = %run.session_id, slot = run.slot_id,
        prompt_tokens = d.prompt_tokens, reused_tokens = d.reused_tokens, decode_tokens = d.decode_tokens,
        server_ms = d.server_ms, "chat completion"
    );
}

fn data(v: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(v.to_string()))
}

/// Sends the SSE events of one completion: a role chunk, content chunks as tokens come, a final
/// chunk with `finish_reason`, the usage chunk if asked, `[DONE]`. `Err(())`: the client went
/// away or the worker failed (an error event was sent).
async fn forward(
    first: spb::GenerateEvent,
    mut stream: WorkerStream,
    reply: &mut Reply,
    filter: &mut StopFilter,
    include_usage: bool,
    tx: &mpsc::Sender<Result<Event, Infallible>>,
) -> Result<(), ()> {
    let send = |v: Value| async move { tx.send(data(&v)).await.map_err(|_| ()) };
    send(chunk_json(&reply.id, reply.created, &reply.model, json!({"role": "assistant", "content": ""}), None)).await?;
    let mut next = Some(Ok(first));
    loop {
        let ev = match next.take() {
            Some(ev) => ev,
            None => match stream.next().await {
                Some(ev) => ev,
                None => {
                    let e = ApiError::WorkerStreamEnded { worker: reply.run.worker.clone() };
                    tracing::warn!(error = %e, "chat completion stream failed");
                    let _ = send(e.to_json()).await;
                    return Err(());
                }
            },
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(s) => {
                let e = worker_error(&reply.run.worker, s, &reply.terms);
                tracing::warn!(error = %e, "chat completion stream failed");
                let _ = send(e.to_json()).await;
                return Err(());
            }
        };
        match ev.event {
            Some(spb::generate_event::Event::Prefill(p)) => reply.run.on_prefill(p),
            Some(spb::generate_event::Event::Token(t)) => {
                let text = filter.push(&t.text);
                if !text.is_empty() {
                    send(chunk_json(&reply.id, reply.created, &reply.model, json!({"content": text}), None)).await?;
                }
            }
            Some(spb::generate_event::Event::Done(d)) => {
                log_done(&reply.run, &d);
                let rest = filter.finish();
                if !filter.stopped() && !rest.is_empty() {
                    send(chunk_json(&reply.id, reply.created, &reply.model, json!({"content": rest}), None)).await?;
                }
                let finish = super::openai::finish_reason(d.finish_reason);
                send(chunk_json(&reply.id, reply.created, &reply.model, json!({}), Some(finish))).await?;
                if include_usage {
                    send(usage_chunk_json(&reply.id, reply.created, &reply.model, &d, &reply.run)).await?;
                }
                return tx.send(Ok(Event::default().data("[DONE]"))).await.map_err(|_| ());
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(value: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(EPISODE_HEADER, HeaderValue::from_bytes(value).unwrap());
        h
    }

    #[test]
    fn a_non_ascii_episode_header_is_kept() {
        let id = episode_of(&headers("épisode-7 ✓".as_bytes()), Some("alice")).unwrap();
        assert_eq!(id.as_deref(), Some("épisode-7 ✓"));
    }

    #[test]
    fn a_non_utf8_episode_header_is_refused_naming_the_header() {
        let e = episode_of(&headers(b"ep-\xff\xfe"), None).unwrap_err();
        match e {
            ApiError::InvalidParam { param, .. } => assert_eq!(param, "X-Episode-Id"),
            e => panic!("expected InvalidParam, got {e:?}"),
        }
    }

    #[test]
    fn a_blank_episode_header_falls_back_to_user() {
        assert_eq!(episode_of(&headers(b"  "), Some(" bob ")).unwrap().as_deref(), Some("bob"));
        assert_eq!(episode_of(&headers(b""), None).unwrap(), None);
        assert_eq!(episode_of(&HeaderMap::new(), Some("carol")).unwrap().as_deref(), Some("carol"));
        assert_eq!(episode_of(&headers(b" ep-1 "), Some("carol")).unwrap().as_deref(), Some("ep-1"));
    }
}
