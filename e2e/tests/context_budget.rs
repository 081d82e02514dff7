//! Prompt + output against the context, over real gRPC and HTTP on loopback with a real worker
//! on the default model and a small context ([`N_CTX`]):
//!
//! - an explicit `max_tokens` that does not fit after the prompt is refused, as OpenAI refuses
//!   it (gRPC INVALID_ARGUMENT, HTTP 400 with `param: "max_tokens"`), naming the context, the
//!   prompt's tokens and the largest `max_tokens` that fits; one that just fits is served;
//! - without `max_tokens` generation stops at the context's end (finish reason CONTEXT,
//!   OpenAI `"length"`): prompt + output tokens never exceed the context;
//! - an agent step whose prompt is over the worker's context is a gRPC INVALID_ARGUMENT from
//!   `AgentService.Step` (with the worker's message), and a step result with `error` in a
//!   `RunEpisode` stream, which stays open; one without `max_tokens` whose prompt leaves less
//!   than the gateway's default budget is served up to the context's end.

mod common;

use common::{corpus, model_path};
use tandem_proto::agent::v1 as apb;
use tandem_proto::step::v1 as pb;
use tokio_stream::StreamExt;

/// Context of the worker here: small, so an agent prompt is over it and a prompt near it
/// prefills quickly.
const N_CTX: usize = 128;

/// Prompt tokens of the requests near the end of the context.
const N_PROMPT: usize = 120;

/// The worker of these tests: the default model, one slot of [`N_CTX`] tokens, the worker's
/// default output budget (256, more than the context leaves).
fn worker_options() -> device_worker::config::EngineOptions {
    device_worker::config::EngineOptions {
        model: Some(model_path()),
        threads: Some(2),
        ctx_size: N_CTX,
        slots: 1,
        ..Default::default()
    }
}

/// [`N_PROMPT`] tokens of `" the"` repeated (greedy decoding goes on repeating it, so the
/// output does not end early).
fn repeated_prompt() -> Vec<u32> {
    let g = gguf::reader::GgufFile::open(&model_path()).unwrap();
    let the = gguf::tokenizer::Tokenizer::from_gguf(&g).unwrap().encode(" the", false).unwrap();
    the.iter().copied().cycle().take(N_PROMPT).collect()
}

