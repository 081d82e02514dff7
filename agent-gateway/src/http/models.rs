//! `GET /v1/models` and `GET /health`: both ask every worker for `StepService.Status`.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_proto::step::v1 as spb;

use super::{json_response, HttpState};
use crate::error::ApiError;

/// How long a worker may take to answer `Status`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// One worker's status, or why it gave none (also the gateway's gRPC health,
/// [`crate::service::serve_secured`]): an address that is no device-worker says what it is
/// ([`crate::worker::Worker::not_a_worker`]).
pub(crate) async fn status_of(worker: &crate::worker::Worker) -> Result<spb::StatusResponse, String> {
    let mut client = worker.client.clone();
    match tokio::time::timeout(STATUS_TIMEOUT, client.status(spb::StatusRequest {})).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => match worker.not_a_worker(&s).await {
            Some(why) => Err(format!("not a device-worker: {why}")),
            None => Err(format!("{} ({:?})", s.message(), s.code())),
        },
        Err(_) => Err(format!("no answer within {} s", STATUS_TIMEOUT.as_secs())),
    }
}

/// The id of a worker's model, as `GET /v1/models` lists it and a request's `model` names it:
/// the GGUF file name without its extension (`SmolLM2-135M-Instruct.Q4_1` for
/// `.../SmolLM2-135M-Instruct.Q4_1.gguf`), else the model's `general.name`; whitespace runs
/// become `-`, so the id is one token (llama-server also names a model by its file).
pub fn model_id(model: &spb::ModelInfo) -> Option<String> {
    let stem = std::path::Path::new(&model.path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let raw = if stem.trim().is_empty() { model.name.as_str() } else { stem.as_str() };
    Some(raw.split_whitespace().collect::<Vec<_>>().join("-")).filter(|id| !id.is_empty())
}

/// The distinct model ids of the workers that answer, in worker order; `fresh`: ask each worker
/// now, else use its cached model ([`crate::worker::Worker::model`]).
pub async fn served_ids(router: &crate::worker::Router, fresh: bool) -> Vec<String> {
    let mut ids: Vec<String> = vec![];
    for w in router.workers() {
        if let Some(id) = w.model(fresh).await.as_ref().and_then(model_id).filter(|id| !ids.contains(id)) {
            ids.push(id);
        }
    }
    ids
}

/// Checks a request's `model` against the served ids (the cached ones, then, when it is not
/// among them, the workers' answers now: a worker restarted with another model is seen at
/// once). A request for an unknown model is refused, as vLLM refuses it; when no worker
/// answers, the check is left to the request itself (which then fails as unavailable).
///
/// Errors: [`ApiError::ModelNotFound`] naming the served ids.
pub async fn check_model(router: &crate::worker::Router, requested: &str) -> Result<(), ApiError> {
    if served_ids(router, false).await.iter().any(|id| id == requested) {
        return Ok(());
    }
    let served = served_ids(router, true).await;
    if served.is_empty() || served.iter().any(|id| id == requested) {
        return Ok(());
    }
    Err(ApiError::ModelNotFound { requested: requested.to_string(), served })
}

/// `GET /v1/models`: `{"object":"list","data":[{"id","object":"model","created":0,"owned_by":"tandem"}]}`
/// with one entry per distinct worker model ([`model_id`]). 503 (OpenAI error JSON) when no
/// worker answers (the gateway's log says which and why).
pub async fn list_models(State(state): State<HttpState>) -> Response {
    let mut ids: Vec<String> = vec![];
    let mut errors = vec![];
    for w in state.router.workers() {
        match status_of(w).await {
            Ok(s) => {
                if let Some(id) = s.model.as_ref().and_then(model_id).filter(|id| !ids.contains(id)) {
                    ids.push(id);
                }
            }
            Err(e) => errors.push(format!("{}: {e}", w.addr)),
        }
    }
    if ids.is_empty() {
        return ApiError::NoWorker(if errors.is_empty() { "no worker has a model loaded".into() } else { errors.join("; ") })
            .into_response();
    }
    let data: Vec<Value> = ids.iter().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tandem"})).collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /health`: `{"status": "ok"|"degraded"|"unavailable", "workers": [{"addr", "ok",
/// "model", "power", "error"}]}`; 200 when at least one worker answers, else 503.
pub async fn health(State(state): State<HttpState>) -> Response {
    let mut workers = vec![];
    let mut ok = 0usize;
    for w in state.router.workers() {
        workers.push(match status_of(w).await {
            Ok(s) => {
                ok += 1;
                json!({"addr": w.addr, "ok": true, "model": s.model.as_ref().and_then(model_id), "power": s.power.map(|p| p.state), "error": null})
            }
            Err(e) => json!({"addr": w.addr, "ok": false, "model": null, "power": null, "error": e}),
        });
    }
    let (status, word) = match ok {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        n if n < workers.len() => (StatusCode::OK, "degraded"),
        _ => (StatusCode::OK, "ok"),
    };
    json_response(status, &json!({"status": word, "workers": workers}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_the_file_stem_as_one_token() {
        let info = |path: &str, name: &str| spb::ModelInfo { path: path.into(), name: name.into(), ..Default::default() };
        assert_eq!(model_id(&info("/m/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2 135M Instruct")).as_deref(), Some("SmolLM2-135M-Instruct.Q4_1"));
        assert_eq!(model_id(&info("/m/my model.gguf", "x")).as_deref(), Some("my-model"));
        assert_eq!(model_id(&info("", " SmolLM2  135M\tInstruct ")).as_deref(), Some("SmolLM2-135M-Instruct"));
        assert_eq!(model_id(&info("", " ")), None);
    }
}
