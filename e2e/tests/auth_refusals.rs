//! Calls the worker's bearer-token layer refuses are counted, over real loopback gRPC with
//! the real default model and the worker's real `GET /metrics`: a missing, a malformed and a
//! wrong token each add one to `worker_requests_total{outcome="refused",reason="unauthenticated"}`
//! (zero-initialised before any refusal), health stays open and uncounted, and an
//! authenticated call is served and counted `ok`.

mod common;

use common::{http_get, sample};
use tandem_auth::{AuthLayer, Authenticator};
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;

const TOKEN: &str = "refusal-token-0123456789abcdef";
const UNAUTHENTICATED: &str = "worker_requests_total{outcome=\"refused\",reason=\"unauthenticated\"}";
const OK: &str = "worker_requests_total{outcome=\"ok\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_calls_are_counted_as_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let cfg = device_worker::config::EngineOptions {
        model: Some(common::model_path()),
        threads: Some(2),
        ctx_size: 1024,
        ..Default::default()
    };
    let engine = common::ready_engine(cfg).await;
    // The worker's metrics endpoint, as `serve --metrics-listen` (installs the recorder first).
    device_worker::telemetry::prometheus::install_worker().unwrap();
    let ml = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = ml.local_addr().unwrap().to_string();
    let (_stop_metrics, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(device_worker::service::metrics::serve(engine.clone(), ml, async { let _ = stopped.await; }));
    let wl = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = format!("http://{}", wl.local_addr().unwrap());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let layer = AuthLayer::grpc(Some(Authenticator::from_file(&token_file).unwrap()), false);
    tokio::spawn(device_worker::service::serve_secured(engine, tandem_auth::Listener::Tcp(wl), async { let _ = stopped.await; }, tandem_auth::GrpcSecurity::auth(layer)));

    let (status, before) = http_get(&metrics, "/metrics").await;
    assert_eq!(status, 200);
    let before_refused = sample(&before, UNAUTHENTICATED).expect("the unauthenticated series is zero-initialised");
    let request = |auth: Option<&str>| {
        let mut r = tonic::Request::new(pb::GenerateRequest {
            session_id: "auth-refusals".into(),
            prompt: Some(pb::generate_request::Prompt::Text("Hello".into())),
            max_tokens: 2,
            ..Default::default()
        });
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
    };
    let mut client = StepServiceClient::connect(worker.clone()).await.unwrap();
    let wrong = format!("Bearer wrong-{TOKEN}");
    for auth in [None, Some("Basic abc"), Some(wrong.as_str())] {
        let err = client.generate(request(auth)).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{auth:?}: {err}");
    }
    // Health is open and not a refusal.
    let ch = tonic::transport::Endpoint::from_shared(worker.clone()).unwrap().connect().await.unwrap();
    tonic_health::pb::health_client::HealthClient::new(ch).check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.expect("health is open");
    // The right token is served.
    let right = format!("Bearer {TOKEN}");
    let mut stream = client.generate(request(Some(&right))).await.expect("served").into_inner();
    while stream.message().await.expect("stream").is_some() {}

    // The served call is counted when the server drops its stream, just after the last event.
    let before_ok = sample(&before, OK).unwrap_or(0.0);
    let mut after = String::new();
    for _ in 0..50 {
        after = http_get(&metrics, "/metrics").await.1;
        if sample(&after, OK).unwrap_or(0.0) > before_ok {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(sample(&after, UNAUTHENTICATED).unwrap() - before_refused, 3.0, "{after}");
    assert_eq!(sample(&after, OK).unwrap_or(0.0) - before_ok, 1.0, "{after}");
}
