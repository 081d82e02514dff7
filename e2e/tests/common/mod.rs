//! Shared harness of the e2e tests: the real model and corpus, and a real device-worker plus
//! agent-gateway served over loopback gRPC in the test process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

/// The model (`TANDEM_MODEL`, else the worker's default path): a required input, the test
/// fails when the file is missing.
#[allow(unused_imports)] // not every test binary uses it
pub use test_support::model_path;

/// The corpus root (`TANDEM_CORPUS`, else `<repo>/../shared/corpus/raw`): a required input,
/// the test fails when it is missing.
#[allow(unused_imports)]
pub use test_support::corpus_dir as corpus;

/// A replay of the first `max_steps` steps of one corpus episode through `gateway`, without
/// a token, its JSONL written to `out`.
pub fn replay_config(gateway: &str, max_steps: usize, out: PathBuf) -> agent_gateway::replay::ReplayConfig {
    agent_gateway::replay::ReplayConfig {
        gateway: gateway.to_string(),
        corpus: corpus(),
        episodes: vec![],
        count: 1,
        max_steps,
        max_tokens: 0,
        screenshots: agent_gateway::screenshot::ScreenshotMode::Never,
        token_file: None,
        tls: Default::default(),
        out,
        list: false,
        dry_run: false,
    }
}

