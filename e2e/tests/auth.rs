//! Bearer-token authentication across the whole path, over real loopback gRPC and HTTP with
//! the real default model: a worker and a gateway that each require a token, the gateway
//! sending its worker token, the replay client sending the gateway's; every endpoint refuses
//! a missing or wrong token (gRPC UNAUTHENTICATED, HTTP 401 with an OpenAI error object) and
//! leaves health open.

mod common;

use std::sync::Arc;

use agent_gateway::replay::{self, ReplayConfig};
use common::{http_get, model_path, replay_config};
use tandem_auth::{AuthLayer, Authenticator, BearerInterceptor};
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;

const WORKER_TOKEN: &str = "worker-token-0123456789abcdef";
const GATEWAY_TOKEN: &str = "gateway-token-0123456789abcdef";

/// `GET path` with `authorization: Bearer token`: (status, body).
async fn http_get_with_token(addr: &str, path: &str, token: &str) -> (u16, String) {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    common::http_exchange(addr, req, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_needs_its_token_and_the_chain_passes_with_them() {
    let model = model_path();
    let dir = tempfile::tempdir().unwrap();
    let (worker_file, gateway_file) = (dir.path().join("worker"), dir.path().join("gateway"));
    std::fs::write(&worker_file, format!("# the worker's token\n{WORKER_TOKEN}\n")).unwrap();
    std::fs::write(&gateway_file, format!("{GATEWAY_TOKEN}\n")).unwrap();
    let mut stops = Vec::new();

    // The worker, behind its token.
    let engine = common::ready_engine(common::engine_options(model)).await;
    let wl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = format!("http://{}", wl.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stops.push(tx);
    let layer = AuthLayer::grpc(Some(Authenticator::from_file(&worker_file).unwrap()), false);
    tokio::spawn(device_worker::service::serve_secured(engine, tandem_auth::Listener::Tcp(wl), async { let _ = rx.await; }, tandem_auth::GrpcSecurity::auth(layer)));

    // Without a token, with the wrong one: UNAUTHENTICATED before any work.
    let request = || pb::GenerateRequest {
        session_id: "auth".into(),
        prompt: Some(pb::generate_request::Prompt::Text("Hello".into())),
        max_tokens: 2,
        ..Default::default()
    };
    let mut anon = StepServiceClient::connect(worker.clone()).await.unwrap();
    let err = anon.generate(request()).await.expect_err("no token is refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("missing bearer token") && err.message().contains("--worker-token-file"), "{}", err.message());
    let mut wrong = tonic::Request::new(request());
    wrong.metadata_mut().insert("authorization", format!("Bearer {GATEWAY_TOKEN}").parse().unwrap());
    let err = anon.generate(wrong).await.expect_err("a wrong token is refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "invalid bearer token");
    // Health stays open (probes, `agent-gateway health`).
    let ch = tonic::transport::Endpoint::from_shared(worker.clone()).unwrap().connect().await.unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .expect("health needs no token");
    assert_eq!(health.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    // The gateway, behind its own token, sending the worker's.
    let worker_token = BearerInterceptor::from_file(&worker_file).unwrap();
    let router = agent_gateway::worker::Router::with_token(std::slice::from_ref(&worker), worker_token).unwrap();
    let gateway_auth = Authenticator::from_file(&gateway_file).unwrap();
    let gl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("http://{}", gl.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stops.push(tx);
    let runner = Arc::new(agent_gateway::step::StepRunner::new(router.clone()));
    let layer = AuthLayer::grpc(Some(gateway_auth.clone()), false);
    tokio::spawn(agent_gateway::service::serve_secured(runner, tandem_auth::Listener::Tcp(gl), async { let _ = rx.await; }, tandem_auth::GrpcSecurity::auth(layer)));

    // A replay with the gateway's token runs a step end to end (gateway → worker with the
    // worker's token); without it the gateway refuses.
    let out = tempfile::tempdir().unwrap();
    let mut cfg = ReplayConfig {
        token_file: Some(gateway_file.clone()),
        ..replay_config(&gateway, 1, out.path().join("replay.jsonl"))
    };
    let (records, summary) = replay::run(&cfg).await.expect("replay with the token");
    assert_eq!(summary.steps, 1);
    assert!(records[0].error.is_empty(), "{:?}", records[0]);
    assert!(records[0].decode_tokens > 0);
    cfg.token_file = None;
    let err = replay::run(&cfg).await.expect_err("a replay without the token fails").to_string();
    assert!(err.contains("missing bearer token: give the token file with --token-file"), "{err}");

    // The HTTP endpoint: 401 with an OpenAI error object, 200 with the token, /health open.
    let hl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = hl.local_addr().unwrap().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stops.push(tx);
    let state = agent_gateway::http::HttpState { router, metrics: None };
    let security = agent_gateway::http::HttpSecurity { auth: Some(gateway_auth), ..Default::default() };
    tokio::spawn(agent_gateway::http::serve_secured(state, hl, async { let _ = rx.await; }, security));
    let (status, body) = http_get(&http, "/v1/models").await;
    assert_eq!(status, 401, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    assert_eq!(http_get_with_token(&http, "/v1/models", WORKER_TOKEN).await.0, 401, "the worker's token is not the gateway's");
    let (status, body) = http_get_with_token(&http, "/v1/models", GATEWAY_TOKEN).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(http_get(&http, "/health").await.0, 200);
}
