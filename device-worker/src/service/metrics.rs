//! The worker's `GET /metrics` server (`--metrics-listen`): the power figures refreshed at
//! each scrape, then the process's Prometheus recorder rendered.

use metrics_exporter_prometheus::PrometheusHandle;
use tandem_telemetry::prometheus::{render, CONTENT_TYPE};
use tandem_telemetry::TelemetryError;

use crate::engine::{EngineHandle, EngineState};
use crate::telemetry::power;
use crate::telemetry::prometheus::install_worker;

/// Whether the engine is loading the model (at start or after a watchdog restart); the
/// power state then reads `"loading"`.
pub fn is_loading(engine: &EngineHandle) -> bool {
    matches!(&*engine.state().borrow(), EngineState::Loading | EngineState::Restarting(_))
}

/// The worker's `/metrics` router: refreshes the power figures of `engine` (so the power
/// state is current at each scrape), then renders `handle`.
pub fn app(engine: EngineHandle, handle: PrometheusHandle) -> axum::Router {
    use axum::http::{header, HeaderValue};
    use axum::response::IntoResponse;
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let engine = engine.clone();
            let handle = handle.clone();
            async move {
                power::record(&engine.power(), is_loading(&engine));
                let mut resp = render(&handle).into_response();
                resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
                resp
            }
        }),
    )
}

/// Serves [`app`] on `listener` until `shutdown` resolves (installs the recorder and the
/// worker's series first, see [`install_worker`]).
///
/// Errors: [`install_worker`]'s; [`TelemetryError::Serve`] when the server fails.
pub async fn serve(
    engine: EngineHandle,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), TelemetryError> {
    let handle = install_worker()?;
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    axum::serve(listener, app(engine, handle))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| TelemetryError::Serve { addr, reason: e.to_string() })
}
