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

/// Set (to the gateway's address) in the child process of
/// `replay_into_a_closed_pipe_ends_quietly`.
const REPLAY_CHILD_ENV: &str = "TANDEM_E2E_REPLAY_CHILD";

/// The replay of `replay_into_a_closed_pipe_ends_quietly`, run in a child process (this test
/// binary again, with [`REPLAY_CHILD_ENV`] set): three steps through the given gateway, the
/// table on this process's standard output.
#[test]
#[ignore = "the replay process of replay_into_a_closed_pipe_ends_quietly (started by it)"]
fn replay_child() {
    let Ok(gateway) = std::env::var(REPLAY_CHILD_ENV) else { return };
    let out = tempfile::tempdir().unwrap();
    let cfg = replay_config(&gateway, 3, out.path().join("replay.jsonl"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(replay::run(&cfg)).expect("replay");
}

/// `agent-gateway replay ... | head -1`: once the reader has the table's header and goes
/// away, the replay ends quietly at its next row (exit code 0), not with "failed printing to
/// stdout: Broken pipe" and exit code 101. The step rows come after real steps of a real
/// worker, so the row printing is what meets the closed pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_into_a_closed_pipe_ends_quietly() {
    use std::io::BufRead;
    let servers = start(model_path()).await;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["replay_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(REPLAY_CHILD_ENV, &servers.gateway)
        .env_remove("RUST_BACKTRACE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the replay process");
    let stdout = child.stdout.take().unwrap();
    // `head -1` of the table (libtest's own lines come first).
    let header = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout).lines().map_while(Result::ok).find(|l| l.contains("progress"))
    })
    .await
    .unwrap();
    assert!(header.is_some_and(|h| h.contains("server_ms")), "no table header");
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("Broken pipe") && !stderr.contains("panicked"),
        "{}: {stderr}",
        out.status
    );
    assert!(stderr.contains("replaying 1 episode(s), 3 step(s)"), "{stderr}");
}
