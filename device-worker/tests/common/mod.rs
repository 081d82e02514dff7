//! Shared helpers: a real worker on loopback holding the real default model.
#![allow(dead_code)]

use std::path::PathBuf;

use device_worker::config::EngineOptions;
use device_worker::engine::EngineHandle;
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The default model ($TANDEM_MODEL or the cache path `tools/fetch_model.sh` writes): a
/// required input, the test fails when it is missing.
#[allow(unused_imports)] // not every test binary uses it
pub use test_support::model_path;

pub struct TestWorker {
    pub client: StepServiceClient<Channel>,
    pub addr: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

/// Starts a worker with `cfg` on an ephemeral loopback port and connects a client.
/// The kernel backend is the one `TANDEM_KERNELS` names (the fastest when unset).
pub async fn start_worker(cfg: EngineOptions) -> TestWorker {
    device_worker::config::KernelArgs::install_env().expect("TANDEM_KERNELS");
    let engine = EngineHandle::spawn(cfg.settings().expect("valid options")).expect("engine thread");
    start_worker_with(engine).await
}

/// Serves an already spawned engine on an ephemeral loopback port and connects a client
/// (tests that keep the handle: power figures, a recording backend).
pub async fn start_worker_with(engine: EngineHandle) -> TestWorker {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(device_worker::service::serve(engine, listener, async {
        let _ = rx.await;
    }));
    let client = StepServiceClient::connect(addr.clone()).await.unwrap();
    TestWorker {
        client,
        addr,
        _shutdown: tx,
    }
}

pub fn config(model: PathBuf) -> EngineOptions {
    EngineOptions {
        model: Some(model),
        threads: Some(2),
        ctx_size: 2048,
        slots: 2,
        micro_batch: 128,
        ..Default::default()
    }
}

pub fn chat(session: &str, system: &str, user: &str, max_tokens: u32) -> pb::GenerateRequest {
    pb::GenerateRequest {
        session_id: session.into(),
        prompt: Some(pb::generate_request::Prompt::Chat(pb::ChatPrompt {
            messages: vec![
                pb::ChatMessage {
                    role: "system".into(),
                    content: system.into(),
                    parts: vec![],
                },
                pb::ChatMessage {
                    role: "user".into(),
                    content: user.into(),
                    parts: vec![],
                },
            ],
        })),
        max_tokens,
        ..Default::default()
    }
}

/// Everything one Generate call streamed.
#[derive(Debug, Default)]
pub struct Collected {
    pub prefill: Option<pb::PrefillStats>,
    pub tokens: Vec<pb::TokenEvent>,
    pub done: Option<pb::FinalStats>,
}

/// Sends `req` and waits for the worker to become ready (retrying UNAVAILABLE while loading).
pub async fn generate(
    client: &mut StepServiceClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<Collected, tonic::Status> {
    let mut stream = loop {
        match client.generate(req.clone()).await {
            Err(s) if s.code() == tonic::Code::Unavailable && s.message().contains("loading") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => break other?.into_inner(),
        }
    };
    let mut c = Collected::default();
    while let Some(ev) = stream.next().await {
        match ev?.event {
            Some(pb::generate_event::Event::Prefill(p)) => c.prefill = Some(p),
            Some(pb::generate_event::Event::Token(t)) => c.tokens.push(t),
            Some(pb::generate_event::Event::Done(d)) => c.done = Some(d),
            None => {}
        }
    }
    Ok(c)
}

/// Waits, polling every `poll`, until `idle` has released its power votes; fails after 5 s.
pub async fn wait_released(idle: &device_worker::power::IdleController, poll: std::time::Duration) {
    let t0 = std::time::Instant::now();
    while idle.state() != device_worker::power::PowerState::Released {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "votes never released"
        );
        tokio::time::sleep(poll).await;
    }
}
