//! StepService over real gRPC on loopback, against a real worker holding the real default
//! model (SmolLM2-135M-Instruct Q4_1).

mod common;

use common::*;
use tandem_proto::step::v1 as pb;
use tokio_stream::StreamExt;

const SYSTEM: &str =
    "You are a phone agent. Answer with one JSON object describing the next action.";

/// One turn of episode `ep-1`: `user` after [`SYSTEM`], up to 12 tokens.
async fn ep1_turn(w: &mut TestWorker, user: &str) -> Result<Collected, tonic::Status> {
    generate(&mut w.client, chat("ep-1", SYSTEM, user, 12)).await
}

/// The worker's Status.
async fn worker_status(w: &mut TestWorker) -> pb::StatusResponse {
    w.client
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// A short request on `session` still completes (`what` says when, for a failure).
async fn assert_serves(w: &mut TestWorker, session: &str, what: &str) {
    let out = generate(&mut w.client, chat(session, SYSTEM, "hi", 3))
        .await
        .expect(what);
    assert!(out.done.is_some(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_streams_prefill_tokens_and_final_stats_and_reuses_the_prefix() {
    let model = model_path();
    let mut w = start_worker(config(model)).await;

    let first = ep1_turn(&mut w, "Task: open the settings app.\nScreen: [0] Button \"Settings\"")
        .await
        .expect("first request");
    let p = first.prefill.expect("prefill event");
    let d = first.done.expect("final event");
    assert!(p.prompt_tokens > 20);
    assert_eq!(p.reused_tokens, 0);
    assert_eq!(first.tokens.len() as u32, d.decode_tokens);
    assert!(d.decode_tokens >= 1 && d.decode_tokens <= 12);
    let joined: String = first.tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(joined, d.text, "streamed pieces add up to the final text");
    for (i, t) in first.tokens.iter().enumerate() {
        assert_eq!(t.index as usize, i);
    }

    // Same episode, a prompt that shares the system message and the task: the shared prefix
    // is reused from the slot's KV cache.
    let second = ep1_turn(&mut w, "Task: open the settings app.\nScreen: [0] Button \"Wi-Fi\"")
        .await
        .expect("second request");
    let p2 = second.prefill.unwrap();
    assert!(
        p2.reused_tokens > 20,
        "reused {} of {}",
        p2.reused_tokens,
        p2.prompt_tokens
    );
    assert_eq!(p2.reused_tokens + p2.new_tokens, p2.prompt_tokens);
    assert!(second.done.unwrap().kv_bound_tokens >= p2.reused_tokens);

    // Greedy is deterministic: the first request again (slot state differs) gives the same text.
    let again = ep1_turn(&mut w, "Task: open the settings app.\nScreen: [0] Button \"Settings\"")
        .await
        .unwrap();
    assert_eq!(again.done.unwrap().text, d.text);

    let status = worker_status(&mut w).await;
    assert_eq!(status.model.as_ref().unwrap().architecture, "llama");
    assert_eq!(status.slots.len(), 2);
    assert!(status.requests_served >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_constrains_the_output() {
    let model = model_path();
    let mut w = start_worker(config(model)).await;
    let schema = r#"{"type":"object","properties":{"action_type":{"enum":["click","navigate_back"]},"index":{"type":"integer","minimum":0,"maximum":9}},"required":["action_type","index"],"additionalProperties":false}"#;
    let mut req = chat(
        "",
        SYSTEM,
        "Tap the second button. Screen: [0] Button \"A\" [1] Button \"B\"",
        48,
    );
    req.json_schema = schema.into();
    let out = generate(&mut w.client, req)
        .await
        .expect("constrained request");
    let d = out.done.unwrap();
    let v: serde_json::Value = serde_json::from_str(&d.text)
        .unwrap_or_else(|e| panic!("output {:?} is not JSON: {e}", d.text));
    assert!(
        matches!(v["action_type"].as_str(), Some("click" | "navigate_back")),
        "{v}"
    );
    assert!(
        v["index"].as_i64().is_some_and(|i| (0..=9).contains(&i)),
        "{v}"
    );
    assert_eq!(d.finish_reason, pb::FinishReason::Grammar as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_invalid_argument_and_the_worker_keeps_serving() {
    let model = model_path();
    let mut cfg = config(model);
    cfg.ctx_size = 256;
    let mut w = start_worker(cfg).await;
    // Wait until loaded.
    generate(&mut w.client, chat("", SYSTEM, "hi", 1))
        .await
        .unwrap();

    let long = "tap the button ".repeat(200);
    let err = generate(&mut w.client, chat("", SYSTEM, &long, 4))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("context"), "{}", err.message());

    let mut bad_schema = chat("", SYSTEM, "hi", 4);
    bad_schema.json_schema = r#"{"type": 12}"#.into();
    let err = generate(&mut w.client, bad_schema).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().to_lowercase().contains("schema"),
        "{}",
        err.message()
    );

    let empty = pb::GenerateRequest {
        max_tokens: 4,
        ..Default::default()
    };
    let err = generate(&mut w.client, empty).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let bad_ids = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Tokens(pb::TokenPrompt {
            ids: vec![1, 999_999],
        })),
        max_tokens: 4,
        ..Default::default()
    };
    let err = generate(&mut w.client, bad_ids).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("999999"), "{}", err.message());

    assert_serves(&mut w, "", "still serving").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_mid_prefill_cancels_and_the_next_request_runs() {
    let model = model_path();
    let mut cfg = config(model);
    cfg.micro_batch = 16; // many micro-batches: the drop lands mid-prefill
    let mut w = start_worker(cfg).await;
    generate(&mut w.client, chat("warm", SYSTEM, "hi", 1))
        .await
        .unwrap();

    let long = "Screen: [0] Button \"Settings\" [1] Button \"Wi-Fi\" ".repeat(60);
    let stream = w
        .client
        .generate(chat("cancel-me", SYSTEM, &long, 8))
        .await
        .unwrap()
        .into_inner();
    drop(stream);
    let t = std::time::Instant::now();

    // The engine publishes its slots when a request ends, so the cancelled request's slot
    // shows up in Status once it stopped (and before another request can take the slot over
    // for its shared prefix, as the next one would). It must show up: it holds what was
    // cached of the prompt.
    let s = loop {
        let status = worker_status(&mut w).await;
        if let Some(s) = status.slots.iter().find(|s| s.session_id == "cancel-me") {
            break s.clone();
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "no slot of the cancelled session in Status after 60 s: {:?}",
            status.slots
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let next = generate(&mut w.client, chat("other", SYSTEM, "hi", 3))
        .await
        .expect("next request");
    assert!(next.done.is_some());
    eprintln!("next request served {:?} after the drop", t.elapsed());
    // The cancelled request stopped before finishing its prompt.
    let full = generate(
        &mut w.client,
        pb::GenerateRequest {
            max_tokens: 1,
            ..chat("probe", SYSTEM, &long, 1)
        },
    )
    .await
    .unwrap()
    .prefill
    .unwrap()
    .prompt_tokens;
    assert!(
        s.cached_tokens < full,
        "cached {} of {full}: the prefill was not cancelled",
        s.cached_tokens
    );

    // A stream dropped after the first token also cancels decode.
    let mut s = w
        .client
        .generate(chat("decode-drop", SYSTEM, "Count to one hundred.", 200))
        .await
        .unwrap()
        .into_inner();
    let _first = s.next().await;
    drop(s);
    assert_serves(&mut w, "other", "after decode drop").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_model_file_gives_a_clear_error_not_a_crash() {
    let model = model_path();
    let bytes = std::fs::read(&model).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("truncated.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let mut w = start_worker(config(cut)).await;
    let err = loop {
        match w.client.generate(chat("", SYSTEM, "hi", 1)).await {
            Err(s) if s.message().contains("loading") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            Err(s) => break s,
            Ok(_) => panic!("a truncated model must not serve"),
        }
    };
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("truncated"), "{}", err.message());
}

/// The services reflection lists on `channel`, or its error (UNIMPLEMENTED when reflection
/// is not served).
async fn reflected_services(channel: tonic::transport::Channel) -> Result<Vec<String>, tonic::Status> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await?
        .into_inner();
    let msg = resp.next().await.expect("one answer")?;
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("{msg:?}")
    };
    Ok(list.service.into_iter().map(|s| s.name).collect())
}

/// Reflection is off by default (issue 20: it lists every method to anyone who connects) and
/// served with `--reflection` (`GrpcSecurity::reflection`); health reports SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_is_off_by_default_and_lists_the_services_when_asked() {
    let model = model_path();
    let settings = config(model).settings().unwrap();
    let engine = device_worker::engine::EngineHandle::spawn(settings).unwrap();
    let w = start_worker_with(engine.clone()).await;
    let channel = tonic::transport::Endpoint::from_shared(w.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let err = reflected_services(channel.clone())
        .await
        .expect_err("no reflection by default");
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");

    // The same engine served again, with reflection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let security = tandem_auth::GrpcSecurity {
        reflection: true,
        ..tandem_auth::GrpcSecurity::open()
    };
    tokio::spawn(device_worker::service::serve_secured(
        engine,
        tandem_auth::Listener::Tcp(listener),
        async {
            let _ = stopped.await;
        },
        security,
    ));
    let reflecting = tonic::transport::Endpoint::from_shared(addr)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let names = reflected_services(reflecting).await.expect("reflection served");
    for want in ["tandem.step.v1.StepService", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let mut status = -1;
    for _ in 0..200 {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "tandem.step.v1.StepService".into(),
            })
            .await
            .unwrap();
        status = r.into_inner().status;
        if status == serving {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, serving);
}

/// A hostile 3 MB prompt is refused from its length alone, before it is tokenized (bounded
/// work and memory per request), for raw text and for chat messages; the worker keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_refused_before_tokenizing() {
    let model = model_path();
    let mut w = start_worker(config(model)).await;
    let huge = "tap the button ".repeat(200_000);
    let text = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Text(huge.clone())),
        max_tokens: 4,
        ..Default::default()
    };
    for req in [text, chat("", SYSTEM, &huge, 4)] {
        let err = generate(&mut w.client, req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("refused before tokenizing"), "{}", err.message());
        assert!(err.message().contains("bytes of text"), "{}", err.message());
    }
    let ok = generate(&mut w.client, chat("", SYSTEM, "hi", 2)).await.expect("still serving");
    assert!(ok.done.is_some());
}
