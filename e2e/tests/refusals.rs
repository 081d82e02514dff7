//! Requests the worker refuses at admission are counted and logged, over real gRPC and its
//! real `GET /metrics` on loopback with the default model: each refusal adds one to
//! `worker_requests_total{outcome="refused",reason="invalid_argument"}` and writes one WARN
//! line `request refused` with the reason (bounded: a 1 MiB session id is not in it), and the
//! zero-initialised series are there before any refusal.

mod common;

use common::{http_get, sample};
use tandem_proto::step::v1 as pb;

const REFUSED: &str = "worker_requests_total{outcome=\"refused\",reason=\"invalid_argument\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refusals_are_counted_by_reason_and_logged_once_each() {
    let logs = common::capture_logs(tracing::Level::INFO);
    let mut servers = common::start(common::model_path()).await;
    let metrics = common::start_worker_metrics(&mut servers).await;
    let (status, before) = http_get(&metrics, "/metrics").await;
    assert_eq!(status, 200);
    for reason in ["invalid_argument", "resource_exhausted", "unavailable", "internal"] {
        let series = format!("worker_requests_total{{outcome=\"refused\",reason=\"{reason}\"}}");
        assert!(sample(&before, &series).is_some(), "{series} is zero-initialised:\n{before}");
    }

    let mut client = pb::step_service_client::StepServiceClient::connect(servers.worker.clone()).await.unwrap();
    let text = |session: &str, t: &str| pb::GenerateRequest {
        session_id: session.into(),
        prompt: Some(pb::generate_request::Prompt::Text(t.into())),
        max_tokens: 1,
        ..Default::default()
    };
    let mut nan = text("", "hi");
    nan.sampling = Some(pb::Sampling { mode: Some(pb::sampling::Mode::Seeded(pb::Seeded { seed: 1, temperature: 1.0, top_p: f32::NAN, top_k: 0 })) });
    let huge_session = "Zq9".repeat(350_000);
    let refused = [
        nan,
        text(&huge_session, "hi"),
        pb::GenerateRequest { max_tokens: 1, ..Default::default() },
        text("", &"tap the button ".repeat(2000)),
    ];
    let n = refused.len();
    for req in refused {
        let err = client.generate(req).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    }

    let (_, after) = http_get(&metrics, "/metrics").await;
    let grew = sample(&after, REFUSED).unwrap() - sample(&before, REFUSED).unwrap_or(0.0);
    assert_eq!(grew, n as f64, "{after}");
    assert_eq!(sample(&after, "worker_requests_total{outcome=\"error\"}"), sample(&before, "worker_requests_total{outcome=\"error\"}"));

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("request refused")).collect();
    assert_eq!(lines.len(), n, "{logs}");
    for l in &lines {
        assert!(l.contains("WARN") && l.contains("reason=\"invalid_argument\""), "{l}");
        assert!(l.len() < 1000, "{} bytes: {}", l.len(), &l[..200]);
    }
    assert!(lines.iter().any(|l| l.contains("top_p")), "{lines:?}");
    assert!(!logs.contains(&huge_session[..3000]));
}
