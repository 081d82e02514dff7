//! Speculative decoding is invisible in the output (issue 5): corpus prompts, built by the
//! gateway's prompt builder, run on a real worker over loopback gRPC with each drafter, with
//! both, and with forced-rejection drafts; every output equals the output without
//! speculation token for token, on the tiny hybrid Qwen3.5 fixture (rollback of recurrent
//! state) and on the default real model (with the gateway's JSON action constraint).
//! The drafts must actually be exercised: proposals, acceptances and rejections are counted
//! from the final stats. The tiny fixture carries an MTP block (synthetic weights), so the
//! `mtp` drafter runs there too: its drafts are rarely right, which exercises rollback of
//! the MTP cache beside the sequence.

use std::path::PathBuf;

use agent_gateway::action::action_json_schema_for;
use agent_gateway::corpus::{load_episodes, Episode};
use device_worker::config::{DraftLengthMode, Drafters, EngineOptions};
use tandem_proto::step::v1 as pb;
use tandem_proto::step::v1::step_service_client::StepServiceClient;

mod common;

fn tiny_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf")
}

/// One run's outputs (per step) and draft counts summed over its steps.
#[derive(Default)]
struct Tally {
    outputs: Vec<Vec<u32>>,
    proposed: u32,
    accepted: u32,
    rounds: u32,
    decode_passes: u32,
    decode_tokens: u32,
    /// Drafter labels of the final stats' per-drafter rows.
    drafters: std::collections::BTreeSet<String>,
}

struct Setup {
    model: PathBuf,
    drafters: &'static str,
    length: DraftLengthMode,
    corrupt: bool,
    /// Send the gateway's JSON action schema (the real model; the tiny fixture's tokenizer
    /// cannot spell JSON well enough to make constrained outputs interesting).
    constrained: bool,
    max_tokens: u32,
}

async fn worker(
    s: &Setup,
) -> (
    StepServiceClient<tonic::transport::Channel>,
    tokio::sync::oneshot::Sender<()>,
) {
    let cfg = EngineOptions {
        model: Some(s.model.clone()),
        threads: Some(2),
        ctx_size: 4096,
        slots: 1,
        drafters: s.drafters.parse::<Drafters>().expect("drafters"),
        draft_length: s.length,
        test_corrupt_drafts: s.corrupt,
        ..Default::default()
    };
    let (_engine, addr, stop) = common::serve_worker(cfg).await;
    (
        StepServiceClient::connect(addr).await.expect("connect"),
        stop,
    )
}

/// Runs the first `n_steps` corpus steps `passes` times on one worker; a tally per pass.
async fn run(s: &Setup, episodes: &[Episode], n_steps: usize, passes: usize) -> Vec<Tally> {
    let (mut client, _stop) = worker(s).await;
    let mut out = Vec::new();
    for _ in 0..passes {
        let mut t = Tally::default();
        let steps = episodes
            .iter()
            .flat_map(|ep| (0..ep.steps.len()).map(move |i| (ep, i)))
            .take(n_steps);
        for (ep, i) in steps {
            let p = ep.step_prompt(i).expect("prompt");
            let bound = ep.steps[i]
                .observation
                .parse()
                .expect("screen")
                .index_bound();
            let req = pb::GenerateRequest {
                session_id: format!("spec-{}", ep.id),
                prompt: Some(pb::generate_request::Prompt::Chat(pb::ChatPrompt {
                    messages: vec![
                        pb::ChatMessage {
                            role: "system".into(),
                            content: p.system.clone(),
                            parts: vec![],
                        },
                        pb::ChatMessage {
                            role: "user".into(),
                            content: p.user.clone(),
                            parts: vec![],
                        },
                    ],
                })),
                max_tokens: s.max_tokens,
                json_schema: if s.constrained {
                    action_json_schema_for(bound).to_string()
                } else {
                    String::new()
                },
                ..Default::default()
            };
            let mut stream = client.generate(req).await.expect("generate").into_inner();
            let (mut ids, mut done) = (Vec::new(), None);
            while let Some(ev) = stream.message().await.expect("stream") {
                match ev.event {
                    Some(pb::generate_event::Event::Token(tok)) => ids.push(tok.id),
                    Some(pb::generate_event::Event::Done(d)) => done = Some(d),
                    _ => {}
                }
            }
            let d = done.expect("final stats");
            assert_eq!(d.decode_tokens as usize, ids.len());
            for ds in &d.drafts {
                assert!(ds.accepted <= ds.proposed, "{ds:?}");
                t.proposed += ds.proposed;
                t.accepted += ds.accepted;
                t.rounds += ds.rounds;
                t.drafters.insert(ds.drafter.clone());
            }
            t.decode_passes += d.decode_passes;
            t.decode_tokens += d.decode_tokens;
            t.outputs.push(ids);
        }
        out.push(t);
    }
    out
}

