//! The engine executes exactly what the dry-run planner plans: every corpus episode, prompts
//! built by the gateway's prompt builder, run on a real worker holding the tiny hybrid Qwen3.5
//! fixture under each checkpoint policy (with and without batch consolidation); each step's
//! processed prompt tokens and prefill passes equal the planner's, run beside it on the same
//! tokens, and the generated tokens are identical across policies (a checkpoint restore is
//! bit-exact). Passes and processed tokens are also read from the model's own counters
//! (`Status.forward`, counted at every forward pass), not only from the engine's statistics.

use std::path::PathBuf;

use agent_gateway::corpus::load_episodes;
use device_worker::prompt::chat_tokens;
use device_worker::state::planner::{plan, CacheState, PlanConfig, PlanRequest, Policy};
use gguf::chat_template::{ChatMessage, ChatTemplate};
use device_worker::config::{Drafters, EngineOptions};
use gguf::reader::GgufFile;
use gguf::tokenizer::Tokenizer;
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;

mod common;

/// A committed fixture (a required input).
fn fixture() -> PathBuf {
    test_support::fixture(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf"),
        "committed in device-worker/tests/fixtures/qwen35 (made by tools/fixtures/, see its README.md)",
    )
}

/// Serves an engine with `policy` / `consolidate` on a free port, speculating with the
/// default drafters or decoding plainly; returns its address and a stop handle.
async fn worker(policy: Policy, consolidate: bool, speculate: bool) -> (String, tokio::sync::oneshot::Sender<()>) {
    let cfg = EngineOptions {
        model: Some(fixture()),
        threads: Some(2),
        ctx_size: 4096,
        slots: 1,
        micro_batch: 512,
        cache_policy: policy,
        consolidate,
        // Plain decoding: every decode pass then feeds one output token, so the model's pass
        // counters split into the planned prefill and one pass per fed-back token. With the
        // default drafters the prefill keeps rollback states, and the end-of-prompt state is
        // taken from them.
        drafters: if speculate { EngineOptions::default().drafters } else { Drafters(Vec::new()) },
        ..Default::default()
    };
    let (_engine, addr, stop) = common::serve_worker(cfg).await;
    (addr, stop)
}