/// The final stats of a `Generate` with `max_tokens`, or its refusal.
async fn generate(
    client: &mut pb::step_service_client::StepServiceClient<tonic::transport::Channel>,
    max_tokens: u32,
) -> Result<pb::FinalStats, tonic::Status> {
    let mut stream = client
        .generate(pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Tokens(pb::TokenPrompt { ids: repeated_prompt() })),
            max_tokens,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut done = None;
    while let Some(ev) = stream.next().await {
        if let Some(pb::generate_event::Event::Done(d)) = ev?.event {
            done = Some(d);
        }
    }
    Ok(done.expect("final stats"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_past_the_context_is_refused_and_output_stops_at_its_end() {
    let mut servers = common::start_with(worker_options()).await;
    let mut client = pb::step_service_client::StepServiceClient::connect(servers.worker.clone()).await.unwrap();
    let room = (N_CTX - N_PROMPT) as u32;

    // One token too many: refused, naming max_tokens and the numbers.
    let err = generate(&mut client, room + 1).await.expect_err("over the context");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let want = format!(
        "max_tokens {} does not fit: the context holds {N_CTX} tokens, the request asks for {} ({N_PROMPT} prompt + {} max_tokens); expected max_tokens at most {room}",
        room + 1,
        N_CTX + 1,
        room + 1
    );
    assert_eq!(err.message(), want);

    // Exactly the room left: served, the output fills the context.
    let d = generate(&mut client, room).await.expect("fits");
    assert_eq!((d.prompt_tokens, d.decode_tokens), (N_PROMPT as u32, room), "{d:?}");
    assert_eq!(d.finish_reason, pb::FinishReason::Length as i32, "{d:?}");

    // No max_tokens (the worker's default, 256): stops at the context's end, not one past it.
    let d = generate(&mut client, 0).await.expect("served");
    assert_eq!(d.finish_reason, pb::FinishReason::Context as i32, "{d:?}");
    assert_eq!((d.prompt_tokens + d.decode_tokens) as usize, N_CTX, "{d:?}");

    // The OpenAI endpoint: the same refusal as a 400 naming max_tokens; without max_tokens
    // the usage stays within the context.
    let http = common::start_http(&mut servers).await;
    let chat = |max_tokens: Option<usize>| {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "the ".repeat(90)}]});
        if let Some(m) = max_tokens {
            body["max_tokens"] = m.into();
        }
        body.to_string()
    };
    let post = |body: String| {
        let http = http.clone();
        async move {
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let (status, body) = common::http_exchange(&http, head, &body).await;
            (status, serde_json::from_str::<serde_json::Value>(&body).unwrap_or_else(|e| panic!("{e}: {body}")))
        }
    };
    let (status, v) = post(chat(Some(1))).await;
    assert_eq!(status, 200, "{v}");
    let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(n_prompt < N_CTX - 1, "the chat prompt must leave room: {n_prompt}");
    let (status, v) = post(chat(Some(N_CTX - n_prompt + 1))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    let numbers = format!("the request asks for {} ({n_prompt} prompt + {} max_tokens); expected max_tokens at most {}", N_CTX + 1, N_CTX - n_prompt + 1, N_CTX - n_prompt);
    assert!(message.contains(&numbers), "{message}");
    let (status, v) = post(chat(None)).await;
    assert_eq!(status, 200, "{v}");
    let total = v["usage"]["total_tokens"].as_u64().unwrap() as usize;
    assert!(total <= N_CTX, "{v}");
    if v["choices"][0]["finish_reason"] == "length" {
        assert_eq!(total, N_CTX, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_prompt_over_the_context_is_invalid_argument() {
    let servers = common::start_with(worker_options()).await;
    let episode = agent_gateway::corpus::load_episodes(&corpus()).unwrap().remove(0);
    let mut client = apb::agent_service_client::AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();

    // Step: the call ends with INVALID_ARGUMENT carrying the worker's message.
    let mut events = common::first_step(&mut client, "over-context", &episode).await;
    let status = loop {
        match events.next().await.expect("the step ends with a status") {
            Ok(apb::StepEvent { event: Some(apb::step_event::Event::Result(r)) }) => panic!("a result instead of a status: {r:?}"),
            Ok(_) => {}
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let message = status.message();
    assert!(message.contains(&servers.worker) && message.contains(&format!("the context holds {N_CTX}")), "{message}");

    // RunEpisode: the same message as the step's error; the stream stays open for the next.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(apb::EpisodeInput {
        input: Some(apb::episode_input::Input::Start(apb::EpisodeStart {
            episode_id: "over-context-episode".into(),
            task: episode.task.clone(),
            max_tokens: 0,
        })),
    })
    .await
    .unwrap();
    let mut events = client.run_episode(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for _ in 0..2 {
        tx.send(apb::EpisodeInput { input: Some(apb::episode_input::Input::Observation(episode.steps[0].to_observation())) })
            .await
            .unwrap();
        let result = loop {
            if let Some(apb::step_event::Event::Result(r)) = events.next().await.unwrap().unwrap().event {
                break r;
            }
        };
        assert!(result.error.contains(&format!("the context holds {N_CTX}")), "{result:?}");
    }
}

/// The result of `client.step` for the first screen of `episode` with `max_tokens`, or the
/// status the call ended with.
async fn agent_step(
    client: &mut apb::agent_service_client::AgentServiceClient<tonic::transport::Channel>,
    id: &str,
    episode: &agent_gateway::corpus::Episode,
    max_tokens: u32,
) -> Result<apb::StepResult, tonic::Status> {
    let mut events = client
        .step(apb::StepRequest {
            episode_id: id.into(),
            task: episode.task.clone(),
            observation: Some(episode.steps[0].to_observation()),
            max_tokens,
        })
        .await?
        .into_inner();
    loop {
        if let Some(apb::step_event::Event::Result(r)) = events.next().await.expect("a result or a status")?.event {
            return Ok(r);
        }
    }
}

/// An agent step without `max_tokens` whose prompt leaves less than the gateway's default
/// budget (96 tokens) before the context's end is served up to the context's end (the
/// default is the gateway's, not the controller's ask); with an explicit `max_tokens` that
/// does not fit, the step is INVALID_ARGUMENT naming max_tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_step_without_max_tokens_is_cut_at_the_context_end() {
    let episode = agent_gateway::corpus::load_episodes(&corpus()).unwrap().remove(0);
    // The step's prompt length, on a worker with room to spare.
    let n_prompt = {
        let servers = common::start_with(device_worker::config::EngineOptions { ctx_size: 4096, ..worker_options() }).await;
        let mut client = apb::agent_service_client::AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
        let r = agent_step(&mut client, "measure", &episode, 1).await.expect("a step");
        r.stats.unwrap().prompt_tokens as usize
    };
    let n_ctx = n_prompt + 40;
    let servers = common::start_with(device_worker::config::EngineOptions { ctx_size: n_ctx, ..worker_options() }).await;
    let mut client = apb::agent_service_client::AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
    let r = agent_step(&mut client, "no-budget", &episode, 0).await.expect("served without max_tokens");
    let stats = r.stats.clone().unwrap();
    assert_eq!(stats.prompt_tokens as usize, n_prompt, "{r:?}");
    assert!(stats.decode_tokens > 0 && (stats.prompt_tokens + stats.decode_tokens) as usize <= n_ctx, "{r:?}");
    let err = agent_step(&mut client, "explicit", &episode, 96).await.expect_err("96 does not fit");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains(&format!("max_tokens 96 does not fit: the context holds {n_ctx} tokens")), "{}", err.message());
}

/// A `replay --max-tokens` that no step can fit stops the replay at once with one message
/// without the worker's address (it failed every step alike, each error naming the worker): a
/// budget of the whole context or more is refused at the episode's start (the gateway knows
/// the worker's context from its Status; a unary `Step` is refused the same way), and one the
/// first step's prompt leaves no room for ends the replay after that step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_budget_no_step_fits_stops_with_one_message() {
    let servers = common::start_with(device_worker::config::EngineOptions { ctx_size: 4096, ..worker_options() }).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::replay_config(&servers.gateway, 3, dir.path().join("replay.jsonl"));
    cfg.max_tokens = 100_000;
    let err = agent_gateway::replay::run(&cfg).await.expect_err("100000 tokens never fit").to_string();
    eprintln!("{err}");
    let refusal = "max_tokens 100000 does not fit: the model's context holds 4096 tokens, the prompt included; expected max_tokens below 4096";
    assert!(err.contains(&format!("step 0): InvalidArgument: {refusal}")) && !err.contains(&servers.worker), "{err}");

    let episode = agent_gateway::corpus::load_episodes(&corpus()).unwrap().remove(0);
    let mut client = apb::agent_service_client::AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();
    let status = agent_step(&mut client, "budget", &episode, 100_000).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with(refusal), "{}", status.message());

    cfg.max_tokens = 4000;
    let err = agent_gateway::replay::run(&cfg).await.expect_err("the prompt leaves less than 4000").to_string();
    eprintln!("{err}");
    assert!(err.contains("--max-tokens 4000 does not fit the first step (episode ") && err.contains(", step 0): the context holds 4096 tokens"), "{err}");
    assert!(err.contains("pass a smaller --max-tokens, or 0 for the gateway's default") && !err.contains(&servers.worker), "{err}");
}
