//! Session and episode ids are bounded at every entry point (`tandem_proto::limits::check_id`:
//! at most 128 bytes of UTF-8 without control characters), over real gRPC and HTTP on
//! loopback with a real worker on the default model: a 1 MiB id is refused by the worker's
//! `Generate` (INVALID_ARGUMENT naming `session_id`), the gateway's `Step` and `RunEpisode`
//! (INVALID_ARGUMENT naming `episode_id`) and the OpenAI endpoint (400 with `param` `user` or
//! `X-Episode-Id`), an id with a newline too, and no log line of the process carries the id
//! whole; a 128-byte id is served.

mod common;

use tandem_proto::agent::v1 as apb;
use tandem_proto::step::v1 as pb;
use tokio_stream::StreamExt;

/// `POST /v1/chat/completions` with `body` and extra header lines; status and body.
async fn post_chat(addr: &str, extra_headers: &str, body: String) -> (u16, serde_json::Value) {
    let (status, body) = common::http_post_with_headers(addr, "/v1/chat/completions", extra_headers, &body).await;
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

fn assert_invalid(s: &tonic::Status, field: &str) {
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s}");
    assert!(s.message().contains(field) && s.message().contains("128 bytes"), "{}", s.message());
    assert!(s.message().len() < 400, "the message names a prefix, not the id: {} bytes", s.message().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_or_control_character_ids_are_refused_everywhere_and_never_logged_whole() {
    // Every log line of this test binary (the only subscriber of the process, at TRACE).
    let logs = common::capture_logs(tracing::Level::TRACE);
    let mut servers = common::start(common::model_path()).await;
    let http = common::start_http(&mut servers).await;
    // A 1 MiB id of a pattern no other text has.
    let huge = "IdX7".repeat(1 << 18);
    let with_newline = "ep-1\nforged log line";

    let mut worker = pb::step_service_client::StepServiceClient::connect(servers.worker.clone()).await.unwrap();
    let chat = |session: &str| pb::GenerateRequest {
        session_id: session.into(),
        prompt: Some(pb::generate_request::Prompt::Text("hi".into())),
        max_tokens: 1,
        ..Default::default()
    };
    for id in [huge.as_str(), with_newline] {
        let err = worker.generate(chat(id)).await.expect_err("over-long session_id");
        assert_invalid(&err, "session_id");
    }
    let ok_id = "s".repeat(128);
    let mut served = worker.generate(chat(&ok_id)).await.expect("a 128-byte session id").into_inner();
    while let Some(ev) = served.next().await {
        ev.expect("served");
    }

    let mut gateway = apb::agent_service_client::AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
    let obs = apb::Observation {
        screen: Some(apb::observation::Screen::UiElementsJson("[]".into())),
        ..Default::default()
    };
    for id in [huge.as_str(), with_newline] {
        let step = apb::StepRequest { episode_id: id.into(), task: "t".into(), observation: Some(obs.clone()), max_tokens: 1 };
        let err = gateway.step(step).await.expect_err("over-long episode_id");
        assert_invalid(&err, "episode_id");

        let start = apb::EpisodeInput { input: Some(apb::episode_input::Input::Start(apb::EpisodeStart { episode_id: id.into(), task: "t".into(), max_tokens: 1 })) };
        let mut events = gateway.run_episode(tokio_stream::iter(vec![start])).await.expect("stream opens").into_inner();
        let err = events.next().await.expect("one event").expect_err("over-long episode_id");
        assert_invalid(&err, "episode_id");
    }

    let body = |user: &str| serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "user": user}).to_string();
    for (headers, user, param) in [
        (String::new(), huge.as_str(), "user"),
        (String::new(), with_newline, "user"),
        // A header of 400 bytes (a 1 MiB header is over hyper's header buffer: 431 before any handler).
        (format!("X-Episode-Id: {}\r\n", &huge[..400]), "", "X-Episode-Id"),
    ] {
        let (status, v) = post_chat(&http, &headers, body(user)).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().len() < 400, "{v}");
    }

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(!logs.is_empty(), "the capture works");
    assert!(!logs.contains(&huge[..4096]), "a log line carries the huge id");
    assert!(!logs.contains("\nforged log line"), "a newline in an id started a log line");
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 16 << 10, "the longest log line is {longest} bytes");
}