/// The model's own pass counters once the worker has finished `served` requests (the status
/// snapshot is published after each request).
async fn forward_counts(client: &mut StepServiceClient<tonic::transport::Channel>, served: u64) -> pb::ForwardCounts {
    for _ in 0..500 {
        let s = client.status(pb::StatusRequest {}).await.expect("status").into_inner();
        if s.requests_served == served {
            return s.forward.expect("the model is loaded: Status.forward present");
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the worker did not report {served} requests served within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_token_counts_equal_the_planner_for_every_policy_and_episode() {
    let file = GgufFile::open(&fixture()).expect("fixture");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file).expect("template");
    let episodes = load_episodes(&common::corpus()).expect("corpus");
    assert!(episodes.len() >= 4);
    let mut outputs_by_config: Vec<Vec<Vec<u32>>> = Vec::new();
    for (policy, consolidate, speculate) in [
        (Policy::Stock, false, false),
        (Policy::Marconi, false, false),
        (Policy::Divergence, false, false),
        (Policy::Divergence, true, false),
        (Policy::Divergence, true, true),
    ] {
        let (addr, _stop) = worker(policy, consolidate, speculate).await;
        let mut client = StepServiceClient::connect(addr).await.expect("connect");
        let status = client.status(pb::StatusRequest {}).await.expect("status").into_inner();
        let cfg = PlanConfig {
            policy,
            consolidate,
            n_batch: 512,
            checkpoint_bytes: status.cache.as_ref().map_or(0, |c| c.checkpoint_bytes as usize),
            kv_bytes_per_token: status.cache.as_ref().map_or(0, |c| c.kv_bytes_per_token as usize),
            end_state: speculate,
            ..PlanConfig::default()
        };
        let mut state = CacheState::default();
        let mut outputs = Vec::new();
        let (mut restores, mut reused, mut served) = (0usize, 0usize, 0u64);
        for ep in &episodes {
            for i in 0..ep.steps.len() {
                let p = ep.step_prompt(i).expect("step prompt");
                let messages = vec![ChatMessage::new("system", p.system.clone()), ChatMessage::new("user", p.user.clone())];
                let ct = chat_tokens(&tokenizer, &template, &messages).expect("tokens");
                let planned = plan(
                    &state,
                    &PlanRequest { prompt: &ct.tokens, last_user_start: ct.last_user_start, image_start: None, image_end: None, line_starts: &ct.line_starts, section_starts: &ct.section_starts },
                    &cfg,
                );
                let req = pb::GenerateRequest {
                    session_id: "planner-check".into(),
                    prompt: Some(pb::generate_request::Prompt::Chat(pb::ChatPrompt {
                        messages: messages
                            .iter()
                            .map(|m| pb::ChatMessage { role: m.role.clone(), content: m.content.clone(), parts: vec![] })
                            .collect(),
                    })),
                    max_tokens: 4,
                    ..Default::default()
                };
                let before = forward_counts(&mut client, served).await;
                let mut stream = client.generate(req).await.expect("generate").into_inner();
                let (mut prefill, mut done, mut ids) = (None, None, Vec::new());
                while let Some(ev) = stream.message().await.expect("stream") {
                    match ev.event {
                        Some(pb::generate_event::Event::Prefill(p)) => prefill = Some(p),
                        Some(pb::generate_event::Event::Token(t)) => ids.push(t.id),
                        Some(pb::generate_event::Event::Done(d)) => done = Some(d),
                        None => {}
                    }
                }
                let (prefill, done) = (prefill.expect("prefill stats"), done.expect("final stats"));
                let tag = format!("{policy:?} cons={consolidate} spec={speculate} {} step {i}", ep.id);
                assert_eq!(done.prompt_tokens as usize, ct.tokens.len(), "{tag}: prompt tokens");
                assert_eq!(done.new_tokens as usize, planned.new_tokens(), "{tag}: new tokens");
                assert_eq!(prefill.passes as usize, planned.passes(), "{tag}: passes");
                assert_eq!(done.kv_bound_tokens as usize, planned.kv_bound, "{tag}: KV bound");
                // The policy's saves and the end-of-prompt state, each actually held.
                let saved = planned.saved.len() + usize::from(planned.end_state.is_some());
                assert_eq!(done.checkpoints_saved as usize, saved, "{tag}: saved");
                assert_eq!(done.checkpoints_restored as usize, planned.restored.is_some() as usize, "{tag}: restored");
                restores += planned.restored.is_some() as usize;
                reused += done.reused_tokens as usize;
                // The slot holds the prompt and the output tokens fed back (all but the last
                // one unless decoding ended at an end-of-generation token).
                let fed = if done.finish_reason == pb::FinishReason::Eos as i32 { ids.len() } else { ids.len().saturating_sub(1) };
                served += 1;
                let after = forward_counts(&mut client, served).await;
                // Decode passes: one per fed-back token when decoding plainly; with speculation
                // the engine's count of verification passes (their drafts were rolled back).
                let decode_passes = if speculate { done.decode_passes as usize } else { fed };
                assert_eq!(after.passes - before.passes, (planned.passes() + decode_passes) as u64, "{tag}: model passes");
                if !speculate {
                    assert_eq!(after.tokens - before.tokens, (planned.new_tokens() + fed) as u64, "{tag}: model tokens");
                }
                let mut processed = ct.tokens.clone();
                processed.extend_from_slice(&ids[..fed]);
                state.apply(&cfg, &planned, &processed);
                outputs.push(ids);
            }
        }
        // The comparison is only worth something if checkpoints were actually restored.
        assert!(restores >= 10 && reused > 0, "{policy:?}: {restores} restores, {reused} tokens reused");
        eprintln!("{policy:?} consolidate={consolidate} speculate={speculate}: {restores} restores, {reused} prompt tokens reused");
        outputs_by_config.push(outputs);
    }
    for (ci, o) in outputs_by_config.iter().enumerate().skip(1) {
        assert_eq!(o, &outputs_by_config[0], "outputs of config {ci} differ from stock's");
    }
}