/// Sends the first step of `episode` to the gateway as episode `id` (unary in, stream out);
/// returns the step's event stream.
pub async fn first_step(
    client: &mut tandem_proto::agent::v1::agent_service_client::AgentServiceClient<tonic::transport::Channel>,
    id: &str,
    episode: &agent_gateway::corpus::Episode,
) -> tonic::Streaming<tandem_proto::agent::v1::StepEvent> {
    client
        .step(tandem_proto::agent::v1::StepRequest {
            episode_id: id.into(),
            task: episode.task.clone(),
            observation: Some(episode.steps[0].to_observation()),
            max_tokens: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Running servers; dropping this stops them.
pub struct Servers {
    /// Gateway AgentService address, `http://127.0.0.1:PORT`.
    pub gateway: String,
    /// Worker StepService address.
    pub worker: String,
    /// The worker's engine (for its metrics server, see [`start_worker_metrics`]).
    pub engine: device_worker::engine::EngineHandle,
    _stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// The worker options of these tests: `model`, 2 threads, 2 slots, a 4096-token context.
pub fn engine_options(model: PathBuf) -> device_worker::config::EngineOptions {
    device_worker::config::EngineOptions {
        model: Some(model),
        threads: Some(2),
        ctx_size: 4096,
        slots: 2,
        ..Default::default()
    }
}

/// Spawns an engine with `cfg` and waits until the model is loaded (as deploy/demo.sh waits
/// for the worker's health); panics when the options are invalid or the model failed to load.
pub async fn ready_engine(cfg: device_worker::config::EngineOptions) -> device_worker::engine::EngineHandle {
    let engine = device_worker::engine::EngineHandle::spawn(cfg.settings().expect("valid options")).unwrap();
    let mut state = engine.state();
    state
        .wait_for(|s| !matches!(s, device_worker::engine::EngineState::Loading))
        .await
        .expect("engine state");
    assert!(engine.admission().is_ok(), "the model failed to load");
    engine
}

/// Loads a worker with `cfg`, waits for the model, and serves StepService on a free loopback
/// port. Returns the engine, its address `http://127.0.0.1:PORT` and the stop handle.
pub async fn serve_worker(
    cfg: device_worker::config::EngineOptions,
) -> (device_worker::engine::EngineHandle, String, tokio::sync::oneshot::Sender<()>) {
    // Serve only once the model is loaded.
    let engine = ready_engine(cfg).await;
    let wl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = format!("http://{}", wl.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(device_worker::service::serve(engine.clone(), wl, async {
        let _ = stopped.await;
    }));
    (engine, worker, stop)
}

/// Loads `model` in a worker ([`engine_options`]), serves it, and serves a gateway routed to
/// it; both on free loopback ports.
pub async fn start(model: PathBuf) -> Servers {
    start_with(engine_options(model)).await
}

/// [`start`] with the worker options `cfg` (another model, a projector).
pub async fn start_with(cfg: device_worker::config::EngineOptions) -> Servers {
    let (engine, worker, s1) = serve_worker(cfg).await;
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&worker)).unwrap();
    let (gateway, s2) = serve_gateway(router).await;
    Servers { gateway, worker, engine, _stop: vec![s1, s2] }
}

/// Serves a gateway (AgentService) over `router` on a free loopback port. Returns its address
/// `http://127.0.0.1:PORT` and the stop handle.
pub async fn serve_gateway(
    router: agent_gateway::worker::Router,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    serve_runner(agent_gateway::step::StepRunner::new(router)).await
}

/// Serves a gateway (AgentService) running steps with `runner` on a free loopback port.
/// Returns its address `http://127.0.0.1:PORT` and the stop handle.
pub async fn serve_runner(
    runner: agent_gateway::step::StepRunner,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let runner = Arc::new(runner);
    let gl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("http://{}", gl.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(agent_gateway::service::serve(runner, gl, async {
        let _ = stopped.await;
    }));
    (gateway, stop)
}

/// Serves the gateway's HTTP endpoint (OpenAI API and `GET /metrics` with the process-wide
/// Prometheus recorder, installed here) routed to `servers.worker`, on a free loopback port;
/// stops with `servers`. Returns `127.0.0.1:PORT`.
pub async fn start_http(servers: &mut Servers) -> String {
    let router = agent_gateway::worker::Router::new(std::slice::from_ref(&servers.worker)).unwrap();
    let (addr, tx) = serve_http_over(router).await;
    servers._stop.push(tx);
    addr
}

/// Serves the gateway's HTTP endpoint over `router` (as [`start_http`], for workers that are
/// not a [`Servers`]' own, e.g. an address nothing listens on). Returns `127.0.0.1:PORT` and
/// the stop handle.
pub async fn serve_http_over(router: agent_gateway::worker::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let metrics = agent_gateway::metrics::install().expect("install the Prometheus recorder");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = agent_gateway::http::HttpState { router, metrics: Some(metrics) };
    tokio::spawn(agent_gateway::http::serve(state, l, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Serves the worker's Prometheus `GET /metrics` (as `device-worker serve --metrics-listen`;
/// the process-wide recorder, installed here) on a free loopback port; stops with `servers`.
/// Returns `127.0.0.1:PORT`.
pub async fn start_worker_metrics(servers: &mut Servers) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Installed before the server task starts, so the first scrape finds the worker's series.
    device_worker::telemetry::prometheus::install_worker().expect("install the Prometheus recorder");
    tokio::spawn(device_worker::service::metrics::serve(servers.engine.clone(), l, async {
        let _ = rx.await;
    }));
    servers._stop.push(tx);
    addr
}

/// `GET path` over HTTP/1.1 to `addr` (`127.0.0.1:PORT`) with `Connection: close`; returns the
/// status code and the body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    // axum answers /metrics with a Content-Length body; chunked bodies are not expected here.
    http_exchange(addr, format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"), "").await
}

/// Sends the request `head` (ending in the blank line) and `body` to `addr`, reads until the
/// server closes; returns the status code and the body (undecoded). A read error after the
/// response (a reset as the server drops a request body it did not read) keeps what came.
pub async fn http_exchange(addr: &str, head: String, body: &str) -> (u16, String) {
    let (status, _, body) = http_exchange_with_head(addr, head, body).await;
    (status, body)
}

/// [`http_exchange`], returning the response's head (status line and header lines) too.
pub async fn http_exchange_with_head(addr: &str, head: String, body: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to the HTTP endpoint");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    (status, head.to_string(), body.to_string())
}

/// The value of the sample `series` (`name{labels}` exactly as rendered, or a bare name) in a
/// Prometheus text exposition; `None` when absent.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

/// `POST path` with the JSON `body` over HTTP/1.1 to `addr` with `Connection: close`; returns
/// the status code and the body (a chunked body, such as server-sent events, undecoded).
pub async fn http_post(addr: &str, path: &str, body: &str) -> (u16, String) {
    http_post_with_headers(addr, path, "", body).await
}

/// [`http_post`] with `extra_headers`: whole header lines, each ending in `\r\n` (or "").
pub async fn http_post_with_headers(addr: &str, path: &str, extra_headers: &str, body: &str) -> (u16, String) {
    http_exchange(addr, post_head(addr, path, extra_headers, body), body).await
}

/// [`http_post`], returning the response's head (status line and header lines) too.
pub async fn http_post_with_head(addr: &str, path: &str, body: &str) -> (u16, String, String) {
    http_exchange_with_head(addr, post_head(addr, path, "", body), body).await
}

/// The head of a `POST path` with the JSON `body` and `extra_headers` ([`http_post_with_headers`]).
pub fn post_head(addr: &str, path: &str, extra_headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra_headers}Connection: close\r\n\r\n",
        body.len()
    )
}

/// A log sink: every line written by the `tracing` subscriber [`capture_logs`] installs.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the process-wide `tracing` subscriber at `level` (no colours) writing into the
/// returned sink; once per test binary.
pub fn capture_logs(level: tracing::Level) -> Captured {
    let logs = Captured::default();
    let w = logs.clone();
    tracing_subscriber::fmt().with_max_level(level).with_ansi(false).with_writer(move || w.clone()).init();
    logs
}