fn report(name: &str, t: &Tally) {
    eprintln!(
        "{name}: {} outputs, {} tokens, {} decode passes ({:.2}/token), drafts {}/{} accepted in {} rounds",
        t.outputs.len(),
        t.decode_tokens,
        t.decode_passes,
        t.decode_passes as f64 / t.decode_tokens.max(1) as f64,
        t.accepted,
        t.proposed,
        t.rounds
    );
}

type Config = (&'static str, &'static str, DraftLengthMode, bool, usize);

/// Drafts of fixed length from `drafters` (`--drafters`), `passes` passes over the steps.
const fn fixed(tag: &'static str, drafters: &'static str, passes: usize) -> Config {
    (tag, drafters, DraftLengthMode::Fixed, false, passes)
}

/// As [`fixed`] with adaptive draft length.
const fn adaptive(tag: &'static str, drafters: &'static str, passes: usize) -> Config {
    (tag, drafters, DraftLengthMode::Adaptive, false, passes)
}

/// As [`fixed`] with every draft corrupted (forced rejections).
const fn forced(tag: &'static str, drafters: &'static str, passes: usize) -> Config {
    (tag, drafters, DraftLengthMode::Fixed, true, passes)
}

/// Every drafter alone, both combined with adaptive length, and forced rejections: (tag,
/// --drafters, length mode, corrupt drafts, passes over the steps).
const ALL_CONFIGS: &[Config] = &[
    fixed("prompt-lookup", "prompt-lookup", 1),
    fixed("experience (cold, warm)", "experience", 2),
    adaptive("prompt-lookup,experience adaptive", "prompt-lookup,experience", 2),
    forced("forced rejection", "prompt-lookup,experience", 2),
    fixed("mtp", "mtp", 1),
    adaptive("mtp,prompt-lookup adaptive", "mtp,prompt-lookup", 1),
];

/// Every configuration against plain greedy decoding on `model`.
async fn equivalence(
    model: PathBuf,
    constrained: bool,
    n_steps: usize,
    max_tokens: u32,
    configs: &[Config],
) -> Vec<(String, Tally)> {
    let episodes = load_episodes(&common::corpus()).expect("corpus");
    let setup = |drafters, length, corrupt| Setup {
        model: model.clone(),
        drafters,
        length,
        corrupt,
        constrained,
        max_tokens,
    };
    let plain = run(
        &setup("none", DraftLengthMode::Fixed, false),
        &episodes,
        n_steps,
        1,
    )
    .await
    .remove(0);
    report("none", &plain);
    assert_eq!(plain.rounds, 0);
    // Plain decoding: one pass per output token fed back, never more than the tokens.
    assert!(plain.decode_passes <= plain.decode_tokens && plain.decode_passes > 0);
    let mut results = Vec::new();
    for &(name, drafters, length, corrupt, passes) in configs {
        let runs = run(
            &setup(drafters, length, corrupt),
            &episodes,
            n_steps,
            passes,
        )
        .await;
        for (pass, t) in runs.into_iter().enumerate() {
            let tag = format!("{name} pass {pass}");
            report(&tag, &t);
            for (step, (a, b)) in t.outputs.iter().zip(&plain.outputs).enumerate() {
                assert_eq!(
                    a, b,
                    "{tag}: step {step} differs from plain greedy decoding"
                );
            }
            results.push((tag, t));
        }
    }
    results
}

