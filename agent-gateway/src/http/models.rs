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
/// [`crate::service::serve_secured`]).
pub(crate) async fn status_of(worker: &crate::worker::Worker) -> Result<spb::StatusResponse, String> {
    let mut client = worker.client.clone();
    match tokio::time::timeout(STATUS_TIMEOUT, client.status(spb::StatusRequest {})).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{} ({:?})", s.message(), s.code())),
        Err(_) => Err(format!("no answer within {} s", STATUS_TIMEOUT.as_secs())),
    }
}

/// The model id of a worker's status: the GGUF's model name, else the file stem of its path.
pub fn model_id(status: &spb::StatusResponse) -> Option<String> {
    let m = status.model.as_ref()?;
    if !m.name.trim().is_empty() {
        return Some(m.name.trim().to_string());
    }
    std::path::Path::new(&m.path).file_stem().map(|s| s.to_string_lossy().into_owned()).filter(|s| !s.is_empty())
}

/// `GET /v1/models`: `{"object":"list","data":[{"id","object":"model","created":0,"owned_by":"tandem"}]}`
/// with one entry per distinct worker model. 503 (OpenAI error JSON) when no worker answers.
pub async fn list_models(State(state): State<HttpState>) -> Response {
    let mut ids: Vec<String> = vec![];
    let mut errors = vec![];
    for w in state.router.workers() {
        match status_of(w).await {
            Ok(s) => {
                if let Some(id) = model_id(&s).filter(|id| !ids.contains(id)) {
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
                json!({"addr": w.addr, "ok": true, "model": model_id(&s), "power": s.power.map(|p| p.state), "error": null})
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
