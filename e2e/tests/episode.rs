//! A real corpus episode through a real gateway and a real worker, over gRPC on loopback.

mod common;

use agent_gateway::replay;
use common::{corpus, model_path, replay_config, start};
use tandem_proto::agent::v1 as apb;
use tandem_proto::agent::v1::agent_service_client::AgentServiceClient;
use tokio_stream::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_gives_a_schema_valid_action_per_step_and_reuses_the_prefix() {
    let model = model_path();
    let servers = start(model).await;
    let out = tempfile::tempdir().unwrap();
    let cfg = replay_config(&servers.gateway, 3, out.path().join("replay.jsonl"));
    let (records, summary) = replay::run(&cfg).await.expect("replay");
    assert_eq!(summary.steps, 3);
    for r in &records {
        assert!(r.error.is_empty(), "step {}: {} (raw {:?})", r.step, r.error, r.raw_output);
        let v: serde_json::Value = serde_json::from_str(&r.action).unwrap();
        assert!(v["action_type"].is_string(), "{v}");
        assert!(r.first_token_ms.is_some_and(|ms| ms <= r.step_ms + 1.0));
    }
    // Steps after the first reuse the shared prefix (rules, task) from the slot.
    assert!(records[1].reused_tokens > 0, "{:?}", records[1]);
    assert!(records[2].reused_tokens > 0);
    let jsonl = std::fs::read_to_string(&cfg.out).unwrap();
    assert_eq!(jsonl.lines().count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_observations_give_clear_errors_and_the_episode_goes_on() {
    let model = model_path();
    let servers = start(model).await;
    let mut client = AgentServiceClient::connect(servers.gateway.clone()).await.unwrap();

    // Step: malformed XML and an empty observation are INVALID_ARGUMENT.
    for (xml, what) in [("<hierarchy><node text=\"a\"", "malformed"), ("", "no visible control")] {
        let req = apb::StepRequest {
            episode_id: "bad".into(),
            task: "open settings".into(),
            observation: Some(apb::Observation {
                screen: Some(apb::observation::Screen::UiautomatorXml(xml.into())),
                ..Default::default()
            }),
            max_tokens: 0,
        };
        let err = client.step(req).await.err().unwrap_or_else(|| panic!("{what}: expected an error"));
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().to_lowercase().contains(what), "{}", err.message());
    }

    // RunEpisode: a bad screen yields a StepResult with `error`, and the next good one works.
    let good = std::fs::read_to_string(corpus().join("llamatouch_evaluator/trace_7/0.xml")).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(apb::EpisodeInput {
        input: Some(apb::episode_input::Input::Start(apb::EpisodeStart {
            episode_id: "bad-then-good".into(),
            task: "delete location history".into(),
            max_tokens: 0,
        })),
    })
    .await
    .unwrap();
    let mut events = client.run_episode(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    for xml in ["<<<not xml", good.as_str()] {
        tx.send(apb::EpisodeInput {
            input: Some(apb::episode_input::Input::Observation(apb::Observation {
                screen: Some(apb::observation::Screen::UiautomatorXml(xml.into())),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    }
    let mut results = vec![];
    let mut tokens_before_result = 0;
    while results.len() < 2 {
        match events.next().await.unwrap().unwrap().event.unwrap() {
            apb::step_event::Event::Token(_) => tokens_before_result += 1,
            apb::step_event::Event::Result(r) => results.push(r),
        }
    }
    assert!(!results[0].error.is_empty() && results[0].action_json.is_empty());
    assert!(results[1].error.is_empty(), "{}", results[1].error);
    assert!(tokens_before_result > 0, "action tokens are streamed before the result");
}