fn find<'a>(r: &'a [(String, Tally)], tag: &str) -> &'a Tally {
    &r.iter().find(|(t, _)| t == tag).expect(tag).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_hybrid_outputs_equal_plain_greedy_with_every_drafter() {
    let r = equivalence(tiny_fixture(), false, 35, 24, ALL_CONFIGS).await;
    // Warm experience replays the same prompts: its outputs are in memory and get drafted.
    let warm = find(&r, "experience (cold, warm) pass 1");
    assert!(warm.accepted > 0, "warm experience memory accepted nothing");
    let forced = find(&r, "forced rejection pass 1");
    assert!(
        forced.rounds > 0 && forced.accepted < forced.proposed,
        "forced rejection exercised no rollback"
    );
    // The MTP drafter proposes every round (fixed length, --n-draft 3).
    let mtp = find(&r, "mtp pass 0");
    assert!(
        mtp.rounds > 0 && mtp.proposed >= mtp.rounds,
        "the mtp drafter proposed nothing"
    );
    assert_eq!(mtp.drafters.iter().collect::<Vec<_>>(), ["mtp"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_model_outputs_equal_plain_greedy_with_every_drafter() {
    let model = common::model_path();
    // A real model costs seconds per request: 4 steps, each drafter, and forced rejections
    // (prompt lookup proposes from the first step on, so one pass suffices there).
    let configs: &[Config] = &[
        fixed("prompt-lookup", "prompt-lookup", 1),
        adaptive("experience (cold, warm)", "experience", 2),
        forced("forced rejection", "prompt-lookup", 1),
    ];
    let r = equivalence(model, true, 4, 48, configs).await;
    let pl = find(&r, "prompt-lookup pass 0");
    assert!(
        pl.accepted > 0,
        "prompt lookup drafted nothing that was accepted on action outputs"
    );
    let warm = find(&r, "experience (cold, warm) pass 1");
    assert!(
        warm.accepted > 0 && warm.decode_passes < warm.decode_tokens,
        "warm experience memory did not cut target passes"
    );
    let forced = find(&r, "forced rejection pass 0");
    assert!(forced.rounds > 0 && forced.accepted < forced.proposed);
}

/// `mtp-trimmed` on a trimmed copy of the tiny fixture written by the gateway's
/// `draft-vocab` tool (top 128 of its 512 tokens, ranked on the corpus): outputs equal plain
/// greedy decoding (verification uses the full vocabulary), and the drafts are counted under
/// their own label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_hybrid_outputs_equal_plain_greedy_with_the_trimmed_mtp_head() {
    use model_tools::draft_vocab::{run as draft_vocab, DraftVocabArgs};
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("tiny-qwen35-q8_0-trimmed.gguf");
    let summary = draft_vocab(&DraftVocabArgs {
        model: tiny_fixture(),
        out: out.clone(),
        top: 128,
        corpus: common::corpus(),
        force: false,
    })
    .expect("draft-vocab writes the trimmed copy");
    assert_eq!(summary.rows, 128);
    let configs: &[Config] = &[
        fixed("mtp-trimmed", "mtp-trimmed", 1),
        forced("mtp-trimmed forced rejection", "mtp-trimmed,prompt-lookup", 1),
    ];
    let r = equivalence(out, false, 12, 24, configs).await;
    let t = find(&r, "mtp-trimmed pass 0");
    assert!(
        t.rounds > 0 && t.proposed >= t.rounds,
        "mtp-trimmed proposed nothing"
    );
    assert_eq!(t.drafters.iter().collect::<Vec<_>>(), ["mtp-trimmed"]);
}
