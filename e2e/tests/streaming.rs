//! Token streaming to controllers: on the real model, the first `ActionToken` of a step
//! reaches the client measurably before the step's `StepResult` (tokens are forwarded as the
//! worker decodes them, not buffered until the action is complete), for both `Step` and
//! `RunEpisode`.

mod common;

use std::time::Instant;

use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio_stream::StreamExt;

const EPISODE: &str = "androidworld/ContactsAddContact_base_o4-mini_trial1";

/// Arrival times (ms since the request) of a step's tokens, and the result with its arrival.
struct Timed {
    token_ms: Vec<f64>,
    result_ms: f64,
    result: apb::StepResult,
}

async fn timed_step(events: &mut tonic::Streaming<apb::StepEvent>, t0: Instant) -> Timed {
    let mut token_ms = vec![];
    while let Some(ev) = events.next().await {
        let at = t0.elapsed().as_secs_f64() * 1e3;
        match ev.expect("event").event.expect("event kind") {
            apb::step_event::Event::Token(_) => token_ms.push(at),
            apb::step_event::Event::Result(result) => return Timed { token_ms, result_ms: at, result },
        }
    }
    panic!("stream ended without a StepResult");
}

/// The first token arrives before the result by at least half the worker's decode time (the
/// tokens after the first are decoded while the client already holds the first), and the
/// tokens arrive spread over that time rather than in one burst.
fn assert_streamed(t: &Timed) {
    let stats = t.result.stats.clone().unwrap_or_default();
    assert!(t.result.error.is_empty(), "{} (raw {:?})", t.result.error, t.result.raw_output);
    assert!(stats.decode_tokens >= 4, "too short an action to measure: {stats:?}");
    let first = *t.token_ms.first().expect("at least one token");
    let last = *t.token_ms.last().unwrap();
    let lead = t.result_ms - first;
    assert!(
        lead >= 0.5 * stats.decode_ms && lead > 5.0,
        "first token at {first:.1} ms, result at {:.1} ms: lead {lead:.1} ms < half the decode time {:.1} ms",
        t.result_ms,
        stats.decode_ms
    );
    assert!(last - first >= 0.3 * stats.decode_ms, "tokens arrived in a burst: first {first:.1} ms, last {last:.1} ms, decode {:.1} ms", stats.decode_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_action_token_arrives_before_the_step_result() {
    let model = common::model_path();
    let episode = agent_gateway::corpus::load_episode(&common::corpus(), EPISODE).expect("corpus episode");
    let servers = common::start(model).await;
    let mut client = AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();

    // Step (unary in, stream out).
    let t0 = Instant::now();
    let mut events = common::first_step(&mut client, "stream-step", &episode).await;
    assert_streamed(&timed_step(&mut events, t0).await);

    // RunEpisode: two steps over one stream.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(apb::EpisodeInput {
        input: Some(apb::episode_input::Input::Start(apb::EpisodeStart {
            episode_id: "stream-episode".into(),
            task: episode.task.clone(),
            max_tokens: 0,
        })),
    })
    .await
    .unwrap();
    let mut events = client.run_episode(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for step in &episode.steps[..2] {
        let t0 = Instant::now();
        tx.send(apb::EpisodeInput { input: Some(apb::episode_input::Input::Observation(step.to_observation())) }).await.unwrap();
        assert_streamed(&timed_step(&mut events, t0).await);
    }
}
